"""``JobLeaseClient.claim_waiting``: the one loop that waits for a held job (real etcd).

It is what ``joblease claim --wait`` and ``joblease run --wait`` use. It waits
on a watch of the holder key (woken by a release at once), gives up with the
last ``HeldError`` when its wait is over, ends at the first answer that is not
"held" (a job completed meanwhile), and gives up with ``WaitSessionLostError``
when its own etcd session is lost while it waits: the fault-injecting store
freezes that session's keep-alives (the one thing faked; etcd is real).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, Lease
from joblease.errors import (
    AlreadyCompletedError,
    HeldError,
    InvalidInputError,
    StoreUnavailableError,
    WaitSessionLostError,
)
from joblease.etcd_store import EtcdStore
from joblease.store import KeepAlive
from tests.support.faulty_store import FaultyStore
from tests.support.waiting import poll


@pytest.fixture
async def holder(client: JobLeaseClient) -> AsyncIterator[JobLeaseClient]:
    async with JobLeaseClient(client.config) as a:
        yield a


async def _waiting(client: JobLeaseClient, job: JobRef, wait: float
                   ) -> tuple[asyncio.Task[Lease], list[HeldError]]:
    seen: list[HeldError] = []
    task = asyncio.create_task(client.claim_waiting(job, "worker-b", wait, on_held=seen.append))
    await poll(lambda: seen or task.done(), 30, "the waiter to see the holder")
    return task, seen


async def test_a_waiter_claims_as_soon_as_the_holder_releases(
    client: JobLeaseClient, holder: JobLeaseClient,
) -> None:
    job = JobRef("default", "wait-then-claim")
    await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=5))
    a = await holder.claim(job, "worker-a")
    task, seen = await _waiting(client, job, 120)
    assert [(h.owner, h.token) for h in seen] == [("worker-a", a.token)]
    await a.release()
    released = time.monotonic()
    b = await asyncio.wait_for(task, 30)
    # woken by the watch, not by the next capped wait (the TTL: 30 s)
    assert time.monotonic() - released < 10
    assert b.owner == "worker-b" and b.generation == 2


async def test_the_last_held_error_is_raised_once_the_wait_is_over(
    client: JobLeaseClient, holder: JobLeaseClient,
) -> None:
    job = JobRef("default", "wait-over")
    await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=5))
    a = await holder.claim(job, "worker-a")
    began = time.monotonic()
    with pytest.raises(HeldError) as held:
        await client.claim_waiting(job, "worker-b", 1.0)
    assert 0.9 <= time.monotonic() - began < 20
    assert held.value.token == a.token
    with pytest.raises(InvalidInputError):
        await client.claim_waiting(job, "worker-b", -1)


async def test_a_job_completed_while_waiting_ends_the_wait_with_that_answer(
    client: JobLeaseClient, holder: JobLeaseClient,
) -> None:
    job = JobRef("default", "wait-completed")
    await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=5))
    a = await holder.claim(job, "worker-a")
    task, _ = await _waiting(client, job, 120)
    await a.complete({"by": "a"})
    with pytest.raises(AlreadyCompletedError):
        await asyncio.wait_for(task, 30)


async def test_a_waiter_whose_own_session_is_lost_gives_up_and_never_claims(
    etcd_config: EtcdConfig, client: JobLeaseClient, holder: JobLeaseClient,
) -> None:
    """The waiter's keep-alives stop reaching etcd (frozen); at its session's
    local deadline it gives up, though it could still talk to etcd to claim."""
    job = JobRef("default", "wait-session-lost")
    await client.register(job, JobSpec(lease_duration_seconds=2, max_attempts=5))
    await holder.claim(job, "worker-a")
    store = FaultyStore(EtcdStore(etcd_config))

    async def frozen(stream: KeepAlive, timeout: float) -> int:
        await asyncio.sleep(timeout)
        raise StoreUnavailableError("test: keep-alives frozen")

    store.renew_hook = frozen
    async with JobLeaseClient(etcd_config, store=store) as waiter:
        began = time.monotonic()
        with pytest.raises(WaitSessionLostError):
            await asyncio.wait_for(waiter.claim_waiting(job, "worker-b", 120), 60)
        assert time.monotonic() - began < 30
    state = await client.get(job)
    assert state.holder is not None and state.holder.owner == "worker-a"
    assert state.generation == 1
