"""Semaphores on a real etcd: the limit is made of claims (docs/semaphores.md).

The "at no revision more than K slots live" checks read etcd's own history of
the test's semaphore prefix (a watch from the revision the test started at),
replaying puts and deletes revision by revision."""

from __future__ import annotations

import asyncio
import time

import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.errors import (
    InvalidInputError,
    SemaphoreFullError,
    SemaphoreNotFoundError,
)
from joblease.fencing.gate import Effect, MemoryGate, StaleFenceError
from joblease.keys import QueueRef, SemaphoreRef
from joblease.queue import Queues
from joblease.records import QueueSpec, SemaphoreUse
from joblease.semaphore import Semaphores
from tests.support.etcd_keys import snapshot
from tests.support.slot_history import max_live
from tests.support.worker_proc import WorkerProc

TTL = 2
DB = SemaphoreRef("default", "billing-db")


def _spec(*uses: tuple[str, int], ttl: int = TTL) -> JobSpec:
    return JobSpec(lease_duration_seconds=ttl, max_attempts=0,
                   semaphores=tuple(SemaphoreUse(n, w) for n, w in uses))


async def _jobs(client: JobLeaseClient, n: int, *uses: tuple[str, int], ttl: int = TTL
                ) -> list[JobRef]:
    jobs = [JobRef("default", f"job-{i}") for i in range(n)]
    for job in jobs:
        await client.register(job, _spec(*uses, ttl=ttl))
    return jobs


_max_live = max_live  # etcd's history of the slots (tests/support/slot_history.py)


async def test_the_limit_holds_and_slots_free_with_their_claims(client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 2)
    start, _ = await client.store.get(b"\0")
    jobs = await _jobs(client, 3, ("billing-db", 1))
    a = await client.claim(jobs[0], "a")
    b = await client.claim(jobs[1], "b")
    with pytest.raises(SemaphoreFullError) as full:
        await client.claim(jobs[2], "c")
    assert (full.value.limit, full.value.live, full.value.exit_code) == (2, 2, 18)
    (slot_a,) = a.slots[0].indexes
    assert [g.to_dict() for g in a.slots] == [  # the slot's token is the claim's
        {"semaphore": str(DB), "slots": [slot_a], "token": a.token}]
    assert {slot_a, *b.slots[0].indexes} == {0, 1}
    status = await sems.status(DB)
    assert sorted((h.holder, h.token) for h in status.holders) == [
        (str(jobs[0]), a.token), (str(jobs[1]), b.token)]
    await a.complete()  # frees its slot in the completion's transaction
    c = await client.claim(jobs[2], "c")
    assert c.slots[0].indexes == (slot_a,) and c.slots[0].token > a.token
    await b.release()
    await c.complete()
    assert (await sems.status(DB)).live == 0
    assert await _max_live(client.store, client.keys.semaphore(DB).slots, start) == 2


async def test_a_paused_ex_holder_is_fenced_by_its_slot_token(client: JobLeaseClient) -> None:
    """K=1: A (a real process) holds the slot and is SIGSTOPped past its TTL; a
    waiter is granted the slot; A wakes and writes: the destination gated on
    the slot refuses it. At no revision were two slots live."""
    sems = Semaphores(client)
    await sems.create(DB, 1)
    start, _ = await client.store.get(b"\0")
    jobs = await _jobs(client, 2, ("billing-db", 1))
    gate = MemoryGate()
    slot = f"semaphore/{DB}/slot/0"
    a = WorkerProc(client.config, jobs[0], "worker-a")
    try:
        claimed = a.next_event("claimed")
        await gate.admit(Effect(slot, claimed["token"]))
        a.pause()
        paused = time.monotonic()
        b = await client.claim_waiting(jobs[1], "worker-b", wait=TTL + 15)
        assert time.monotonic() - paused >= TTL - 0.5  # etcd expired A's lease first
        assert b.slots[0].indexes == (0,) and b.slots[0].token > claimed["token"]
        await gate.admit(Effect(slot, b.slots[0].token))
        a.resume()
        with pytest.raises(StaleFenceError):  # A's late write under its old slot token
            await gate.admit(Effect(slot, claimed["token"]))
        a.send("complete null")
        assert a.next_event("completed")["error"] == "stale"
        await b.complete()
    finally:
        a.stop()
    assert await _max_live(client.store, client.keys.semaphore(DB).slots, start) == 1


async def test_a_claim_needing_two_semaphores_takes_neither_when_one_is_full(
        client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 1)
    await sems.create(SemaphoreRef("default", "gpu"), 4)
    hog = (await _jobs(client, 1, ("billing-db", 1)))[0]
    held = await client.claim(hog, "hog")
    job = JobRef("default", "both")
    await client.register(job, _spec(("billing-db", 1), ("gpu", 2)))
    before = await snapshot(client.store, client.keys.namespace_prefix())
    with pytest.raises(SemaphoreFullError) as full:
        await client.claim(job, "w")
    assert full.value.semaphore == str(DB)
    assert await snapshot(client.store, client.keys.namespace_prefix()) == before
    await held.release()
    lease = await client.claim(job, "w")
    got = {str(g.semaphore): g.indexes for g in lease.slots}
    assert got[str(DB)] == (0,)
    assert len(got["default/gpu"]) == 2 and set(got["default/gpu"]) <= set(range(4))


@pytest.mark.parametrize(("uses", "error", "match"), [
    ((("Bad_Name", 1),), InvalidInputError, "invalid semaphore name"),
    ((("billing-db", 0),), InvalidInputError, "invalid weight"),
    ((("billing-db", 1), ("billing-db", 1)), InvalidInputError, "named twice"),
])
async def test_bad_semaphore_uses_are_refused_at_registration(
        client: JobLeaseClient, uses: tuple[tuple[str, int], ...], error: type[Exception],
        match: str) -> None:
    with pytest.raises(error, match=match):
        await client.register(JobRef("default", "j"), _spec(*uses))
    assert await snapshot(client.store, client.keys.namespace_prefix()) == {}


async def test_unknown_semaphores_and_impossible_weights_are_clear_errors(
        client: JobLeaseClient) -> None:
    await Semaphores(client).create(DB, 2)
    job = JobRef("default", "j")
    await client.register(job, _spec(("nope", 1)))
    before = await snapshot(client.store, client.keys.namespace_prefix())
    with pytest.raises(SemaphoreNotFoundError, match="semaphore default/nope does not exist"):
        await client.claim(job, "w")
    await client.register(job, _spec(("billing-db", 3)))
    before = await snapshot(client.store, client.keys.namespace_prefix())
    with pytest.raises(InvalidInputError, match="limit is 2: it could never be granted"):
        await client.claim(job, "w")
    assert await snapshot(client.store, client.keys.namespace_prefix()) == before
    with pytest.raises(InvalidInputError):
        await Semaphores(client).create(DB, 0)


async def test_waiters_are_served_in_arrival_order_and_a_raised_limit_lets_them_in(
        client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 1)
    jobs = await _jobs(client, 4, ("billing-db", 1), ttl=30)
    first = await client.claim(jobs[0], "first")
    granted: list[str] = []

    async def wait(job: JobRef) -> None:
        lease = await client.claim_waiting(job, job.name, wait=30)
        granted.append(job.name)
        await lease.wait_done()

    waiters = []
    for job in jobs[1:]:  # one after another: each is in line before the next comes
        waiters.append(asyncio.create_task(wait(job)))
        deadline = time.monotonic() + 10
        while (await sems.status(DB)).waiters < len(waiters):
            assert time.monotonic() < deadline, "waiter did not get in line"
            await asyncio.sleep(0.02)
    await first.release()
    deadline = time.monotonic() + 10
    while not granted:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert granted == ["job-1"]
    await sems.create(DB, 3)  # raised: both remaining waiters get in at once
    deadline = time.monotonic() + 10
    while len(granted) < 3:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.02)
    assert granted == ["job-1", "job-2", "job-3"]
    status = await sems.status(DB)
    assert (status.live, status.waiters) == (3, 0)
    for task in waiters:
        task.cancel()
    await asyncio.gather(*waiters, return_exceptions=True)


async def test_a_lowered_limit_revokes_nobody_and_grants_nothing_until_below_it(
        client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 3)
    jobs = await _jobs(client, 4, ("billing-db", 1), ttl=30)
    # by slot index: picks are random, so the claim order says nothing of the indexes
    held = sorted([await client.claim(job, job.name) for job in jobs[:3]],
                  key=lambda lease: lease.slots[0].indexes[0])
    await sems.create(DB, 2)
    assert all(lease.valid for lease in held)  # nobody revoked
    assert (await sems.status(DB)).live == 3
    await held[0].release()  # 2 live: not below the new limit
    with pytest.raises(SemaphoreFullError):
        await client.claim(jobs[3], "late")
    await held[2].release()  # slot 2's holder: 1 live, and nobody above the limit
    lease = await client.claim(jobs[3], "late")
    assert lease.slots[0].indexes[0] < 2
    await held[1].release()
    await lease.release()


async def test_a_waiter_that_gives_up_leaves_nothing_behind(client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 1)
    jobs = await _jobs(client, 2, ("billing-db", 1))
    held = await client.claim(jobs[0], "a")
    with pytest.raises(SemaphoreFullError):
        await client.claim_waiting(jobs[1], "b", wait=0.5)
    _, waiters = await client.store.get(client.keys.semaphore(DB).waiters, prefix=True)
    assert waiters == []
    await held.release()


async def test_queue_items_take_slots_too(client: JobLeaseClient) -> None:
    sems = Semaphores(client)
    await sems.create(DB, 2)
    queues = Queues(client)
    q = QueueRef("default", "renders")
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=0,
                                     semaphores=(SemaphoreUse("billing-db", 1),)))
    await queues.enqueue(q, [(f"i{n}", n) for n in range(5)])
    a = await queues.claim_next(q, "a")
    b = await queues.claim_next(q, "b")
    assert a is not None and b is not None and a.slots and b.slots
    with pytest.raises(SemaphoreFullError):
        await queues.claim_next(q, "c")
    waiting = asyncio.create_task(queues.claim_next(q, "c", wait=10))
    await asyncio.sleep(0.2)
    assert not waiting.done()
    await a.complete()
    c = await asyncio.wait_for(waiting, 10)
    assert c is not None and c.slots[0].indexes == a.slots[0].indexes
    await b.complete()
    await c.complete()


async def test_the_docs_example_works_as_written(client: JobLeaseClient) -> None:
    from pathlib import Path
    doc = (Path(__file__).resolve().parents[2] / "docs" / "semaphores.md").read_text()
    block = doc.split("```python\n", 1)[1].split("```", 1)[0]
    block = block.replace("    ...\n", "    return lease\n")  # hand the lease to the test
    namespace: dict[str, object] = {}
    exec(compile(block, "docs/semaphores.md", "exec"), namespace)
    lease = await namespace["nightly"](client)  # type: ignore[operator]
    assert lease.slots[0].indexes[0] in range(3) and lease.slots[0].token == lease.token
    await lease.complete()
