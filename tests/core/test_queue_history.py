"""A queue item's tenure history (docs/history.md, "Queue items") on a real etcd.

An item is a job of its queue, so its history is a job's: one tenure per
claim under ``Q/history/<id>/``, written by the item's own claim, release and
checkpoint transactions, its completion told by the result's token, an
expiry derived. What differs is the bound (the queue's ``historyLimit``, per
item) and that the history goes with the item (prune) and the queue (delete),
never touching the queue's counts.
"""

from __future__ import annotations

import pytest

from joblease import EtcdConfig, JobLeaseClient, StaleTokenError
from joblease.errors import InvalidInputError
from joblease.etcd_store import EtcdStore
from joblease.keys import ItemRef, QueueRef
from joblease.queue import Queues
from joblease.records import QueueSpec, TenureEnd
from joblease.store import TxnResult
from tests.support.etcd_keys import snapshot
from tests.support.faulty_store import (
    FaultyStore,
    delay_the_first_claim_until_the_revoke,
    is_item_claim,
)

TTL = 2


async def _history_keys(queues: Queues, item: ItemRef) -> dict[bytes, int]:
    """Every key of the item's history (under its history prefix) with its create revision."""
    prefix = queues.keys(item.queue).item(item.id).history.prefix
    _, kvs = await queues.store.get(prefix, prefix=True)
    return {kv.key[len(prefix):]: kv.create_revision for kv in kvs}


async def test_an_expired_holder_then_a_completed_one_and_the_late_completion_refused(
    client: JobLeaseClient, etcd_config: EtcdConfig,
) -> None:
    """The seed story on an item: A claims and stalls past its TTL (its client
    stops renewing; etcd expires the lease), B claims the item and completes
    it, then A's completion arrives (from another process, as `joblease queue
    complete --token` sends it) and is refused. The history says all of it:
    A's tenure expired with one refused completion counted against it, B's
    completed with the result's token."""
    q = QueueRef("default", "hist-seed")
    queues = Queues(client)
    await queues.create(q, QueueSpec(TTL, 3, history_limit=3))
    await queues.enqueue(q, [("x", {"n": 1})])
    item = ItemRef(q, "x")

    stalled = JobLeaseClient(etcd_config)
    a = await Queues(stalled).claim_next(q, "worker-a")
    assert a is not None and a.generation == 1
    await a.checkpoint({"done": 1})
    await stalled.close(revoke=False)  # no keep-alive reaches etcd any more

    # B waits on a watch for the expiry; its first guess of the generation (the
    # round's 0) is refused by the claim's compare and corrected
    b = await queues.claim_next(q, "worker-b", wait=3 * TTL + 5)
    assert b is not None and b.generation == 2 and b.token > a.token
    await b.complete({"rows": 1})
    with pytest.raises(StaleTokenError):
        await queues.complete_for(item, "worker-a", a.token, {"rows": 1})

    history = await queues.history(item)
    assert history.registered and history.history_limit == 3
    assert [(t.generation, t.token, t.owner, t.end, t.checkpoints, t.refused_completions)
            for t in history.tenures] == [
        (1, a.token, "worker-a", TenureEnd.EXPIRED, 1, 1),
        (2, b.token, "worker-b", TenureEnd.COMPLETED, 0, 0)]
    assert history.tenures[0].ended_at is None and history.tenures[1].ended_at is not None
    # the keys, where the protocol puts them; each tenure's create revision is its token
    keys = await _history_keys(queues, item)
    assert sorted(keys) == [b"000000000001", b"000000000001/checkpoints",
                            b"000000000001/refused", b"000000000002"]
    assert (keys[b"000000000001"], keys[b"000000000002"]) == (a.token, b.token)
    as_json = history.to_dict()
    assert (as_json["queue"], as_json["item"]) == ("default/hist-seed", "x")
    # the counts do not see the history: one item, completed
    counts = await queues.counts(q)
    assert (counts.total, counts.completed, counts.pending, counts.held) == (1, 1, 0, 0)


async def test_only_the_last_limit_tenures_of_an_item_are_kept(
    client: JobLeaseClient, etcd_config: EtcdConfig,
) -> None:
    """limit + 5 claims of one item leave exactly its last ``limit`` tenures
    (each claim deletes the older ones in its own transaction); a release and a
    checkpoint made from another process's handle record themselves too."""
    limit = 3
    q = QueueRef("default", "hist-retention")
    queues = Queues(client)
    await queues.create(q, QueueSpec(10, 0, history_limit=limit))
    await queues.enqueue(q, [("x", None), ("other", None)])
    item = ItemRef(q, "x")
    sizes = []
    for n in range(limit + 5):
        lease = await queues.claim(item, f"w{n}")
        assert lease.generation == n + 1
        async with JobLeaseClient(etcd_config) as cli:  # `joblease queue release --token`
            handle = await Queues(cli).lease_for(item, f"w{n}", lease.token)
            await handle.checkpoint({"n": n})
            await handle.release()
        keys = await _history_keys(queues, item)
        sizes.append(len(keys))
    history = await queues.history(item)
    assert [(t.generation, t.end, t.checkpoints) for t in history.tenures] == [
        (g, TenureEnd.RELEASED, 1) for g in range(6, limit + 6)]
    assert sizes[limit - 1:] == [3 * limit] * 6  # tenure, end, checkpoints: bounded
    assert await _history_keys(queues, ItemRef(q, "other")) == {}  # unclaimed: none

    # a lowered limit is applied by the item's next claim, backlog and all
    await queues.create(q, QueueSpec(10, 0, history_limit=1))
    lease = await queues.claim(item, "last")
    assert [t.generation for t in (await queues.history(item)).tenures] == [limit + 6]
    assert list(await _history_keys(queues, item)) == [b"000000000009"]
    await lease.release()


async def test_a_retried_item_continues_its_history(client: JobLeaseClient) -> None:
    q = QueueRef("default", "hist-retry")
    queues = Queues(client)
    await queues.create(q, QueueSpec(10, 1, history_limit=3))
    await queues.enqueue(q, [("x", None)])
    item = ItemRef(q, "x")
    first = await queues.claim(item, "w1")
    await first.release()
    assert await queues.claim_next(q, "w2") is None  # exhausted: marked failed
    await queues.retry(item)
    second = await queues.claim_next(q, "w2")
    assert second is not None and second.generation == 2
    await second.complete("ok")
    assert [(t.generation, t.owner, t.end) for t in (await queues.history(item)).tenures] == [
        (1, "w1", TenureEnd.RELEASED), (2, "w2", TenureEnd.COMPLETED)]


async def test_prune_and_delete_remove_the_history_with_the_item(client: JobLeaseClient) -> None:
    """Prune deletes a finished item's history in its own transaction (and no
    other item's: ``a``'s prefix is not ``ab``'s); deleting the queue deletes
    every history. A queue without a history limit writes none."""
    q = QueueRef("default", "hist-prune")
    queues = Queues(client)
    await queues.create(q, QueueSpec(10, 0, history_limit=2))
    await queues.enqueue(q, [("a", None), ("ab", None)])
    for item_id in ("a", "ab"):
        lease = await queues.claim(ItemRef(q, item_id), "w")
        if item_id == "a":
            await lease.complete("done")
        else:
            await lease.release()
    assert list(await _history_keys(queues, ItemRef(q, "a"))) == [b"000000000001"]
    assert await queues.prune(q, 0) == 1
    assert await _history_keys(queues, ItemRef(q, "a")) == {}
    assert not (await queues.history(ItemRef(q, "a"))).registered
    assert len(await _history_keys(queues, ItemRef(q, "ab"))) == 2  # tenure, end
    counts = await queues.counts(q)
    assert (counts.total, counts.pending, counts.completed) == (1, 1, 0)
    await queues.delete(q)
    assert await snapshot(queues.store, queues.keys(q).prefix) == {}

    plain = QueueRef("default", "hist-off")
    await queues.create(plain, QueueSpec(10, 0))
    await queues.enqueue(plain, [("x", None)])
    lease = await queues.claim(ItemRef(plain, "x"), "w")
    await lease.checkpoint(1)
    await lease.release()
    history = await queues.history(ItemRef(plain, "x"))
    assert history.registered and history.history_limit == 0 and history.tenures == ()
    assert await _history_keys(queues, ItemRef(plain, "x")) == {}


async def test_a_queue_history_limit_out_of_range_is_refused(client: JobLeaseClient) -> None:
    q = QueueRef("default", "hist-bad")
    for bad in (-1, 101, True):
        with pytest.raises(InvalidInputError, match="historyLimit"):
            await Queues(client).create(q, QueueSpec(10, 3, history_limit=bad))
    assert await snapshot(client.store, Queues(client).keys(q).prefix) == {}


async def test_an_item_claim_revoked_while_settling_reads_revoked(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """A delayed copy of an item's claim commits just before the revoke that
    settles its unknown outcome: its tenure reads ``revoked``, the claim made
    again (with the generation it reads) is the one open tenure."""
    q = QueueRef("default", "hist-revoked")
    await Queues(client).create(q, QueueSpec(30, 3, history_limit=3))
    await Queues(client).enqueue(q, [("x", None)])
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        delayed = delay_the_first_claim_until_the_revoke(store, is_item_claim)
        lease = await Queues(c).claim(ItemRef(q, "x"), "w")
        store.on_txn = store.on_revoke = None
        landed: TxnResult = delayed["landed"]
        assert landed.succeeded and lease.generation == 2
        tenures = (await Queues(client).history(ItemRef(q, "x"))).tenures
        assert [(t.generation, t.token, t.end) for t in tenures] == [
            (1, landed.revision, TenureEnd.REVOKED), (2, lease.token, TenureEnd.OPEN)]
        await lease.release()
