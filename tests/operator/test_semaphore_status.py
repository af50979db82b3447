"""JobSemaphore status from a semaphore's state: pure logic
(joblease.operator.semaphore_status, semaphore_registration)."""

from __future__ import annotations

import datetime as dt

import pytest

from joblease.errors import InvalidInputError
from joblease.keys import SemaphoreRef
from joblease.operator.semaphore_registration import limit_from_resource, spec_matches
from joblease.operator.semaphore_status import same_facts, should_apply, status_from_semaphore
from joblease.semaphore import SemaphoreStatus, SlotHolder

NOW = dt.datetime(2026, 12, 1, 12, 0, 0, tzinfo=dt.UTC)
LATER = NOW + dt.timedelta(seconds=30)
DB = SemaphoreRef("team-a", "db")


def state(revision: int = 10, *, limit: int = 2, live: int = 1, waiters: int = 0
          ) -> SemaphoreStatus:
    holders = [SlotHolder(i, f"job-{i}", f"w-{i}", 5 + i, 99) for i in range(live)]
    return SemaphoreStatus(DB, revision, limit, live, holders, waiters,
                           "job-9" if waiters else None)


def conditions(s: dict[str, object]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in s["conditions"]}  # type: ignore[attr-defined, index]


def test_a_state_becomes_the_status_without_lease_ids() -> None:
    s = status_from_semaphore(state(), 10, 3, None, NOW)
    assert {k: s[k] for k in ("limit", "live", "waiters", "etcdRevision",
                              "observedGeneration")} == {
        "limit": 2, "live": 1, "waiters": 0, "etcdRevision": 10, "observedGeneration": 3}
    assert s["holders"] == [{"slot": 0, "holder": "job-0", "owner": "w-0", "token": 5}]
    assert conditions(s) == {"Registered": "True", "Saturated": "False"}


def test_saturated_when_live_reaches_the_limit_and_transition_time_kept() -> None:
    full = status_from_semaphore(state(live=2, waiters=1), 11, 1, None, NOW)
    assert conditions(full)["Saturated"] == "True"
    again = status_from_semaphore(state(12, live=2, waiters=1), 12, 1, full, LATER)
    assert same_facts(full, again)  # only etcdRevision moved: no write
    saturated = next(c for c in again["conditions"] if c["type"] == "Saturated")
    assert saturated["lastTransitionTime"] == "2026-12-01T12:00:00Z"


def test_no_semaphore_in_etcd_is_not_registered() -> None:
    s = status_from_semaphore(None, 4, 0, {"observedGeneration": 2}, NOW)
    assert (s["limit"], s["live"], s["holders"], s["observedGeneration"]) == (0, 0, [], 2)
    assert conditions(s) == {"Registered": "False", "Saturated": "Unknown"}


def test_never_backwards() -> None:
    assert should_apply({"etcdRevision": 10}, 10) and should_apply(None, 1)
    assert not should_apply({"etcdRevision": 10}, 9)


@pytest.mark.parametrize("spec", [{}, {"limit": 0}, {"limit": 10001}, {"limit": True},
                                  {"limit": "3"}, None])
def test_bad_limits_are_clear_errors(spec: dict[str, object] | None) -> None:
    with pytest.raises(InvalidInputError, match="invalid limit"):
        limit_from_resource(spec)
    assert not spec_matches(spec, 3)


def test_spec_matches_the_stored_limit() -> None:
    assert limit_from_resource({"limit": 10000}) == 10000
    assert spec_matches({"limit": 3}, 3) and not spec_matches({"limit": 3}, 2)
    assert not spec_matches({"limit": 3}, None)
