"""The client's watched semaphore views (joblease.slot_view) on a real etcd:
our own writes are applied at once and never undone by the watch that
brings them later, and a waiter in line is woken by the view, hand-over
after hand-over, without missing one."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.errors import SemaphoreFullError
from joblease.keys import SemaphoreRef
from joblease.records import SemaphoreSpec, SemaphoreUse, WaiterRecord
from joblease.semaphore import Semaphores
from joblease.slot_view import SemaphoreView
from joblease.slots import SemaphoreState
from joblease.store import Compare, Put

DB = SemaphoreRef("default", "billing-db")


async def _jobs(client: JobLeaseClient, n: int, ttl: int) -> list[JobRef]:
    jobs = [JobRef("default", f"job-{i}") for i in range(n)]
    for job in jobs:
        await client.register(job, JobSpec(lease_duration_seconds=ttl, max_attempts=0,
                                           semaphores=(SemaphoreUse("billing-db"),)))
    return jobs


def _free_kept(state: SemaphoreState | None) -> None:
    """The free indexes a view keeps are those below the limit with no live slot."""
    assert state is not None and state.free is not None
    assert set(state.free) == set(range(state.limit)) - set(state.slots)


async def _live_in_etcd(client: JobLeaseClient) -> set[int]:
    return {h.index for h in (await Semaphores(client).status(DB)).holders}


async def test_a_view_shows_our_writes_at_once_and_the_watch_never_undoes_them(
        client: JobLeaseClient) -> None:
    await Semaphores(client).create(DB, 3)
    jobs = await _jobs(client, 10, ttl=30)
    # A second client claims too: its slots reach our view only through the watch.
    async with JobLeaseClient(client.config) as other:
        for round_ in range(5):
            mine = await client.claim(jobs[2 * round_], "me")
            view = client._views[client.keys.semaphore(DB).prefix]
            state = await view.state()
            assert state is not None and mine.slots[0].indexes[0] in state.slots
            _free_kept(state)
            theirs = await other.claim(jobs[2 * round_ + 1], "them")
            await mine.complete()
            state = await view.state()
            assert state is not None
            assert mine.slots[0].indexes[0] not in state.slots, "our completion freed it"
            _free_kept(state)
            await theirs.release()
            # Once the watch has delivered everything up to now, the view is
            # etcd's state: no put it brought late brought a freed slot back.
            now = (await client.store.get(client.keys.semaphore(DB).spec))[0]
            deadline = time.monotonic() + 10
            while view.revision < now:
                assert time.monotonic() < deadline, "the view's watch fell behind"
                await asyncio.sleep(0.01)
            state = await view.state()
            assert state is not None
            assert set(state.slots) == await _live_in_etcd(client) == set()
            _free_kept(state)


async def test_a_release_wakes_the_next_waiter_in_line_hand_over_after_hand_over(
        client: JobLeaseClient) -> None:
    # TTL 30 s: a waiter whose wake-up was missed would sleep until its wait is
    # capped at the TTL, far beyond this test's deadline.
    sems = Semaphores(client)
    await sems.create(DB, 1)
    jobs = await _jobs(client, 25, ttl=30)
    first = await client.claim(jobs[0], "first")
    served: list[str] = []

    async def wait(job: JobRef) -> None:
        lease = await client.claim_waiting(job, job.name, wait=60)
        served.append(job.name)
        await lease.release()  # at once: the next one in line is woken by this

    waiters = []
    for n, job in enumerate(jobs[1:], start=1):
        waiters.append(asyncio.create_task(wait(job)))
        deadline = time.monotonic() + 10
        while (await sems.status(DB)).waiters < n:
            assert time.monotonic() < deadline, "waiter did not get in line"
            await asyncio.sleep(0.01)
    await first.release()
    done, _ = await asyncio.wait(waiters, timeout=15)
    assert len(done) == len(waiters), f"served only {served} within 15 s"
    for task in done:
        task.result()
    assert served == [job.name for job in jobs[1:]]
    status = await sems.status(DB)
    assert (status.live, status.waiters) == (0, 0)


async def test_kept_slot_keys_and_warm_views_follow_a_deleted_and_recreated_semaphore(
        client: JobLeaseClient) -> None:
    """The claim path keeps slot keys per index (joblease.keys.SemaphoreKeys) and
    plans from a warm view: after the semaphore is deleted and created again
    with a smaller limit, every claim takes a slot below the new limit, the
    limit holds in etcd, and the keys kept are the ones the formula gives."""
    sems = Semaphores(client)
    await sems.create(DB, 4)
    jobs = await _jobs(client, 7, ttl=30)
    first = [await client.claim(job, "before") for job in jobs[:4]]  # every index 0..3 kept
    assert sorted(lease.slots[0].indexes[0] for lease in first) == [0, 1, 2, 3]
    for lease in first:
        await lease.complete()
    await sems.delete(DB)
    await sems.create(DB, 2)
    held = [await client.claim(job, "after") for job in jobs[4:6]]
    assert sorted(lease.slots[0].indexes[0] for lease in held) == [0, 1]
    try:
        await client.claim(jobs[6], "third")
    except SemaphoreFullError:
        pass
    else:
        raise AssertionError("a third slot was granted under a limit of 2")
    assert await _live_in_etcd(client) == {0, 1}
    keys = client.keys.semaphore(DB)
    for index in (0, 1, 2, 3, 4, 9999):
        formula = keys.slots + str(index).zfill(6).encode()
        assert keys.slot(index) == formula and keys.slot_index(formula) == index
    for lease in held:
        await lease.release()


async def _until_seen(view: SemaphoreView, revision: int) -> None:
    deadline = time.monotonic() + 10
    while view.revision < revision:
        assert time.monotonic() < deadline, "the view's watch fell behind"
        await asyncio.sleep(0.01)


async def test_a_warm_client_plans_with_the_limit_spec_weight_and_waiters_in_force(
        client: JobLeaseClient) -> None:
    """What a warm client keeps (its view's state, the kept compares, the keys per
    use) follows a limit changed at runtime, a semaphore deleted and created
    again, a job's weight changed and a waiter come and gone: each claim sends
    the compares of the spec and limit etcd has by then, and takes its weight."""
    sems = Semaphores(client)
    keys = client.keys.semaphore(DB)
    await sems.create(DB, 2)
    job = (await _jobs(client, 1, ttl=30))[0]
    sent: list[list[Compare]] = []
    real_txn = client.store.txn

    async def txn(compares: Any, success: Any, failure: Any = ()) -> Any:
        if any(isinstance(op, Put) and op.key.startswith(keys.slots) for op in success):
            sent.append(list(compares))
        return await real_txn(compares, success, failure)

    client.store.txn = txn  # type: ignore[method-assign]  # observes; etcd answers

    async def claim_and_check(weight: int) -> None:
        spec_kv = (await client.store.get(keys.spec))[1][0]
        limit = SemaphoreSpec.decode(spec_kv.value).limit
        view = client._views[keys.prefix]
        await _until_seen(view, spec_kv.mod_revision)
        state = view.state_now()
        assert state is not None and state.limit == limit
        assert state.spec_revision == spec_kv.mod_revision
        _free_kept(state)
        lease = await client.claim(job, "me")
        assert len(lease.slots[0].indexes) == weight
        _free_kept(view.state_now())
        picks = lease.slots[0].indexes
        assert sent[-1][-(weight + 3):] == [
            Compare(keys.spec, "mod", "==", spec_kv.mod_revision),
            *(Compare(keys.slot(i), "create", "==", 0) for i in picks),
            Compare(keys.slot(limit), "create", "==", 0, range_end=keys.slots_end),
            Compare(keys.waiters, "create", "==", 0, range_end=keys.waiters_end)]
        await lease.release()

    await (await client.claim(job, "me")).release()  # the view is made (and warm)
    await claim_and_check(1)
    await claim_and_check(1)  # warm: the same kept compares
    await sems.create(DB, 3)  # raised at runtime
    await claim_and_check(1)
    await sems.create(DB, 1)  # lowered
    await claim_and_check(1)
    await sems.delete(DB)
    await sems.create(DB, 1)  # re-created with the same limit: a new spec revision
    await claim_and_check(1)
    await sems.create(DB, 4)
    await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=0,
                                       semaphores=(SemaphoreUse("billing-db", 2),)))
    await claim_and_check(2)  # the weight changed
    # a waiter comes: the view's state shows it (a plain claim is refused), then goes
    lease_id, _ = await client.store.grant(30)
    waiter = keys.waiter("t-other")
    revision = await client.store.put(waiter, WaiterRecord("x", "o", 1).encode(), lease_id)
    view = client._views[keys.prefix]
    await _until_seen(view, revision)
    state = view.state_now()
    assert state is not None and [kv.key for kv in state.waiters] == [waiter]
    try:
        await client.claim(job, "me")
    except SemaphoreFullError:
        pass
    else:
        raise AssertionError("a claim jumped the line")
    await client.store.revoke(lease_id)
    revision = (await client.store.get(keys.spec))[0]
    await _until_seen(view, revision)
    state = view.state_now()
    assert state is not None and state.waiters == []
    await claim_and_check(2)


async def test_our_claims_and_completions_are_applied_by_index_as_by_key(
        client: JobLeaseClient) -> None:
    """``took``/``freed`` (a claim's slots, a completion's) change a view as
    ``applied`` does from the keys: at once, and never undone by an older change."""
    await Semaphores(client).create(DB, 8)
    keys = client.keys.semaphore(DB)
    by_index, by_key = SemaphoreView(client.store, DB, keys), SemaphoreView(client.store, DB, keys)
    try:
        for view in (by_index, by_key):
            assert await view.state() is not None
        now = max(by_index.revision, by_key.revision)  # nobody else writes: later ones are ours
        marks = {by_index: by_index.changes, by_key: by_key.changes}
        by_index.took(now + 1, (3, 5), b"mine", 77)
        by_key.applied(now + 1, [(keys.slot(3), b"mine", 77), (keys.slot(5), b"mine", 77)])
        by_index.freed(now + 2, (3,))
        by_key.applied(now + 2, (), [keys.slot(3)])
        by_index.took(now + 1, (3,), b"older", 77)  # older than our delete: ignored
        by_key.applied(now + 1, [(keys.slot(3), b"older", 77)])
        for view in (by_index, by_key):
            state = view.state_now()
            assert state is not None
            assert {i: (kv.value, kv.mod_revision, kv.lease) for i, kv in state.slots.items()} \
                == {5: (b"mine", now + 1, 77)}
            assert view.changes == marks[view] + 1  # the one freed slot
            _free_kept(state)
    finally:
        await by_index.close()
        await by_key.close()


async def test_the_free_slots_a_view_keeps_follow_a_limit_changed_while_slots_are_held(
        client: JobLeaseClient) -> None:
    """The view keeps the free indexes below the limit (a pick on a busy
    semaphore takes from them): a limit raised or lowered while slots are
    live, and a slot freed above a lowered limit, leave exactly the indexes
    below the limit with no live slot."""
    sems = Semaphores(client)
    keys = client.keys.semaphore(DB)
    await sems.create(DB, 3)
    jobs = await _jobs(client, 3, ttl=30)
    held = [await client.claim(job, "me") for job in jobs]  # all three slots
    view = client._views[keys.prefix]
    _free_kept(view.state_now())
    for limit in (5, 2, 4, 1):
        revision = await sems.create(DB, limit)
        await _until_seen(view, revision)
        state = view.state_now()
        assert state is not None and state.limit == limit
        _free_kept(state)
    for lease in held:
        await lease.release()
        _free_kept(view.state_now())
    state = view.state_now()
    assert state is not None and set(state.free or ()) == {0}
