"""The handle a successful claim returns.

A :class:`Lease` is valid while (a) the session's etcd lease is being renewed
within the local safety deadline and (b) the holder key still carries this
claim (re-checked after every keep-alive: a live etcd lease is not proof of
ownership, because the key can be deleted while the lease lives). Once
invalid it never becomes valid again.

``complete`` and ``release`` use exactly the renew condition -- the holder key
still has this token (create revision) and this exact value (owner + claim
id) -- in one transaction, so a stale completion is rejected by etcd itself.
``checkpoint`` uses the same condition, plus "the checkpoint key is as this
handle last saw it" (so a late copy of an older checkpoint cannot overwrite a
newer one of the same claim).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from joblease import tracing, validation
from joblease.errors import (
    CorruptRecordError,
    JobLeaseError,
    LeaseLostError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.history import TenureKeys
from joblease.keys import ItemKeys, ItemRef, JobKeys, JobRef
from joblease.records import CheckpointRecord, Holder, ItemRecord, ResultRecord, TenureEnd
from joblease.slots import SlotGrant
from joblease.store import Compare, Delete, Get, KeyValue, Put, Store, Txn, TxnOp, TxnResult

if TYPE_CHECKING:
    from joblease.session import Session

log = logging.getLogger(__name__)

#: How long an unknown outcome is read back (etcd unreachable) before the
#: operation gives up with OutcomeUnknownError.
READ_BACK_SECONDS = 30.0


def _holder_owner(kv: KeyValue) -> tuple[str | None, str]:
    """The owner a stored holder names, or ``(None, why it cannot be decoded)``."""
    try:
        return str(Holder.decode_value(kv.value)["owner"]), ""
    except CorruptRecordError as exc:
        return None, str(exc)


def _result_record(kv: KeyValue) -> tuple[ResultRecord | None, str]:
    """The stored result, or ``(None, why it cannot be decoded)``."""
    try:
        return ResultRecord.decode(kv.value, kv.mod_revision), ""
    except CorruptRecordError as exc:
        return None, str(exc)


class LeaseState(enum.StrEnum):
    HELD = "held"
    LOST = "lost"
    COMPLETED = "completed"
    RELEASED = "released"


class Lease:
    """Temporary ownership of one job, proven by ``token``."""

    # One is made per claim: slots rather than a dict per handle (less to
    # allocate and for the garbage collector to track).
    __slots__ = ("_checkpoint_kv", "_completion_deletes", "_done", "_holder_and_result",
                 "_holder_value", "_keys", "_on_slots_freed", "_read_back_timeout", "_reason",
                 "_renew_condition",
                 "_session", "_slot_deletes", "_state", "claim_id", "generation", "item", "job",
                 "owner", "result", "slots", "store", "tenure", "token", "trace", "ttl")

    def __init__(
        self,
        *,
        store: Store,
        session: Session[Lease] | None,
        job: JobRef | ItemRef,
        keys: JobKeys | ItemKeys,
        owner: str,
        claim_id: str,
        token: int,
        generation: int,
        ttl: int,
        holder_value: bytes,
        checkpoint: KeyValue | None = None,
        item: ItemRecord | None = None,
        slots: tuple[SlotGrant, ...] = (),
        on_slots_freed: Callable[[tuple[SlotGrant, ...], int], None] | None = None,
        tenure: TenureKeys | None = None,
        holder_and_result: tuple[Get, Get] | None = None,
        read_back_timeout: float = READ_BACK_SECONDS,
    ) -> None:
        self.store = store
        #: how long an unknown outcome is read back (the client's setting)
        self._read_back_timeout = read_back_timeout
        self.job = job
        self.owner = owner
        self.claim_id = claim_id
        self.token = token
        self.generation = generation
        self.ttl = ttl
        self._keys = keys
        self._session = session
        self._holder_value = holder_value
        #: the renew condition, and the reads every refusal is explained from: the
        #: same for the whole claim, so built once, not per completion or check
        self._renew_condition = (Compare(keys.holder, "create", "==", token),
                                 Compare(keys.holder, "value", "==", holder_value))
        #: (``holder_and_result``: the claim's own ``Get``s of the same two keys; the
        #: ops are immutable, so one object serves both)
        self._holder_and_result = holder_and_result or (Get(keys.holder), Get(keys.result))
        self._state = LeaseState.HELD
        self._reason: str | None = None
        #: set once the handle is finished; made by the first wait_done
        self._done: asyncio.Event | None = None
        self.result: ResultRecord | None = None
        #: the checkpoint key as this handle last saw it (claim's read, or our write)
        self._checkpoint_kv = checkpoint
        #: for a queue item's claim: the item (its payload), read by the claim itself
        self.item = item
        #: the semaphore slots this claim took (docs/semaphores.md); completion
        #: and release delete them in their own transactions
        self.slots = slots
        self._slot_deletes = [d for grant in slots for d in grant.frees()] if slots else []
        #: what the completion deletes beside writing its result
        self._completion_deletes = (*map(Delete, keys.completion_deletes), *self._slot_deletes)
        #: told the revision at which our completion or release freed the slots
        #: (the client's semaphore views apply it before their watches bring it)
        self._on_slots_freed = on_slots_freed
        #: this tenure's trace (docs/tracing.md); a handle that does not renew has none
        self.trace = (tracing.start_tenure(job, job.namespace, owner, claim_id, token, generation)
                      if session is not None else tracing.NO_TENURE)
        #: this claim's tenure in the job's history (None: the job keeps none);
        #: release and checkpoint record themselves in it, a refused completion too
        self.tenure = tenure
        if session is not None:
            session.on_loss(self._on_session_loss)
            session.attach(self)

    # -- state -------------------------------------------------------------------------------

    @property
    def session(self) -> Session[Lease] | None:
        """The session this claim is bound to (None: a handle that does not renew)."""
        return self._session

    @property
    def lease_id(self) -> int:
        return self._session.lease_id if self._session is not None else 0

    @property
    def last_renewal(self) -> float:
        """Monotonic time the last successful keep-alive was sent (0: not renewed here)."""
        return self._session.last_renewal if self._session is not None else 0.0

    @property
    def margin(self) -> float:
        """Seconds between this handle's local safety deadline and the earliest
        moment etcd can expire its lease (invariant ``conservative-deadline``);
        0 for a handle that does not renew (``lease_for``)."""
        return self._session.margin if self._session is not None else 0.0

    @property
    def state(self) -> LeaseState:
        if self._state is LeaseState.HELD and not self.valid:
            return LeaseState.LOST
        return self._state

    @property
    def valid(self) -> bool:
        """True while this worker may produce effects under ``token``."""
        if self._state is not LeaseState.HELD:
            return False
        return self._session is not None and self._session.alive

    @property
    def lost_reason(self) -> str | None:
        if self._reason is None and self._state is LeaseState.HELD and not self.valid:
            return "no keep-alive succeeded before the safety deadline"
        return self._reason

    def remaining(self) -> float:
        """Seconds of local safety left; produce no effects once it reaches 0."""
        if not self.valid or self._session is None:
            return 0.0
        return self._session.remaining()

    def ensure_valid(self) -> None:
        """Raise :class:`LeaseLostError` unless effects under ``token`` are allowed now."""
        if not self.valid:
            raise LeaseLostError(str(self.job), self.token, self.lost_reason or self._state.value)

    async def wait_done(self) -> LeaseState:
        """Wait until the lease is lost, completed or released; return which."""
        while self._state is LeaseState.HELD:
            if self._session is None:
                break
            remaining = self._session.remaining()
            if remaining <= 0:
                self._lose(self.lost_reason or "safety deadline passed")
                break
            if self._done is None:
                self._done = asyncio.Event()
            try:
                await asyncio.wait_for(self._done.wait(), timeout=remaining)
            except TimeoutError:
                continue
        return self._state

    def _lose(self, reason: str) -> None:
        if self._state is LeaseState.HELD:
            self._state, self._reason = LeaseState.LOST, reason
            closed = reason.endswith("session closed")  # the owner closed its client
            log.log(logging.INFO if closed else logging.WARNING,
                    "lease on %s (token %d) lost: %s", self.job, self.token, reason)
            self._finish()

    def _on_session_loss(self, why: str) -> None:
        self._lose(f"etcd lease lost: {why}")

    def _finish(self) -> None:
        """Detach from the session: a long-lived session must not keep every
        finished handle alive."""
        if self._done is not None:
            self._done.set()
        if self.trace is not tracing.NO_TENURE:
            self.trace.end(tracing.end_cause(self._state.value, self._reason), self._reason)
        if self._session is not None:
            self._session.detach(self)
            self._session.remove_on_loss(self._on_session_loss)

    # -- the renew condition -----------------------------------------------------------------

    def _ours(self) -> tuple[Compare, ...]:
        return self._renew_condition

    def holder_compares(self) -> list[Compare]:
        """The renew condition as etcd compares: the holder key still has this
        token (create revision) and this exact value (owner + claim id).

        Add them to any transaction that must commit only while this claim
        holds the job (``joblease.fencing.guarded_put`` does). The first
        compare's ``key`` is the job's holder key.
        """
        return list(self._ours())

    async def check(self) -> None:
        """Re-check that the holder key is still ours; lose the lease if not."""
        if self._state is not LeaseState.HELD:
            return
        try:
            r = await self.store.txn(self._ours(), [], self._holder_and_result)
        except (StoreUnavailableError, JobLeaseError) as exc:
            log.info("holder check for %s failed: %s", self.job, exc)
            return
        if not r.succeeded:
            self._lose(self._describe_change(r))

    def _describe_change(self, r: TxnResult) -> str:
        holder, result = r.kv(0), r.kv(1)
        if holder is not None:
            owner, problem = _holder_owner(holder)
            if owner is None:
                return f"job now held with token {holder.create_revision} ({problem})"
            return f"job now held by {owner!r} with token {holder.create_revision}"
        if result is not None:
            rec, problem = _result_record(result)
            if rec is None:
                return f"job has a result ({problem})"
            return f"job completed with token {rec.token}"
        return "holder key deleted (expired, released or job unregistered)"

    def _stale(self, r: TxnResult, detail: str = "") -> StaleTokenError:
        """The refusal, naming who holds (or completed) the job now. Never raises
        for stored data: a record that cannot be decoded is named as such."""
        holder, result = r.kv(0), r.kv(1)
        if holder is not None:
            owner, problem = _holder_owner(holder)
            return StaleTokenError(str(self.job), self.token, holder.create_revision, owner,
                                   detail or problem)
        if result is not None:
            rec, problem = _result_record(result)
            if rec is None:
                return StaleTokenError(str(self.job), self.token, None, None,
                                       detail or f"the job has a result: {problem}")
            return StaleTokenError(str(self.job), self.token, rec.token, rec.owner,
                                   detail or "the job was completed under that token")
        return StaleTokenError(str(self.job), self.token, None, None, detail)

    # -- checkpoint --------------------------------------------------------------------------

    @property
    def checkpoint_record(self) -> CheckpointRecord | None:
        """The job's last checkpoint as this handle knows it: the previous
        holder's as read by the claim transaction itself (or by ``lease_for``'s
        read), then this handle's own last one. ``None``: there was none.

        Raises :class:`CorruptRecordError` if the stored value cannot be decoded.
        """
        kv = self._checkpoint_kv
        return None if kv is None else CheckpointRecord.decode(kv.value, kv.mod_revision)

    @tracing.child_span(tracing.SPAN_CHECKPOINT)
    async def checkpoint(self, data: Any) -> CheckpointRecord:
        """Store ``data`` (JSON, at most ``MAX_CHECKPOINT_BYTES``) as the job's
        checkpoint if, and only if, this claim still holds the job.

        One transaction: the renew condition, and the checkpoint key unchanged
        since this handle last saw it. Raises :class:`StaleTokenError` (naming
        the current token) when the claim no longer holds the job: nothing is
        stored. An unknown outcome is settled by reading back (our value there:
        committed; holder still ours: the same conditional write is sent again,
        and it can commit at most once); :class:`OutcomeUnknownError` if it
        cannot be settled.
        """
        validation.json_payload(data, "checkpoint", validation.MAX_CHECKPOINT_BYTES,
                                PayloadTooLargeError)
        value = CheckpointRecord(owner=self.owner, claim_id=self.claim_id, token=self.token,
                                 generation=self.generation, data=data,
                                 checkpointed_at=time.time()).encode()
        key = self._keys.checkpoint
        reads = [Get(self._keys.holder), Get(self._keys.result), Get(key)]
        for _ in range(5):
            seen = self._checkpoint_kv.mod_revision if self._checkpoint_kv else 0
            try:
                r = await self.store.txn([*self._ours(), Compare(key, "mod", "==", seen)],
                                         [Put(key, value), *self._history_puts(None)], reads)
            except OutcomeUnknownError:
                log.info("checkpoint of %s has an unknown outcome; reading back", self.job)
                r = await self._read_back_checkpoint(reads)
            if r.succeeded:
                return self._checkpointed(KeyValue(key, value, 0, r.revision, 0, 0))
            stored = r.kv(2)
            if stored is not None and stored.value == value:
                return self._checkpointed(stored)  # an earlier copy committed
            holder = r.kv(0)
            if (holder is not None and holder.create_revision == self.token
                    and holder.value == self._holder_value):
                # Still ours: not written (after an unknown outcome the same
                # conditional write is sent again), or another writer of this
                # same claim checkpointed meanwhile (e.g. the CLI beside the
                # sidecar): last writer wins.
                self._checkpoint_kv = stored
                continue
            self._lose(self._describe_change(r))
            raise self._stale(r)
        raise OutcomeUnknownError(
            f"checkpoint of {self.job} could not be confirmed after several attempts; "
            "the holder was still ours and a copy still in flight may commit")

    def _checkpointed(self, kv: KeyValue) -> CheckpointRecord:
        self._checkpoint_kv = kv
        return CheckpointRecord.decode(kv.value, kv.mod_revision)

    async def _read_back_checkpoint(self, reads: list[Get]) -> TxnResult:
        """After an unknown outcome: holder, result and checkpoint as they are
        now, in one read, shaped like the checkpoint's failure branch."""
        r = await self._read_until_answered("checkpoint", [], list(reads), [])
        return TxnResult(False, r.revision, r.responses)

    # -- complete / release ------------------------------------------------------------------

    @tracing.child_span(tracing.SPAN_COMPLETE)
    async def complete(self, result: Any = None) -> ResultRecord:
        """Record ``result`` if, and only if, this claim still holds the job.

        Raises :class:`StaleTokenError` (naming the current token) when it does not.
        """
        if self._state is LeaseState.COMPLETED and self.result is not None:
            return self.result
        encoded = validation.json_payload(result, "result", validation.MAX_RESULT_BYTES,
                                          PayloadTooLargeError)
        completed_at = time.time()
        value = ResultRecord.format(self.owner, self.claim_id, self.token, self.generation,
                                    result, encoded, completed_at)
        for _ in range(3):
            try:
                r = await self.store.txn(
                    self._ours(), [Put(self._keys.result, value), *self._completion_deletes],
                    self._holder_and_result)
            except OutcomeUnknownError:
                log.info("completion of %s has an unknown outcome; reading back", self.job)
                # Invariant read-back (docs/protocol.md). If our result is there, it committed; if
                # the holder is still ours, it did not and the same conditional
                # transaction is safe to send again (it can commit at most once).
                outcome = await self._read_back("completion")
                if outcome is None:
                    continue
                r = outcome
            if r.succeeded:
                # What was stored, as a reader decodes it (the result as JSON has
                # it: lists for tuples, string keys), without decoding the record
                # this call has just encoded and validated.
                self.result = ResultRecord(
                    owner=self.owner, claim_id=self.claim_id, token=self.token,
                    generation=self.generation,
                    result=validation.as_decoded(result, encoded),
                    completed_at=completed_at, revision=r.revision)
                self._state = LeaseState.COMPLETED
                self._finish()
                self._slots_freed(r.revision)
                return self.result
            stored = r.kv(1)
            rec = _result_record(stored)[0] if stored is not None else None
            if rec is not None and rec.claim_id == self.claim_id:
                self.result = rec
                self._state = LeaseState.COMPLETED
                self._finish()
                return self.result
            self._lose(self._describe_change(r))
            if self.tenure is not None:  # off the hot path: we are refused anyway
                await self.tenure.record_refusal(self.store, self.token)
            raise self._stale(r)
        raise OutcomeUnknownError(
            f"completion of {self.job} could not be confirmed: three copies had unknown "
            "outcomes and the holder was still ours after each; the job is not completed "
            "yet and this handle still holds it (a copy still in flight may commit)")

    def fused_request(self, result_value: bytes, claim: Txn
                      ) -> tuple[list[Compare], list[TxnOp], list[TxnOp]]:
        """The fused transaction :meth:`complete_fused` sends: ``if ours then put
        result, delete holder (and pending, for an item; and the slots), claim
        else get holder, get result``, ``claim`` last in the success branch."""
        return (list(self._ours()),
                [Put(self._keys.result, result_value), *self._completion_deletes, claim],
                list(self._holder_and_result))

    async def complete_fused(self, result: Any, claim: Txn, next_reads: Sequence[Get]
                             ) -> tuple[ResultRecord, TxnResult | None, bool]:
        """:meth:`complete` with ``claim``, the claim of another item, nested
        under the completion's success branch (docs/queues.md, "Complete and
        claim the next"; ``Queues.complete_next`` builds it). Decided and
        refused exactly as :meth:`complete`; returns the result, what says
        whether the claim committed and whether that is a read: the nested
        claim's answer (False) when the commit's answer came, else
        ``next_reads`` read at one revision (True) with the read-back (the
        completion learned from a read: after an unknown outcome, or an
        earlier copy that committed), or ``None`` when that read failed (the
        claim may have committed: the caller ends the session).

        Raises :class:`OutcomeUnknownError` when the completion itself cannot
        be settled; a copy still in flight may then commit the claim with it.
        """
        if self._state is LeaseState.COMPLETED and self.result is not None:
            return self.result, None, False
        encoded = validation.json_payload(result, "result", validation.MAX_RESULT_BYTES,
                                          PayloadTooLargeError)
        record = ResultRecord(owner=self.owner, claim_id=self.claim_id, token=self.token,
                              generation=self.generation, result=result,
                              completed_at=time.time())
        value = record.encode(encoded)
        compares, success, failure = self.fused_request(value, claim)
        reads = [*self._holder_and_result, *next_reads]
        for _ in range(3):
            try:
                r = await self.store.txn(compares, success, failure)
            except OutcomeUnknownError:
                log.info("completion of %s (with a claim) has an unknown outcome; reading back",
                         self.job)
                back = await self._read_until_answered("completion", [], reads, [])
                if self._is_ours(back.kv(0)):
                    continue  # neither committed: the conditional transaction is safe to resend
                self._completed_or_stale(back)
                assert self.result is not None
                return self.result, TxnResult(True, back.revision, back.responses[2:]), True
            if r.succeeded:
                self.result = ResultRecord(
                    owner=record.owner, claim_id=record.claim_id, token=record.token,
                    generation=record.generation,
                    result=validation.as_decoded(result, encoded),
                    completed_at=record.completed_at, revision=r.revision)
                self._state = LeaseState.COMPLETED
                self._finish()
                claim_answer = r.nested(len(success) - 1)  # its revision: the outer one's
                return (self.result, TxnResult(claim_answer.succeeded, r.revision,
                                               claim_answer.responses), False)
            self._completed_or_stale(r)
            # an earlier copy committed (its answer was lost): so may its claim
            assert self.result is not None
            try:
                back = await self._read_until_answered("completion", [], list(next_reads), [])
            except OutcomeUnknownError:
                return self.result, None, True
            return self.result, back, True
        raise OutcomeUnknownError(
            f"completion of {self.job} could not be confirmed: three copies had unknown "
            "outcomes and the holder was still ours after each; the job is not completed "
            "yet and this handle still holds it (a copy still in flight may commit)")

    def _is_ours(self, kv: KeyValue | None) -> bool:
        return (kv is not None and kv.create_revision == self.token
                and kv.value == self._holder_value)

    def _completed_or_stale(self, r: TxnResult) -> None:
        """From a refused completion's reads (holder, result): completed if
        the result is this claim's, else lost and :class:`StaleTokenError`."""
        stored = r.kv(1)
        rec = _result_record(stored)[0] if stored is not None else None
        if rec is not None and rec.claim_id == self.claim_id:
            self.result = rec
            self._state = LeaseState.COMPLETED
            self._finish()
            return
        self._lose(self._describe_change(r))
        raise self._stale(r)

    async def _read_back(self, what: str) -> TxnResult | None:
        """After an unknown outcome: ``None`` when the holder is still ours (the
        write has not committed); else the holder and result as they are now.

        Raises :class:`OutcomeUnknownError` (not a plain "unavailable", which
        would claim nothing was written) when etcd cannot be read for 30 s.
        """
        r = await self._read_until_answered(what, self._ours(), [], self._holder_and_result)
        return None if r.succeeded else r

    async def _read_until_answered(self, what: str, compares: Sequence[Compare],
                                   success: Sequence[Get], failure: Sequence[Get]
                                   ) -> TxnResult:
        """One read-only transaction, retried while etcd is unreachable, for at
        most the client's ``read_back_timeout``; then :class:`OutcomeUnknownError`
        for ``what``."""
        deadline = time.monotonic() + self._read_back_timeout
        while True:
            try:
                return await self.store.txn(compares, success, failure)
            except StoreUnavailableError as exc:
                if time.monotonic() > deadline:
                    raise OutcomeUnknownError(
                        f"{what} of {self.job} has an unknown outcome and etcd could not "
                        f"be read back: {exc}") from exc
                await asyncio.sleep(0.2)

    async def release(self) -> None:
        """Give the job back (it becomes claimable at once; the attempt stays counted).

        Returns only once etcd confirmed the holder is gone. Raises
        :class:`StaleTokenError` if someone else holds or completed the job,
        and :class:`OutcomeUnknownError` if the release could not be confirmed:
        then the holder is (as far as etcd was last seen) still ours, this
        handle still holds the job, and calling ``release`` again is safe.
        """
        if self._state in (LeaseState.RELEASED, LeaseState.COMPLETED):
            return
        for _ in range(3):
            try:
                r = await self.store.txn(self._ours(), [Delete(self._keys.holder),
                                                        *self._slot_deletes,
                                                        *self._history_puts(TenureEnd.RELEASED)],
                                         self._holder_and_result)
            except OutcomeUnknownError:
                log.info("release of %s has an unknown outcome; reading back", self.job)
                outcome = await self._read_back("release")
                if outcome is None:
                    continue  # still ours: not applied; the conditional delete is safe to resend
                if outcome.kv(0) is None and outcome.kv(1) is None:
                    break  # our delete committed (or the key expired): released either way
                r = outcome
            if not r.succeeded:
                self._lose(self._describe_change(r))
                raise self._stale(r)
            self._slots_freed(r.revision)
            break
        else:
            raise OutcomeUnknownError(
                f"release of {self.job} could not be confirmed: three copies had unknown "
                "outcomes and the holder was still ours after each; the job is still held "
                "by this handle (release again, or close the client to revoke its lease)")
        self._state = LeaseState.RELEASED
        self._finish()

    def _history_puts(self, end: TenureEnd | None) -> list[Put]:
        """What a transaction of this claim adds to its tenure: the ``end``, or
        (``None``) one more checkpoint."""
        if self.tenure is None:
            return []
        return [self.tenure.checkpoint_put() if end is None else self.tenure.end_put(end)]

    def _slots_freed(self, revision: int) -> None:
        if self.slots and self._on_slots_freed is not None:
            self._on_slots_freed(self.slots, revision)

    async def __aenter__(self) -> Lease:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._state is LeaseState.HELD:
            try:
                await self.release()
            except StoreUnavailableError as e:
                log.warning("release of %s on exit failed; the job stays held until this "
                            "handle's etcd lease ends (client closed or expiry): %s", self.job, e)
            except JobLeaseError as e:
                log.info("release of %s on exit failed: %s", self.job, e)

    @staticmethod
    async def check_all(holders: list[Lease]) -> None:
        """Re-check many holders with few requests (invariant ``renew-checks-holder`` at scale).

        One transaction per chunk of 64 handles (two compares each, within
        etcd's default ``--max-txn-ops`` of 128) proves every holder key in
        the chunk is still ours; only a chunk that fails is re-checked handle
        by handle to find which were lost. Renewal then costs about
        ``held / 64`` requests per keep-alive period instead of ``held``.
        """
        leases = [h for h in holders if h._state is LeaseState.HELD]
        for start in range(0, len(leases), 64):
            chunk = leases[start:start + 64]
            try:
                r = await chunk[0].store.txn([c for lease in chunk for c in lease._ours()], [])
            except JobLeaseError as exc:
                log.info("holder check failed: %s", exc)
                continue
            if not r.succeeded:
                for lease in chunk:
                    await lease.check()

    def checkpoint_dict(self) -> dict[str, Any] | None:
        """``checkpoint_record`` as JSON (``{"corrupt": why}`` if it cannot be decoded)."""
        try:
            record = self.checkpoint_record
        except CorruptRecordError as exc:
            return {"corrupt": str(exc)}
        return None if record is None else record.to_dict()

    def to_dict(self) -> dict[str, Any]:
        queue = {}
        if isinstance(self.job, ItemRef):
            queue = {"queue": str(self.job.queue), "item": self.job.id,
                     "payload": None if self.item is None else self.item.payload}
        if self.slots:
            queue["semaphores"] = [grant.to_dict() for grant in self.slots]
        return {"job": str(self.job), **queue, "owner": self.owner, "claimId": self.claim_id,
                "token": self.token, "generation": self.generation, "ttl": self.ttl,
                "leaseId": self.lease_id, "state": self.state.value,
                "checkpoint": self.checkpoint_dict(),
                "valid": self.valid, "remainingSeconds": round(self.remaining(), 3),
                "lostReason": self.lost_reason}
