"""The checker finds each kind of violation in hand-made bad histories, and
none in a good one."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tests.chaos.checker import (
    Entry,
    FinalJob,
    HolderAt,
    Liveness,
    check,
    check_statuses,
    summarize,
)
from tests.chaos.history import History, Op, merge
from tests.chaos.queue_checker import (
    FinalItem,
    check_queue,
    check_queue_statuses,
    failures,
    final_counts,
)
from tests.chaos.sem_checker import (
    SlotEvent,
    check_limit,
    check_nothing_lost,
    check_semaphore,
    check_slot_fences,
    max_live,
)

J = "chaos/j1"


class H:
    """Builds a history in memory: ``h.claim("a", token=10, generation=1)``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.n = 0

    def _op(self, process: str, kind: str, phase: str, invoke_extra: dict[str, Any] | None = None,
            **fields: Any) -> str:
        self.n += 1
        op = f"{process}:{self.n}"
        self.ops.append(Op(op=op, process=process, kind=kind, phase="invoke",
                           extra=invoke_extra or {},
                           **{k: v for k, v in fields.items() if k not in ("reason", "extra")}))
        if phase != "none":
            self.ops.append(Op(op=op, process=process, kind=kind, phase=phase, **fields))
        return op

    def claim(self, p: str, token: int, gen: int, phase: str = "ok", job: str = J,
              owner: str | None = None) -> str:
        return self._op(p, "claim", phase, job=job, token=token, generation=gen,
                        extra={"owner": owner} if owner else {})

    def complete(self, p: str, token: int, gen: int, phase: str = "ok", job: str = J,
                 reason: str | None = None) -> str:
        return self._op(p, "complete", phase, job=job, token=token, generation=gen,
                        reason=reason)

    def write(self, p: str, token: int, gen: int, key: str, phase: str = "ok",
              resource: str = "ledger/j1", reason: str | None = None,
              resend: str | None = None, duplicate: bool = False, job: str = J) -> str:
        return self._op(p, "write", phase, invoke_extra={"resend": resend} if resend else None,
                        job=job, token=token, generation=gen, resource=resource, key=key,
                        reason=reason, extra={"duplicate": duplicate})

    def release(self, p: str, token: int, gen: int, job: str, phase: str = "ok") -> str:
        return self._op(p, "release", phase, job=job, token=token, generation=gen)

    def enqueue(self, queue: str, ids: list[str], poison: list[str] | None = None,
                phase: str = "ok") -> str:
        return self._op("runner", "enqueue", phase,
                        invoke_extra={"ids": ids, "poison": poison or []}, job=queue)

    def lost(self, p: str, token: int, gen: int, reason: str) -> str:
        return self._op(p, "lost", "ok", job=J, token=token, generation=gen, reason=reason)


def good() -> tuple[H, dict[str, FinalJob], dict[str, list[Entry]]]:
    """A paused, stale A and its successor B, everything refused/accepted as it must be."""
    h = H()
    h.claim("a", token=10, gen=1)
    h.write("a", 10, 1, "j1#g1:0")
    h.claim("b", token=15, gen=2)                          # after A's lease expired
    h.write("b", 15, 2, "j1#g2:0")
    h.write("a", 10, 1, "j1#g1:1", phase="fail", reason="stale")  # A's delayed write
    h.complete("a", 10, 1, phase="fail", reason="stale")
    h.complete("b", 15, 2)
    final = {J: FinalJob(generation=2, result_token=15, result_generation=2)}
    dest = {"ledger/j1": [Entry(1, 10, "j1#g1:0", J, 1), Entry(2, 15, "j1#g2:0", J, 2)]}
    return h, final, dest


def kinds(violations: list[Any]) -> set[str]:
    return {v.kind for v in violations}


def test_good_history_has_no_violations() -> None:
    h, final, dest = good()
    live = Liveness(faults_stopped_at=100.0, bound=30.0, completed_at={J: 105.0})
    assert check(h.ops, final=final, destinations=dest, liveness=live) == []


def test_two_accepted_completions() -> None:
    h, final, dest = good()
    h.complete("a", 10, 1)  # A's completion accepted too
    v = check(h.ops, final=final, destinations=dest)
    assert "multiple-completions" in kinds(v)
    assert "stale-completion" in kinds(v)


def test_stale_completion_accepted() -> None:
    h = H()
    h.claim("a", token=10, gen=1)
    h.claim("b", token=15, gen=2)
    h.complete("a", 10, 1)  # accepted although B's claim (token 15) came later
    final = {J: FinalJob(generation=2, result_token=10, result_generation=1)}
    v = check(h.ops, final=final)
    assert kinds(v) == {"stale-completion"}
    assert "token 10" in v[0].message and "15" in v[0].message


def test_result_in_etcd_that_history_contradicts() -> None:
    h, final, _ = good()
    final[J] = FinalJob(generation=2, result_token=10, result_generation=1)
    assert "result-mismatch" in kinds(check(h.ops, final=final))
    final[J] = FinalJob(generation=2)  # acknowledged completion missing from etcd
    assert "result-mismatch" in kinds(check(h.ops, final=final))
    final[J] = FinalJob(generation=1, result_token=15)
    assert "generation-regressed" in kinds(check(h.ops, final=final))


def test_unknown_completion_may_explain_the_result() -> None:
    h = H()
    h.claim("a", token=10, gen=1)
    h.complete("a", 10, 1, phase="unknown", reason="timeout")
    final = {J: FinalJob(generation=1, result_token=10, result_generation=1)}
    assert check(h.ops, final=final) == []
    h2 = H()
    h2.claim("a", token=10, gen=1)
    h2.complete("a", 10, 1, phase="none")  # killed before the answer
    assert check(h2.ops, final=final) == []


def test_token_going_backwards_at_a_resource() -> None:
    h, final, _ = good()
    h.write("a", 10, 1, "j1#g1:2")  # suppose the destination accepted A's late write
    dest = {"ledger/j1": [Entry(1, 10, "j1#g1:0", J, 1), Entry(2, 15, "j1#g2:0", J, 2),
                          Entry(3, 10, "j1#g1:2", J, 1)]}
    v = check(h.ops, final=final, destinations=dest)
    assert kinds(v) == {"token-backwards", "generation-backwards"}
    assert "seq 3" in v[0].message


def test_lost_acknowledged_write() -> None:
    h, final, dest = good()
    dest["ledger/j1"] = dest["ledger/j1"][:1]  # B's acknowledged write vanished
    v = check(h.ops, final=final, destinations=dest)
    assert kinds(v) == {"lost-write"}
    assert "j1#g2:0" in v[0].message


def test_duplicate_effect_and_foreign_token() -> None:
    h, final, dest = good()
    dest["ledger/j1"].append(Entry(3, 15, "j1#g2:0", J, 2))
    assert "duplicate-effect" in kinds(check(h.ops, final=final, destinations=dest))
    _, _, dest = good()
    dest["ledger/j1"].append(Entry(3, 16, "j1#g2:9", J, 2))  # gen 2's claim had token 15
    assert "foreign-token" in kinds(check(h.ops, final=final, destinations=dest))


def test_duplicate_generation() -> None:
    h = H()
    h.claim("a", token=10, gen=1)
    h.claim("b", token=12, gen=1)
    v = check(h.ops)
    assert kinds(v) == {"duplicate-generation"}


def test_tokens_not_increasing_with_generation() -> None:
    h = H()
    h.claim("a", token=20, gen=1)
    h.claim("b", token=12, gen=2)
    assert kinds(check(h.ops)) == {"token-order"}


def test_liveness_violation() -> None:
    h, final, dest = good()
    other = "chaos/j2"
    final[other] = FinalJob(generation=3)
    live = Liveness(faults_stopped_at=100.0, bound=30.0,
                    completed_at={J: 140.0, other: None})
    v = check(h.ops, final=final, destinations=dest, liveness=live)
    assert kinds(v) == {"liveness"}
    assert {x.job for x in v} == {J, other}


def test_failed_and_unknown_ops_do_not_count_as_accepted() -> None:
    h, final, dest = good()
    h.claim("c", token=30, gen=3, phase="fail")
    h.write("c", 30, 3, "j1#g3:0", phase="unknown", reason="timeout")
    assert check(h.ops, final=final, destinations=dest) == []
    counts = summarize(h.ops)
    assert counts["write"]["unknown"] == 1
    assert counts["write"]["rejected_stale"] == 1
    assert counts["complete"]["accepted"] == 1


def test_history_files_round_trip(tmp_path: Any) -> None:
    a = History(tmp_path / "a.jsonl", "a")
    inv = a.invoke("claim", job=J)
    a.ok(inv, token=10, generation=1)
    w = a.invoke("write", job=J, token=10, generation=1, resource="ledger/j1", key="k",
                 checked=False)
    a.fail(w, "stale")
    b = History(tmp_path / "b.jsonl", "b")
    b.invoke("complete", job=J, token=10, generation=1)  # no outcome: killed
    with open(tmp_path / "b.jsonl", "a") as f:
        f.write('{"op": "b:2", "torn')  # a torn last line is skipped
    ops = merge([tmp_path / "a.jsonl", tmp_path / "b.jsonl"])
    assert [(o.process, o.kind, o.phase) for o in ops] == [
        ("a", "claim", "invoke"), ("a", "claim", "ok"), ("a", "write", "invoke"),
        ("a", "write", "fail"), ("b", "complete", "invoke")]
    assert ops[1].token == 10 and ops[3].reason == "stale" and ops[3].checked is False
    counts = summarize(ops)
    assert counts["complete"] == {"attempted": 1, "unknown": 1}
    assert counts["write"]["unchecked_rejected_stale"] == 1


# -- holder exclusivity (judged on the holder key read at each claim's token revision) --------

def exclusive() -> tuple[H, dict[tuple[str, int], HolderAt | None]]:
    h = H()
    h.claim("a", token=10, gen=1, owner="a")
    h.claim("b", token=15, gen=2, owner="b")   # A's holder expired in between
    return h, {(J, 10): HolderAt(10, 10, "a"), (J, 15): HolderAt(15, 15, "b")}


def test_exclusive_holders_pass() -> None:
    h, holders = exclusive()
    assert check(h.ops, holders=holders) == []
    del holders[(J, 15)]  # a claim whose holder was not read is not judged
    assert check(h.ops, holders=holders) == []


def test_claim_over_a_live_holder_is_a_safety_violation() -> None:
    """With the claim's "no live holder" compare gone, B's claim puts over A's live
    holder: at B's token the key still has A's create revision."""
    h, holders = exclusive()
    holders[(J, 15)] = HolderAt(create_revision=10, mod_revision=15, owner="b")
    v = check(h.ops, holders=holders)
    assert kinds(v) == {"holder-not-exclusive"}
    assert "token 15" in v[0].message and "revision 10" in v[0].message
    assert len(v[0].ops) == 2  # B's claim and A's, whose holder was live


def test_claim_token_with_no_holder_or_another_owner() -> None:
    h, holders = exclusive()
    holders[(J, 15)] = None
    assert kinds(check(h.ops, holders=holders)) == {"holder-missing"}
    holders[(J, 15)] = HolderAt(15, 15, "a")
    v = check(h.ops, holders=holders)
    assert kinds(v) == {"holder-owner"} and "'a'" in v[0].message


def test_failed_or_unknown_claims_are_not_judged_for_exclusivity() -> None:
    h, holders = exclusive()
    h.claim("c", token=20, gen=3, phase="unknown")
    holders[(J, 20)] = HolderAt(15, 20)
    assert check(h.ops, holders=holders) == []


# -- re-sent writes (same idempotency key) -------------------------------------------------

def test_resent_write_answered_as_duplicate_passes() -> None:
    h, final, dest = good()
    first = h.write("b", 15, 2, "j1#g2:0")
    h.write("b", 15, 2, "j1#g2:0", resend=first, duplicate=True)
    assert check(h.ops, final=final, destinations=dest) == []
    assert summarize(h.ops)["write"]["resent"] == 1


def test_resent_write_applied_again() -> None:
    h, final, dest = good()
    first = h.write("b", 15, 2, "j1#g2:1")
    h.write("b", 15, 2, "j1#g2:1", resend=first, duplicate=False)
    dest["ledger/j1"] += [Entry(3, 15, "j1#g2:1", J, 2), Entry(4, 15, "j1#g2:1", J, 2)]
    v = check(h.ops, final=final, destinations=dest)
    assert kinds(v) == {"duplicate-not-replayed", "duplicate-effect"}


def test_resend_after_an_unknown_outcome_may_apply_it() -> None:
    """The first copy's outcome was unknown (it never landed): the re-send applies it."""
    h, final, dest = good()
    first = h.write("b", 15, 2, "j1#g2:1", phase="unknown", reason="timeout")
    h.write("b", 15, 2, "j1#g2:1", resend=first, duplicate=False)
    dest["ledger/j1"].append(Entry(3, 15, "j1#g2:1", J, 2))
    assert check(h.ops, final=final, destinations=dest) == []


# -- lease losses ---------------------------------------------------------------------------

def test_lease_lost_to_a_stale_auth_token() -> None:
    h, final, dest = good()
    h.lost("a", 10, 1, "etcd lease lost: keep-alive failed: invalid auth token")
    h.lost("b", 15, 2, "safety deadline passed")
    v = check(h.ops, final=final, destinations=dest)
    assert kinds(v) == {"auth-loss"} and len(v) == 1


# -- the operator's statuses (as the API server served them) ---------------------------------

def served() -> tuple[dict[str, list[dict[str, Any]]], dict[str, FinalJob]]:
    statuses: list[dict[str, Any]] = [
        {},  # created; the operator has not written yet
        {"phase": "Pending", "generation": 0, "etcdRevision": 5},
        {"phase": "Claimed", "generation": 1, "fencingToken": 10, "etcdRevision": 10},
        {"phase": "Pending", "generation": 1, "etcdRevision": 14},  # expired: no token
        {"phase": "Claimed", "generation": 2, "fencingToken": 15, "etcdRevision": 15},
        {"phase": "Completed", "generation": 2, "fencingToken": 15, "etcdRevision": 18},
    ]
    return {J: statuses}, {J: FinalJob(generation=2, result_token=15, result_generation=2)}


def test_statuses_that_only_move_forward_pass() -> None:
    statuses, final = served()
    h, _, dest = good()  # the history behind the same final state
    assert check(h.ops, final=final, destinations=dest, statuses=statuses) == []


def test_status_moving_backwards() -> None:
    statuses, final = served()
    statuses[J].insert(5, {"phase": "Claimed", "generation": 1, "fencingToken": 10,
                           "etcdRevision": 10})  # an old revision applied late
    v = check_statuses(statuses, final)
    assert kinds(v) == {"status-backwards"}
    assert {"etcdRevision", "generation", "fencingToken"} <= {
        w.message.split(": ")[1].split()[0] for w in v}
    statuses, final = served()
    statuses[J].append({"phase": "Pending", "generation": 2, "etcdRevision": 19})
    v = check_statuses(statuses, final)
    assert "status-backwards" in kinds(v) and "status-final" in kinds(v)


def test_final_status_differs_from_etcd() -> None:
    statuses, final = served()
    final[J] = FinalJob(generation=3, result_token=20, result_generation=3)
    v = check_statuses(statuses, final)
    assert kinds(v) == {"status-final"} and "20" in v[0].message
    assert kinds(check_statuses({}, final)) == {"status-final"}


# -- queue runs (tests/chaos/queue_checker.py): an item is a job of its queue ----------------

Q = "chaos/q"
I1 = f"{Q}/i1"
P0 = f"{Q}/poison-0"
MAX = 3  # the queue's maxAttempts in these histories
R1 = "http/ledger/chaos-q-i1"


def good_queue() -> tuple[H, dict[str, FinalItem], dict[str, list[Entry]]]:
    """i1: A claims, pauses, B claims after the expiry and completes; A's late write and
    completion are refused. poison-0: three claims, each released, then Failed."""
    h = H()
    h.enqueue(Q, ["i1", "poison-0"], poison=["poison-0"])
    h.claim("a", token=10, gen=1, job=I1, owner="a")
    h.write("a", 10, 1, "i1#g1:0", resource=R1, job=I1)
    h.claim("b", token=15, gen=2, job=I1, owner="b")
    h.write("b", 15, 2, "i1#g2:0", resource=R1, job=I1)
    h.write("a", 10, 1, "i1#g1:1", phase="fail", reason="stale", resource=R1, job=I1)
    h.complete("a", 10, 1, phase="fail", reason="stale", job=I1)
    h.complete("b", 15, 2, job=I1)
    for gen, token in ((1, 20), (2, 22), (3, 24)):
        h.claim("a", token=token, gen=gen, job=P0, owner="a")
        h.release("a", token, gen, P0)
    final = {I1: FinalItem(generation=2, result_token=15, result_generation=2,
                           result_version=1),
             P0: FinalItem(generation=3, failed_generation=3)}
    dest = {R1: [Entry(1, 10, "i1#g1:0", I1, 1), Entry(2, 15, "i1#g2:0", I1, 2)]}
    return h, final, dest


def check_q(h: H, final: dict[str, FinalItem], dest: dict[str, list[Entry]] | None = None,
            holders: dict[tuple[str, int], HolderAt | None] | None = None) -> list[Any]:
    return check_queue(h.ops, final=final, max_attempts=MAX, poison=[P0], destinations=dest,
                       holders=holders)


def test_good_queue_history_has_no_violations() -> None:
    h, final, dest = good_queue()
    holders = {(I1, 10): HolderAt(10, 10, "a"), (I1, 15): HolderAt(15, 15, "b")}
    assert check_q(h, final, dest, holders) == []
    assert failures(final, [P0]) == {"poison": [P0], "exhausted": []}
    assert summarize(h.ops)["enqueue"] == {"accepted": 1, "attempted": 1}


def test_item_completed_twice_in_the_history() -> None:
    h, final, dest = good_queue()
    h.complete("a", 10, 1, job=I1)  # A's stale completion accepted as well
    v = check_q(h, final, dest)
    assert "item-completed-twice" in kinds(v)
    assert any("2 accepted completions" in x.message for x in v)


def test_item_completed_twice_in_etcd() -> None:
    """The history shows one completion; etcd's results key was put twice."""
    h, final, dest = good_queue()
    final[I1] = replace(final[I1], result_version=2)
    v = check_q(h, final, dest)
    assert kinds(v) == {"item-completed-twice"} and "2 times" in v[0].message
    # etcd's result is another completion than the acknowledged one
    h, final, dest = good_queue()
    h.ops = [o for o in h.ops if not (o.kind == "complete" and o.token == 10)]
    h.complete("a", 10, 1, phase="unknown", reason="timeout", job=I1)
    final[I1] = replace(final[I1], result_token=10, result_generation=1)
    assert "item-completed-twice" in kinds(check_q(h, final, dest))


def test_acknowledged_item_lost() -> None:
    h, final, dest = good_queue()
    del final[I1]  # etcd has no such item
    v = check_q(h, final, dest)
    assert "item-lost" in kinds(v) and any("no such item" in x.message for x in v)
    h, final, dest = good_queue()
    h.enqueue(Q, ["i2"])
    final[f"{Q}/i2"] = FinalItem(generation=1, pending=True, held=True)  # never drained
    v = check_q(h, final, dest)
    assert kinds(v) == {"item-lost"} and "Claimed" in v[0].message


def test_unacknowledged_item_etcd_holds_must_settle_too() -> None:
    h, final, dest = good_queue()
    h.enqueue(Q, ["i3"], phase="unknown")
    final[f"{Q}/i3"] = FinalItem(pending=True)  # the enqueue committed; nobody drained it
    v = check_q(h, final, dest)
    assert kinds(v) == {"item-lost"} and "not acknowledged" in v[0].message
    del final[f"{Q}/i3"]  # it never committed: nothing was promised, nothing is owed
    assert check_q(h, final, dest) == []


def test_item_state_torn() -> None:
    h, final, dest = good_queue()
    final[I1] = replace(final[I1], failed_generation=2)
    v = check_q(h, final, dest)
    assert "item-state-torn" in kinds(v) and "both" in v[0].message
    h, final, dest = good_queue()
    final[P0] = replace(final[P0], pending=True)
    assert kinds(check_q(h, final, dest)) == {"item-state-torn"}


def test_item_failed_before_max_attempts() -> None:
    h, final, dest = good_queue()
    final[I1] = FinalItem(generation=2, failed_generation=2)
    h.ops = [o for o in h.ops if not (o.kind == "complete" and o.job == I1)]
    v = check_q(h, final, dest)
    assert kinds(v) == {"item-failed-early"} and "maxAttempts is 3" in v[0].message
    # reported as exhausted (not poison): the report says which
    assert failures(final, [P0]) == {"poison": [P0], "exhausted": [I1]}


def test_item_claimed_more_than_max_attempts() -> None:
    h, final, dest = good_queue()
    h.claim("b", token=30, gen=4, job=P0, owner="b")
    h.release("b", 30, 4, P0)
    final[P0] = FinalItem(generation=4, failed_generation=4)
    v = check_q(h, final, dest)
    assert kinds(v) == {"item-attempts-exceeded"} and len(v[0].ops) == 1


def test_poison_item_completed() -> None:
    h, final, dest = good_queue()
    final[P0] = FinalItem(generation=3, result_token=24, result_generation=3,
                          result_version=1)
    h.complete("a", 24, 3, phase="unknown", reason="timeout", job=P0)
    assert kinds(check_q(h, final, dest)) == {"poison-completed"}


def test_item_effect_below_the_resource_mark() -> None:
    h, final, dest = good_queue()
    # a late effect carrying token 10, accepted after token 15's (with no claim of
    # token 10 in the history, only the token order can tell)
    h.ops = [o for o in h.ops if not (o.kind == "claim" and o.token == 10)]
    dest[R1].append(Entry(3, 10, "i1#g1:2", I1, None))
    v = [x for x in check_q(h, final, dest) if x.kind.startswith("item-")]
    assert kinds(v) == {"item-token-backwards"} and "seq 3" in v[0].message


def test_item_effect_of_a_superseded_claim() -> None:
    """Generation 1 (token 20) was superseded by generation 2; its effect was accepted
    after generation 2's. Token 12 < 20 (the tokens are wrong too, so the token rule
    cannot see it): only succession tells."""
    h = H()
    h.enqueue(Q, ["i1"])
    h.claim("a", token=20, gen=1, job=I1)
    h.claim("b", token=12, gen=2, job=I1)
    h.write("b", 12, 2, "k2", resource=R1, job=I1)
    h.write("a", 20, 1, "k1", resource=R1, job=I1)
    h.complete("b", 12, 2, job=I1)
    final = {I1: FinalItem(generation=2, result_token=12, result_generation=2,
                           result_version=1)}
    dest = {R1: [Entry(1, 12, "k2", I1, None), Entry(2, 20, "k1", I1, None)]}
    v = check_q(h, final, dest)
    assert "item-superseded-effect" in kinds(v) and "item-token-backwards" not in kinds(v)
    assert "item-token-order" in kinds(v)


def test_item_claim_tokens_not_increasing() -> None:
    h, final, dest = good_queue()
    h.claim("c", token=14, gen=3, job=I1)  # a later claim, a lower token
    final[I1] = replace(final[I1], generation=3)
    v = check_q(h, final, dest)
    assert "item-token-order" in kinds(v)
    assert any("generation 3 has token 14" in x.message for x in v)



# -- the operator's JobQueue statuses (queue_checker.check_queue_statuses) --------------------

def queue_served() -> tuple[list[dict[str, Any]], dict[str, FinalItem]]:
    """good_queue's run as the operator mirrored it: the queue created at revision 3,
    both items enqueued at 5, i1's result created at 18, poison-0 marked failed at 26."""
    _, final, _ = good_queue()
    final[I1] = replace(final[I1], item_revision=5, result_revision=18)
    final[P0] = replace(final[P0], item_revision=5, failed_revision=26)

    def status(rev: int, total: int, pending: int, held: int, completed: int,
               failed: int) -> dict[str, Any]:
        return {"etcdRevision": rev, "observedGeneration": 1, "total": total,
                "pending": pending, "held": held, "completed": completed, "failed": failed}
    served = [
        {},                              # created; the operator has not written yet
        status(3, 0, 0, 0, 0, 0),        # registered, nothing enqueued
        status(8, 2, 1, 1, 0, 0),        # i1 held
        status(19, 2, 1, 0, 1, 0),       # i1 completed; poison-0 pending (between claims)
        status(27, 2, 0, 0, 1, 1),       # poison-0 failed: drained
    ]
    return served, final


def test_queue_statuses_that_only_move_forward_pass() -> None:
    served, final = queue_served()
    assert check_queue_statuses(served, Q, final) == []
    assert final_counts(final) == {"total": 2, "pending": 0, "held": 0, "completed": 1,
                                   "failed": 1}
    h, _, dest = good_queue()  # the same run's history, judged with its statuses
    assert check_queue(h.ops, final=final, max_attempts=MAX, poison=[P0], destinations=dest,
                       statuses={Q: served}) == []


def test_queue_status_moving_backwards() -> None:
    served, final = queue_served()
    served.insert(4, dict(served[2]))  # counts read at revision 8, applied after 19's
    v = check_queue_statuses(served, Q, final)
    assert kinds(v) == {"queue-status-backwards"}
    assert {w.message.split(": ")[1].split()[0] for w in v} == {"etcdRevision", "completed"}
    # a later revision whose completed count fell (the counts cannot fall in these runs)
    served, final = queue_served()
    served[4] = {**served[4], "completed": 0, "pending": 1}
    v = check_queue_statuses(served, Q, final)
    assert "queue-status-backwards" in kinds(v) and "queue-status-counts" in kinds(v)
    # observedGeneration going back
    served, final = queue_served()
    served[3] = {**served[3], "observedGeneration": 2}
    v = check_queue_statuses(served, Q, final)
    assert kinds(v) == {"queue-status-backwards"} and "observedGeneration 1" in v[0].message


def test_queue_status_counts_that_do_not_add_up() -> None:
    served, final = queue_served()
    served[3] = {**served[3], "pending": 0}  # 0 + 0 + 1 + 0 != 2
    v = check_queue_statuses(served, Q, final)
    assert kinds(v) == {"queue-status-torn"} and "#3" in v[0].message


def test_queue_status_counts_not_etcds_at_their_revision() -> None:
    """They add up and never fall, but at revision 19 etcd had i1's result (created at
    18): a status claiming none then is wrong."""
    served, final = queue_served()
    served[3] = {**served[3], "completed": 0, "pending": 2}
    v = check_queue_statuses(served, Q, final)
    assert kinds(v) == {"queue-status-counts"} and "etcdRevision 19" in v[0].message
    # and one counting an item etcd did not have yet
    served, final = queue_served()
    served[1] = {**served[1], "total": 1, "pending": 1}
    assert kinds(check_queue_statuses(served, Q, final)) == {"queue-status-counts"}


def test_last_queue_status_differs_from_etcd() -> None:
    served, final = queue_served()
    v = check_queue_statuses(served[:-1], Q, final)  # never caught up with the drain
    assert kinds(v) == {"queue-status-final"} and "'failed': 1" in v[0].message
    assert kinds(check_queue_statuses([{}], Q, final)) == {"queue-status-final"}
    # wired into check_queue per JobQueue
    h, _, dest = good_queue()
    v = check_queue(h.ops, final=final, max_attempts=MAX, poison=[P0], destinations=dest,
                    statuses={Q: served[:-1]})
    assert kinds(v) == {"queue-status-final"} and v[0].job == Q

# -- the semaphore workload (tests/chaos/sem_checker.py) ------------------------------------

SEM = "chaos/db"
S0 = f"sqlite/semaphore/{SEM}/slot/0"          # a destination's slot resources
S0_LEDGER = f"http/ledger/semaphore-{SEM.replace('/', '-')}-slot-0"
JA, JB, JC = "chaos/j1", "chaos/j2", "chaos/j3"


def sem_claim(h: H, p: str, job: str, token: int, slot: int, gen: int = 1) -> str:
    return h._op(p, "claim", "ok", job=job, token=token, generation=gen,
                 extra={"owner": p, "slots": [{"semaphore": SEM, "slots": [slot],
                                               "token": token}]})


def put(rev: int, index: int, holder: str, owner: str, create: int | None = None) -> SlotEvent:
    return SlotEvent(rev, "put", index, rev if create is None else create, holder, owner)


def good_semaphore() -> tuple[H, list[SlotEvent], dict[str, list[Entry]],
                              dict[str, FinalJob]]:
    """Limit 2: A and B take slots 0 and 1; A pauses past its TTL, its lease (and
    slot 0) expires, C gets slot 0; A's late write under slot 0's old token is
    refused; everyone completes."""
    h = H()
    sem_claim(h, "a", JA, 10, 0)
    sem_claim(h, "b", JB, 11, 1)
    h.write("b", 11, 1, "s1", resource=f"sqlite/semaphore/{SEM}/slot/1",
            job=f"semaphore/{SEM}/slot/1")
    h.write("a", 10, 1, "s0a", resource=S0, job=f"semaphore/{SEM}/slot/0")
    sem_claim(h, "c", JC, 15, 0)
    h.write("c", 15, 1, "s0c", resource=S0, job=f"semaphore/{SEM}/slot/0")
    h.write("a", 10, 1, "s0a2", phase="fail", reason="stale", resource=S0,
            job=f"semaphore/{SEM}/slot/0")
    events = [SlotEvent(5, "limit", limit=2), put(10, 0, JA, "a"), put(11, 1, JB, "b"),
              SlotEvent(14, "delete", 0), put(15, 0, JC, "c"), SlotEvent(20, "delete", 1),
              SlotEvent(21, "delete", 0)]
    dest = {S0: [Entry(1, 10, "s0a"), Entry(2, 15, "s0c")],
            S0_LEDGER: [Entry(1, 10, "l0a"), Entry(2, 15, "l0c")],
            f"sqlite/semaphore/{SEM}/slot/1": [Entry(1, 11, "s1")]}
    final = {j: FinalJob(1, t, 1) for j, t in ((JA, 30), (JB, 31), (JC, 32))}
    return h, events, dest, final


def check_s(h: H, events: list[SlotEvent], dest: dict[str, list[Entry]],
            final: dict[str, FinalJob], live_at_end: dict[int, str | None] | None = None
            ) -> list[Any]:
    return check_semaphore(h.ops, semaphore=SEM, events=events, jobs=[JA, JB, JC],
                           final=final, live_at_end=live_at_end or {}, destinations=dest)


def test_good_semaphore_history_has_no_violations() -> None:
    h, events, dest, final = good_semaphore()
    assert check_s(h, events, dest, final) == []
    assert max_live(events) == 2


def test_more_slots_live_than_the_limit() -> None:
    h, events, dest, final = good_semaphore()
    events.insert(3, put(12, 2, JC, "c"))  # a third slot while 0 and 1 are live
    v = check_s(h, events, dest, final)
    assert kinds(v) >= {"slots-over-limit", "slot-above-limit"}
    assert any("left 3 slots live" in x.message for x in v)


def test_a_lowered_limit_excuses_earlier_grants_but_not_later_ones() -> None:
    """Limit 3, three slots granted, the limit lowered to 2: nobody is revoked (no
    violation while the three drain); a grant while two are still live is one."""
    lowered = [SlotEvent(5, "limit", limit=3), put(10, 0, JA, "a"), put(11, 1, JB, "b"),
               put(12, 2, JC, "c"), SlotEvent(13, "limit", limit=2)]
    drained = [SlotEvent(14, "delete", 2), SlotEvent(15, "delete", 0), put(16, 0, JA, "a2")]
    assert check_limit(lowered + drained, SEM) == []  # 2 live after the grant: at the limit
    early = [SlotEvent(14, "delete", 0), put(15, 0, JA, "a2")]  # slots 1 and 2 still live
    v = check_limit(lowered + early, SEM)
    assert kinds(v) == {"slots-over-limit"} and "limit at that revision is 2" in v[0].message


def test_slot_tokens_of_successive_grants_must_increase() -> None:
    h, events, dest, final = good_semaphore()
    # C's claim put slot 0 over A's live slot key (no delete between): the same
    # create revision, two holders of one slot
    events = [e for e in events if not (e.kind == "delete" and e.revision == 14)]
    events = [put(15, 0, JC, "c", create=10) if e.revision == 15 else e for e in events]
    v = check_s(h, events, dest, final)
    assert "slot-token-order" in kinds(v)
    assert any("token 10, not above the previous grant's 10" in x.message for x in v)


def test_a_worker_handed_a_slot_token_etcd_never_granted() -> None:
    h, events, dest, final = good_semaphore()
    sem_claim(h, "d", JC, 16, 0, gen=2)  # etcd's grant of slot 0 to j3 has token 15
    v = [x for x in check_s(h, events, dest, final) if x.kind.startswith("slot")]
    assert kinds(v) == {"slot-grant-unknown"} and "token 16" in v[0].message


def test_a_destination_accepting_a_superseded_slot_token() -> None:
    h, events, dest, final = good_semaphore()
    dest[S0].append(Entry(3, 10, "s0a2"))  # A's late write accepted after C's
    dest[S0_LEDGER].append(Entry(3, 10, "l0a2"))
    v = check_s(h, events, dest, final)
    assert kinds(v) == {"slot-token-backwards", "slot-superseded-effect"}
    assert {x.resource for x in v} == {S0, S0_LEDGER}


def test_superseded_slot_grant_seen_by_etcd_order_not_tokens() -> None:
    """Slot 0's grants in etcd's order have tokens 20 then 12 (wrong, so the token
    rule at the destination cannot see it): the effect of grant #1 accepted after
    grant #2's is superseded; a token etcd never granted is foreign."""
    h, _, dest, final = good_semaphore()
    events = [SlotEvent(5, "limit", limit=2), put(20, 0, JA, "a"),
              SlotEvent(21, "delete", 0), put(22, 0, JC, "c", create=12),
              SlotEvent(23, "delete", 0)]
    dest = {S0: [Entry(1, 12, "k2"), Entry(2, 20, "k1"), Entry(3, 21, "k3")]}
    v = check_slot_fences(dest, events, SEM)
    assert kinds(v) == {"slot-superseded-effect", "slot-foreign-token"}
    assert "slot-token-order" in kinds(check_s(h, events, dest, final))


def test_a_job_not_completed_or_a_slot_left_live() -> None:
    h, events, dest, final = good_semaphore()
    assert kinds(check_s(h, events, dest, final, {1: JB})) == {"slot-leaked"}
    final[JC] = FinalJob(2)  # claimed twice, never completed
    v = check_s(h, events, dest, final, {1: JB})
    assert kinds(v) == {"job-not-completed"}  # a leak is judged once all completed
    del final[JB]
    assert len(check_nothing_lost([JA, JB, JC], final, {}, SEM)) == 2
