"""JobQueue status from a queue's counts: pure logic (joblease.operator.queue_status)."""

from __future__ import annotations

import datetime as dt

import pytest

from joblease.errors import InvalidInputError
from joblease.operator.queue_registration import spec_from_resource, spec_matches
from joblease.operator.queue_status import (
    completions_per_minute,
    same_facts,
    should_apply,
    status_from_counts,
)
from joblease.queue import QueueCounts
from joblease.records import QueueSpec

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)


def counts(revision: int = 10, *, pending: int = 2, held: int = 1, completed: int = 3,
           failed: int = 0, age: float | None = 4.5) -> QueueCounts:
    return QueueCounts(revision, pending + held + completed + failed, pending, held, completed,
                       failed, age)


def test_counts_become_the_status_with_conditions() -> None:
    s = status_from_counts(counts(), 10, QueueSpec(5), 2, None, NOW)
    assert {k: s[k] for k in ("pending", "held", "completed", "failed", "total")} == {
        "pending": 2, "held": 1, "completed": 3, "failed": 0, "total": 6}
    assert (s["etcdRevision"], s["observedGeneration"], s["oldestPendingAgeSeconds"]) == (
        10, 2, 4.5)
    assert s["countTime"] == "2026-12-01T12:00:00Z" and s["completionsPerMinute"] == 0.0
    conds = {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}
    assert conds == {"Registered": ("True", "Registered"), "Suspended": ("False", "Claimable"),
                     "Idle": ("False", "Working"), "HasFailedItems": ("False", "NoneFailed")}
    assert all(c["observedGeneration"] == 2 for c in s["conditions"])


def test_drained_suspended_and_failed_queues_say_so() -> None:
    s = status_from_counts(counts(pending=0, held=0, failed=2, age=None), 11,
                           QueueSpec(5, suspend=True), 1, None, NOW)
    conds = {c["type"]: (c["status"], c["reason"]) for c in s["conditions"]}
    assert conds["Idle"] == ("True", "Drained") and conds["Suspended"] == ("True", "Suspended")
    assert conds["HasFailedItems"] == ("True", "ItemsFailed")
    assert "oldestPendingAgeSeconds" not in s
    empty = status_from_counts(counts(pending=0, held=0, completed=0, age=None), 11,
                               QueueSpec(5), 1, None, NOW)
    assert {c["type"]: c["reason"] for c in empty["conditions"]}["Idle"] == "Empty"


def test_no_queue_in_etcd_is_not_registered_with_zero_counts() -> None:
    s = status_from_counts(None, 7, None, 0, {"observedGeneration": 3}, NOW)
    assert s["total"] == 0 and s["etcdRevision"] == 7 and s["observedGeneration"] == 3
    assert {c["type"]: c["status"] for c in s["conditions"]} == {
        "Registered": "False", "Suspended": "Unknown", "Idle": "Unknown",
        "HasFailedItems": "False"}


def test_transition_times_move_only_when_a_condition_flips() -> None:
    first = status_from_counts(counts(), 10, QueueSpec(5), 1, None, NOW)
    later = NOW + dt.timedelta(minutes=5)
    second = status_from_counts(counts(11, failed=1), 11, QueueSpec(5), 1, first, later)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times["Registered"] == "2026-12-01T12:00:00Z"
    assert times["HasFailedItems"] == "2026-12-01T12:05:00Z"


def test_never_older_revisions() -> None:
    assert should_apply(None, 1) and should_apply({"etcdRevision": 5}, 5)
    assert should_apply({"etcdRevision": 5}, 6) and not should_apply({"etcdRevision": 5}, 4)


def test_completion_rate_comes_from_the_previous_status() -> None:
    previous = {"completed": 10, "countTime": "2026-12-01T11:59:00Z"}
    assert completions_per_minute(previous, 40, NOW) == 30.0
    assert completions_per_minute(previous, 10, NOW) == 0.0
    assert completions_per_minute({}, 40, NOW) == 0.0  # nothing to compare with
    # a retry cannot make completed go down, but a deleted and re-created queue can
    assert completions_per_minute(previous, 0, NOW) == 0.0


def test_only_estimates_changing_is_not_worth_a_write() -> None:
    a = status_from_counts(counts(10, age=1.0), 10, QueueSpec(5), 1, None, NOW)
    b = status_from_counts(counts(12, age=9.0), 12, QueueSpec(5), 1, a,
                           NOW + dt.timedelta(seconds=30))
    assert same_facts(a, b)
    c = status_from_counts(counts(13, completed=4), 13, QueueSpec(5), 1, a, NOW)
    assert not same_facts(a, c)


def test_resource_spec_to_queue_spec() -> None:
    # the CRD's defaults: 3 attempts, 3 tenures kept per item
    assert spec_from_resource({"leaseDurationSeconds": 9}) == QueueSpec(9, 3, False, 0,
                                                                         history_limit=3)
    full = {"leaseDurationSeconds": 9, "maxAttempts": 0, "suspend": True, "shards": 4,
            "historyLimit": 0}
    assert spec_from_resource(full) == QueueSpec(9, 0, True, 4)
    assert spec_matches(full, QueueSpec(9, 0, True, 4))
    assert not spec_matches(full, QueueSpec(9, 0, False, 4))
    assert not spec_matches(full, QueueSpec(9, 0, True, 4, history_limit=3))
    assert not spec_matches({"leaseDurationSeconds": 1}, QueueSpec(1))  # invalid: no match


def test_bad_resource_specs_are_refused_naming_the_field() -> None:
    for spec, word in (({"leaseDurationSeconds": 1}, "ttl"),
                       ({"leaseDurationSeconds": 5, "suspend": "yes"}, "suspend"),
                       ({"leaseDurationSeconds": 5, "shards": 100_001}, "shards"),
                       ({"leaseDurationSeconds": 5, "shards": True}, "shards"),
                       ({"leaseDurationSeconds": 5, "maxAttempts": -1}, "attempts"),
                       ({"leaseDurationSeconds": 5, "historyLimit": 101}, "historylimit"),
                       ({"leaseDurationSeconds": 5, "historyLimit": "3"}, "historylimit")):
        with pytest.raises(InvalidInputError) as err:
            spec_from_resource(spec)
        assert word in str(err.value).lower(), (spec, err.value)
