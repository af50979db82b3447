"""The mirror's ordering rules with several states of one job in a row (one etcd
response can carry several revisions). Uses test_status's fake API server: only
the ordering logic is under test here; tests/kube runs the real one."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.mirror import Mirror
from joblease.store import Put
from tests.support.mirror_fakes import FakeClient, FakeKube, settle, state


async def test_states_in_a_row_give_every_event_and_the_newest_status() -> None:
    kube = FakeKube()
    mirror = Mirror(cast(Any, FakeClient()), cast(Any, kube), OperatorMetrics())
    mirror.observe(state(5))
    await settle(mirror)
    # A claim and its expiry in one etcd response: two states, two revisions, no await.
    mirror.observe(state(9, generation=1, holder=("a", 9)))
    mirror.observe(state(10, generation=1))
    await settle(mirror)
    assert kube.writes == [5, 10]
    assert kube.events == ["Claimed", "Expired"]


async def test_a_state_older_than_the_last_seen_changes_nothing() -> None:
    kube = FakeKube()
    mirror = Mirror(cast(Any, FakeClient()), cast(Any, kube), OperatorMetrics())
    mirror.observe(state(9, generation=1, holder=("a", 9)))
    await settle(mirror)
    mirror.observe(state(6))  # e.g. a replayed older revision: no Expired, no write
    mirror.observe(state(12, generation=1, holder=("a", 9)))
    await settle(mirror)
    assert kube.writes == [9]  # 12 only changes the revision: not news
    assert kube.events == []


async def test_a_non_utf8_key_under_a_jobs_prefix_does_not_break_its_refresh(
        client: JobLeaseClient) -> None:
    """Real etcd: a tenant can write a key under the job's prefix whose name is not
    UTF-8; the refresh still reads the job and writes its status, with no error."""
    job = JobRef("ns", "job")
    await client.register(job, JobSpec(10))
    await client.store.txn([], [Put(client.keys.job(job).prefix + b"\xff", b"x")], [])
    kube = FakeKube()
    metrics = OperatorMetrics()
    mirror = Mirror(client, cast(Any, kube), metrics)
    mirror.refresh(job)
    await asyncio.gather(*mirror._background)
    await settle(mirror)
    assert metrics.mirror_errors.labels("observe")._value.get() == 0
    assert len(kube.writes) == 1


async def test_a_refresh_that_fails_unexpectedly_is_counted_not_lost_silently(
        client: JobLeaseClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """Real etcd, with one injected fault: ``client.get`` raising an error outside
    the project's types (a bug, or a library surprise) is logged and counted, and
    the mirror carries on (the task does not die as an unretrieved exception)."""
    job = JobRef("ns", "job")
    await client.register(job, JobSpec(10))

    async def broken_get(ref: JobRef) -> Any:
        raise RuntimeError(f"injected: cannot read {ref}")

    monkeypatch.setattr(client, "get", broken_get)
    metrics = OperatorMetrics()
    mirror = Mirror(client, cast(Any, FakeKube()), metrics)
    mirror.refresh(job)
    await asyncio.gather(*mirror._background)
    assert metrics.mirror_errors.labels("observe")._value.get() == 1


async def test_a_deleted_joblease_keeps_its_last_status_when_its_keys_go() -> None:
    """The finalizer removes the keys of a Completed JobLease being deleted: the
    "not registered" state that follows is never written over the completion, even
    though the mirror's cached object predates the deletion (the API server bumped
    the resourceVersion when it set ``deletionTimestamp``), so the write it would
    make conflicts and re-reads an object that is now being deleted."""
    kube = FakeKube()
    mirror = Mirror(cast(Any, FakeClient()), cast(Any, kube), OperatorMetrics())
    mirror.observe(state(9, generation=1, holder=("a", 9)))
    mirror.observe(state(11, generation=1, result={"rows": 3}))
    await settle(mirror)
    assert kube.writes == [11] and kube.obj["status"]["phase"] == "Completed"
    completed = kube.obj["status"]
    # kubectl delete: the API server sets deletionTimestamp (a new resourceVersion)
    kube.obj["metadata"]["deletionTimestamp"] = "2025-01-01T12:01:00Z"
    kube.obj["metadata"]["resourceVersion"] = str(
        int(kube.obj["metadata"]["resourceVersion"]) + 1)
    mirror.observe(state(14, spec=None))  # the finalizer removed the keys
    await settle(mirror)
    assert kube.writes == [11]
    assert kube.obj["status"] == completed


async def test_the_recent_tenures_are_read_once_per_change_not_per_resync(
        client: JobLeaseClient) -> None:
    """Real etcd, the fake API server: a claim is one bounded history read; the
    same job seen again at a newer revision with nothing changed (a resync, a
    refresh) reads nothing and writes nothing; its release reads again."""
    job = JobRef("ns", "job")
    await client.register(job, JobSpec(10, history_limit=5))
    lease = await client.claim(job, "w")
    kube, metrics = FakeKube(), OperatorMetrics()
    mirror = Mirror(client, cast(Any, kube), metrics)
    reads = metrics.history_reads._value.get
    mirror.observe(await client.get(job))
    await settle(mirror)
    assert reads() == 1
    assert [t["end"] for t in kube.obj["status"]["recentTenures"]] == ["open"]
    await client.store.txn([], [Put(b"/elsewhere", b"x")], [])  # the revision moves on
    mirror.observe(await client.get(job))
    await settle(mirror)
    assert reads() == 1 and len(kube.writes) == 1
    await lease.release()
    mirror.observe(await client.get(job))
    await settle(mirror)
    assert reads() == 2
    assert [t["end"] for t in kube.obj["status"]["recentTenures"]] == ["released"]
