"""Work queues: many items under one name, every claim fenced (docs/queues.md).

An item is a job of its queue. Claiming one is the job's claim transaction
(``JobLeaseClient._claim_on``) on the item's keys, with the queue's spec in
place of the job's and the item's pending key compared too; completion,
release, checkpoints and renewal are the job's :class:`~joblease.lease.Lease`
unchanged, and so is an item's tenure history (``Q/history/<id>/``, bounded
by the queue's ``historyLimit``: docs/history.md). This module adds what a
queue needs besides: enqueueing in batches, picking the next item, marking
exhausted items failed, retrying them, and counting, all in etcd and
nowhere else.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from joblease import validation
from joblease.client import ItemClaim, JobLeaseClient
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    ConflictError,
    CorruptRecordError,
    FencedError,
    HeldError,
    InvalidInputError,
    ItemNotFoundError,
    ItemRecordMissingError,
    JobLeaseError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    QueueNotFoundError,
    QueueSuspendedError,
    SemaphoreFullError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.history import assemble_history, history_reads, record_refusal_of, tenure_of
from joblease.keys import ItemKeys, ItemRef, JobRef, QueueKeys, QueueRef
from joblease.lease import Lease
from joblease.records import (
    FailedRecord,
    History,
    Holder,
    ItemRecord,
    PendingRecord,
    QueueSpec,
    ResultRecord,
    encode_claim,
    new_claim_id,
)
from joblease.slots import check_uses, semaphore_refs
from joblease.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Put,
    Txn,
    TxnOp,
    TxnResult,
    describe,
    prefix_end,
)

#: Candidates a claimer picks from at random, among the oldest claimable items.
PICK_FROM = 16
#: Free candidates a read must find, at least, before it stops reading past the
#: held keys (and the window the oldest pending age is looked for in).
READ_AHEAD = 32
#: etcd reads the whole pending range to sort it by create revision (a sorted
#: range ignores its limit until after the sort), so one candidate read costs
#: as much as the queue is long, and while a client's pool is empty its
#: claimers wait for that read. Reading ahead one key in READ_AHEAD_SHARE of
#: the pending keys the last read counted (at least READ_AHEAD_MIN, at most
#: READ_AHEAD_MAX) keeps the cost per claim at about READ_AHEAD_SHARE keys
#: scanned whatever the backlog, and makes those waits rare: with one in 64
#: and at least 32, 64 claimers found the pool empty every ~23 claims and the
#: queue ran at half the rate of its bare transactions (docs/benchmarks.md).
#: The price is memory (the pool: at most READ_AHEAD_MAX keys per queue) and
#: a pool that ages while it drains (a candidate taken by another process
#: since costs one refused transaction, as it did with a small pool).
READ_AHEAD_MIN = 256
READ_AHEAD_SHARE = 4
READ_AHEAD_MAX = 8192


class ItemPhase(enum.StrEnum):
    PENDING = "Pending"  # in the queue, claimable (or exhausted, not yet marked)
    CLAIMED = "Claimed"  # a live holder exists
    COMPLETED = "Completed"
    FAILED = "Failed"  # used its round's attempts without a result


@dataclass(frozen=True)
class ItemState:
    """What etcd holds for one item, as of ``revision``."""

    item: ItemRef
    revision: int
    record: ItemRecord
    phase: ItemPhase
    generation: int
    holder: Holder | None
    result: ResultRecord | None
    failed: FailedRecord | None

    @property
    def token(self) -> int | None:
        if self.holder is not None:
            return self.holder.token
        return None if self.result is None else self.result.token

    def to_dict(self) -> dict[str, Any]:
        return {
            "queue": str(self.item.queue), "item": self.item.id, "phase": self.phase.value,
            "payload": self.record.payload, "enqueuedAt": self.record.enqueued_at,
            "enqueueRevision": self.record.revision, "generation": self.generation,
            "token": self.token, "revision": self.revision,
            "holder": None if self.holder is None else {
                "owner": self.holder.owner, "claimId": self.holder.claim_id,
                "token": self.holder.token, "leaseId": self.holder.lease_id},
            "result": None if self.result is None else self.result.to_dict(),
            "failed": None if self.failed is None else {
                "generation": self.failed.generation, "failedAt": self.failed.failed_at},
        }


@dataclass(frozen=True)
class QueueCounts:
    """A queue's counts at one revision; ``pending + held + completed + failed == total``."""

    revision: int
    total: int
    pending: int
    held: int
    completed: int
    failed: int
    #: Wall-clock age of the oldest claimable item (informational), None if none.
    oldest_pending_age: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"revision": self.revision, "total": self.total, "pending": self.pending,
                "held": self.held, "completed": self.completed, "failed": self.failed,
                "oldestPendingAgeSeconds": (None if self.oldest_pending_age is None
                                            else round(self.oldest_pending_age, 3))}


@dataclass(frozen=True)
class EnqueueResult:
    """Ids written by this call, and ids that were already there with the same payload."""

    added: list[str] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"added": len(self.added), "existing": len(self.existing),
                "ids": [*self.added, *self.existing]}


@functools.lru_cache(maxsize=1024)
def _attempts_from(pending_value: bytes) -> int:
    """``attemptsFrom`` of a pending key's value. The items of one enqueue batch
    share one value (same round, same ``since``), so most claims decode none."""
    return PendingRecord.decode(pending_value).attempts_from


def _canonical(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def _chunks(seq: Sequence[Any], size: int) -> Iterable[Sequence[Any]]:
    for i in range(0, len(seq), size):
        yield seq[i:i + size]


@dataclass(frozen=True)
class FusedClaim:
    """The claim of the next item as a fused completion sends it (docs/queues.md,
    "Complete and claim the next"): the item's keys, the queue spec's and the
    pending key's revisions, the round's attempt limit (0: unlimited), the
    session's lease and the holder and claims values."""

    keys: ItemKeys
    spec_revision: int
    pending_revision: int
    max_attempts: int
    lease_id: int
    holder_value: bytes
    claims_value: bytes
    claim_id: str = ""  # in the two values; not sent on its own


def fused_claim_txn(claim: FusedClaim) -> Txn:
    """The claim nested under a completion's success branch: an item claim's
    compares and writes without slots or history; its success answers put,
    put, claims, checkpoint, item (as a claim's); its failure nothing."""
    k = claim.keys
    compares = [Compare(k.spec, "mod", "==", claim.spec_revision),
                Compare(k.holder, "create", "==", 0),
                Compare(k.result, "version", "==", 0)]
    if claim.max_attempts > 0:
        compares.append(Compare(k.claims, "version", "<", claim.max_attempts))
    compares += [Compare(k.pending, "mod", "==", claim.pending_revision),
                 Compare(k.item, "version", ">", 0)]
    return Txn(tuple(compares), (Put(k.holder, claim.holder_value, lease=claim.lease_id),
                                 Put(k.claims, claim.claims_value), Get(k.claims),
                                 Get(k.checkpoint), Get(k.item)))


def fused_request(lease: Lease, result_value: bytes, claim: FusedClaim
                  ) -> tuple[list[Compare], list[TxnOp], list[TxnOp]]:
    """The whole fused transaction as ``lease.complete_fused`` sends it for an item
    lease without slots: ``if ours then put result, delete holder, delete pending,
    txn(claim) else get holder, get result`` (tests/vectors/fused.json pins it,
    for the Go sidecar's protocol.FusedRequest too)."""
    return lease.fused_request(result_value, fused_claim_txn(claim))


#: stuck pending keys a pool remembers at most (``_Pool.stuck``)
_STUCK_KEPT = 1024


def _stuck_error(queue: QueueRef, keys: QueueKeys, ids: list[str]) -> CorruptRecordError:
    """What claim_next says when only stuck pending keys are left to claim."""
    shown = ", ".join(ids[:5]) + (f" and {len(ids) - 5} more" if len(ids) > 5 else "")
    return CorruptRecordError(
        f"queue {queue} pending",
        f"item(s) {shown} are pending but already completed, without their item record or "
        f"with a pending record that does not decode, states joblease never writes (the "
        f"completion deletes the pending key, enqueue "
        f"writes both): nothing else is claimable; delete their keys under "
        f"{keys.field_prefix('pending').decode()!r} (or enqueue one without a record again)")


class _Pool:
    """Candidates of one queue read at one revision, shared by a client's claimers."""

    def __init__(self) -> None:
        self.candidates: list[KeyValue] = []
        self.revision = 0
        self.held_hint = 0  # holders seen at the last read: how far to read ahead
        self.pending_hint = 0  # pending keys counted at the last read: how much to read
        self.found = False  # whether the last read found any candidate
        #: pending keys (by key, at their mod revision) whose claim was refused as
        #: completed or for a missing item record: a pending key outliving its
        #: item's completion or record, which joblease never writes (the
        #: completion and deletion remove it too), would otherwise be read,
        #: claimed and refused again without end; reads skip them
        self.stuck: dict[bytes, int] = {}
        #: the item ids of such keys the last read skipped
        self.stuck_seen: list[str] = []
        self._lock = asyncio.Lock()

    def take(self) -> KeyValue | None:
        """One of the ``PICK_FROM`` oldest, at random (claimers of other
        processes read the same head: a random pick spreads them out)."""
        if not self.candidates:
            return None
        return self.candidates.pop(random.randrange(min(PICK_FROM, len(self.candidates))))

    async def refill(self, read: Callable[[], Awaitable[tuple[int, list[KeyValue], int, int,
                                                               list[str]]]]
                     ) -> tuple[int, bool]:
        """Read again unless a concurrent claimer just did: the revision of the
        read, and whether it found any candidate (the claimers that took them
        since may have emptied the pool: that is no sign of an empty queue)."""
        revision = self.revision
        async with self._lock:
            if self.revision == revision:  # nobody refilled while we waited
                (self.revision, self.candidates, self.held_hint,
                 self.pending_hint, self.stuck_seen) = await read()
                self.found = bool(self.candidates)
        return self.revision, self.found

    def refused_for_good(self, pending: KeyValue) -> None:
        """A claim of ``pending``'s item was refused as completed (or for a
        missing item record). Usually another claimer completed (or deleted)
        it meanwhile, deleting the key (so it is never read at this revision
        again); if the key is still there, it is stuck, and reads skip it."""
        if len(self.stuck) >= _STUCK_KEPT:
            self.stuck.clear()  # mostly races' keys, long gone: a stuck one is refused once more
        self.stuck[pending.key] = pending.mod_revision


class Queues:
    """Queues on a :class:`JobLeaseClient` (its etcd, key root and sessions).

    ``queues = Queues(client)``; ``await queues.enqueue(q, [("a", {...}), ...])``;
    ``async for lease in queues.work(q, owner): ...; await lease.complete(r)``.
    """

    def __init__(self, client: JobLeaseClient) -> None:
        self.client = client
        self.store = client.store
        self._specs: dict[QueueRef, tuple[int, QueueSpec]] = {}
        self._pools: dict[QueueRef, _Pool] = {}

    def keys(self, queue: QueueRef) -> QueueKeys:
        return self.client.keys.queue(queue)

    @staticmethod
    def _check_queue(queue: QueueRef) -> None:
        validation.job_ref(JobRef(queue.namespace, queue.name))

    async def _read(self, reads: list[Get]) -> TxnResult:
        """``reads`` at one revision (a read-only transaction), retried while etcd is away."""
        return await self.client.retry_read(lambda: self.store.txn([], reads))

    async def queues_of(self, namespace: str) -> list[QueueRef]:
        """The queues of ``namespace`` (their specs: one key each, read in pages,
        never their items)."""
        validation.job_ref(JobRef(namespace, "x"))
        prefix = self.client.keys.queues_prefix(namespace)
        end = prefix_end(prefix)
        found: list[QueueRef] = []
        cursor = prefix
        while cursor < end:
            # read the first key of the next queue's subtree (whichever it is),
            # check that queue's spec, then jump past the whole subtree
            _, kvs = await self.store.get(cursor, end=end, limit=1, keys_only=True)
            if not kvs:
                break
            name = kvs[0].key[len(prefix):].split(b"/", 1)[0]
            _, spec = await self.store.get(prefix + name + b"/spec", keys_only=True)
            if spec:
                found.append(QueueRef(namespace, name.decode()))
            cursor = prefix_end(prefix + name + b"/")
        return found

    # -- the queue itself ------------------------------------------------------------------

    async def create(self, queue: QueueRef, spec: QueueSpec, *,
                     guard: Sequence[Compare] = ()) -> int:
        """Register ``queue`` (idempotent: the same spec again writes nothing;
        another spec replaces it, as a JobLease's registration does). With
        ``spec.shards``, items ``0``..``shards-1`` are enqueued (payload null).

        ``guard``: extra conditions the spec write requires, as for
        :meth:`JobLeaseClient.register` (the operator passes its leadership
        term); if one fails nothing is written and :class:`FencedError` is
        raised. The shard items are enqueued only after a guarded spec write
        succeeded; their enqueue is not itself guarded (it is idempotent, and
        what it writes is exactly what the spec that was just accepted asks for)."""
        self._check_queue(queue)
        validation.ttl(spec.lease_duration_seconds)
        validation.max_attempts(spec.max_attempts)
        if isinstance(spec.shards, bool) or not isinstance(spec.shards, int) or not (
                0 <= spec.shards <= 100_000):
            raise InvalidInputError(f"invalid shards {spec.shards!r}: an integer 0..100000")
        if not isinstance(spec.suspend, bool):
            raise InvalidInputError(f"invalid suspend {spec.suspend!r}: true or false")
        check_uses(spec.semaphores)
        validation.history_limit(spec.history_limit, validation.MAX_QUEUE_HISTORY_LIMIT)
        keys = self.keys(queue)
        value = spec.encode()
        if guard:
            revision = await self._guarded_create(queue, keys, value, guard)
        else:
            revision = (await self._idempotent([Compare(keys.spec, "value", "==", value)],
                                               [Get(keys.spec)], [Put(keys.spec, value)])
                        ).revision
        self._specs.pop(queue, None)
        if spec.shards:
            await self.enqueue(queue, [(str(i), None) for i in range(spec.shards)])
        return revision

    async def _guarded_create(self, queue: QueueRef, keys: QueueKeys, value: bytes,
                              guard: Sequence[Compare]) -> int:
        """The spec write nested in a transaction whose compares are ``guard``, as
        ``JobLeaseClient.register`` does it (the write itself uses both branches,
        so the guard cannot join its compares: a failed guard would run the put).
        An unknown outcome is settled by sending it again (a repeat after a commit
        is a read); if that copy finds the guard failed, the first may have
        committed (``written=None``)."""
        inner = Txn((Compare(keys.spec, "value", "==", value),), (Get(keys.spec),),
                    (Put(keys.spec, value),))
        unknown = False
        for attempt in range(5):
            try:
                r = await self.store.txn(guard, [inner], [Get(keys.spec)])
            except OutcomeUnknownError:
                if attempt == 4:
                    raise
                unknown = True
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            if r.succeeded:
                return r.revision
            if not unknown:
                raise FencedError(f"create of queue {queue}", describe(guard))
            now = r.kv(0)
            detail = ("the spec holds this call's value now" if now and now.value == value
                      else "the spec holds another value now" if now
                      else "the queue does not exist now")
            raise FencedError(f"create of queue {queue}", describe(guard), written=None,
                              detail=detail)
        raise AssertionError("unreachable")

    async def _idempotent(self, compares: list[Compare], success: list[Any],
                          failure: list[Any]) -> TxnResult:
        """A transaction whose repeat after a commit is harmless, sent again
        while its outcome is unknown."""
        for attempt in range(5):
            try:
                return await self.store.txn(compares, success, failure)
            except OutcomeUnknownError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    async def spec(self, queue: QueueRef, *, refresh: bool = False) -> tuple[int, QueueSpec]:
        """The queue's spec and its mod revision (cached; a changed spec fails
        the claim's first compare and is read again)."""
        cached = None if refresh else self._specs.get(queue)
        if cached is not None:
            return cached
        _, kvs = await self.store.get(self.keys(queue).spec)
        if not kvs:
            self._specs.pop(queue, None)
            raise QueueNotFoundError(str(queue))
        entry = (kvs[0].mod_revision, QueueSpec.decode(kvs[0].value))
        self._specs[queue] = entry
        return entry

    def forget_spec(self, queue: QueueRef) -> None:
        """Drop the cached spec of ``queue`` (a caller that stopped following it)."""
        self._specs.pop(queue, None)

    async def delete(self, queue: QueueRef, *, guard: Sequence[Compare] = ()) -> int:
        """Delete the queue and every item, in one transaction conditional on
        the spec it read (a re-created queue is left alone). Returns the
        revision; raises :class:`NotRegisteredError` if there is no queue.

        ``guard``: extra conditions the delete requires (outer transaction, the
        conditional delete nested in it, as :meth:`JobLeaseClient.unregister`);
        if one fails nothing is deleted and :class:`FencedError` is raised
        (``written=None`` after an unknown outcome: a first copy may have
        committed)."""
        self._check_queue(queue)
        keys = self.keys(queue)
        try:
            return await self.client.delete_registered(
                keys.spec, keys.prefix, f"queue {queue}",
                lambda: QueueNotFoundError(str(queue)), guard=guard)
        finally:
            self._specs.pop(queue, None)

    # -- enqueue ----------------------------------------------------------------------------

    async def enqueue(self, queue: QueueRef, items: Iterable[tuple[str | None, Any]]
                      ) -> EnqueueResult:
        """Add ``(id, payload)`` items (``id`` None: a generated one).

        The batch is checked whole first: a bad id or payload raises
        :class:`InvalidInputError`, an id already stored with another payload
        :class:`ConflictError`, and nothing of the batch is written. An id
        stored with the same payload is skipped (a re-enqueue is a no-op)."""
        self._check_queue(queue)
        wanted: dict[str, bytes] = {}
        payloads: dict[str, Any] = {}
        for item_id, payload in items:
            item_id = uuid.uuid4().hex if item_id is None else validation.item_id(item_id)
            validation.json_payload(payload, f"payload of item {item_id!r}",
                                    validation.MAX_PAYLOAD_BYTES, PayloadTooLargeError)
            encoded = _canonical(payload)
            if wanted.get(item_id, encoded) != encoded:
                raise InvalidInputError(f"item {item_id!r} appears twice in the batch with "
                                        "different payloads; nothing was written")
            wanted[item_id] = encoded
            payloads[item_id] = payload
        keys = self.keys(queue)
        result = EnqueueResult()
        todo = await self._new_ids(queue, keys, wanted, result)
        now = time.time()
        while todo:
            chunk, todo = todo[:validation.ENQUEUE_CHUNK], todo[validation.ENQUEUE_CHUNK:]
            compares = [Compare(keys.spec, "create", "!=", 0)]
            success: list[Any] = []
            pending = PendingRecord(0, now).encode()
            for item_id in chunk:
                ik = keys.item(item_id)
                compares.append(Compare(ik.item, "create", "==", 0))
                success += [Put(ik.item, ItemRecord(payloads[item_id], now).encode()),
                            Put(ik.pending, pending)]
            r = await self._idempotent(compares, success, [Get(keys.spec)])
            if r.succeeded:
                result.added.extend(chunk)
                continue
            if r.kv(0) is None:
                raise QueueNotFoundError(str(queue))
            # An id of the chunk appeared meanwhile (a concurrent enqueue, or an
            # earlier copy of this one that committed): settle the chunk again.
            todo = await self._new_ids(queue, keys, {i: wanted[i] for i in chunk},
                                       result) + list(todo)
        return result

    async def _new_ids(self, queue: QueueRef, keys: QueueKeys, wanted: dict[str, bytes],
                       result: EnqueueResult) -> list[str]:
        """The ids of ``wanted`` not stored yet; stored ones with the same
        payload go to ``result.existing``; one with another payload raises."""
        ids = list(wanted)
        new: list[str] = []
        spec_read = Get(keys.spec)
        for chunk in _chunks(ids, 127):
            reads = [spec_read, *(Get(keys.item(i).item) for i in chunk)]
            r = await self._read(reads)
            if r.kv(0) is None:
                raise QueueNotFoundError(str(queue))
            for n, item_id in enumerate(chunk, start=1):
                kv = r.kv(n)
                if kv is None:
                    new.append(item_id)
                elif _canonical(ItemRecord.decode(kv.value).payload) == wanted[item_id]:
                    result.existing.append(item_id)
                else:
                    raise ConflictError(str(queue), item_id)
        return new

    # -- claims -----------------------------------------------------------------------------

    async def claim(self, item: ItemRef, owner: str) -> Lease:
        """Claim this item (an Indexed Job's index). Raises like
        :meth:`JobLeaseClient.claim`, with :class:`QueueSuspendedError`; an
        item found exhausted is marked failed before
        :class:`AttemptsExhaustedError` is raised."""
        self._check_queue(item.queue)
        validation.item_id(item.id)
        validation.owner(owner)
        keys = self.keys(item.queue).item(item.id)
        return await self._claim(item, keys, owner, None)

    async def claim_or_create(self, item: ItemRef, owner: str, payload: Any = None) -> Lease:
        """Claim this item, enqueueing it first if it is absent (a CronJob slot).
        A slot already completed raises :class:`AlreadyCompletedError`."""
        await self.enqueue(item.queue, [(item.id, payload)])
        return await self.claim(item, owner)

    async def _claim(self, item: ItemRef, keys: ItemKeys, owner: str,
                     pending: KeyValue | None, *, waiting: bool = False) -> Lease:
        client = self.client
        refresh = False
        revoked: list[int] = []
        generation: int | None = None  # the item's claims version, when read
        for _ in range(16):  # slot races are re-planned here (picks are random)
            spec_revision, spec = await self.spec(item.queue, refresh=refresh)
            if spec.suspend:
                raise QueueSuspendedError(str(item.queue))
            if pending is None or refresh:
                pending, generation = await self._pending(item, keys)
            attempts_from = _attempts_from(pending.value)
            # the queue's spec as a job's, with this round's attempts counted
            # from attemptsFrom (unlimited stays 0)
            job_spec = spec.job_spec(attempts_from)
            slot_plan = await client.plan_slots(str(item), item.namespace, job_spec, None,
                                                waiting=waiting)
            session = await client.sessions.for_claim(spec.lease_duration_seconds)
            try:
                with client.sessions.using(session), client._reserving(slot_plan):
                    # A history's tenure key needs the generation: a claim-next
                    # candidate's is guessed from its round (exact for a first
                    # claim, the usual case); a wrong guess is refused by the
                    # claim's compare and the refresh reads the right one.
                    outcome = await client._claim_on(
                        item, keys, owner, spec_revision, job_spec, session, revoked,
                        item=ItemClaim(pending.mod_revision), slots=slot_plan,
                        generation=attempts_from if generation is None else generation)
            except AttemptsExhaustedError:
                await self._mark_failed(keys, pending)
                raise
            if isinstance(outcome, Lease):
                return outcome
            refresh = True
        raise StoreUnavailableError(f"claim of item {item} did not settle after several attempts")

    async def _pending(self, item: ItemRef, keys: ItemKeys) -> tuple[KeyValue, int]:
        """The item's pending key and generation (its claims' version, read with
        it); raises why it has none (completed, failed, absent)."""
        r = await self._read([
            Get(keys.pending), Get(keys.item), Get(keys.result), Get(keys.claims),
            Get(keys.spec)])
        pending, record, result, claims, spec = (r.kv(i) for i in range(5))
        if pending is not None:
            return pending, claims.version if claims else 0
        if spec is None:
            raise QueueNotFoundError(str(item.queue))
        if record is None:
            raise ItemNotFoundError(str(item))
        if result is not None:
            rec = ResultRecord.decode(result.value)
            raise AlreadyCompletedError(str(item), rec.owner, rec.token, rec.generation)
        generation = claims.version if claims else 0
        raise AttemptsExhaustedError(str(item), generation, generation)

    async def _mark_failed(self, keys: ItemKeys, pending: KeyValue) -> None:
        """Move an exhausted item out of the pending set (docs/queues.md, "Mark
        failed"); a compare that fails means someone else settled it first.
        Best effort: if etcd cannot be reached, the next claimer that meets
        the item marks it."""
        with contextlib.suppress(StoreUnavailableError):
            r = await self.store.txn([], [Get(keys.claims)])
            claims = r.kv(0)
            version = claims.version if claims else 0
            await self.store.txn(
                [Compare(keys.pending, "mod", "==", pending.mod_revision),
                 Compare(keys.holder, "create", "==", 0),
                 Compare(keys.result, "version", "==", 0),
                 Compare(keys.claims, "version", "==", version)],
                [Delete(keys.pending),
                 Put(keys.failed, FailedRecord(version, time.time()).encode())], [])

    async def claim_next(self, queue: QueueRef, owner: str, *, wait: float = 0.0
                         ) -> Lease | None:
        """Claim one of the oldest claimable items; ``None`` if none became
        claimable within ``wait`` seconds (waiting is a watch, never a poll).

        Candidates are read once (one read-only transaction) into a pool this
        client's concurrent claimers share, so they never race each other for
        one item and the next claim usually costs one transaction; a
        candidate another process took meanwhile is refused and dropped."""
        self._check_queue(queue)
        validation.owner(owner)
        keys = self.keys(queue)
        pool = self._pools.setdefault(queue, _Pool())
        deadline = time.monotonic() + wait
        while True:
            _, spec = await self.spec(queue)
            if spec.suspend:
                raise QueueSuspendedError(str(queue))
            full: SemaphoreFullError | None = None
            while (pending := pool.take()) is not None:
                item_id = pending.key[len(keys.field_prefix("pending")):].decode()
                try:
                    _attempts_from(pending.value)
                except CorruptRecordError:
                    # written by hand (joblease writes none): skipped like a stuck key,
                    # so one bad key cannot stop the queue for every claimer
                    pool.refused_for_good(pending)
                    continue
                try:
                    return await self._claim(ItemRef(queue, item_id), keys.item(item_id),
                                             owner, pending, waiting=wait > 0)
                except (AlreadyCompletedError, ItemRecordMissingError):
                    pool.refused_for_good(pending)  # completed meanwhile, or stuck
                    continue
                except (HeldError, AttemptsExhaustedError, ItemNotFoundError):
                    continue  # taken, exhausted (now marked failed) or gone meanwhile
                except SemaphoreFullError as exc:
                    pool.candidates.append(pending)  # still claimable once a slot frees
                    full = exc
                    break
            if full is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise full
                await self.client.wait_for_room(
                    full, [k for _, k, _ in semaphore_refs(self.client.keys, queue.namespace,
                                                           spec.semaphores)], left)
                continue
            revision, found = await pool.refill(
                lambda: self._candidates(keys, pool.held_hint, pool.pending_hint, pool.stuck))
            if pool.candidates or found:
                # Candidates (or ones that concurrent claimers took while we
                # waited for their read): claimable items may be left, so
                # take or read again; only a read that found none means none.
                continue
            left = deadline - time.monotonic()
            if left <= 0:
                if pool.stuck_seen:
                    raise _stuck_error(queue, keys, pool.stuck_seen)
                return None
            await self._wait_for_change(keys, revision, left)

    async def _candidates(self, keys: QueueKeys, held_hint: int, pending_hint: int,
                          stuck: dict[bytes, int]
                          ) -> tuple[int, list[KeyValue], int, int, list[str]]:
        """The revision read at, the oldest pending keys that have no holder
        (at most the read-ahead of them when there are that many: one in
        ``READ_AHEAD_SHARE`` of the ``pending_hint`` pending keys the last read
        counted, between ``READ_AHEAD_MIN`` and ``READ_AHEAD_MAX``), the number
        of holders and the number of pending keys, in one read-only
        transaction; and the ids of the ``stuck`` pending keys it skipped."""
        held_prefix, pending_prefix = keys.field_prefix("held"), keys.field_prefix("pending")
        ahead = min(max(READ_AHEAD_MIN, pending_hint // READ_AHEAD_SHARE), READ_AHEAD_MAX)
        limit = held_hint + ahead
        while True:
            # Skip only the keys marked stuck before this read was sent: a
            # concurrent claimer may mark one while the read is in flight, a
            # key this read can show still pending (held, not yet completed)
            # at an older revision than the completion that refused the claim.
            # A read sent after the mark sees what the refusal saw.
            stuck_before = dict(stuck)
            r = await self._read([
                Get(held_prefix, prefix=True, keys_only=True),
                Get(pending_prefix, prefix=True, limit=limit, oldest_first=True),
                Get(pending_prefix, prefix=True, count_only=True)])
            held = {kv.key[len(held_prefix):] for kv in r.kvs(0)}
            pending = r.kvs(1)
            free, skipped = [], []
            for kv in pending:
                if stuck_before and stuck_before.get(kv.key) == kv.mod_revision:
                    skipped.append(kv.key[len(pending_prefix):].decode())
                elif kv.key[len(pending_prefix):] not in held:
                    free.append(kv)
            # Fewer free ones than asked for although the read was cut at the
            # limit: the holders (and stuck keys) filled it; read again past them.
            if len(free) >= READ_AHEAD or len(pending) < limit:
                if stuck and len(pending) < limit:  # read whole: forget keys gone since
                    seen = {kv.key: kv.mod_revision for kv in pending}
                    for key in [k for k, rev in stuck.items() if seen.get(k) != rev]:
                        del stuck[key]
                return r.revision, free, len(held), r.count(2), skipped
            limit = len(held) + len(skipped) + ahead

    async def _wait_for_change(self, keys: QueueKeys, revision: int, timeout: float) -> None:
        """Until a pending key is written, a holder deleted or the spec changed
        after ``revision``, or ``timeout`` passes."""
        pending, held = keys.field_prefix("pending"), keys.field_prefix("held")

        async def changed() -> None:
            async for batch in self.store.watch(keys.prefix, prefix=True,
                                                start_revision=revision + 1):
                for event in batch.events:
                    key = event.kv.key
                    if ((event.kind == "put" and key.startswith(pending))
                            or (event.kind == "delete" and key.startswith(held))
                            or key == keys.spec):
                        return

        with contextlib.suppress(TimeoutError, JobLeaseError):
            await asyncio.wait_for(changed(), timeout)
        self._specs.clear()

    async def work(self, queue: QueueRef, owner: str, *, wait: float = 0.0
                   ) -> AsyncIterator[Lease]:
        """Claim items one after another: each lease is yielded to be completed
        (or released) before the next is claimed; ends when none became
        claimable within ``wait`` seconds."""
        while True:
            lease = await self.claim_next(queue, owner, wait=wait)
            if lease is None:
                return
            yield lease

    async def complete_next(self, lease: Lease, result: Any = None
                            ) -> tuple[ResultRecord, Lease | None]:
        """Complete ``lease`` (an item claimed by this client) and, where it is
        safe, claim the next item of its queue in the same transaction
        (docs/queues.md, "Complete and claim the next"): the result, and the
        next item's lease, or ``None`` (none was claimed with it: claim the next
        the usual way, e.g. :meth:`claim_next`). The completion is decided and
        refused exactly as :meth:`Lease.complete` decides it. The claim is
        fused only when it needs nothing a claim transaction adds beside
        the item's own keys: no semaphore slots, no tenure history, the
        session the held item is bound to (the queue's TTL), and a candidate
        already in the pool (no read is sent for one); otherwise this is
        ``lease.complete`` alone. The Go sidecar's draining loop sends the same
        transaction (``tests/vectors/fused.json``)."""
        fused = self._fusable(lease)
        if fused is None:
            return await lease.complete(result), None
        item, claim, pending = fused
        session = lease.session  # the claim is bound to the held item's session
        assert session is not None
        keys = claim.keys
        try:
            with self.client.sessions.using(session):
                record, evidence, read = await lease.complete_fused(
                    result, fused_claim_txn(claim),
                    [Get(keys.holder), Get(keys.claims), Get(keys.checkpoint), Get(keys.item)])
        except OutcomeUnknownError as exc:
            # a copy still in flight, or one whose outcome could not be read,
            # may commit the claim: end the session so it cannot outlive this
            await self.client.sessions.end(
                session, f"a completion sent with the claim of {item} has an unknown outcome")
            raise OutcomeUnknownError(
                f"{exc}; the claim of {item} sent with it may have committed, so the "
                f"session's lease {session.lease_id:x} was revoked") from exc
        except (StoreUnavailableError, InvalidInputError):
            self._pools.setdefault(item.queue, _Pool()).candidates.append(pending)
            raise
        except asyncio.CancelledError:
            # The request may be on its way and commit the claim of the next
            # item, bound to this session, which no handle knows of and which
            # the session would renew for as long as it lives: end the session,
            # as a claim cancelled in flight does (client._claim_on).
            self.client.sessions.drop(
                session, f"a completion sent with the claim of {item} was cancelled in flight")
            raise
        if evidence is None:
            await self.client.sessions.end(
                session, f"the claim of {item} sent with a completion could not be read back")
            return record, None
        if read:  # holder, claims, checkpoint, item of the next item
            holder = evidence.kv(0)
            if holder is None or holder.value != claim.holder_value:
                return record, None
            claims = evidence.kv(1)
            return record, self._fused_lease(lease, item, claim, holder.create_revision,
                                             claims.version if claims else 0, evidence.kv(2),
                                             evidence.kv(3))
        if not evidence.succeeded:
            return record, None  # taken, or changed meanwhile: dropped, as a refused claim is
        claims = evidence.kv(2)
        return record, self._fused_lease(lease, item, claim, evidence.revision,
                                         claims.version if claims else 0, evidence.kv(3),
                                         evidence.kv(4))

    def _fusable(self, lease: Lease) -> tuple[ItemRef, FusedClaim, KeyValue] | None:
        """The candidate the completion of ``lease`` can claim in its
        transaction, or ``None`` (see :meth:`complete_next`)."""
        job = lease.job
        if not isinstance(job, ItemRef) or lease.slots or lease.tenure is not None:
            return None
        cached = self._specs.get(job.queue)
        session = lease.session
        if cached is None or session is None:
            return None
        spec_revision, spec = cached
        if (spec.suspend or spec.history_limit > 0 or spec.semaphores
                or session.ttl != spec.lease_duration_seconds or not session.alive
                or session.remaining() < self.client.sessions.min_session_left):
            return None
        pool = self._pools.get(job.queue)
        if pool is None:
            return None
        keys = self.keys(job.queue)
        prefix = keys.field_prefix("pending")
        while (pending := pool.take()) is not None:
            item_id = pending.key[len(prefix):].decode()
            if item_id == job.id:
                continue
            try:
                attempts_from = _attempts_from(pending.value)
            except CorruptRecordError:
                pool.refused_for_good(pending)  # skipped as claim_next skips it
                continue
            claim_id = new_claim_id()
            return ItemRef(job.queue, item_id), FusedClaim(
                keys=keys.item(item_id), spec_revision=spec_revision,
                pending_revision=pending.mod_revision,
                max_attempts=spec.job_spec(attempts_from).max_attempts,
                lease_id=session.lease_id,
                holder_value=Holder.encode_value(lease.owner, claim_id,
                                                 spec.lease_duration_seconds, time.time()),
                claims_value=encode_claim(lease.owner, claim_id), claim_id=claim_id), pending
        return None

    def _fused_lease(self, lease: Lease, item: ItemRef, claim: FusedClaim, token: int,
                     generation: int, checkpoint: KeyValue | None,
                     item_kv: KeyValue | None) -> Lease | None:
        assert item_kv is not None  # compared: version(item) > 0
        session = lease.session
        return Lease(store=self.store, read_back_timeout=self.client.read_back_timeout,
                     session=session, job=item, keys=claim.keys,
                     owner=lease.owner, claim_id=claim.claim_id, token=token,
                     generation=generation, ttl=lease.ttl, holder_value=claim.holder_value,
                     checkpoint=checkpoint,
                     item=ItemRecord.decode(item_kv.value, item_kv.create_revision))

    async def lease_for(self, item: ItemRef, owner: str, token: int) -> Lease:
        """A handle on ``owner``'s claim of ``item`` with ``token``, to complete,
        checkpoint or release it from another process (the job's ``lease_for``).
        Raises :class:`StaleTokenError` unless that claim holds the item now."""
        self._check_queue(item.queue)
        validation.item_id(item.id)
        validation.owner(owner)
        validation.token(token)
        keys = self.keys(item.queue).item(item.id)
        r = await self._read([Get(keys.holder), Get(keys.claims), Get(keys.checkpoint),
                              Get(keys.item), Get(keys.result),
                              Get(keys.history.prefix, prefix=True, keys_only=True)])
        holder_kv, claims, checkpoint, item_kv, result_kv = (r.kv(i) for i in range(5))
        if item_kv is None:
            raise ItemNotFoundError(str(item))
        holder = Holder.decode_value(holder_kv.value) if holder_kv else None
        if holder_kv is None or holder is None or holder_kv.create_revision != token or (
                holder["owner"] != owner):
            result = ResultRecord.decode(result_kv.value) if result_kv else None
            current = (holder_kv.create_revision if holder_kv
                       else result.token if result else None)
            current_owner = (holder["owner"] if holder
                             else result.owner if result else None)
            raise StaleTokenError(str(item), token, current, current_owner)
        _, spec = await self.spec(item.queue)
        generation = claims.version if claims else 0
        # this claim's tenure, if the queue keeps a history (so a release or a
        # checkpoint from here records itself as the claimer's own would)
        tenure_key = keys.history.tenure(generation)
        tenure = tenure_of(keys.history, next((kv for kv in r.kvs(5) if kv.key == tenure_key),
                                              None), generation, token)
        return Lease(store=self.store, read_back_timeout=self.client.read_back_timeout,
                     session=None, job=item, keys=keys, owner=owner,
                     claim_id=holder["claimId"], token=token, tenure=tenure,
                     generation=generation,
                     ttl=int(holder.get("ttl", 0)), holder_value=holder_kv.value,
                     checkpoint=checkpoint,
                     item=ItemRecord.decode(item_kv.value, item_kv.create_revision),
                     slots=await self.client.held_slots(item.namespace, spec.semaphores,
                                                        holder["claimId"]))

    async def complete_for(self, item: ItemRef, owner: str, token: int, result: Any = None
                           ) -> ResultRecord:
        """Complete ``item`` under ``owner``'s claim with ``token`` from another
        process (:meth:`lease_for`, then ``complete``). A refused stale
        completion is counted against the tenure of ``token`` in the item's
        history (as the holder's own refused completion is), then
        :class:`StaleTokenError` is raised."""
        try:
            lease = await self.lease_for(item, owner, token)
        except StaleTokenError as stale:
            if stale.current_token != token:  # not a repeat of our own completion
                await record_refusal_of(self.store, self.keys(item.queue).item(item.id).history,
                                        token, str(item))
            raise
        return await lease.complete(result)

    async def history(self, item: ItemRef) -> History:
        """The item's tenures (its last ``historyLimit`` claims, the queue's
        limit), oldest first, read at one revision (docs/history.md, "Queue
        items"). ``registered`` is False when the queue or the item is absent;
        a queue that keeps no history has none."""
        self._check_queue(item.queue)
        validation.item_id(item.id)
        keys = self.keys(item.queue).item(item.id)
        r = await self._read(history_reads(keys))
        return assemble_history(item, keys, r.revision, r.kv(0), r.kv(1), r.kv(2), r.kvs(3),
                                r.kv(4))

    # -- retry, inspect ---------------------------------------------------------------------

    async def retry(self, item: ItemRef) -> int:
        """Put a failed item back in the queue with ``maxAttempts`` new claims
        (its generation and tokens keep increasing). Returns the revision;
        raises :class:`InvalidInputError` if the item has not failed."""
        self._check_queue(item.queue)
        validation.item_id(item.id)
        keys = self.keys(item.queue).item(item.id)
        for _ in range(5):
            r = await self.store.txn([], [Get(keys.failed), Get(keys.claims), Get(keys.item)])
            failed, claims = r.kv(0), r.kv(1)
            if r.kv(2) is None:
                raise ItemNotFoundError(str(item))
            if failed is None:
                raise InvalidInputError(f"item {item} has not failed; only a failed item "
                                        "can be retried")
            version = claims.version if claims else 0
            try:
                w = await self.store.txn(
                    [Compare(keys.failed, "mod", "==", failed.mod_revision),
                     Compare(keys.pending, "create", "==", 0),
                     Compare(keys.claims, "version", "==", version)],
                    [Delete(keys.failed),
                     Put(keys.pending, PendingRecord(version, time.time()).encode())], [])
            except OutcomeUnknownError:
                continue  # read again: a committed copy shows the item pending
            if w.succeeded:
                return w.revision
        raise OutcomeUnknownError(f"retry of item {item} did not settle")

    async def item(self, item: ItemRef) -> ItemState:
        """The item as etcd holds it; :class:`NotRegisteredError` if absent."""
        self._check_queue(item.queue)
        validation.item_id(item.id)
        states = await self._states(item.queue, [item.id])
        if not states:
            raise ItemNotFoundError(str(item))
        return states[0]

    async def items(self, queue: QueueRef, *, limit: int = 1000,
                    phase: ItemPhase | None = None) -> list[ItemState]:
        """Up to ``limit`` items in enqueue order (optionally of one phase)."""
        self._check_queue(queue)
        keys = self.keys(queue)
        prefix = keys.field_prefix("items")
        r = await self._read([
            Get(prefix, prefix=True, keys_only=True, oldest_first=True,
                limit=0 if phase else limit), Get(keys.spec)])
        if r.kv(1) is None:
            raise QueueNotFoundError(str(queue))
        ids = [kv.key[len(prefix):].decode() for kv in r.kvs(0)]
        out: list[ItemState] = []
        for chunk in _chunks(ids, 16):
            out += [s for s in await self._states(queue, list(chunk))
                    if phase is None or s.phase is phase]
            if len(out) >= limit:
                return out[:limit]
        return out

    async def _states(self, queue: QueueRef, ids: list[str]) -> list[ItemState]:
        keys = self.keys(queue)
        reads: list[Get] = []
        for item_id in ids:
            ik = keys.item(item_id)
            reads += [Get(ik.item), Get(ik.pending), Get(ik.holder), Get(ik.claims),
                      Get(ik.result), Get(ik.failed)]
        r = await self._read(reads)
        states = []
        for n, item_id in enumerate(ids):
            item_kv, pending, holder_kv, claims, result_kv, failed_kv = (
                r.kv(6 * n + i) for i in range(6))
            if item_kv is None:
                continue
            generation = claims.version if claims else 0
            holder = None
            if holder_kv is not None:
                value = Holder.decode_value(holder_kv.value)
                holder = Holder(owner=value["owner"], claim_id=value["claimId"],
                                token=holder_kv.create_revision, generation=generation,
                                lease_id=holder_kv.lease,
                                claimed_at=float(value.get("claimedAt", 0)))
            result = (ResultRecord.decode(result_kv.value, result_kv.mod_revision)
                      if result_kv else None)
            failed = FailedRecord.decode(failed_kv.value) if failed_kv else None
            phase = (ItemPhase.COMPLETED if result else ItemPhase.CLAIMED if holder
                     else ItemPhase.FAILED if failed or pending is None else ItemPhase.PENDING)
            states.append(ItemState(ItemRef(queue, item_id), r.revision,
                                    ItemRecord.decode(item_kv.value, item_kv.create_revision),
                                    phase, generation, holder, result, failed))
        return states

    async def prune(self, queue: QueueRef, older_than: float, *, limit: int = 10_000) -> int:
        """Delete up to ``limit`` finished items (completed or failed) that
        finished more than ``older_than`` seconds ago, oldest first; returns how
        many. Each goes in one transaction conditional on its result (or failed
        mark) being the one read, so an item retried meanwhile is kept.

        The item's tenure history (``Q/history/<id>/``) goes in the same
        transaction. Age is the finisher's wall clock (``completedAt``, ``failedAt``):
        retention is housekeeping, never an ownership decision. A pruned id
        is forgotten: enqueueing it again makes a new item (docs/queues.md)."""
        self._check_queue(queue)
        if not older_than >= 0:
            raise InvalidInputError(f"invalid retention {older_than!r}: seconds >= 0")
        keys = self.keys(queue)
        cutoff = time.time() - older_than
        pruned = 0
        for field_name in ("results", "failed"):
            prefix = keys.field_prefix(field_name)
            r = await self._read([Get(prefix, prefix=True, oldest_first=True,
                                      limit=min(limit, 10_000))])
            for kv in r.kvs(0):
                if pruned >= limit:
                    return pruned
                finished = (ResultRecord.decode(kv.value).completed_at
                            if field_name == "results"
                            else FailedRecord.decode(kv.value).failed_at)
                if finished > cutoff:
                    break  # oldest first: the rest are younger
                ik = keys.item(kv.key[len(prefix):].decode())
                w = await self.store.txn(
                    [Compare(kv.key, "mod", "==", kv.mod_revision),
                     Compare(ik.pending, "create", "==", 0),
                     Compare(ik.holder, "create", "==", 0)],
                    [Delete(ik.item), Delete(ik.claims), Delete(ik.result),
                     Delete(ik.checkpoint), Delete(ik.failed),
                     Delete(ik.history.prefix, prefix=True)], [])
                pruned += int(w.succeeded)
        return pruned

    async def counts(self, queue: QueueRef) -> QueueCounts:
        """The queue's counts at one revision (count-only ranges: their cost does
        not grow with the number of items). The oldest pending item's age needs
        the pending keys sorted by create revision, which etcd sorts whole: a
        read of the backlog's keys (no values past the first holders'), so its
        cost grows with the backlog (docs/queues.md, "Counts")."""
        self._check_queue(queue)
        keys = self.keys(queue)
        fields = ("items", "pending", "held", "results", "failed")
        held_prefix = keys.field_prefix("held")
        pending_prefix = keys.field_prefix("pending")
        limit = READ_AHEAD
        while True:
            r = await self._read([
                Get(keys.spec),
                *(Get(keys.field_prefix(f), prefix=True, count_only=True) for f in fields),
                Get(held_prefix, prefix=True, keys_only=True),
                Get(pending_prefix, prefix=True, oldest_first=True, limit=limit)])
            if r.kv(0) is None:
                raise QueueNotFoundError(str(queue))
            total, pending, held, completed, failed = (r.count(i) for i in range(1, 6))
            held_ids = {kv.key[len(held_prefix):] for kv in r.kvs(6)}
            oldest = next((kv for kv in r.kvs(7)
                           if kv.key[len(pending_prefix):] not in held_ids), None)
            # every key read is held but there are more: read past the holders
            if oldest is not None or len(r.kvs(7)) < limit:
                break
            limit = len(held_ids) + READ_AHEAD
        age = None
        if oldest is not None:
            since = PendingRecord.decode(oldest.value).since
            age = max(0.0, time.time() - since) if since else None
        return QueueCounts(r.revision, total, pending - held, held, completed, failed, age)
