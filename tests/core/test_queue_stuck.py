"""A pending key that outlives its item's completion, or its item record (states
joblease never writes: the completion deletes the pending key in its own
transaction, enqueue writes both keys in one; made here by hand, as a tenant
with write access to its prefix could) must not make ``claim_next`` read, claim
and be refused without end, nor a claim commit a holder for an item it cannot
hand over. Against the session's real etcd; the
transactions sent are counted by the fault-injecting store, which forwards them
all (nothing is faked)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.errors import CorruptRecordError, ItemRecordMissingError
from joblease.etcd_store import EtcdStore
from joblease.keys import ItemRef, QueueRef
from joblease.queue import Queues, _Pool
from joblease.records import QueueSpec
from joblease.store import Compare, Delete, Get, TxnOp, TxnResult
from tests.support.faulty_store import FaultyStore
from tests.support.waiting import poll


@pytest.fixture
async def counted(etcd_config: EtcdConfig
                  ) -> AsyncIterator[tuple[Queues, list[int], EtcdStore]]:
    """Queues on a client whose every transaction is counted (one entry each),
    and a plain store of the same etcd (for the writes by hand)."""
    store = FaultyStore(EtcdStore(etcd_config))
    sent: list[int] = []

    async def count(compares: Sequence[Compare], success: Sequence[TxnOp],
                    failure: Sequence[TxnOp]) -> TxnResult:
        sent.append(1)
        return await store.inner.txn(compares, success, failure)

    store.on_txn = count
    async with JobLeaseClient(etcd_config, store=store) as c:
        yield Queues(c), sent, store.inner
    store.on_txn = None


async def _completed_but_pending(queues: Queues, store: EtcdStore, q: QueueRef,
                                 ids: Sequence[str]) -> None:
    """Create ``q``, enqueue and complete ``ids``, then put each one's pending key
    back as it was (by hand: the state under test)."""
    await queues.create(q, QueueSpec(lease_duration_seconds=30, max_attempts=3))
    await queues.enqueue(q, [(i, None) for i in ids])
    saved = {}
    for i in ids:
        keys = queues.keys(q).item(i)
        _, kvs = await store.get(keys.pending)
        saved[keys.pending] = kvs[0].value
        await (await queues.claim(ItemRef(q, i), "done-before")).complete()
    for key, value in saved.items():
        await store.put(key, value)


async def test_only_stuck_pending_keys_left_is_a_clear_error_not_a_loop(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    queues, sent, store = counted
    q = QueueRef("default", "stuck")
    await _completed_but_pending(queues, store, q, ["a", "b"])
    sent.clear()
    with pytest.raises(CorruptRecordError) as info:
        await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    message = str(info.value)
    assert "default/stuck" in message and "a, b" in message and "already completed" in message
    # the spec, one read, a refused claim of each, one more read that skips both
    assert len(sent) <= 6, len(sent)
    # nothing changed: both still completed, their pending keys still there
    for i in ("a", "b"):
        assert (await queues.item(ItemRef(q, i))).result is not None
        _, kvs = await store.get(queues.keys(q).item(i).pending)
        assert len(kvs) == 1


async def test_stuck_pending_keys_do_not_hide_claimable_items(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    queues, _, store = counted
    q = QueueRef("default", "stuck-and-free")
    await _completed_but_pending(queues, store, q, ["a"])
    await queues.enqueue(q, [("b", None)])
    lease = await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert lease is not None and lease.job == ItemRef(q, "b")
    await lease.complete()
    with pytest.raises(CorruptRecordError, match="item\\(s\\) a are pending"):
        await asyncio.wait_for(queues.claim_next(q, "worker"), 10)


async def test_a_waiting_claimer_still_gets_an_item_enqueued_while_only_stuck_keys_are_left(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    queues, sent, store = counted
    q = QueueRef("default", "stuck-wait")
    await _completed_but_pending(queues, store, q, ["a"])
    sent.clear()
    task = asyncio.create_task(queues.claim_next(q, "worker", wait=20))
    # once its read has skipped the stuck key, it is waiting: then enqueue
    await poll(lambda: q in queues._pools and queues._pools[q].stuck_seen, 10,
               "the read that skips the stuck key")
    await queues.enqueue(q, [("c", None)])
    lease = await asyncio.wait_for(task, 20)
    assert lease is not None and lease.job == ItemRef(q, "c")
    assert len(sent) <= 10, len(sent)  # waited on a watch, no loop of reads
    await lease.complete()


async def test_a_stuck_pending_key_written_again_is_tried_again(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    """Skipping is by the key's mod revision: a pending key rewritten since
    (here by hand again) is read and tried once more, not ignored for good."""
    queues, sent, store = counted
    q = QueueRef("default", "stuck-rewritten")
    await _completed_but_pending(queues, store, q, ["a"])
    with pytest.raises(CorruptRecordError):
        await queues.claim_next(q, "worker")
    pending = queues.keys(q).item("a").pending
    _, kvs = await store.get(pending)
    await store.put(pending, kvs[0].value)
    sent.clear()
    with pytest.raises(CorruptRecordError):
        await queues.claim_next(q, "worker")
    assert len(sent) >= 3, len(sent)  # read, claimed (refused) again, read


async def _without_records(queues: Queues, store: EtcdStore, q: QueueRef,
                           ids: Sequence[str]) -> dict[str, int]:
    """Delete the item records of ``ids`` by hand, their pending keys left; the
    pending keys' mod revisions."""
    await store.txn([], [Delete(queues.keys(q).item(i).item) for i in ids], [])
    revisions = {}
    for i in ids:
        _, kvs = await store.get(queues.keys(q).item(i).pending)
        revisions[i] = kvs[0].mod_revision
    return revisions


async def _untouched(queues: Queues, store: EtcdStore, q: QueueRef, item_id: str,
                     pending_revision: int) -> None:
    """Nothing was written for ``item_id``: no holder, no claim, the same pending key."""
    keys = queues.keys(q).item(item_id)
    for key in (keys.holder, keys.claims, keys.result):
        _, kvs = await store.get(key)
        assert kvs == [], key
    _, kvs = await store.get(keys.pending)
    assert [kv.mod_revision for kv in kvs] == [pending_revision]


async def test_a_claim_of_a_pending_item_without_its_record_is_refused_and_writes_nothing(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    queues, _, store = counted
    q = QueueRef("default", "no-record")
    await queues.create(q, QueueSpec(lease_duration_seconds=30, max_attempts=3))
    await queues.enqueue(q, [("a", {"n": 1})])
    (revision,) = (await _without_records(queues, store, q, ["a"])).values()
    with pytest.raises(ItemRecordMissingError) as info:
        await asyncio.wait_for(queues.claim(ItemRef(q, "a"), "worker"), 10)
    assert isinstance(info.value, CorruptRecordError)  # exit 14, HTTP 500 "corrupt"
    assert queues.keys(q).item("a").item.decode() in str(info.value)
    await _untouched(queues, store, q, "a", revision)
    # the repair the error names (docs/queues.md): enqueue it again
    await queues.enqueue(q, [("a", {"n": 2})])
    lease = await asyncio.wait_for(queues.claim(ItemRef(q, "a"), "worker"), 10)
    assert lease.item is not None and lease.item.payload == {"n": 2}
    await lease.complete()


async def test_claim_next_claims_the_rest_then_names_the_items_without_their_record(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    queues, sent, store = counted
    q = QueueRef("default", "no-record-rest")
    await queues.create(q, QueueSpec(lease_duration_seconds=30))
    await queues.enqueue(q, [("a", None), ("b", None)])
    (revision,) = (await _without_records(queues, store, q, ["a"])).values()
    lease = await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert lease is not None and lease.job == ItemRef(q, "b")
    await lease.complete()
    sent.clear()
    with pytest.raises(CorruptRecordError, match="item\\(s\\) a are pending") as info:
        await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert "without their item record" in str(info.value)
    assert len(sent) <= 6, len(sent)  # no loop of reads and refusals
    await _untouched(queues, store, q, "a", revision)


async def test_a_completion_fused_with_a_claim_of_an_item_without_its_record_claims_nothing(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    """The fused claim compares the record too: the completion commits alone."""
    queues, _, store = counted
    q = QueueRef("default", "no-record-fused")
    await queues.create(q, QueueSpec(lease_duration_seconds=30))
    await queues.enqueue(q, [("a", None), ("b", None)])
    lease = await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert lease is not None
    other = "b" if lease.job == ItemRef(q, "a") else "a"
    assert [kv.key for kv in queues._pools[q].candidates] == [
        queues.keys(q).item(other).pending]  # the fused claim's only candidate
    (revision,) = (await _without_records(queues, store, q, [other])).values()
    record, following = await asyncio.wait_for(queues.complete_next(lease, 1), 10)
    assert record.result == 1 and following is None
    await _untouched(queues, store, q, other, revision)


async def test_a_key_refused_while_a_read_is_in_flight_is_not_called_stuck_by_that_read(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    """The race a client's concurrent claimers run into (CI, 2026-12-07): a
    candidate read is sent while another claimer holds item ``a``; before the
    read's answer is looked at, the holder completes ``a`` and a third claimer,
    which had ``a`` from an older read, is refused it as completed and marks the
    key. The read shows ``a`` still pending at the mark's mod revision, but it
    was sent before the mark: it must not call ``a`` stuck (that read answered
    CorruptRecordError for a queue joblease had drained correctly). The
    interleaving is made deterministic by the transaction hook; the refusal's
    mark is the pool's own call, as claim_next makes it."""
    queues, _, store = counted
    q = QueueRef("default", "stuck-race")
    await queues.create(q, QueueSpec(lease_duration_seconds=30))
    await queues.enqueue(q, [("a", None)])
    pending_key = queues.keys(q).item("a").pending
    _, (stale,) = await store.get(pending_key)  # what the older read handed out
    holder = await queues.claim(ItemRef(q, "a"), "holder")
    raced: list[bool] = []

    async def complete_and_refuse_during_the_read(
            compares: Sequence[Compare], success: Sequence[TxnOp],
            failure: Sequence[TxnOp]) -> TxnResult:
        answer = await store.txn(compares, success, failure)
        if not raced and any(getattr(op, "count_only", False) for op in success):
            raced.append(True)
            await holder.complete()  # deletes a's pending key
            queues._pools[q].refused_for_good(stale)  # the third claimer's refusal
        return answer

    queues.client.store.on_txn = complete_and_refuse_during_the_read  # type: ignore[attr-defined]
    assert await asyncio.wait_for(queues.claim_next(q, "reader"), 10) is None
    assert raced, "the candidate read never ran"
    queues.client.store.on_txn = None  # type: ignore[attr-defined]
    # the completion stands and nothing is left pending
    assert (await queues.item(ItemRef(q, "a"))).result is not None
    assert (await store.get(pending_key))[1] == []


async def _undecodable_pending(queues: Queues, store: EtcdStore, q: QueueRef,
                               item_id: str) -> bytes:
    """Overwrite ``item_id``'s pending key with a value that is not a pending record
    (by hand: joblease writes none); the key."""
    pending = queues.keys(q).item(item_id).pending
    await store.put(pending, b"not json")
    return pending


async def test_an_undecodable_pending_key_is_skipped_not_a_stop(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    """Before, the oldest pending key failing to decode made every claim_next raise
    it, so one bad key stopped the queue for every claimer (the Go sidecar's
    TestAnUndecodablePendingKeyIsSkippedNotAStop is the same)."""
    queues, _, store = counted
    q = QueueRef("default", "bad-pending")
    await queues.create(q, QueueSpec(lease_duration_seconds=30, max_attempts=3))
    await queues.enqueue(q, [("a", None), ("b", None)])
    pending = await _undecodable_pending(queues, store, q, "a")
    _, (bad,) = await store.get(pending)
    # whichever of the two the pick tries first: b is claimed, a skipped
    lease = await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert lease is not None and lease.job == ItemRef(q, "b")
    await lease.complete()
    with pytest.raises(CorruptRecordError, match="item\\(s\\) a are pending") as info:
        await asyncio.wait_for(queues.claim_next(q, "worker"), 10)
    assert "does not decode" in str(info.value)
    await _untouched(queues, store, q, "a", bad.mod_revision)


async def test_complete_next_with_an_undecodable_candidate_still_completes(
        counted: tuple[Queues, list[int], EtcdStore]) -> None:
    """complete_next fuses the next candidate of its pool into the completion; a
    candidate whose pending key does not decode must be skipped there, not raise
    before the held item's completion is sent (it did: the decode's
    CorruptRecordError is no ValueError)."""
    queues, _, store = counted
    q = QueueRef("default", "bad-candidate")
    await queues.create(q, QueueSpec(lease_duration_seconds=30, max_attempts=3))
    await queues.enqueue(q, [("x", None), ("a", None)])
    await _undecodable_pending(queues, store, q, "a")
    lease = await asyncio.wait_for(queues.claim(ItemRef(q, "x"), "worker"), 10)
    await queues.spec(q)  # cached, as a draining worker's is: the fused path is open
    r = await store.txn([], [Get(queues.keys(q).field_prefix("pending"), prefix=True)])
    pool = queues._pools.setdefault(q, _Pool())
    pool.candidates = [kv for kv in r.kvs(0) if kv.key.endswith(b"/a")]
    assert pool.candidates and pool.candidates[0].value == b"not json"
    record, following = await asyncio.wait_for(queues.complete_next(lease, {"ok": 1}), 10)
    assert following is None and record.result == {"ok": 1}
    assert (await queues.item(ItemRef(q, "x"))).result is not None
    _, kvs = await store.get(queues.keys(q).item("a").pending)
    assert [kv.value for kv in kvs] == [b"not json"]
