"""The checker finds each kind of violation in hand-made bad histories, and
none in a good one."""

from __future__ import annotations

from typing import Any

from tests.chaos.checker import Entry, FinalJob, Liveness, check, summarize
from tests.chaos.history import History, Op, merge

J = "chaos/j1"


class H:
    """Builds a history in memory: ``h.claim("a", token=10, generation=1)``."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.n = 0

    def _op(self, process: str, kind: str, phase: str, **fields: Any) -> str:
        self.n += 1
        op = f"{process}:{self.n}"
        self.ops.append(Op(op=op, process=process, kind=kind, phase="invoke",
                           **{k: v for k, v in fields.items() if k not in ("reason", "extra")}))
        if phase != "none":
            self.ops.append(Op(op=op, process=process, kind=kind, phase=phase, **fields))
        return op

    def claim(self, p: str, token: int, gen: int, phase: str = "ok", job: str = J) -> str:
        return self._op(p, "claim", phase, job=job, token=token, generation=gen)

    def complete(self, p: str, token: int, gen: int, phase: str = "ok", job: str = J,
                 reason: str | None = None) -> str:
        return self._op(p, "complete", phase, job=job, token=token, generation=gen,
                        reason=reason)

    def write(self, p: str, token: int, gen: int, key: str, phase: str = "ok",
              resource: str = "ledger/j1", reason: str | None = None) -> str:
        return self._op(p, "write", phase, job=J, token=token, generation=gen,
                        resource=resource, key=key, reason=reason)


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
