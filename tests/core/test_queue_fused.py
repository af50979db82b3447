"""A completion fused with the next claim (``Queues.complete_next``, docs/queues.md,
"Complete and claim the next") on a real etcd: its effects are the two-step
path's, the next item's token is the commit revision, a lost race for the next
item still completes the held one, a lost answer is read back truthfully (the
fault-injecting store loses it, the one thing faked), a queue with a history
or semaphore slots takes the two-step path, and a drain sends about one
transaction per item."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.errors import OutcomeUnknownError, StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.keys import ItemRef, QueueRef
from joblease.lease import Lease, LeaseState
from joblease.queue import READ_AHEAD, Queues
from joblease.records import QueueSpec, ResultRecord
from joblease.store import Compare, Put, Store, Txn, TxnOp, TxnResult
from tests.support.faulty_store import FaultyStore
from tests.support.waiting import poll

TTL = 30


async def _state(store: Store, prefix: bytes) -> dict[str, str]:
    """A queue's keys without revisions, claim ids and wall clocks."""
    _, kvs = await store.get(prefix, prefix=True)
    out: dict[str, str] = {}
    for kv in kvs:
        rel = kv.key[len(prefix):].decode()
        if rel.startswith("results/"):
            rec = ResultRecord.decode(kv.value)
            out[rel] = f"{rec.owner} {rec.generation} {rec.result}"
        elif rel.startswith("claims/"):
            out[rel] = f"version {kv.version}"
        elif rel != "spec":
            out[rel] = "present"
    return out


async def _drain(queues: Queues, queue: QueueRef, fused: bool, limit: int) -> list[int]:
    """Claim and complete until nothing is claimable, at most ``limit`` items (a
    broken completion that leaves items claimable fails, not hangs)."""
    tokens: list[int] = []
    lease = await queues.claim_next(queue, "worker")
    while lease is not None:
        assert len(tokens) < limit, f"still claiming after {limit} items"
        tokens.append(lease.token)
        assert isinstance(lease.job, ItemRef)
        nxt: Lease | None = None
        if fused:
            _, nxt = await queues.complete_next(lease, {"id": lease.job.id})
        else:
            await lease.complete({"id": lease.job.id})
        lease = nxt if nxt is not None else await queues.claim_next(queue, "worker")
    return tokens


async def test_the_fused_path_leaves_what_the_two_step_path_leaves(client: JobLeaseClient
                                                                  ) -> None:
    queues = Queues(client)
    states = {}
    for fused in (False, True):
        q = QueueRef("default", f"fused-{str(fused).lower()}")
        await queues.create(q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
        ids = [f"i{i:03d}" for i in range(READ_AHEAD + 5)]  # a fused completion empties a pool
        await queues.enqueue(q, [(i, {"id": i}) for i in ids])
        tokens = await _drain(queues, q, fused, len(ids))
        assert len(tokens) == len(ids) and tokens == sorted(tokens)
        counts = await queues.counts(q)
        assert (counts.completed, counts.pending, counts.held, counts.failed) == (len(ids), 0, 0, 0)
        states[fused] = await _state(queues.store, queues.keys(q).prefix)
        for i in ids:
            assert (await queues.item(ItemRef(q, i))).generation == 1
    assert states[True] == states[False]


async def _two_items(queues: Queues, q: QueueRef, spec: QueueSpec) -> Lease:
    await queues.create(q, spec)
    await queues.enqueue(q, [("a", {"id": "a"}), ("b", {"id": "b"})])
    lease = await queues.claim_next(q, "worker")
    assert lease is not None
    return lease


def _other(lease: Lease) -> str:
    assert isinstance(lease.job, ItemRef)
    return "b" if lease.job.id == "a" else "a"


async def test_the_next_items_token_is_the_commit_revision(client: JobLeaseClient) -> None:
    queues = Queues(client)
    q = QueueRef("default", "next")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    record, nxt = await queues.complete_next(lease, 7)
    assert nxt is not None and isinstance(nxt.job, ItemRef) and nxt.job.id == _other(lease)
    assert record.revision == nxt.token and nxt.generation == 1 and nxt.valid
    assert nxt.item is not None and nxt.item.payload == {"id": nxt.job.id}
    state = await queues.item(nxt.job)
    assert state.token == nxt.token
    await nxt.complete(8)
    assert (await queues.counts(q)).completed == 2


async def test_a_lost_race_for_the_next_item_still_completes_the_held_one(
        client: JobLeaseClient, etcd_config: EtcdConfig) -> None:
    queues = Queues(client)
    q = QueueRef("default", "race")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    async with JobLeaseClient(etcd_config) as other_client:
        rival = await Queues(other_client).claim(ItemRef(q, _other(lease)), "rival")
        record, nxt = await queues.complete_next(lease, 7)
        assert nxt is None and record.token == lease.token
        assert lease.state is LeaseState.COMPLETED
        assert (await queues.item(ItemRef(q, _other(lease)))).token == rival.token
        counts = await queues.counts(q)
        assert (counts.completed, counts.held, counts.pending) == (1, 1, 0)


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[Queues, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        yield Queues(c), store
        store.on_txn = None


def _fused(success: Sequence[TxnOp]) -> bool:
    return any(isinstance(op, Txn) for op in success) and any(
        isinstance(op, Put) and b"/results/" in op.key for op in success)


async def test_a_fused_completion_whose_answer_was_lost_is_read_back_with_its_claim(
        faulty: tuple[Queues, FaultyStore]) -> None:
    queues, store = faulty
    q = QueueRef("default", "lost")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    lost: list[int] = []
    store.on_txn = _losing_the_fused_answer(store, lost)
    record, nxt = await queues.complete_next(lease, 7)
    assert lost and record.claim_id == lease.claim_id and lease.state is LeaseState.COMPLETED
    assert nxt is not None and nxt.token == lost[0] and nxt.generation == 1 and nxt.valid
    assert nxt.item is not None and isinstance(nxt.job, ItemRef)
    assert nxt.item.payload == {"id": nxt.job.id}
    await nxt.complete(8)
    assert (await queues.counts(q)).completed == 2


async def test_a_read_back_never_adopts_another_claimers_holder_of_the_next_item(
        faulty: tuple[Queues, FaultyStore], etcd_config: EtcdConfig) -> None:
    queues, store = faulty
    q = QueueRef("default", "lost-race")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    async with JobLeaseClient(etcd_config) as other_client:
        rival = await Queues(other_client).claim(ItemRef(q, _other(lease)), "rival")
        lost: list[int] = []
        store.on_txn = _losing_the_fused_answer(store, lost)
        record, nxt = await queues.complete_next(lease, 7)
        assert lost and nxt is None and record.claim_id == lease.claim_id
        assert (await queues.item(ItemRef(q, _other(lease)))).token == rival.token


async def test_a_fused_completion_never_sent_is_sent_again(
        faulty: tuple[Queues, FaultyStore]) -> None:
    """The answer lost before the request reached etcd: the read-back finds the
    held item still ours, and the same transaction is sent again."""
    queues, store = faulty
    q = QueueRef("default", "dropped")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    dropped: list[bool] = []

    async def drop_first(compares: Sequence[Compare], success: Sequence[TxnOp],
                         failure: Sequence[TxnOp]) -> TxnResult:
        if _fused(success) and not dropped:
            dropped.append(True)
            raise OutcomeUnknownError("injected: lost on its way")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = drop_first
    record, nxt = await queues.complete_next(lease, 7)
    assert dropped and nxt is not None and record.revision == nxt.token
    assert not store.revoked


async def test_a_queue_with_a_history_completes_without_a_fused_claim(
        client: JobLeaseClient) -> None:
    queues = Queues(client)
    q = QueueRef("default", "history")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3,
                                                  history_limit=2))
    _, nxt = await queues.complete_next(lease, 7)
    assert nxt is None and lease.state is LeaseState.COMPLETED


async def test_a_fused_drain_sends_about_one_transaction_per_item(
        etcd_config: EtcdConfig) -> None:
    store = FaultyStore(EtcdStore(etcd_config))
    sent: list[bool] = []

    async def count(compares: Sequence[Compare], success: Sequence[TxnOp],
                    failure: Sequence[TxnOp]) -> TxnResult:
        sent.append(True)
        return await store.inner.txn(compares, success, failure)

    async with JobLeaseClient(etcd_config, store=store) as c:
        queues = Queues(c)
        q = QueueRef("default", "per-item")
        await queues.create(q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
        n = 2 * READ_AHEAD
        await queues.enqueue(q, [(f"i{i:03d}", None) for i in range(n)])
        await queues.spec(q)
        store.on_txn = count
        assert len(await _drain(queues, q, fused=True, limit=n)) == n
        store.on_txn = None
    # one candidate read (the library reads ahead at least READ_AHEAD_MIN keys:
    # every item), the first claim, n - 1 fused completions, the last one
    # alone (the pool is empty) and the read that finds nothing left
    assert len(sent) == n + 3, len(sent)


def _losing_the_fused_answer(store: FaultyStore, lost: list[int], *,
                             then_fail_reads: bool = False) -> Callable[
                                 [Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]],
                                 Awaitable[TxnResult]]:
    """An ``on_txn`` that sends every transaction, but loses the answer of the first
    fused one (its commit revision goes in ``lost``); with ``then_fail_reads``,
    every read-only transaction after it fails (etcd cannot be read back)."""
    async def on_txn(compares: Sequence[Compare], success: Sequence[TxnOp],
                     failure: Sequence[TxnOp]) -> TxnResult:
        if then_fail_reads and lost and _read_only(compares, success):
            raise StoreUnavailableError("injected: etcd unreachable for the read-back")
        r = await store.inner.txn(compares, success, failure)
        if _fused(success) and not lost:
            lost.append(r.revision)
            raise OutcomeUnknownError("injected: the fused completion's answer was lost")
        return r
    return on_txn

def _read_only(compares: Sequence[Compare], success: Sequence[TxnOp]) -> bool:
    return not compares and all(not isinstance(op, (Put, Txn)) for op in success)


async def _assert_session_revoked(queues: Queues, store: FaultyStore, lease: Lease,
                                  q: QueueRef) -> None:
    """The session's etcd lease is gone in etcd, and no holder of the queue is left."""
    assert lease.lease_id in store.revoked
    assert await store.inner.time_to_live(lease.lease_id) == -1
    _, held = await store.inner.get(queues.keys(q).field_prefix("held"), prefix=True)
    assert held == []


async def test_a_fused_completion_whose_read_back_fails_revokes_the_session(
        faulty: tuple[Queues, FaultyStore]) -> None:
    """The fused transaction commits, its answer is lost, and etcd cannot be read
    back (for the fixture client's read_back_timeout, 0.5 s): the claim sent with
    it may have committed (it has), so the session's lease is revoked before
    "outcome unknown" is answered (docs/queues.md)."""
    queues, store = faulty
    q = QueueRef("default", "readback-fails")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    lost: list[int] = []
    store.on_txn = _losing_the_fused_answer(store, lost, then_fail_reads=True)
    with pytest.raises(OutcomeUnknownError, match="revoked"):
        await queues.complete_next(lease, 7)
    store.on_txn = None
    assert lost  # the fused claim committed: its holder was bound to the session
    await _assert_session_revoked(queues, store, lease, q)


async def test_three_fused_copies_that_find_the_item_still_ours_revoke_the_session(
        faulty: tuple[Queues, FaultyStore]) -> None:
    """Every copy is lost on its way (one may still be in flight and commit): after
    three read-backs that find the held item still ours, the session's lease is
    revoked before "outcome unknown" is answered."""
    queues, store = faulty
    q = QueueRef("default", "three-copies")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    dropped: list[bool] = []

    async def drop_every_copy(compares: Sequence[Compare], success: Sequence[TxnOp],
                              failure: Sequence[TxnOp]) -> TxnResult:
        if _fused(success):
            dropped.append(True)
            raise OutcomeUnknownError("injected: lost on its way")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = drop_every_copy
    with pytest.raises(OutcomeUnknownError, match="revoked"):
        await queues.complete_next(lease, 7)
    store.on_txn = None
    assert len(dropped) == 3
    await _assert_session_revoked(queues, store, lease, q)


async def test_a_fused_completion_cancelled_in_flight_leaves_no_holder_renewed(
        faulty: tuple[Queues, FaultyStore]) -> None:
    """Cancelling a fused completion whose transaction committed but whose answer
    never came (the fault-injecting store withholds it) must not leave the next
    item's holder, which no handle knows of, renewed by the session: the session
    is ended, so its etcd lease goes and no holder of the queue is left."""
    queues, store = faulty
    q = QueueRef("default", "cancelled")
    lease = await _two_items(queues, q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3))
    committed = asyncio.Event()

    async def commit_and_never_answer(compares: Sequence[Compare], success: Sequence[TxnOp],
                                      failure: Sequence[TxnOp]) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if _fused(success):
            committed.set()
            await asyncio.Event().wait()
        return r

    store.on_txn = commit_and_never_answer
    task = asyncio.create_task(queues.complete_next(lease, 7))
    await asyncio.wait_for(committed.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    store.on_txn = None
    # the fused claim committed (its claims key is not bound to the session): the
    # case under test
    _, claims = await store.inner.get(queues.keys(q).item(_other(lease)).claims)
    assert [kv.version for kv in claims] == [1]

    async def revoked() -> bool:
        return await store.inner.time_to_live(lease.lease_id) == -1

    await poll(revoked, 5, "the session's etcd lease to be revoked (TTL is 30 s)",
               interval=0.01)
    await _assert_session_revoked(queues, store, lease, q)
