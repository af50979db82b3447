"""The protocol's verbs and typed errors against a real etcd."""

from __future__ import annotations

import asyncio

import pytest

from joblease import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    HeldError,
    JobLeaseClient,
    JobRef,
    JobSpec,
    NotRegisteredError,
    Phase,
    StaleTokenError,
)
from joblease.lease import LeaseState


async def test_claim_of_unregistered_job_is_refused(client: JobLeaseClient) -> None:
    with pytest.raises(NotRegisteredError) as info:
        await client.claim(JobRef("default", "nope"), "w")
    assert info.value.exit_code == 3 and info.value.http_status == 404


async def test_register_is_idempotent_and_update_changes_the_spec(client: JobLeaseClient) -> None:
    job = JobRef("team-a", "idem")
    r1 = await client.register(job, JobSpec(10, 3, {"input": "x"}))
    _, kvs1 = await client.store.get(client.keys.job(job).spec)
    await client.register(job, JobSpec(10, 3, {"input": "x"}))
    _, kvs2 = await client.store.get(client.keys.job(job).spec)
    assert kvs1[0].mod_revision == kvs2[0].mod_revision == r1, "re-registering wrote again"
    await client.register(job, JobSpec(20, 5))
    state = await client.get(job)
    assert state.spec == JobSpec(20, 5)


async def test_a_claimed_job_cannot_be_claimed_again_until_released(
    client: JobLeaseClient, etcd_config: object
) -> None:
    job = JobRef("default", "held")
    await client.register(job, JobSpec(10, 0))
    lease = await client.claim(job, "a")
    async with JobLeaseClient(client.config) as other:
        with pytest.raises(HeldError) as info:
            await other.claim(job, "b")
        assert info.value.owner == "a" and info.value.token == lease.token
        await lease.release()
        assert lease.state is LeaseState.RELEASED
        second = await other.claim(job, "b")
        assert second.generation == lease.generation + 1
        assert second.token > lease.token
        with pytest.raises(StaleTokenError):
            await lease.complete("late")  # released: no longer the holder
        await second.release()


async def test_completed_job_is_never_claimed_again(client: JobLeaseClient) -> None:
    job = JobRef("default", "done")
    await client.register(job, JobSpec(10, 0))
    lease = await client.claim(job, "a")
    record = await lease.complete({"answer": 42})
    assert record.generation == 1 and record.token == lease.token
    with pytest.raises(AlreadyCompletedError) as info:
        await client.claim(job, "b")
    assert info.value.token == lease.token
    assert (await lease.complete({"answer": 42})) == record  # idempotent for the completer
    state = await client.get(job)
    assert state.phase is Phase.COMPLETED and state.result is not None
    assert state.result.result == {"answer": 42}


async def test_attempts_are_bounded_by_max_attempts(client: JobLeaseClient) -> None:
    job = JobRef("default", "bounded")
    await client.register(job, JobSpec(10, max_attempts=2))
    for _ in range(2):
        lease = await client.claim(job, "w")
        await lease.release()
    with pytest.raises(AttemptsExhaustedError) as info:
        await client.claim(job, "w")
    assert info.value.attempts == 2 and info.value.max_attempts == 2
    assert (await client.get(job)).phase is Phase.FAILED


async def test_unregistering_a_held_job_makes_the_holder_lose_it(client: JobLeaseClient) -> None:
    job = JobRef("default", "deleted")
    await client.register(job, JobSpec(3, 0))
    lease = await client.claim(job, "w")
    await client.unregister(job)
    state = await asyncio.wait_for(lease.wait_done(), timeout=5)
    assert state is LeaseState.LOST
    assert lease.lost_reason is not None and "deleted" in lease.lost_reason
    assert not (await client.get(job)).registered


async def test_a_spec_change_is_picked_up_by_the_next_claim(client: JobLeaseClient) -> None:
    job = JobRef("default", "respec")
    await client.register(job, JobSpec(10, 0))
    first = await client.claim(job, "w")  # caches the spec (TTL 10)
    assert first.ttl == 10
    await first.release()
    async with JobLeaseClient(client.config) as other:
        await other.register(job, JobSpec(4, 0))
    fresh = await client.claim(job, "w")  # stale cached spec fails the compare; re-read
    assert fresh.ttl == 4
    assert fresh.generation == 2


async def test_a_claim_after_re_registration_uses_the_new_specs_conditions(
    client: JobLeaseClient,
) -> None:
    """The claim's compares are built once per cached spec (joblease.lease.JobOps):
    after another client re-registers the job with more attempts, this client's
    next claim compares against the new spec revision and the new limit, not the
    conditions it built for the old spec."""
    job = JobRef("default", "respec-attempts")
    await client.register(job, JobSpec(10, max_attempts=1))
    await (await client.claim(job, "w")).release()  # the one attempt; ops cached
    with pytest.raises(AttemptsExhaustedError):
        await client.claim(job, "w")
    async with JobLeaseClient(client.config) as other:
        await other.register(job, JobSpec(10, max_attempts=3))
    second = await client.claim(job, "w")
    assert second.generation == 2
    await second.complete("done")
    assert (await client.get(job)).result is not None


async def test_complete_from_another_process_uses_the_holder_condition(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "by-token")
    await client.register(job, JobSpec(10, 0))
    lease = await client.claim(job, "w")
    async with JobLeaseClient(client.config) as cli:
        with pytest.raises(StaleTokenError):
            await cli.lease_for(job, "w", lease.token + 1)
        with pytest.raises(StaleTokenError):
            await cli.lease_for(job, "someone-else", lease.token)
        handle = await cli.lease_for(job, "w", lease.token)
        record = await handle.complete({"from": "cli"})
    assert record.token == lease.token
    assert await asyncio.wait_for(lease.wait_done(), 5) is LeaseState.LOST


async def test_watch_reports_each_change_in_revision_order(client: JobLeaseClient) -> None:
    job = JobRef("default", "watched")
    await client.register(job, JobSpec(10, 0))
    seen: list[tuple[int, str]] = []
    snapshot_taken = asyncio.Event()

    async def consume() -> None:
        async for state in client.watch():
            seen.append((state.revision, state.phase.value))
            snapshot_taken.set()
            if state.phase is Phase.COMPLETED:
                return

    task = asyncio.create_task(consume())
    await asyncio.wait_for(snapshot_taken.wait(), 10)
    lease = await client.claim(job, "w")
    await lease.complete(None)
    await asyncio.wait_for(task, 10)
    revisions = [r for r, _ in seen]
    assert revisions == sorted(revisions)
    assert [p for _, p in seen] == ["Pending", "Claimed", "Completed"]


async def test_list_returns_every_job_from_one_snapshot(client: JobLeaseClient) -> None:
    for i in range(5):
        await client.register(JobRef("ns-a" if i % 2 else "ns-b", f"job-{i}"), JobSpec(10))
    every = await client.list()
    assert len(every) == 5 and len({s.revision for s in every}) == 1
    assert {s.job.name for s in await client.list("ns-a")} == {"job-1", "job-3"}


async def test_batched_holder_checks_find_exactly_the_lost_holder(
    client: JobLeaseClient,
) -> None:
    """Many holders on one session are re-checked in chunks after each
    keep-alive; a failing chunk is narrowed down to the handle that lost."""
    jobs = [JobRef("default", f"many-{i}") for i in range(70)]  # two chunks of <= 64
    for job in jobs:
        await client.register(job, JobSpec(3, 0))
    leases = [await client.claim(job, "w") for job in jobs]
    await client.unregister(jobs[65])
    state = await asyncio.wait_for(leases[65].wait_done(), timeout=5)
    assert state is LeaseState.LOST
    renewed = leases[0].last_renewal
    async with asyncio.timeout(5):  # another keep-alive and its holder checks pass
        while leases[0].last_renewal == renewed:
            await asyncio.sleep(0.05)
    assert [i for i, lease in enumerate(leases) if not lease.valid] == [65]
