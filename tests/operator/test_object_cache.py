"""The mirror's per-JobLease object cache gives back exactly the object last stored,
never an older one, in a fraction of the bytes of its JSON."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from joblease.keys import JobRef
from joblease.operator.object_cache import ObjectCache, slim
from joblease.operator.status import recent_tenures_status, status_from_state
from joblease.records import (
    CheckpointRecord,
    Holder,
    JobSpec,
    JobState,
    ResultRecord,
    Tenure,
    TenureEnd,
)

NOW = dt.datetime(2026, 12, 3, 6, 0, 7, tzinfo=dt.UTC)
JOB = JobRef("team-a", "nightly-report-4711")


def _obj(state: JobState, *, rv: str = "987654", **status_extra: Any) -> dict[str, Any]:
    status = status_from_state(state, 2, None, NOW, lease_remaining=17)
    status.update(status_extra)
    return {
        "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
        "metadata": {"name": JOB.name, "namespace": JOB.namespace,
                     "uid": "5b0e0c1e-7b7c-4f0e-9a7e-1c2d3e4f5a6b", "resourceVersion": rv,
                     "generation": 2, "creationTimestamp": "2026-12-03T05:00:00Z",
                     "annotations": {"joblease.io/last-handled-configuration": "{...}"},
                     "managedFields": [{"manager": "kubectl", "operation": "Update"}]},
        "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3, "parameters": {"day": "mon"}},
        "status": status}


SPEC = JobSpec(30, 3, {"day": "mon"}, history_limit=5)
HOLDER = Holder("wörker-ß", "f" * 32, 5001, 2, 7587000000000000123, NOW.timestamp() - 3)
RESULT = ResultRecord("wörker-ß", "f" * 32, 5001, 2, {"rows": list(range(300)), "ok": "✓"},
                      NOW.timestamp(), 5010)
CHECKPOINT = CheckpointRecord("wörker-ß", "f" * 32, 5001, 2, {"offset": 12}, NOW.timestamp(),
                              5005)
STATES = {
    "pending": JobState(JOB, 4999, SPEC, 4990, None, 0, None, None, 4990),
    "claimed": JobState(JOB, 5005, SPEC, 4990, HOLDER, 2, "wörker-ß", None, 5005,
                        checkpoint=CHECKPOINT),
    "completed": JobState(JOB, 5010, SPEC, 4990, None, 2, "wörker-ß", RESULT, 5010,
                          checkpoint=CHECKPOINT),
    "failed": JobState(JOB, 6000, SPEC, 4990, None, 3, "w", None, 6000),
    "corrupt": JobState(JOB, 6100, None, 4990, None, 0, None, None, 6100,
                        corrupt="holder: ValueError: bad \udcff"[:20]),
    "not registered": JobState(JOB, 6200, None, 0, None, 0, None, None, 0),
}


def test_get_gives_back_exactly_the_slim_object_last_put() -> None:
    cache = ObjectCache()
    tenures = recent_tenures_status((Tenure(1, 4000, "a", "c" * 32, NOW.timestamp(),
                                            TenureEnd.EXPIRED),))
    for label, state in STATES.items():
        obj = _obj(state, recentTenures=tenures)
        cache.put(JOB, obj)
        assert cache.get(JOB) == slim(obj), label
        assert "managedFields" not in cache.get(JOB)["metadata"]  # type: ignore[index]


def test_a_put_replaces_the_older_object_never_serves_it() -> None:
    cache = ObjectCache()
    cache.put(JOB, _obj(STATES["claimed"], rv="100"))
    newer = _obj(STATES["completed"], rv="101")
    cache.put(JOB, newer)
    got = cache.get(JOB)
    assert got is not None
    assert got["metadata"]["resourceVersion"] == "101"
    assert got["status"]["phase"] == "Completed"
    assert got == slim(newer)


def test_discard_forgets_and_other_jobs_keep_theirs() -> None:
    cache = ObjectCache()
    other = JobRef("team-a", "other")
    cache.put(JOB, _obj(STATES["claimed"], rv="100"))
    cache.put(other, _obj(STATES["pending"], rv="7"))
    cache.discard(JOB)
    assert cache.get(JOB) is None and JOB not in cache
    assert cache.get(other)["metadata"]["resourceVersion"] == "7"  # type: ignore[index]
    cache.discard(JOB)  # forgetting twice is fine
    assert len(cache) == 1


def test_each_get_is_a_fresh_copy() -> None:
    """The mirror edits what it got (a conflicting write re-reads into it): the
    cached object must not change with it."""
    cache = ObjectCache()
    cache.put(JOB, _obj(STATES["pending"]))
    first = cache.get(JOB)
    assert first is not None
    first["status"]["phase"] = "Completed"
    first["metadata"]["resourceVersion"] = "1"
    again = cache.get(JOB)
    assert again is not None
    assert again["status"]["phase"] == "Pending"
    assert again["metadata"]["resourceVersion"] == "987654"


def test_a_cached_object_takes_a_fraction_of_its_json() -> None:
    """What the cache is for: at 10,000 JobLeases its objects were the mirror's
    largest memory (docs/benchmarks-operator.md). A pending or claimed object's
    compact JSON is 1.2-1.4 KB; kept, it takes at most a quarter of that."""
    cache = ObjectCache()
    for label in ("pending", "claimed", "failed"):
        obj = _obj(STATES[label])
        cache.put(JOB, obj)
        size = len(json.dumps(slim(obj), separators=(",", ":")).encode())
        assert cache.packed_bytes() <= size / 4, (label, cache.packed_bytes(), size)
