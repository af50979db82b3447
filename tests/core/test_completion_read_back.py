"""An ambiguous completion's read-back accepts only its own result (invariant ``read-back``).

A completion whose answer was lost is confirmed by finding *its* result: the
stored record must carry this claim's id. A read-back that took any stored
result as its own would let a worker whose lease ended report another
worker's completion as its own success; only the chaos run would notice.
Here that is tested directly: A's lease ends, B claims and completes, then
A's completion has an unknown outcome (the fault-injecting store loses it
before it reaches etcd, the one thing faked), and the read-back finds B's
result. Real etcd behind everything.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, Phase
from joblease.errors import OutcomeUnknownError, StaleTokenError
from joblease.etcd_store import EtcdStore
from joblease.store import Compare, TxnOp, TxnResult
from tests.support.faulty_store import FaultyStore, is_completion
from tests.support.waiting import poll


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        yield c, store
        store.on_txn = None


async def test_ambiguous_completion_after_another_worker_completed_is_refused_as_stale(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    a_client, store = faulty
    job = JobRef("default", "late-ambiguous-completion")
    await client.register(job, JobSpec(lease_duration_seconds=2, max_attempts=3))
    a = await a_client.claim(job, "worker-a")

    # A's lease ends: its etcd lease is revoked behind its back (as etcd would
    # expire it), so the holder key goes and A's handle learns it lost.
    await store.inner.revoke(a.lease_id)
    await poll(lambda: not a.valid, 10, "A to notice its lease ended")

    b = await client.claim(job, "worker-b")
    b_record = await b.complete({"by": "b"})
    assert b.token > a.token

    lost: list[bool] = []

    async def lose_the_completion(compares: Sequence[Compare], success: Sequence[TxnOp],
                                  failure: Sequence[TxnOp]) -> TxnResult:
        if is_completion(success) and not lost:
            lost.append(True)  # never reaches etcd; A cannot tell
            raise OutcomeUnknownError("injected: the completion's answer was lost")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = lose_the_completion
    with pytest.raises(StaleTokenError) as refused:
        await a.complete({"by": "a"})
    assert lost, "A's completion was not made ambiguous"
    assert refused.value.token == a.token
    assert refused.value.current_token == b.token == b_record.token
    assert refused.value.current_owner == "worker-b"
    assert a.result is None

    state = await client.get(job)
    assert state.phase is Phase.COMPLETED
    assert state.result is not None
    assert state.result.claim_id == b.claim_id and state.result.result == {"by": "b"}
