"""The status mirror's logic: etcd state -> status, never backwards (no I/O)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any, cast

import pytest

from joblease.errors import InvalidInputError
from joblease.operator.events import derive_events, refine_ends
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.mirror import Mirror
from joblease.operator.registration import spec_from_resource, spec_matches
from joblease.operator.status import (
    bounded_result,
    history_changed,
    recent_tenures_status,
    same_facts,
    should_apply,
    status_from_state,
)
from joblease.records import SemaphoreUse, Tenure, TenureEnd
from tests.support.mirror_fakes import SPEC, T0, FakeClient, FakeKube, settle, state


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_pending_job_is_registered_and_claimable() -> None:
    s = status_from_state(state(5), 1, None, T0)
    assert s["phase"] == "Pending"
    assert s["holderIdentity"] == ""
    assert s["generation"] == 0 and s["attempts"] == 0
    assert s["etcdRevision"] == 5 and s["observedGeneration"] == 1
    assert "fencingToken" not in s
    c = conditions(s)
    assert c["Registered"]["status"] == "True"
    assert c["Claimed"]["status"] == "False"
    assert all(x["observedGeneration"] == 1 for x in c.values())
    assert all(x["lastTransitionTime"] == "2025-01-01T12:00:00Z" for x in c.values())


def test_claimed_status_carries_holder_generation_and_token() -> None:
    s = status_from_state(state(9, generation=1, holder=("worker-a", 9)), 1, None, T0,
                          lease_remaining=8)
    assert s["phase"] == "Claimed"
    assert (s["holderIdentity"], s["generation"], s["fencingToken"]) == ("worker-a", 1, 9)
    assert s["claimTime"] == "2025-01-01T12:00:00Z"
    assert s["leaseExpiryTime"] == "2025-01-01T12:00:08Z"
    assert s["renewTime"] == "2025-01-01T11:59:58Z"  # 10 s TTL, 8 s left
    assert conditions(s)["Claimed"]["status"] == "True"


def test_completed_status_carries_result_and_completer_token() -> None:
    s = status_from_state(state(41, generation=1, result={"rows": 3}), 1, None, T0)
    assert s["phase"] == "Completed"
    assert s["result"] == {"rows": 3} and s["resultTruncated"] is False
    assert s["fencingToken"] == 40
    assert s["completionTime"] == "2025-01-01T12:00:05Z"
    assert s["completedBy"] == "a" and s["holderIdentity"] == ""
    c = conditions(s)
    assert c["Completed"]["status"] == "True" and c["Claimed"]["status"] == "False"


def test_exhausted_attempts_show_failed() -> None:
    s = status_from_state(state(50, generation=2), 1, None, T0)
    assert s["phase"] == "Failed" and s["attempts"] == 2
    assert conditions(s)["Failed"]["status"] == "True"
    assert conditions(s)["Failed"]["reason"] == "AttemptsExhausted"


def test_last_attempt_while_held_is_claimed_not_failed() -> None:
    assert status_from_state(state(50, generation=2, holder=("b", 50)), 1, None, T0)[
        "phase"] == "Claimed"


def test_unregistered_job_says_so() -> None:
    s = status_from_state(state(60, spec=None), 0, {"observedGeneration": 3}, T0)
    assert conditions(s)["Registered"]["status"] == "False"
    assert s["observedGeneration"] == 3  # unknown now: keep what was observed


def test_non_object_result_is_wrapped() -> None:
    assert bounded_result("done") == ({"value": "done"}, False)
    s = status_from_state(state(41, generation=1, result=[1, 2]), 1, None, T0)
    assert s["result"] == {"value": [1, 2]}


def test_large_result_is_truncated_to_the_limit() -> None:
    big = {"blob": "é" * 5000}
    s = status_from_state(state(41, generation=1, result=big), 1, None, T0, result_limit=1000)
    assert s["resultTruncated"] is True
    preview = s["result"]["preview"]
    assert len(preview.encode()) <= 1000
    assert json.dumps(big, separators=(",", ":"), sort_keys=True).startswith(preview)


def test_condition_transition_time_kept_while_status_unchanged() -> None:
    first = status_from_state(state(9, generation=1, holder=("a", 9)), 1, None, T0)
    later = T0 + dt.timedelta(minutes=5)
    # Same condition statuses, different holder: message changes, transition time does not.
    second = status_from_state(state(20, generation=2, holder=("b", 20)), 1, first, later)
    c1, c2 = conditions(first), conditions(second)
    assert c2["Claimed"]["lastTransitionTime"] == c1["Claimed"]["lastTransitionTime"]
    assert c2["Claimed"]["message"] != c1["Claimed"]["message"]
    # A flip (held -> completed) moves only the flipped conditions' times.
    third = status_from_state(state(30, generation=2, result={}), 1, second, later)
    c3 = conditions(third)
    stamp = "2025-01-01T12:05:00Z"
    assert c3["Claimed"]["lastTransitionTime"] == stamp
    assert c3["Completed"]["lastTransitionTime"] == stamp
    assert c3["Registered"]["lastTransitionTime"] == c1["Registered"]["lastTransitionTime"]


@pytest.mark.parametrize(("stored", "incoming", "apply"),
                         [(None, 1, True), (10, 11, True), (10, 10, False), (10, 9, False)])
def test_should_apply_only_strictly_newer_revisions(stored: int | None, incoming: int,
                                                    apply: bool) -> None:
    status = None if stored is None else {"etcdRevision": stored}
    assert should_apply(status, state(incoming)) is apply


def test_only_revision_and_estimates_changed_is_not_news() -> None:
    a = status_from_state(state(9, generation=1, holder=("a", 9)), 1, None, T0,
                          lease_remaining=9)
    b = status_from_state(state(12, generation=1, holder=("a", 9)), 1, a,
                          T0 + dt.timedelta(seconds=3), lease_remaining=7)
    assert same_facts(a, b)
    c = status_from_state(state(13, generation=2, holder=("b", 13)), 1, a, T0)
    assert not same_facts(a, c)


def test_spec_validation_and_matching() -> None:
    assert spec_from_resource({"leaseDurationSeconds": 10, "maxAttempts": 2}) == SPEC
    assert spec_from_resource({"leaseDurationSeconds": 10}).max_attempts == 3
    assert spec_matches({"leaseDurationSeconds": 10, "maxAttempts": 2, "suspend": False}, SPEC)
    assert not spec_matches({"leaseDurationSeconds": 11, "maxAttempts": 2}, SPEC)
    with pytest.raises(InvalidInputError, match="lease duration"):
        spec_from_resource({"leaseDurationSeconds": 1})
    with pytest.raises(InvalidInputError, match="parameters too large"):
        spec_from_resource({"leaseDurationSeconds": 10, "parameters": {"x": "y" * 70000}})
    deep: object = 1
    for _ in range(64):
        deep = [deep]
    with pytest.raises(InvalidInputError, match="nested deeper than 64"):  # 65 with the object
        spec_from_resource({"leaseDurationSeconds": 10, "parameters": {"x": deep}})


def test_a_joblease_s_semaphores_are_registered_in_name_order() -> None:
    spec = spec_from_resource({"leaseDurationSeconds": 10, "semaphores": [
        {"name": "gpu", "weight": 2}, {"name": "billing-db"}]})
    assert spec.semaphores == (SemaphoreUse("billing-db", 1), SemaphoreUse("gpu", 2))
    assert spec_matches({"leaseDurationSeconds": 10, "maxAttempts": 3, "semaphores": [
        {"name": "billing-db", "weight": 1}, {"name": "gpu", "weight": 2}]}, spec)
    for bad, why in [([{"name": "Bad_Name"}], "invalid semaphore name"),
                     ([{"name": "db", "weight": 0}], "invalid weight"),
                     ("db", "must be a list")]:
        with pytest.raises(InvalidInputError, match=why):
            spec_from_resource({"leaseDurationSeconds": 10, "semaphores": bad})


def test_events_follow_consecutive_states() -> None:
    pending = state(5)
    held_a = state(9, generation=1, holder=("a", 9))
    expired = state(15, generation=1)
    held_b = state(20, generation=2, holder=("b", 20))
    done = state(30, generation=2, result={})
    failed = state(40, generation=2)
    reasons = lambda b, a: [e.reason for e in derive_events(b, a)]  # noqa: E731
    assert reasons(None, held_a) == []  # no history after a restart: no event
    assert reasons(pending, held_a) == ["Claimed"]
    assert reasons(held_a, expired) == ["Expired"]
    assert reasons(held_a, held_b) == ["Expired", "Claimed"]
    assert reasons(held_b, done) == ["Completed"]
    assert reasons(held_b, failed) == ["Expired", "Failed"]
    assert reasons(held_a, state(16, generation=1, spec=None)) == []  # unregistered
    # after a restart, a job out of attempts is reported again (nothing else is)
    assert reasons(None, failed) == ["Failed"]
    assert reasons(None, done) == [] and reasons(None, expired) == []
    assert reasons(None, state(41, generation=2, spec=None)) == []
    (event,) = derive_events(None, failed)
    assert event.type == "Warning"
    assert "all 2 attempts used without a result (2 claims)" in event.message


async def test_mirror_coalesces_and_never_writes_an_older_revision() -> None:
    kube = FakeKube()
    mirror = Mirror(cast(Any, FakeClient()), cast(Any, kube), OperatorMetrics())
    mirror.observe(state(5))
    mirror.observe(state(9, generation=1, holder=("a", 9)))  # burst: one write
    await settle(mirror)
    assert kube.writes == [9]
    assert kube.obj["status"]["observedGeneration"] == 1
    assert kube.events == ["Claimed"]
    mirror.offer(state(7), [])  # a late, older state (e.g. a slow refresh)
    await settle(mirror)
    assert kube.writes == [9] and kube.obj["status"]["fencingToken"] == 9


async def test_mirror_rereads_on_conflict_and_keeps_a_newer_status() -> None:
    kube = FakeKube()
    mirror = Mirror(cast(Any, FakeClient()), cast(Any, kube), OperatorMetrics())
    mirror.observe(state(5))
    await settle(mirror)
    # Another writer (an overlapping operator) stored a newer status meanwhile.
    newer = status_from_state(state(20, generation=2, holder=("b", 20)), 1, None, T0)
    kube.bump(newer)
    mirror.observe(state(15, generation=1, holder=("a", 15)))
    await settle(mirror)
    assert kube.writes == [5]
    assert kube.obj["status"]["etcdRevision"] == 20
    assert kube.obj["status"]["holderIdentity"] == "b"


def _tenure(generation: int, token: int, end: TenureEnd, owner: str = "a",
            ended_at: float | None = None, refused: int = 0) -> Tenure:
    return Tenure(generation=generation, token=token, owner=owner, claim_id="c",
                  claimed_at=T0.timestamp(), end=end, ended_at=ended_at,
                  refused_completions=refused)


def test_the_short_form_is_the_last_three_tenures_newest_first_with_a_capped_holder() -> None:
    tenures = (_tenure(1, 10, TenureEnd.RELEASED, ended_at=T0.timestamp() + 1),
               _tenure(2, 20, TenureEnd.EXPIRED, refused=2),
               _tenure(3, 30, TenureEnd.COMPLETED, "b" * 300, ended_at=T0.timestamp() + 9),
               _tenure(4, 40, TenureEnd.OPEN, "c"))
    short = recent_tenures_status(tenures)
    assert [(t["generation"], t["token"], t["end"], t["refusedCompletions"]) for t in short] == [
        (4, 40, "open", 0), (3, 30, "completed", 0), (2, 20, "expired", 2)]
    assert short[1]["holder"] == "b" * 253 and short[1]["endedAt"] == "2025-01-01T12:00:09Z"
    assert "endedAt" not in short[2] and short[2]["claimedAt"] == "2025-01-01T12:00:00Z"
    assert recent_tenures_status(()) == []


def test_the_short_form_is_read_again_only_for_a_change() -> None:
    held = state(9, generation=1, holder=("a", 9))
    written = {**status_from_state(held, 1, None, T0), "recentTenures": []}
    later = state(12, generation=1, holder=("a", 9))  # a resync: the same facts
    assert not history_changed(written, status_from_state(later, 1, written, T0), later)
    refused = dataclasses.replace(later, history_revision=12)  # the history alone changed
    assert history_changed(written, status_from_state(refused, 1, written, T0), refused)
    gone = state(12, generation=1)  # the holder vanished
    assert history_changed(written, status_from_state(gone, 1, written, T0), gone)
    without = {k: v for k, v in written.items() if k != "recentTenures"}
    assert history_changed(without, status_from_state(later, 1, without, T0), later)


def test_the_history_tells_an_expired_event_from_a_release_or_a_revoke() -> None:
    expired = derive_events(state(9, generation=1, holder=("a", 9)), state(15, generation=1))
    assert [(e.type, e.reason, e.token) for e in expired] == [("Warning", "Expired", 9)]
    told = {end: [(e.type, e.reason) for e in refine_ends(expired, (_tenure(1, 9, end),))]
            for end in (TenureEnd.EXPIRED, TenureEnd.RELEASED, TenureEnd.REVOKED)}
    assert told == {TenureEnd.EXPIRED: [("Warning", "Expired")],
                    TenureEnd.RELEASED: [("Normal", "Released")],
                    TenureEnd.REVOKED: [("Warning", "Revoked")]}
    [lost] = refine_ends(expired, (_tenure(1, 9, TenureEnd.EXPIRED),))
    assert lost.message.startswith("holder a (generation 1, token 9) lost the job")
    # no history (historyLimit 0), or another token's: the watch's own wording
    assert refine_ends(expired, ()) == expired
    assert refine_ends(expired, (_tenure(2, 20, TenureEnd.RELEASED),)) == expired
