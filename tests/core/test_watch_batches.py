"""``client.watch`` and ``client.list`` against what etcd really sends.

etcd packs several revisions into one watch response (a watch that starts in
the past gets the catch-up in one go); a watch can fail in ways the store does
not resume; tenants can write anything under their own prefix. None of these
may make a reader report a wrong state, miss one, or stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from joblease import (
    EtcdConfig,
    JobLeaseClient,
    JobRef,
    JobSpec,
    JobState,
    Phase,
    StoreUnavailableError,
)
from joblease.etcd_store import EtcdStore
from joblease.store import WatchBatch
from tests.support.faulty_store import FaultyStore


async def test_each_revision_in_one_watch_response_is_reported_with_its_own_state(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """Issue 20 §2.12: a claim and a release that reach the watcher in one
    response are two states, each at its own revision (the claim is not lost)."""
    job = JobRef("default", "batched")
    await client.register(job, JobSpec(10, 0))
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store) as watcher:
        states = watcher.watch()
        first = await anext(states)  # the snapshot; the etcd watch is opened after it
        assert first.phase is Phase.PENDING
        lease = await client.claim(job, "worker-a")
        await lease.release()
        # The watch now starts in the past: etcd sends both revisions at once.
        seen = [await asyncio.wait_for(anext(states), 10) for _ in range(2)]
        await states.aclose()
    batch = store.watch_batches[0]
    assert len({e.kv.mod_revision for e in batch.events}) == 2, "not one batch: test is moot"
    claimed, released = seen
    assert claimed.revision == lease.token
    assert claimed.phase is Phase.CLAIMED
    assert claimed.holder is not None and claimed.holder.token == lease.token
    assert released.revision > claimed.revision
    assert released.phase is Phase.PENDING and released.holder is None
    assert released.generation == claimed.generation == 1


async def test_jobs_that_vanish_during_a_watch_outage_are_reported_not_registered(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """Issue 20 §2.16: the watch fails (not a compaction) and a job is
    unregistered meanwhile; the resync must say so rather than forget the job."""
    stays, goes = JobRef("default", "stays"), JobRef("default", "goes")
    for job in (stays, goes):
        await client.register(job, JobSpec(10, 0))
    store = FaultyStore(EtcdStore(etcd_config))
    outage_over = asyncio.Event()

    async def broken_watch(key: bytes, start_revision: int) -> AsyncIterator[WatchBatch]:
        await outage_over.wait()
        raise StoreUnavailableError("injected: etcd unreachable for a while")
        yield  # an async generator, like the store's watch

    store.watch_hooks.append(broken_watch)
    async with JobLeaseClient(etcd_config, store=store) as watcher:
        states = watcher.watch()
        snapshot = [await anext(states) for _ in range(2)]
        assert {s.job for s in snapshot} == {stays, goes}
        pending = asyncio.ensure_future(anext(states))
        await client.unregister(goes)
        outage_over.set()
        vanished = await asyncio.wait_for(pending, 10)
        assert vanished.job == goes and vanished.phase is Phase.NOT_REGISTERED
        resynced = await asyncio.wait_for(anext(states), 10)
        assert resynced.job == stays and resynced.phase is Phase.PENDING
        lease = await client.claim(stays, "worker-a")
        after = await asyncio.wait_for(anext(states), 10)  # the resumed watch works
        assert after.job == stays and after.holder is not None
        assert after.holder.token == lease.token
        await states.aclose()


async def test_list_and_watch_report_a_corrupt_job_and_keep_going(
    client: JobLeaseClient,
) -> None:
    """Issue 20 §2.2 (core): a non-JSON ``result`` and a wrong-shaped ``holder``
    under one job's prefix make that job ``Corrupt`` (a key whose name is not
    UTF-8 is ignored); every other job is still listed and watched, and the bad
    one can still be read on its own."""
    good, bad, other = (JobRef("default", n) for n in ("good", "bad", "other"))
    for job in (good, bad, other):
        await client.register(job, JobSpec(10, 0))
    keys = client.keys.job(bad)
    states = client.watch()
    snapshot = [await anext(states) for _ in range(3)]
    assert {s.phase for s in snapshot} == {Phase.PENDING}
    await client.store.put(keys.result, b"{not json")  # type: ignore[attr-defined]
    await client.store.put(keys.holder, b'["not", "a", "holder"]')  # type: ignore[attr-defined]
    await client.store.put(keys.prefix + b"\xff\xfe", b"x")  # type: ignore[attr-defined]
    lease = await client.claim(good, "worker-a")
    seen: list[JobState] = []
    async with asyncio.timeout(10):
        while not any(s.job == good and s.phase is Phase.CLAIMED for s in seen):
            seen.append(await anext(states))
    await states.aclose()
    last_bad = [s for s in seen if s.job == bad][-1]
    assert last_bad.phase is Phase.CORRUPT
    assert last_bad.corrupt is not None
    assert "result" in last_bad.corrupt and "holder" in last_bad.corrupt

    listed = {s.job: s for s in await client.list()}
    assert listed[bad].phase is Phase.CORRUPT
    assert listed[good].phase is Phase.CLAIMED and listed[good].token == lease.token
    assert listed[other].phase is Phase.PENDING
    assert (await client.get(bad)).phase is Phase.CORRUPT

    fresh = client.watch()  # a new watch starts from a snapshot with the bad job in it
    resnapshot = {s.job: s.phase for s in [await anext(fresh) for _ in range(3)]}
    await fresh.aclose()
    assert resnapshot == {good: Phase.CLAIMED, bad: Phase.CORRUPT, other: Phase.PENDING}
