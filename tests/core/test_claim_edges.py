"""Claims, unregisters and sessions at the edges: unknown outcomes, late copies,
slow keep-alive answers, long-lived clients.

Each test puts a fault at one exact step with :class:`FaultyStore` (a real
etcd behind a wrapper that can lose an answer, hold a request back and let
it land later, fail reads or revokes, or hold a keep-alive answer) and
checks the guarantee named in its title: a truthful answer, and nothing left
behind that nobody owns.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from joblease import (
    EtcdConfig,
    JobLeaseClient,
    JobRef,
    JobSpec,
    OutcomeUnknownError,
    Phase,
)
from joblease.store import Compare, TxnOp, TxnResult
from tests.core.faulty_store import FaultyStore, is_unregister


async def eventually(predicate: Callable[[], Any], timeout: float, what: str,
                     interval: float = 0.01) -> Any:
    """Await ``predicate()`` (sync or async) until truthy; fail after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(etcd_config)
    async with JobLeaseClient(etcd_config, store=store) as c:
        yield c, store
        store.fail_reads = store.fail_revokes = False
        store.on_txn = None
        store.on_revoke = None
        store.reply_gate = None


# -- unregister -----------------------------------------------------------------------------


async def test_unregister_resent_after_an_unknown_outcome_never_erases_a_newer_registration(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 1: the first copy commits, its answer is lost, and before the client
    settles it the job is registered, claimed and completed again. The new job
    and its result must survive (a blind re-send of the prefix delete erased them)."""
    c, store = faulty
    job = JobRef("default", "reincarnated")
    await client.register(job, JobSpec(10, 3))
    newer: dict[str, Any] = {}

    async def first_copy_commits_then_job_is_reborn(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if not is_unregister(success) or newer:
            return await store.inner.txn(compares, success, failure)
        r = await store.inner.txn(compares, success, failure)
        assert r.succeeded
        await client.register(job, JobSpec(10, 3))
        lease = await client.claim(job, "worker-b")
        newer["record"] = await lease.complete({"n": 2})
        raise OutcomeUnknownError("test: the unregister's answer was lost")

    store.on_txn = first_copy_commits_then_job_is_reborn
    await c.unregister(job)
    state = await client.get(job)
    assert state.registered, "the re-sent unregister deleted a newer registration"
    assert state.result is not None and state.result == newer["record"]
    assert state.phase is Phase.COMPLETED


async def test_unregister_whose_request_was_lost_is_sent_again_and_deletes_the_job(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    c, store = faulty
    job = JobRef("default", "lost-unregister")
    await client.register(job, JobSpec(10, 3))
    lease = await client.claim(job, "worker-a")
    lost: list[bool] = []

    async def lose_the_first_request(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if is_unregister(success) and not lost:
            lost.append(True)
            raise OutcomeUnknownError("test: the request never reached etcd")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = lose_the_first_request
    await c.unregister(job)
    assert lost
    state = await client.get(job)
    assert not state.registered and state.holder is None and state.generation == 0
    await eventually(lambda: not lease.valid, 10, "the holder to learn it lost the job")
