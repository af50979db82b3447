"""A waiter wakes when the holder goes, not a backoff later (real etcd).

``JobLeaseClient.wait_for_holder_change`` watches the job's holder key from the
revision a refused claim saw it at: a release or an expiry wakes the waiter, and
a claim right after it wins. With nothing changing it waits out its timeout.
"""

from __future__ import annotations

import time

import pytest

from joblease import HeldError, JobLeaseClient, JobRef, JobSpec, Lease

TTL = 2


async def _held_by_a(client: JobLeaseClient, job: JobRef, a: JobLeaseClient
                     ) -> tuple[Lease, HeldError]:
    await client.register(job, JobSpec(lease_duration_seconds=TTL, max_attempts=5))
    lease = await a.claim(job, "worker-a")
    with pytest.raises(HeldError) as held:
        await client.claim(job, "worker-b")
    assert held.value.revision >= lease.token  # the revision the holder was seen at
    return lease, held.value


async def test_a_release_wakes_the_waiter_at_once(client: JobLeaseClient) -> None:
    job = JobRef("default", "wait-release")
    async with JobLeaseClient(client.config) as a:
        lease, held = await _held_by_a(client, job, a)
        await lease.release()
        began = time.monotonic()
        # the release happened before the wait began: the watch from the seen
        # revision still reports it (no lost wake-up)
        assert await client.wait_for_holder_change(job, held.revision, timeout=30)
        assert time.monotonic() - began < 5
        b = await client.claim(job, "worker-b")
        assert b.generation == 2


async def test_an_expiry_wakes_the_waiter_within_the_ttl(client: JobLeaseClient) -> None:
    job = JobRef("default", "wait-expiry")
    async with JobLeaseClient(client.config) as a:
        lease, held = await _held_by_a(client, job, a)
        assert lease._session is not None  # test-only: A stops renewing (a paused process)
        await lease._session.close(revoke=False)
        began = time.monotonic()
        assert await client.wait_for_holder_change(job, held.revision, timeout=TTL + 20)
        waited = time.monotonic() - began
        # etcd expires the lease after its TTL (it checks about twice a second)
        assert waited < TTL + 5, waited
        b = await client.claim(job, "worker-b")
        assert b.token > lease.token


async def test_without_a_change_it_waits_out_the_timeout(client: JobLeaseClient) -> None:
    job = JobRef("default", "wait-timeout")
    async with JobLeaseClient(client.config) as a:
        _, held = await _held_by_a(client, job, a)
        began = time.monotonic()
        assert not await client.wait_for_holder_change(job, held.revision, timeout=1.0)
        assert 0.9 <= time.monotonic() - began < 10
        with pytest.raises(HeldError):
            await client.claim(job, "worker-b")
