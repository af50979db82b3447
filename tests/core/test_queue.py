"""Work queues on a real etcd: every JobLease guarantee per item, plus enqueue,
next-item claims, failure and retry (docs/queues.md)."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease import queue as queue_module
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    ConflictError,
    HeldError,
    InvalidInputError,
    ItemNotFoundError,
    OutcomeUnknownError,
    QueueNotFoundError,
    QueueSuspendedError,
)
from joblease.etcd_store import EtcdStore
from joblease.fencing.gate import Effect, MemoryGate, StaleFenceError
from joblease.keys import ItemRef, QueueRef
from joblease.queue import READ_AHEAD, ItemPhase, Queues
from joblease.records import QueueSpec
from joblease.store import Compare, Put, TxnOp, TxnResult
from joblease.validation import MAX_PAYLOAD_BYTES
from tests.support.etcd_keys import snapshot
from tests.support.faulty_store import FaultyStore
from tests.support.worker_proc import WorkerProc

TTL = 2
Q = QueueRef("default", "files")


@pytest.fixture
async def queues(client: JobLeaseClient) -> Queues:
    queues = Queues(client)
    await queues.create(Q, QueueSpec(lease_duration_seconds=TTL, max_attempts=2))
    return queues


def _prefix(queues: Queues) -> bytes:
    return queues.keys(Q).prefix


async def test_enqueue_is_idempotent_and_refuses_another_payload(queues: Queues) -> None:
    first = await queues.enqueue(Q, [("a", {"n": 1}), ("b", [1, 2])])
    assert sorted(first.added) == ["a", "b"] and first.existing == []
    before = await snapshot(queues.store, _prefix(queues))
    again = await queues.enqueue(Q, [("b", [1, 2]), ("a", {"n": 1})])
    assert again.added == [] and sorted(again.existing) == ["a", "b"]
    assert await snapshot(queues.store, _prefix(queues)) == before  # a no-op: nothing written
    with pytest.raises(ConflictError) as err:
        await queues.enqueue(Q, [("c", 3), ("a", {"n": 2})])
    assert err.value.item == "a" and err.value.exit_code == 16
    assert await snapshot(queues.store, _prefix(queues)) == before  # "c" was not written either
    counts = await queues.counts(Q)
    assert (counts.total, counts.pending) == (2, 2)


@pytest.mark.parametrize("item_id, payload, why", [
    ("", None, "invalid item id"),
    ("a/b", None, "invalid item id"),
    ("x" * 254, None, "invalid item id"),
    ("ok", math.nan, "not JSON"),
    ("ok", "\ud800", "surrogate"),
    ("ok", "x" * MAX_PAYLOAD_BYTES, "limit"),
])
async def test_bad_items_refuse_the_whole_batch(queues: Queues, item_id: str, payload: object,
                                                why: str) -> None:
    before = await snapshot(queues.store, _prefix(queues))
    with pytest.raises(InvalidInputError, match=why):
        await queues.enqueue(Q, [("fine", 1), (item_id, payload)])
    assert await snapshot(queues.store, _prefix(queues)) == before


async def test_a_batch_of_one_id_twice_must_agree(queues: Queues) -> None:
    with pytest.raises(InvalidInputError, match="twice"):
        await queues.enqueue(Q, [("a", 1), ("a", 2)])
    assert (await queues.enqueue(Q, [("a", 1), ("a", 1)])).added == ["a"]


async def test_enqueue_into_a_missing_queue_writes_nothing(client: JobLeaseClient) -> None:
    queues = Queues(client)
    with pytest.raises(QueueNotFoundError):
        await queues.enqueue(QueueRef("default", "nope"), [("a", 1)])
    assert await snapshot(client.store, client.keys.namespace_prefix()) == {}


async def test_large_batches_are_written_in_chunks(queues: Queues) -> None:
    result = await queues.enqueue(Q, [(f"i{n:04d}", n) for n in range(300)])
    assert len(result.added) == 300
    counts = await queues.counts(Q)
    assert (counts.total, counts.pending, counts.held) == (300, 300, 0)


async def test_seed_example_per_item(queues: Queues) -> None:
    """A claims item x and is paused (SIGSTOP) past the TTL; B claims x with a
    larger token; A's completion and A's fenced write are refused."""
    await queues.enqueue(Q, [("x", {"file": "s3://b/x"}), ("y", None)])
    item = ItemRef(Q, "x")
    gate = MemoryGate()
    a = WorkerProc(queues.client.config, item, "worker-a")
    try:
        claimed_a = a.next_event("claimed")
        await gate.admit(Effect(str(item), claimed_a["token"]))
        a.pause()
        paused_at = time.monotonic()
        lease_b = None
        while lease_b is None:
            try:
                lease_b = await queues.claim(item, "worker-b")
            except HeldError:
                assert time.monotonic() - paused_at < TTL + 10
                await asyncio.sleep(0.05)
        assert time.monotonic() - paused_at >= TTL - 0.5  # etcd decided the expiry
        assert lease_b.token > claimed_a["token"]
        assert lease_b.generation == claimed_a["generation"] + 1
        assert lease_b.item is not None and lease_b.item.payload == {"file": "s3://b/x"}
        await gate.admit(Effect(str(item), lease_b.token))
        a.resume()
        a.send('complete {"by": "a"}')
        late = a.next_event("completed")
        assert late["ok"] is False and late["error"] == "stale"
        assert late["currentToken"] == lease_b.token
        with pytest.raises(StaleFenceError):
            await gate.admit(Effect(str(item), claimed_a["token"]))
        await lease_b.complete({"by": "b"})
    finally:
        a.stop()
    state = await queues.item(item)
    assert state.phase is ItemPhase.COMPLETED and state.result is not None
    assert state.result.owner == "worker-b" and state.result.token == lease_b.token
    counts = await queues.counts(Q)
    assert (counts.completed, counts.pending, counts.held) == (1, 1, 0)


async def test_a_completed_item_cannot_be_claimed_or_completed_again(queues: Queues) -> None:
    await queues.enqueue(Q, [("x", 1)])
    lease = await queues.claim(ItemRef(Q, "x"), "w")
    await lease.complete("done")
    with pytest.raises(AlreadyCompletedError):
        await queues.claim(ItemRef(Q, "x"), "w2")
    assert await queues.claim_next(Q, "w2") is None


async def test_a_poison_item_fails_after_max_attempts_while_the_rest_drain(
        queues: Queues) -> None:
    await queues.enqueue(Q, [(f"ok{n}", n) for n in range(5)] + [("poison", "boom")])
    done: list[str] = []
    for _ in range(40):
        lease = await queues.claim_next(Q, "w")
        if lease is None:
            break
        if lease.job.id == "poison":  # type: ignore[union-attr]
            await lease.release()  # the worker crashes on it: no result
            continue
        await lease.complete(lease.item.payload if lease.item else None)
        done.append(lease.job.id)  # type: ignore[union-attr]
    assert sorted(done) == [f"ok{n}" for n in range(5)]
    state = await queues.item(ItemRef(Q, "poison"))
    assert state.phase is ItemPhase.FAILED and state.generation == 2
    counts = await queues.counts(Q)
    assert (counts.total, counts.completed, counts.failed, counts.pending) == (6, 5, 1, 0)
    with pytest.raises(AttemptsExhaustedError):
        await queues.claim(ItemRef(Q, "poison"), "w")

    # retry: two new attempts, generation and tokens go on increasing
    await queues.retry(ItemRef(Q, "poison"))
    assert (await queues.counts(Q)).pending == 1
    lease = await queues.claim_next(Q, "w")
    assert lease is not None and lease.job == ItemRef(Q, "poison") and lease.generation == 3
    await lease.complete("fixed")
    assert (await queues.item(ItemRef(Q, "poison"))).phase is ItemPhase.COMPLETED
    with pytest.raises(InvalidInputError, match="has not failed"):
        await queues.retry(ItemRef(Q, "poison"))


async def test_claim_next_waits_on_a_watch_for_new_items(queues: Queues) -> None:
    waiter = asyncio.create_task(queues.claim_next(Q, "w", wait=10))
    await asyncio.sleep(0.2)
    assert not waiter.done()
    await queues.enqueue(Q, [("late", "hi")])
    lease = await asyncio.wait_for(waiter, 5)
    assert lease is not None and lease.item is not None and lease.item.payload == "hi"
    await lease.complete()


async def test_claim_next_waits_for_an_expired_holder(queues: Queues) -> None:
    await queues.enqueue(Q, [("only", None)])
    first = await queues.claim_next(Q, "a")
    assert first is not None
    assert await queues.claim_next(Q, "b") is None  # held, nothing else
    await first.release()
    second = await queues.claim_next(Q, "b", wait=5)
    assert second is not None and second.token > first.token


async def test_concurrent_claimers_each_get_a_distinct_item(queues: Queues,
                                                            client: JobLeaseClient) -> None:
    await queues.enqueue(Q, [(f"i{n}", n) for n in range(40)])
    results: list[str] = []

    async def worker(name: str) -> None:
        async for lease in queues.work(Q, name):
            results.append(lease.job.id)  # type: ignore[union-attr]
            await lease.complete()

    await asyncio.wait_for(asyncio.gather(*(worker(f"w{n}") for n in range(8))), 60)
    assert sorted(results) == sorted(f"i{n}" for n in range(40))  # each exactly once
    assert (await queues.counts(Q)).completed == 40


async def test_a_cron_slot_runs_at_most_once(queues: Queues) -> None:
    slot = ItemRef(Q, "2026-12-01T23:00:00Z")
    lease = await queues.claim_or_create(slot, "job-1")
    await lease.complete("ran")
    with pytest.raises(AlreadyCompletedError):
        await queues.claim_or_create(slot, "job-2")  # a second Job for the same slot


async def test_shards_exist_from_creation(client: JobLeaseClient) -> None:
    queues = Queues(client)
    q = QueueRef("default", "indexed")
    await queues.create(q, QueueSpec(lease_duration_seconds=TTL, max_attempts=3, shards=8))
    assert [s.item.id for s in await queues.items(q)] == [str(i) for i in range(8)]
    lease = await queues.claim(ItemRef(q, "5"), "pod-5")
    assert lease.item is not None and lease.item.payload is None
    with pytest.raises(ItemNotFoundError):
        await queues.claim(ItemRef(q, "8"), "pod-8")


async def test_a_suspended_queue_claims_nothing(queues: Queues) -> None:
    await queues.enqueue(Q, [("x", 1)])
    await queues.create(Q, QueueSpec(lease_duration_seconds=TTL, max_attempts=2, suspend=True))
    with pytest.raises(QueueSuspendedError):
        await queues.claim_next(Q, "w")
    with pytest.raises(QueueSuspendedError):
        await queues.claim(ItemRef(Q, "x"), "w")
    await queues.create(Q, QueueSpec(lease_duration_seconds=TTL, max_attempts=2))
    assert await queues.claim_next(Q, "w") is not None


async def test_counts_add_up_and_delete_removes_everything(queues: Queues) -> None:
    await queues.enqueue(Q, [(f"i{n}", n) for n in range(10)])
    held = [await queues.claim_next(Q, "w") for _ in range(3)]
    assert all(held)
    await held[0].complete()  # type: ignore[union-attr]
    counts = await queues.counts(Q)
    assert (counts.total, counts.completed, counts.held, counts.pending) == (10, 1, 2, 7)
    assert counts.oldest_pending_age is not None
    await queues.delete(Q)
    assert await snapshot(queues.store, _prefix(queues)) == {}
    with pytest.raises(QueueNotFoundError):
        await queues.counts(Q)


# -- unknown outcomes (faults at one exact step; every forwarded request is real) ------------


def _puts(success: Sequence[TxnOp], field: bytes) -> bool:
    return any(isinstance(op, Put) and f"/{field.decode()}/".encode() in op.key
               for op in success)


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[Queues, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store) as c:
        queues = Queues(c)
        await queues.create(Q, QueueSpec(lease_duration_seconds=TTL, max_attempts=2))
        yield queues, store
        store.on_txn = None


async def test_an_item_claim_whose_reply_was_lost_is_found_by_reading_back(
        faulty: tuple[Queues, FaultyStore]) -> None:
    queues, store = faulty
    await queues.enqueue(Q, [("x", {"n": 1})])
    lost: list[int] = []

    async def lose_claim_reply(compares: Sequence[Compare], success: Sequence[TxnOp],
                               failure: Sequence[TxnOp]) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if _puts(success, b"held") and not lost:
            lost.append(r.revision)
            raise OutcomeUnknownError("injected: the claim's reply was lost")
        return r

    store.on_txn = lose_claim_reply
    lease = await queues.claim(ItemRef(Q, "x"), "w")
    assert lost and lease.token == lost[0] and lease.generation == 1  # ours, adopted
    assert lease.item is not None and lease.item.payload == {"n": 1}
    assert lease.valid


async def test_an_item_claim_never_sent_is_settled_and_claimed_again(
        faulty: tuple[Queues, FaultyStore]) -> None:
    """The reply is lost before the request reaches etcd: the read-back does not
    find it, the session's etcd lease is revoked (no late copy can commit) and
    the item is claimed again, that attempt not counted."""
    queues, store = faulty
    await queues.enqueue(Q, [("x", None)])
    dropped: list[bool] = []

    async def drop_first_claim(compares: Sequence[Compare], success: Sequence[TxnOp],
                               failure: Sequence[TxnOp]) -> TxnResult:
        if _puts(success, b"held") and not dropped:
            dropped.append(True)
            raise OutcomeUnknownError("injected: the claim was lost on its way")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = drop_first_claim
    lease = await queues.claim(ItemRef(Q, "x"), "w")
    assert dropped and lease.generation == 1 and store.revoked


async def test_an_item_completion_whose_reply_was_lost_is_confirmed_and_leaves_the_queue(
        faulty: tuple[Queues, FaultyStore]) -> None:
    queues, store = faulty
    await queues.enqueue(Q, [("x", None), ("y", None)])
    lease = await queues.claim(ItemRef(Q, "x"), "w")
    lost: list[bool] = []

    async def lose_completion_reply(compares: Sequence[Compare], success: Sequence[TxnOp],
                                    failure: Sequence[TxnOp]) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if _puts(success, b"results") and not lost:
            lost.append(True)
            raise OutcomeUnknownError("injected: the completion's reply was lost")
        return r

    store.on_txn = lose_completion_reply
    record = await lease.complete("done")
    assert lost and record.token == lease.token
    counts = await queues.counts(Q)
    assert (counts.completed, counts.pending, counts.held) == (1, 1, 0)


async def test_prune_forgets_finished_items_past_their_retention(queues: Queues) -> None:
    await queues.enqueue(Q, [("done", 1), ("failed", 2), ("open", 3)])
    lease = await queues.claim(ItemRef(Q, "done"), "w")
    await lease.complete()
    for _ in range(2):
        poison = await queues.claim(ItemRef(Q, "failed"), "w")
        await poison.release()
    with pytest.raises(AttemptsExhaustedError):
        await queues.claim(ItemRef(Q, "failed"), "w")  # marks it failed
    assert await queues.prune(Q, older_than=3600) == 0  # too young
    assert await queues.prune(Q, older_than=0) == 2
    assert [s.item.id for s in await queues.items(Q)] == ["open"]
    counts = await queues.counts(Q)
    assert (counts.total, counts.completed, counts.failed, counts.pending) == (1, 0, 0, 1)
    # a pruned id is forgotten: enqueueing it again is a new item
    assert (await queues.enqueue(Q, [("done", "again")])).added == ["done"]
    with pytest.raises(InvalidInputError):
        await queues.prune(Q, older_than=-1)


async def test_a_window_of_exhausted_items_does_not_hide_a_claimable_one(
        client: JobLeaseClient, monkeypatch: pytest.MonkeyPatch) -> None:
    """The oldest pending keys a claimer reads are all exhausted: it marks each failed
    and must read again (a pending delete wakes no waiter), not wait or answer None
    while an item beyond them is claimable."""
    # A window of READ_AHEAD keys, so that READ_AHEAD + 4 exhausted items fill it.
    monkeypatch.setattr(queue_module, "READ_AHEAD_MIN", READ_AHEAD)
    q = QueueRef("default", "window")
    queues = Queues(client)
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=1))
    old = [f"old-{i:03d}" for i in range(READ_AHEAD + 4)]
    await queues.enqueue(q, [(i, None) for i in old])
    await queues.enqueue(q, [("fresh", "x")])
    for item_id in old:  # each uses its one attempt and is given back without a result
        await (await queues.claim(ItemRef(q, item_id), "exhauster")).release()
    lease = await queues.claim_next(q, "worker", wait=0)
    assert lease is not None and lease.job == ItemRef(q, "fresh")
    counts = await queues.counts(q)
    assert counts.failed >= READ_AHEAD  # the window it read was marked failed on the way


async def test_concurrent_claimers_without_wait_answer_none_only_when_nothing_is_claimable(
        queues: Queues, monkeypatch: pytest.MonkeyPatch) -> None:
    # 64 claimers share one candidate pool; one read fills it with 32 (the
    # read-ahead lowered to that). The ones that waited for that read must not
    # answer "nothing claimable" because the others emptied the pool meanwhile:
    # 8 items are still free then.
    monkeypatch.setattr(queue_module, "READ_AHEAD_MIN", 32)
    await queues.enqueue(Q, [(f"i{n}", n) for n in range(40)])
    await queues.spec(Q)  # cached, as a running worker has it: all 64 meet at the first read
    got = await asyncio.wait_for(
        asyncio.gather(*(queues.claim_next(Q, f"w{n}") for n in range(64))), 60)
    leases = [lease for lease in got if lease is not None]
    assert sorted(lease.job.id for lease in leases) == sorted(  # type: ignore[union-attr]
        f"i{n}" for n in range(40))
    assert (await queues.counts(Q)).held == 40


async def test_two_clients_drain_a_deep_queue_each_item_once(
        queues: Queues, etcd_config: EtcdConfig, monkeypatch: pytest.MonkeyPatch) -> None:
    # A deep queue makes each candidate read take more than READ_AHEAD_MIN (one
    # in READ_AHEAD_SHARE of the pending keys; lowered so 400 items are "deep"):
    # two clients then work through the same large head and refuse each
    # other's items, and still complete every item once.
    monkeypatch.setattr(queue_module, "READ_AHEAD_SHARE", 4)
    monkeypatch.setattr(queue_module, "READ_AHEAD_MIN", 32)
    await queues.enqueue(Q, [(f"i{n:03d}", n) for n in range(400)])
    done: list[str] = []

    async def worker(q: Queues, name: str) -> None:
        async for lease in q.work(Q, name):
            done.append(lease.job.id)  # type: ignore[union-attr]
            await lease.complete()

    async with JobLeaseClient(etcd_config) as other_client:
        other = Queues(other_client)
        first = await other.claim_next(Q, "b")
        assert first is not None and other._pools[Q].pending_hint == 400  # counted the backlog
        await first.complete()
        done.append(first.job.id)  # type: ignore[union-attr]
        await asyncio.wait_for(asyncio.gather(
            *(worker(queues, f"a{n}") for n in range(8)),
            *(worker(other, f"b{n}") for n in range(8))), 120)
    assert sorted(done) == [f"i{n:03d}" for n in range(400)]  # each exactly once
    counts = await queues.counts(Q)
    assert (counts.completed, counts.pending, counts.held) == (400, 0, 0)


async def test_the_oldest_pending_age_is_found_past_the_holders(queues: Queues) -> None:
    """The oldest keys are all held: the age is the first unheld one's, not None."""
    await queues.enqueue(Q, [(f"i{n:03d}", n) for n in range(READ_AHEAD + 3)])
    held = [await queues.claim(ItemRef(Q, f"i{n:03d}"), "w") for n in range(READ_AHEAD + 1)]
    counts = await queues.counts(Q)
    assert counts.held == READ_AHEAD + 1 and counts.pending == 2
    assert counts.oldest_pending_age is not None
    for lease in held:
        await lease.release()
