"""A pending key that outlives its item's completion (a state joblease never
writes: the completion deletes it in its own transaction; written here by hand,
as a tenant with write access to its prefix could) must not make ``claim_next``
read, claim and be refused without end. Against the session's real etcd; the
transactions sent are counted by the fault-injecting store, which forwards them
all (nothing is faked)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.errors import CorruptRecordError
from joblease.etcd_store import EtcdStore
from joblease.keys import ItemRef, QueueRef
from joblease.queue import Queues
from joblease.records import QueueSpec
from joblease.store import Compare, TxnOp, TxnResult
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
