"""The protocol's entry point: register, claim, inspect and watch jobs.

Claim (invariant ``claim-is-one-transaction``, docs/protocol.md) is one etcd
transaction:

    if  mod(spec) == the spec revision we know   (registered, spec unchanged)
    and create(holder) == 0                      (no live holder)
    and version(result) == 0                     (not completed)
    and version(claims) < maxAttempts            (attempts left; skipped if unlimited)
    then put holder (bound to this client's etcd lease), put claims, get claims,
         get checkpoint                          (the last holder's, for the new one)
    else get spec, holder, result, claims        (to say exactly why not)

A job with a tenure history (``historyLimit`` > 0 in its spec) adds
``version(claims) == g`` (the generation this client last saw) and, in the
success branch, puts the tenure ``_history/<name>/<g+1>`` and deletes the
tenures older than the last ``historyLimit`` (docs/protocol.md, "Tenure history").

The commit revision is the fencing token; ``claims``' version after the put is
the generation. Both come back in the same round trip. The spec is read once
and cached: a changed spec fails the first compare and is re-read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections import OrderedDict, defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableSequence, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from joblease import slots as slots_plan
from joblease import tracing, validation
from joblease.background import BackgroundTasks, until_first
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    ClaimOutcomeUnknownError,
    ClaimRevokedError,
    CompactedError,
    CorruptRecordError,
    FencedError,
    HeldError,
    InvalidInputError,
    ItemRecordMissingError,
    JobLeaseError,
    LeaseNotFoundError,
    NotRegisteredError,
    OutcomeUnknownError,
    QueueNotFoundError,
    SemaphoreFullError,
    StaleTokenError,
    StoreUnavailableError,
    WaitSessionLostError,
)
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.history import (
    TenureKeys,
    assemble_history,
    history_reads,
    record_refusal_of,
    tenure_of,
)
from joblease.keys import (
    ItemKeys,
    ItemRef,
    JobKeys,
    JobRef,
    KeySpace,
    SemaphoreKeys,
    SemaphoreRef,
)
from joblease.lease import READ_BACK_SECONDS, Lease
from joblease.records import (
    CheckpointRecord,
    History,
    Holder,
    ItemRecord,
    JobSpec,
    JobState,
    ResultRecord,
    SemaphoreUse,
    SlotRecord,
    TenureEnd,
    WaiterRecord,
    decoding,
    encode_claim,
    encode_holder_and_tenure,
    new_claim_id,
)
from joblease.session import Session
from joblease.session_pool import SessionPool
from joblease.slot_view import SemaphoreView, wait_for_room
from joblease.slots import SlotGrant, SlotPlan, Ticket
from joblease.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Put,
    Store,
    Txn,
    TxnOp,
    TxnResult,
    WatchEvent,
    describe,
    prefix_end,
    retry_unavailable,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Keys per read when scanning jobs (:meth:`JobLeaseClient.scan_jobs`).
SCAN_PAGE = 512
#: What a claim without semaphore slots reserves while in flight: nothing
#: (one reusable context manager, not a new one per claim).
_NOT_RESERVING = contextlib.nullcontext()


class _Reservation:
    """A claim's slot picks in ``reserved`` (by semaphore prefix) while it is in
    flight (JobLeaseClient._reserving); a plain class, not a generator-based
    context manager: one is entered per claim that takes slots."""

    __slots__ = ("_plan", "_reserved")

    def __init__(self, reserved: dict[bytes, set[int]], plan: SlotPlan) -> None:
        self._reserved, self._plan = reserved, plan

    def __enter__(self) -> None:
        reserved = self._reserved
        for state, indexes in self._plan.picks:
            held = reserved.get(state.keys.prefix)
            if held is None:
                reserved[state.keys.prefix] = set(indexes)
            else:
                held.update(indexes)

    def __exit__(self, *exc: object) -> None:
        reserved = self._reserved
        for state, indexes in self._plan.picks:
            held = reserved.get(state.keys.prefix)
            if held is not None:
                held.difference_update(indexes)
                if not held:
                    del reserved[state.keys.prefix]


@dataclass(frozen=True)
class ItemClaim:
    """What a claim of a queue item compares besides a job's conditions: the
    item's pending key as read (docs/queues.md, "Claim an item")."""

    pending_revision: int


def assemble(job: JobRef, fields: dict[str, KeyValue], revision: int, *,
             history_revision: int = 0) -> JobState:
    """Build a :class:`JobState` from a job's keys (``spec``/``holder``/``claims``/``result``/
    ``checkpoint``).

    Never raises for stored data: a record that cannot be decoded is left empty
    and named in ``JobState.corrupt`` (phase ``Corrupt``), so one bad job never
    stops a reader (list, watch, the operator) of every other job.
    """
    spec_kv, holder_kv = fields.get("spec"), fields.get("holder")
    claims_kv, result_kv = fields.get("claims"), fields.get("result")
    checkpoint_kv = fields.get("checkpoint")
    generation = claims_kv.version if claims_kv else 0
    problems: list[str] = []
    spec = holder = result = checkpoint = None
    last_owner = None
    try:
        spec = JobSpec.decode(spec_kv.value) if spec_kv else None
    except CorruptRecordError as exc:
        problems.append(str(exc))
    try:
        if holder_kv is not None:
            value = Holder.decode_value(holder_kv.value)
            holder = Holder(owner=value["owner"], claim_id=value["claimId"],
                            token=holder_kv.create_revision, generation=generation,
                            lease_id=holder_kv.lease,
                            claimed_at=float(value.get("claimedAt", 0)))
    except CorruptRecordError as exc:
        problems.append(str(exc))
    try:
        if claims_kv is not None:
            with decoding("claims"):
                owner = json.loads(claims_kv.value).get("owner")
                last_owner = owner if isinstance(owner, str) else None
    except CorruptRecordError as exc:
        problems.append(str(exc))
    try:
        result = ResultRecord.decode(result_kv.value, result_kv.mod_revision) if result_kv else None
    except CorruptRecordError as exc:
        problems.append(str(exc))
    try:
        checkpoint = (CheckpointRecord.decode(checkpoint_kv.value, checkpoint_kv.mod_revision)
                      if checkpoint_kv else None)
    except CorruptRecordError as exc:
        problems.append(str(exc))
    return JobState(
        job=job,
        revision=revision,
        spec=spec,
        spec_revision=spec_kv.mod_revision if spec_kv else 0,
        holder=holder,
        generation=generation,
        last_claim_owner=last_owner,
        result=result,
        mod_revision=max((kv.mod_revision for kv in fields.values()), default=0),
        corrupt="; ".join(problems) or None,
        checkpoint=checkpoint,
        history_revision=history_revision,
    )


def _item_of(kv: KeyValue | None) -> ItemRecord | None:
    return None if kv is None else ItemRecord.decode(kv.value, kv.create_revision)


class JobLeaseClient:
    """Register, claim, complete, inspect and watch jobs in etcd.

    ``async with JobLeaseClient(EtcdConfig(endpoints=("127.0.0.1:2379",))) as c:``

    ``read_back_timeout`` bounds how long an unknown outcome is read back
    before the client gives up and says so (:class:`ClaimOutcomeUnknownError`,
    :class:`OutcomeUnknownError`).

    ``revoke_on_loss`` (default True): a session lost past its local deadline
    revokes its etcd lease at once, so its jobs become claimable at once. A
    caller that must stop work first (``joblease run`` stops its command, then
    revokes) passes False; etcd then expires the lease no earlier than the
    margin after the local deadline (invariant ``stopped-before-reclaim``).
    """

    #: Specs of at most this many jobs are cached; the least recently used go first.
    _spec_cache_size = 1024

    def __init__(self, config: EtcdConfig | None = None, *, store: Store | None = None,
                 margin: float | None = None, read_back_timeout: float = READ_BACK_SECONDS,
                 revoke_on_loss: bool = True) -> None:
        self.config = config or EtcdConfig.from_env()
        self.store: Store = store if store is not None else EtcdStore(self.config)
        self.keys = KeySpace(self.config.root)
        tracing.prepare()  # the SDK's import, if traced, now rather than inside the first claim
        self._read_back_timeout = read_back_timeout
        self._specs: OrderedDict[JobRef, tuple[int, JobSpec]] = OrderedDict()
        #: each cached job's generation (claims' version) as last seen: a claim of a
        #: job with a history names its tenure key by it (a wrong guess fails the
        #: claim's compare, whose failure branch reads the right one)
        self._generations: dict[JobRef, int] = {}
        #: slot indexes picked by this client's claims in flight, by semaphore prefix
        self._reserved_slots: dict[bytes, set[int]] = {}
        #: watched views of the semaphores its claims use, by prefix (LRU)
        self._views: OrderedDict[bytes, SemaphoreView] = OrderedDict()
        self._max_views = 64
        self._refs: dict[tuple[str, tuple[SemaphoreUse, ...]],
                         list[tuple[SemaphoreRef, SemaphoreKeys, int]]] = {}
        self._background = BackgroundTasks()
        #: owner strings :meth:`claim` has validated (bounded, see _valid_owner)
        self._valid_owners: set[str] = set()
        #: the etcd leases claims are bound to (joblease.session_pool)
        self.sessions = SessionPool(self.store, self._background, margin=margin,
                                    revoke_on_loss=revoke_on_loss,
                                    revoke_timeout=read_back_timeout)

    @property
    def read_back_timeout(self) -> float:
        """How long this client reads back an unknown outcome before saying so."""
        return self._read_back_timeout

    async def __aenter__(self) -> JobLeaseClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing. With ``revoke`` (default) held jobs become claimable at
        once (if etcd cannot be reached for the revoke, once their TTL runs
        out); without, they stay held until etcd expires them (``claim`` in a
        short-lived CLI process uses that). Retired sessions are closed too."""
        views, self._views = list(self._views.values()), OrderedDict()
        for view in views:
            await view.close()
        await self.sessions.close(revoke=revoke)
        await self._background.wait()
        await self.store.close()

    # -- registration ------------------------------------------------------------------------

    async def register(self, job: JobRef, spec: JobSpec, *,
                       guard: Sequence[Compare] = ()) -> int:
        """Create or update the registration; idempotent. Returns the etcd revision.

        ``guard``: extra conditions this call's write requires (the operator
        passes "the leader key still has my term"). The write commits only
        while every one holds, in the same transaction; otherwise nothing is
        written and :class:`FencedError` is raised.
        """
        validation.job_ref(job)
        validation.ttl(spec.lease_duration_seconds)
        validation.max_attempts(spec.max_attempts)
        validation.history_limit(spec.history_limit)
        validation.json_payload(spec.parameters, "parameters", validation.MAX_PARAMETERS_BYTES)
        slots_plan.check_uses(spec.semaphores)
        keys = self.keys.job(job)
        value = spec.encode()
        if not guard:
            r = await self._write_idempotent(
                [Compare(keys.spec, "value", "==", value)], [Get(keys.spec)],
                [Put(keys.spec, value)])
            return r.revision
        # The unguarded transaction already uses both branches (``if spec == value then
        # get else put``), so the guard cannot simply be added to its compares: a failed
        # guard would run the put. It goes one level up instead, as the compares of an
        # outer transaction whose success branch is the unguarded one, nested (etcd >=
        # 3.3, RequestOp.request_txn): one atomic transaction, and "guard failed" is
        # exactly "outer failed", never confused with "spec differs". The failure branch
        # reads the spec so the error can say what is there. An unknown outcome is
        # settled as the unguarded register settles it, by sending the same transaction
        # again (harmless: a repeat after a commit is a read); that copy is also the
        # read-back, and if it finds the guard failed, the error says the first copy may
        # have committed before (written=None), not that nothing was written.
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
                log.info("guarded register of %s has an unknown outcome; sending it again",
                         job)
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            if r.succeeded:
                return r.revision
            if not unknown:
                raise FencedError(f"register of {job}", describe(guard))
            now = r.kv(0)
            detail = ("the spec holds this call's value now" if now and now.value == value
                      else "the spec holds another value now" if now
                      else "the job is not registered now")
            raise FencedError(f"register of {job}", describe(guard), written=None,
                              detail=detail)
        raise AssertionError("unreachable")

    async def unregister(self, job: JobRef, *, guard: Sequence[Compare] = ()) -> int:
        """Delete every key of the job's registration as it is now; a live holder
        learns it lost at its next check. Returns the etcd revision.

        The delete is conditional on the spec's create revision read first, so
        it removes exactly the registration it saw and never a newer one: a
        copy re-sent (or arriving late) after an unknown outcome cannot erase
        a job that was registered, claimed and completed again in between.
        An unknown outcome is settled by reading the spec back: gone or
        re-created means the registration we saw is gone (done); the same
        registration still there means the delete did not commit, and the
        same conditional delete is sent again (it can commit at most once).
        If the registration changed between the read and the delete, the one
        that is there now is not ours to delete and is left alone.

        ``guard``: extra conditions the delete requires, as for :meth:`register`
        (outer transaction, the conditional delete nested in it); if one fails,
        nothing is deleted and :class:`FencedError` is raised. After an unknown
        outcome the read-back evaluates the guard too (a read-only transaction
        with the guard as compares, reading the spec in both branches): guard
        failed and the registration we saw still there means the delete never
        committed and no copy can while the guard fails (``written=False``);
        guard failed and the registration gone means it may have been ours
        (``written=None``).
        """
        validation.job_ref(job)
        keys = self.keys.job(job)
        self._forget_spec(job)
        _, kvs = await self.store.get(keys.spec)
        created = kvs[0].create_revision if kvs else 0
        condition = [Compare(keys.spec, "create", "==", created)]
        # the job's keys and its tenure history go together: a registration made
        # later starts its generations (and so its tenure keys) at 1 again
        deletes = (Delete(keys.prefix, prefix=True), Delete(keys.history.prefix, prefix=True))
        unknown = False
        for _ in range(5):
            try:
                if not guard:
                    r = await self.store.txn(condition, deletes, [])
                    return r.revision
                r = await self.store.txn(guard, [Txn(tuple(condition), deletes)],
                                         [Get(keys.spec)])
                if r.succeeded:
                    return r.revision
                raise FencedError(f"unregister of {job}", describe(guard),
                                  written=None if unknown else False)
            except OutcomeUnknownError as exc:
                unknown = True
                log.info("unregister of %s has an unknown outcome; reading back", job)
                try:
                    if guard:
                        back = await self.retry_read(
                            lambda: self.store.txn(guard, [Get(keys.spec)], [Get(keys.spec)]))
                        revision, now = back.revision, back.kvs(0)
                    else:
                        revision, now = await self.retry_read(lambda: self.store.get(keys.spec))
                except JobLeaseError as read_failed:
                    raise OutcomeUnknownError(
                        f"unregister of {job} has an unknown outcome and reading it back "
                        f"failed: {read_failed}") from exc
                gone = (now[0].create_revision if now else 0) != created
                if guard and not back.succeeded:
                    raise FencedError(
                        f"unregister of {job}", describe(guard), written=None if gone else False,
                        detail="the registration it saw is gone now" if gone else
                        "the registration it saw is still there") from exc
                if gone:
                    return revision  # what we were asked to delete is gone; a newer one stays
        raise OutcomeUnknownError(f"unregister of {job} could not be confirmed")

    async def delete_registered(self, spec_key: bytes, prefix: bytes, what: str,
                                missing: Callable[[], JobLeaseError], *,
                                guard: Sequence[Compare] = ()) -> int:
        """Delete every key under ``prefix`` in one transaction conditional on
        ``spec_key``'s create revision as read first (a queue or a semaphore:
        the one read is removed, never a newer one), under ``guard`` if given (an
        outer transaction, the conditional delete nested in it, as
        :meth:`unregister`). Raises ``missing()`` if there is no spec,
        :class:`FencedError` if the guard fails (``written=None`` after an
        unknown outcome: a first copy may have committed). An unknown outcome is
        read again: gone or re-created means done. Returns the revision."""
        unknown = False
        for _ in range(5):
            _, kvs = await self.store.get(spec_key)
            if not kvs:
                raise missing()
            condition = Compare(spec_key, "create", "==", kvs[0].create_revision)
            delete = Delete(prefix, prefix=True)
            try:
                if guard:
                    outer = await self.store.txn(guard, [Txn((condition,), (delete,))], [])
                    if not outer.succeeded:
                        raise FencedError(f"delete of {what}", describe(guard),
                                          written=None if unknown else False)
                    nested = outer.nested(0)
                    r = TxnResult(nested.succeeded, outer.revision, nested.responses)
                else:
                    r = await self.store.txn([condition], [delete], [])
            except OutcomeUnknownError:
                unknown = True
                continue
            if r.succeeded:
                return r.revision
        raise OutcomeUnknownError(f"deleting {what} did not settle")

    async def _write_idempotent(self, compares: list[Compare], success: list[Any],
                                failure: list[Any]) -> TxnResult:
        """Re-send a write after an unknown outcome, for writes whose repetition is harmless.

        Only ``register`` uses it: ``if spec == value then get else put value``.
        A second copy after a committed first one is a read; a copy arriving
        after a concurrent change re-applies this call's value, which is the
        order "the other change, then this call" (the calls overlapped).
        """
        for attempt in range(5):
            try:
                return await self.store.txn(compares, success, failure)
            except OutcomeUnknownError:
                if attempt == 4:
                    raise
                await asyncio.sleep(0.1 * 2**attempt)
        raise AssertionError("unreachable")

    # -- claim -------------------------------------------------------------------------------

    async def _spec(self, job: JobRef, keys: JobKeys, *, refresh: bool = False
                    ) -> tuple[int, JobSpec]:
        """The job's spec and its mod revision, from a bounded LRU cache (a
        changed spec fails the claim's first compare and is re-read).

        The only way into the cache, and ``job`` is validated on the way: a
        cached job is a valid one (:meth:`claim` does not validate it again)."""
        cached = None if refresh else self._specs.get(job)
        if cached is not None:
            self._specs.move_to_end(job)
            return cached
        validation.job_ref(job)
        # one read of the spec and the generation (what a history's tenure key needs)
        r = await self.store.txn([], [Get(keys.spec), Get(keys.claims)])
        spec_kv, claims_kv = r.kv(0), r.kv(1)
        if spec_kv is None:
            self._specs.pop(job, None)
            self._generations.pop(job, None)
            raise NotRegisteredError(str(job))
        entry = (spec_kv.mod_revision, JobSpec.decode(spec_kv.value))
        self._specs[job] = entry
        self._specs.move_to_end(job)
        self._generations[job] = claims_kv.version if claims_kv else 0
        while len(self._specs) > self._spec_cache_size:
            self._generations.pop(self._specs.popitem(last=False)[0], None)
        return entry

    def _forget_spec(self, job: JobRef) -> None:
        """Drop the cached spec (and generation): the next claim reads both again."""
        self._specs.pop(job, None)
        self._generations.pop(job, None)

    def _saw_generation(self, job: JobRef | ItemRef, generation: int) -> None:
        """Remember ``job``'s generation for its next claim's tenure key, while
        its spec is cached (so the two are bounded and evicted together)."""
        if isinstance(job, JobRef) and job in self._specs:
            self._generations[job] = generation

    async def plan_slots(self, what: str, namespace: str, spec: JobSpec,
                         ticket: Ticket | None, *, fresh: bool = False,
                         waiting: bool = False) -> SlotPlan | None:
        """The semaphore slots a claim of ``spec`` takes (None: it names none):
        planned from this client's watched views of the semaphores, or (``fresh``
        after a refused claim, a view not ready) read in one read-only
        transaction; :class:`SemaphoreFullError` when one has no room for it,
        with what to wait from: the read's revision, or the views' change marks.

        A view saying "full" is the answer for a caller that will wait and plan
        again at the view's next change (``waiting``, or in line with a
        ``ticket``): such a wake-up costs no round trip. A plain claim is
        refused only on a read (the view may be a little behind etcd)."""
        if not spec.semaphores:
            return None
        refs = self._semaphore_refs(namespace, spec.semaphores)
        if not fresh:  # the fast path plans from watched views
            views = [self._view(ref, keys) for ref, keys, _ in refs]
            # ready views answer without an await (a new one waits for its first read)
            seen = [view.state_now() if view.ready else await view.state() for view in views]
            if all(state is not None for state in seen):
                try:
                    return slots_plan.plan(
                        what, [(state, weight) for state, (_, _, weight) in
                               zip(seen, refs, strict=True) if state is not None],
                        ticket, self._reserved_slots)
                except SemaphoreFullError as full:
                    if ticket is not None or waiting:
                        # the marks of the states planned from (no await since)
                        full.marks = tuple((view, view.changes) for view in views)
                        raise
                    # the view may be behind: the read below decides
        reads = [op for _, keys, _ in refs for op in slots_plan.reads(keys)]
        r = await self.retry_read(lambda: self.store.txn([], reads))
        states = [(slots_plan.parse(ref, keys, r, 3 * n), weight)
                  for n, (ref, keys, weight) in enumerate(refs)]
        try:
            return slots_plan.plan(what, states, ticket, self._reserved_slots)
        except SemaphoreFullError as full:
            full.revision = r.revision
            raise

    def _semaphore_refs(self, namespace: str, uses: tuple[SemaphoreUse, ...]
                        ) -> list[tuple[SemaphoreRef, SemaphoreKeys, int]]:
        """``slots.semaphore_refs``, kept per (namespace, uses): the same keys on
        every claim of the same jobs, built once (at most 1024 kept)."""
        found = self._refs.get((namespace, uses))
        if found is None:
            if len(self._refs) >= 1024:
                self._refs.clear()
            found = self._refs[(namespace, uses)] = slots_plan.semaphore_refs(
                self.keys, namespace, uses)
        return found

    def _applied(self, revision: int, puts: Sequence[tuple[bytes, bytes, int]] = (),
                 deletes: Sequence[bytes] = ()) -> None:
        """Our transaction committed at ``revision``: the semaphore views it
        touched apply its slot and waiter writes now, not when their watches
        deliver them (joblease.slot_view)."""
        for view in self._views.values():
            prefix = view.keys.prefix
            if any(k.startswith(prefix) for k, _, _ in puts) or any(
                    k.startswith(prefix) for k in deletes):
                view.applied(revision, puts, deletes)

    def _took(self, plan: SlotPlan, revision: int, value: bytes, lease: int) -> None:
        """Our claim with ``plan`` committed at ``revision`` (slot value ``value``
        bound to ``lease``): ``_applied``, straight to the views of its semaphores."""
        for state, indexes in plan.picks:
            view = self._views.get(state.keys.prefix)
            if view is not None:
                view.took(revision, indexes, value, lease)
        if plan.ticket is not None:  # its claim deleted its waiter keys
            self._applied(revision, (), plan.ticket.keys)

    def _slots_freed(self, grants: Sequence[SlotGrant], revision: int) -> None:
        """A completion or release of ours deleted ``grants``' slots at ``revision``."""
        for grant in grants:
            view = self._views.get(grant.prefix) if grant.prefix else None
            if view is not None:
                view.freed(revision, grant.indexes)
            elif not grant.prefix:  # a grant read back (held_slots): found by its keys
                self._applied(revision, (), grant.keys)

    async def wait_for_room(self, full: SemaphoreFullError,
                            semaphores: Sequence[SemaphoreKeys], timeout: float) -> None:
        """After ``full``, until room may have been made in one of ``semaphores``
        (a slot or a waiter deleted, a limit changed), at most ``timeout``
        seconds: on the watched views when they are there (from their change
        marks, or from the refusal's read revision), else on a watch of each."""
        views = dict(full.marks)
        if not views:
            views = {v: None for k in semaphores
                     if (v := self._views.get(k.prefix)) is not None and not v.broken}
            if len(views) < len(semaphores):
                await self.wait_for_slots(semaphores, full.revision, timeout)
                return
        await wait_for_room(list(views.items()), full.revision, timeout)

    def _view(self, ref: SemaphoreRef, keys: SemaphoreKeys) -> SemaphoreView:
        """The watched view of a semaphore (at most ``_max_views``, least recently
        used closed first; a broken one is replaced)."""
        view = self._views.get(keys.prefix)
        if view is None or view.broken:
            if view is not None:
                self._close_view(self._views.pop(keys.prefix))
            view = self._views[keys.prefix] = SemaphoreView(self.store, ref, keys)
            while len(self._views) > self._max_views:
                self._close_view(self._views.popitem(last=False)[1])
        self._views.move_to_end(keys.prefix)
        return view

    def _close_view(self, view: SemaphoreView) -> None:
        self._background.spawn(view.close())

    def _reserving(self, plan: SlotPlan | None) -> contextlib.AbstractContextManager[None]:
        """While a claim with ``plan`` is in flight, this client's other claims
        pick other slots (they would only collide with it)."""
        if plan is None:
            return _NOT_RESERVING
        return _Reservation(self._reserved_slots, plan)

    def _valid_owner(self, owner: str) -> None:
        """Validate ``owner`` and remember it (a worker claims as one owner, or a
        few): :meth:`claim` validates each owner string once, not at every claim."""
        validation.owner(owner)
        if len(self._valid_owners) >= 64:
            self._valid_owners.clear()
        self._valid_owners.add(owner)

    async def claim(self, job: JobRef, owner: str, *, ticket: Ticket | None = None) -> Lease:
        """Claim ``job`` for ``owner`` in one etcd transaction.

        Raises :class:`NotRegisteredError`, :class:`HeldError`,
        :class:`AlreadyCompletedError` or :class:`AttemptsExhaustedError`
        saying why not; :class:`ClaimRevokedError` (an ``AttemptsExhaustedError``)
        when our own claim used the last attempt but was ended while settling
        an unknown outcome; :class:`ClaimOutcomeUnknownError` when an unknown
        outcome could not be settled (the claim may have committed; its etcd
        lease was ended before raising, so no holder of it is left renewed).
        Cancelling a claim in flight ends the session it was bound to.

        A job whose spec names semaphores takes their slots in the same
        transaction (docs/semaphores.md), or raises :class:`SemaphoreFullError`
        (``ticket``: the caller's place in line, from :meth:`claim_waiting`).
        """
        cached = self._specs.get(job)
        if cached is None:  # a cached job's ref was validated when its spec was read
            validation.job_ref(job)
        if owner not in self._valid_owners:
            self._valid_owner(owner)
        keys = self.keys.job(job)
        refresh = False
        revoked: list[int] = []  # tokens of our claims that committed and were revoked
        fresh_slots = False
        unsettled = 0  # tries that did not settle (4 at most, as without semaphores)
        for _ in range(16):  # ... and slot races, re-planned (picks are random), up to 16
            # The common case (spec cached, no semaphores, the current session usable)
            # costs no await before the claim's own transaction.
            if refresh:
                cached = None
            elif cached is None:
                cached = self._specs.get(job)
            if cached is not None:
                self._specs.move_to_end(job)
                spec_revision, spec = cached
            else:
                spec_revision, spec = await self._spec(job, keys, refresh=refresh)
            try:
                slot_plan = None if not spec.semaphores else await self.plan_slots(
                    str(job), job.namespace, spec, ticket, fresh=fresh_slots)
            except SemaphoreFullError:
                if refresh or ticket is not None:
                    # In line: the spec is re-read by claim_waiting at most once
                    # per guard TTL, not at every wake-up of every waiter.
                    raise
                refresh = True  # planned from a cached spec: make sure it is current
                continue
            except (InvalidInputError, NotRegisteredError):
                if refresh:
                    raise
                refresh = True  # planned from a cached spec: make sure it is current
                continue
            session = (self.sessions.ready(spec.lease_duration_seconds)
                       or await self.sessions.for_claim(spec.lease_duration_seconds))
            with self.sessions.using(session), self._reserving(slot_plan):
                outcome = await self._claim_on(job, keys, owner, spec_revision, spec, session,
                                               revoked, slots=slot_plan,
                                               generation=self._generations.get(job, 0))
            if isinstance(outcome, Lease):
                return outcome
            refresh, cached = outcome, None
            fresh_slots = slot_plan is not None  # refused: plan from etcd, not a view
            if slot_plan is None or outcome is False:
                unsettled += 1
                if unsettled == 4:
                    break
        if revoked:
            raise StoreUnavailableError(
                f"claim of {job} did not settle after several attempts; claims with tokens "
                f"{', '.join(map(str, revoked))} committed and were ended by the revoke that "
                f"settled their unknown outcome (each used an attempt)")
        raise StoreUnavailableError(f"claim of {job} did not settle after several attempts")

    async def _claim_on(self, job: JobRef | ItemRef, keys: JobKeys | ItemKeys, owner: str,
                        spec_revision: int, spec: JobSpec, session: Session[Lease],
                        revoked: list[int], item: ItemClaim | None = None,
                        slots: SlotPlan | None = None, generation: int = 0) -> Lease | bool:
        """One claim transaction bound to ``session``: the lease, or whether to
        re-read the spec before trying again (``revoked`` collects the tokens
        of our claims ended while settling an unknown outcome).

        For a queue item (``item``, with ``ItemKeys``), ``spec`` is its queue's
        (``max_attempts`` counted from the round's ``attempts_from``) and the
        item's pending key must be unchanged too (docs/queues.md, "Claim an item").
        ``slots``: the semaphore slots to take in the same transaction.
        ``generation``: the job's (or item's) generation as last seen, for its
        tenure key when ``spec`` keeps a history (a wrong guess fails the
        ``version(claims) == generation`` compare: the claim is refused and
        retried with the generation its failure branch read)."""
        claim_id = new_claim_id()
        claimed_at = time.time()
        if spec.history_limit > 0:
            holder_value, tenure_start = encode_holder_and_tenure(
                owner, claim_id, spec.lease_duration_seconds, claimed_at)
        else:
            holder_value = Holder.encode_value(owner, claim_id, spec.lease_duration_seconds,
                                               claimed_at)
        claim_value = encode_claim(owner, claim_id)
        compares = [
            Compare(keys.spec, "mod", "==", spec_revision),
            Compare(keys.holder, "create", "==", 0),
            Compare(keys.result, "version", "==", 0),
        ]
        if spec.max_attempts > 0:
            compares.append(Compare(keys.claims, "version", "<", spec.max_attempts))
        # A job with a history needs no read-back of its generation: the
        # ``version(claims) == generation`` compare below fixes it at
        # generation + 1, so the success branch has one Get fewer.
        keeps_history = spec.history_limit > 0
        success: list[TxnOp] = [Put(keys.holder, holder_value, lease=session.lease_id),
                                Put(keys.claims, claim_value)]
        if not keeps_history:
            success.append(Get(keys.claims))
        success.append(Get(keys.checkpoint))
        failure = [Get(keys.spec), Get(keys.holder), Get(keys.result), Get(keys.claims)]
        if item is not None:
            assert isinstance(keys, ItemKeys)
            compares += [Compare(keys.pending, "mod", "==", item.pending_revision),
                         Compare(keys.item, "version", ">", 0)]
            success.append(Get(keys.item))
            failure += [Get(keys.pending), Get(keys.item)]
        slot_value = b""
        if slots is not None:
            compares += slots.compares()
            # after every Get the success branch is read by index; writes go last
            slot_value = SlotRecord(str(job), owner, claim_id).encode()
            success += slots.writes(session.lease_id, slot_value)
        tenure = None
        if keeps_history:
            tenure = TenureKeys(keys.history, generation + 1)
            compares.append(Compare(keys.claims, "version", "==", generation))
            success += tenure.claim_writes(tenure_start, spec.history_limit)
        try:
            r = await self.store.txn(compares, success, failure)
        except LeaseNotFoundError:
            # etcd expired our session lease before we noticed; start a new one.
            self.sessions.drop(session, "etcd no longer knows the lease")
            return False
        except OutcomeUnknownError:
            lease = await self._resolve_ambiguous_claim(job, keys, owner, claim_id,
                                                        holder_value, session, spec, revoked,
                                                        slots, tenure)
            return False if lease is None else lease
        except asyncio.CancelledError:
            # The request may be on its way and commit a holder bound to this
            # session that no handle knows of, renewed for as long as the session
            # lives: end the session so that cannot outlive the cancellation.
            self.sessions.drop(session, "a claim bound to it was cancelled in flight")
            raise
        if r.succeeded:
            if keeps_history:
                claimed_generation, at = generation + 1, 2
            else:
                claims = r.kv(2)
                assert claims is not None
                claimed_generation, at = claims.version, 3
            self._saw_generation(job, claimed_generation)
            record = None
            if item is not None:
                item_kv = r.kv(at + 1)
                assert item_kv is not None  # compared: version(item) > 0
                record = ItemRecord.decode(item_kv.value, item_kv.create_revision)
            if slots is not None:
                self._took(slots, r.revision, slot_value, session.lease_id)
            return Lease(store=self.store, read_back_timeout=self._read_back_timeout,
                         session=session, job=job, keys=keys,
                         owner=owner, claim_id=claim_id, token=r.revision,
                         generation=claimed_generation, ttl=spec.lease_duration_seconds,
                         holder_value=holder_value, checkpoint=r.kv(at), item=record,
                         slots=slots.grants(r.revision) if slots else (),
                         on_slots_freed=self._slots_freed, tenure=tenure,
                         holder_and_result=(failure[1], failure[2]))
        if item is not None:
            assert isinstance(keys, ItemKeys)
            return self._item_refused(job, r, spec_revision, spec, item, keys)
        return self._refused(job, r, spec_revision)

    def _refused(self, job: JobRef | ItemRef, r: TxnResult, spec_revision: int) -> bool:
        """Raise the error that explains a failed claim; return True if the spec
        merely changed (re-read it and try again)."""
        spec_kv, holder_kv, result_kv, claims_kv = r.kv(0), r.kv(1), r.kv(2), r.kv(3)
        if spec_kv is None:
            if isinstance(job, JobRef):
                self._forget_spec(job)
            raise NotRegisteredError(str(job))
        generation = claims_kv.version if claims_kv else 0
        self._saw_generation(job, generation)  # the next try names the right tenure
        if result_kv is not None:
            rec = ResultRecord.decode(result_kv.value)
            raise AlreadyCompletedError(str(job), rec.owner, rec.token, rec.generation)
        if holder_kv is not None:
            owner = str(Holder.decode_value(holder_kv.value).get("owner"))
            raise HeldError(str(job), owner, holder_kv.create_revision, generation, r.revision)
        if spec_kv.mod_revision != spec_revision:
            return True
        spec = JobSpec.decode(spec_kv.value)
        if spec.max_attempts and generation >= spec.max_attempts:
            raise AttemptsExhaustedError(str(job), generation, spec.max_attempts)
        # raced with a change that is gone again, or (a job with a history) another
        # claim came and went since we last saw the generation; just retry
        return True

    @staticmethod
    def _item_refused(item_ref: JobRef | ItemRef, r: TxnResult, spec_revision: int,
                      spec: JobSpec, item: ItemClaim, keys: ItemKeys) -> bool:
        """Raise why a claim of a queue item failed; True if the queue's spec or
        the item's pending key merely changed (read them again and retry)."""
        spec_kv, holder_kv, result_kv, claims_kv, pending_kv, item_kv = (
            r.kv(i) for i in range(6))
        name = str(item_ref)
        if spec_kv is None:
            queue = item_ref.queue if isinstance(item_ref, ItemRef) else item_ref
            raise QueueNotFoundError(str(queue))
        generation = claims_kv.version if claims_kv else 0
        if result_kv is not None:
            rec = ResultRecord.decode(result_kv.value)
            raise AlreadyCompletedError(name, rec.owner, rec.token, rec.generation)
        if holder_kv is not None:
            owner = str(Holder.decode_value(holder_kv.value).get("owner"))
            raise HeldError(name, owner, holder_kv.create_revision, generation, r.revision)
        if spec_kv.mod_revision != spec_revision:
            return True
        if pending_kv is None:  # neither completed nor pending: failed (or never enqueued)
            raise AttemptsExhaustedError(name, generation, spec.max_attempts)
        if pending_kv.mod_revision != item.pending_revision:
            return True
        if item_kv is None:
            raise ItemRecordMissingError(name, keys.item.decode())
        if spec.max_attempts and generation >= spec.max_attempts:
            raise AttemptsExhaustedError(name, generation, spec.max_attempts)
        return True

    async def _resolve_ambiguous_claim(
        self, job: JobRef | ItemRef, keys: JobKeys | ItemKeys, owner: str, claim_id: str,
        holder_value: bytes, session: Session[Lease], spec: JobSpec, revoked: list[int],
        slots: SlotPlan | None = None, tenure: TenureKeys | None = None,
    ) -> Lease | None:
        """Invariant ``read-back``: a claim whose response was lost is resolved by reading back.

        The holder record carries our unique claim id, so "my claim committed"
        is told apart from "someone else holds it" (then the retry raises
        :class:`HeldError`; another worker's holder is never adopted). If ours
        is not there, the request may still be in flight; revoking the
        session's etcd lease makes any late copy fail (a put bound to a revoked
        lease is refused). A copy may have committed between the read-back
        and the revoke, so ``claims`` is read again after it: if the latest
        claim is ours, its attempt is used and its holder went with the lease;
        the claim is made again while attempts are left, else
        :class:`ClaimRevokedError` says so. If any of these reads or the
        revoke fails, the session is ended first and
        :class:`ClaimOutcomeUnknownError` raised. Returns the lease, or
        ``None`` to retry.
        """
        try:
            fields = await self._read_back(keys)
        except JobLeaseError as exc:
            raise await self._unresolved(job, claim_id, session,
                                         f"reading it back failed: {exc}") from exc
        except BaseException:  # cancelled or a bug: the outcome is still unknown
            self.sessions.drop(session, "its claim's unknown outcome was not settled")
            raise
        holder = fields.get("holder")
        if holder is not None and holder.value == holder_value:
            claims = fields.get("claims")
            log.info("ambiguous claim of %s resolved by read-back: committed", job)
            return Lease(store=self.store, read_back_timeout=self._read_back_timeout,
                         session=session, job=job, keys=keys, owner=owner,
                         claim_id=claim_id, token=holder.create_revision,
                         generation=claims.version if claims else 0,
                         ttl=session.ttl, holder_value=holder_value,
                         checkpoint=fields.get("checkpoint"),
                         item=_item_of(fields.get("item")),
                         # the holder committed, so did its slots (one transaction)
                         slots=slots.grants(holder.create_revision) if slots else (),
                         on_slots_freed=self._slots_freed, tenure=tenure)
        log.info("ambiguous claim of %s not visible; revoking lease %x so it cannot commit late",
                 job, session.lease_id)
        if not await self.sessions.end(session, "revoked to settle an ambiguous claim"):
            raise ClaimOutcomeUnknownError(
                str(job), claim_id, session.lease_id, lease_revoked=False, ttl=session.ttl,
                why="not visible on read-back, and the revoke that settles it failed")
        try:
            _, kvs = await self.retry_read(lambda: self.store.get(keys.claims))
        except JobLeaseError as exc:
            raise ClaimOutcomeUnknownError(
                str(job), claim_id, session.lease_id, lease_revoked=True, ttl=session.ttl,
                why=f"re-reading it after the revoke failed: {exc}") from exc
        claims = kvs[0] if kvs else None
        self._saw_generation(job, claims.version if claims else 0)
        if claims is None or self._claim_id_of(claims) != claim_id:
            return None  # not claimed, and with the lease gone it never will be
        token, generation = claims.mod_revision, claims.version
        if tenure is not None:
            # its tenure committed with it; say how it ended (the holder went with
            # the revoked lease), so the history does not read "expired"
            await tenure.record_end(self.store, token, TenureEnd.REVOKED)
        if spec.max_attempts and generation >= spec.max_attempts:
            raise ClaimRevokedError(str(job), token, generation, spec.max_attempts)
        revoked.append(token)
        log.warning("claim of %s committed while its outcome was being settled (token %d, "
                    "generation %d) and was ended by the revoke; that attempt is used; "
                    "claiming again", job, token, generation)
        return None

    @staticmethod
    def _claim_id_of(claims: KeyValue) -> str | None:
        """The claim id in a ``claims`` value; ``None`` if it is not one we wrote."""
        try:
            value = json.loads(claims.value)
        except ValueError:
            return None
        claim_id = value.get("claimId") if isinstance(value, dict) else None
        return claim_id if isinstance(claim_id, str) else None

    async def _unresolved(self, job: JobRef | ItemRef, claim_id: str, session: Session[Lease],
                          why: str) -> ClaimOutcomeUnknownError:
        """End ``session`` (a holder of the unsettled claim must not be renewed)
        and say truthfully what is known."""
        revoked = await self.sessions.end(session, "its claim's unknown outcome was not settled")
        return ClaimOutcomeUnknownError(str(job), claim_id, session.lease_id,
                                        lease_revoked=revoked, ttl=session.ttl, why=why)

    async def _read_back(self, keys: JobKeys | ItemKeys) -> dict[str, KeyValue]:
        """The job's (or item's) raw keys, read back (nothing decoded: a malformed
        value elsewhere in the job must not stop an ambiguity from being settled)."""
        async def read() -> dict[str, KeyValue]:
            if isinstance(keys, ItemKeys):
                fields = keys.fields()
                r = await self.store.txn([], [Get(key) for key in fields.values()])
                return {name: kv for i, name in enumerate(fields) if (kv := r.kv(i)) is not None}
            _, kvs = await self.store.get(keys.prefix, prefix=True)
            return {kv.key[len(keys.prefix):].decode(): kv for kv in kvs}
        return await self.retry_read(read)

    async def retry_read(self, fn: Callable[[], Awaitable[T]], timeout: float | None = None
                         ) -> T:
        """``fn`` retried while etcd is unavailable, for up to ``timeout``
        seconds (default: the client's read-back timeout)."""
        return await retry_unavailable(
            fn, self._read_back_timeout if timeout is None else timeout)

    # -- acting on someone's behalf ----------------------------------------------------------

    async def lease_for(self, job: JobRef, owner: str, token: int) -> Lease:
        """A handle on an existing claim held by ``owner`` with ``token``, to
        complete or release it from another process (same condition as the
        holder's). The handle does not renew: the claimer's process does.

        Raises StaleTokenError unless ``owner`` holds ``job`` with ``token``
        now; the holder's exact value comes from the same read, and etcd
        re-checks it (create revision and value) when the handle acts.
        """
        validation.job_ref(job)
        validation.owner(owner)
        validation.token(token)
        keys, fields, state = await self._read_job(job)
        if not state.registered:
            raise NotRegisteredError(str(job))
        h, holder_kv = state.holder, fields.get("holder")
        if h is None or holder_kv is None or h.token != token or h.owner != owner:
            current_owner = h.owner if h else (state.result.owner if state.result else None)
            raise StaleTokenError(str(job), token, state.token, current_owner)
        holder = Holder.decode_value(holder_kv.value)
        assert state.spec is not None
        # this claim's tenure, if the job keeps a history (so a completion from
        # here ends it as the claimer's own would)
        tenure_key = keys.history.tenure(state.generation)
        _, tenure_kvs = await self.retry_read(lambda: self.store.get(tenure_key))
        tenure = tenure_of(keys.history, tenure_kvs[0] if tenure_kvs else None,
                           state.generation, token)
        return Lease(store=self.store, read_back_timeout=self._read_back_timeout,
                     session=None, job=job, keys=keys, owner=owner,
                     claim_id=h.claim_id, token=token, generation=state.generation,
                     ttl=int(holder.get("ttl", 0)), holder_value=holder_kv.value,
                     checkpoint=fields.get("checkpoint"),
                     slots=await self.held_slots(job.namespace, state.spec.semaphores,
                                                 h.claim_id),
                     on_slots_freed=self._slots_freed, tenure=tenure)

    async def complete_for(self, job: JobRef, owner: str, token: int, result: Any = None
                           ) -> ResultRecord:
        """Complete ``job`` under ``owner``'s claim with ``token`` from another
        process (:meth:`lease_for`, then ``complete``: the holder's own condition).

        A refused stale completion is counted against the tenure of ``token``
        in the job's history, as the holder's own refused completion is; then
        :class:`StaleTokenError` is raised.
        """
        try:
            lease = await self.lease_for(job, owner, token)
        except StaleTokenError as stale:
            if stale.current_token != token:  # not a repeat of our own completion
                await self._record_refusal(job, token)
            raise
        return await lease.complete(result)

    async def _record_refusal(self, job: JobRef, token: int) -> None:
        """Count a refused completion against the tenure whose token is ``token``,
        if the history still holds it (a bounded read of its keys)."""
        await record_refusal_of(self.store, self.keys.job(job).history, token, str(job))

    async def held_slots(self, namespace: str, uses: Sequence[SemaphoreUse], claim_id: str
                         ) -> tuple[SlotGrant, ...]:
        """The slots claim ``claim_id`` holds of the semaphores ``uses`` names
        (read from etcd: for a handle made from another process, whose release
        or completion must free them too)."""
        if not uses:
            return ()
        refs = slots_plan.semaphore_refs(self.keys, namespace, uses)
        r = await self.retry_read(lambda: self.store.txn(
            [], [Get(k.slots, prefix=True) for _, k, _ in refs]))
        grants = []
        for n, (ref, keys, _) in enumerate(refs):
            mine = [kv for kv in r.kvs(n) if SlotRecord.decode(kv.value).claim_id == claim_id]
            if mine:
                grants.append(SlotGrant(ref, tuple(keys.slot_index(kv.key) for kv in mine),
                                        mine[0].create_revision, tuple(kv.key for kv in mine)))
        return tuple(grants)

    async def wait_for_holder_change(self, job: JobRef, revision: int, timeout: float) -> bool:
        """Wait until the job's holder key changes after ``revision`` (the holder
        released, its lease expired, or someone else claimed), at most ``timeout``
        seconds; True if it changed.

        A waiter that only retried with backoff would claim up to a backoff late after
        the holder is gone; a watch wakes it when etcd deletes the key. While etcd is
        unreachable the watch keeps reconnecting until ``timeout``; an error it cannot
        retry (revision compacted, permission denied) ends the wait early with False:
        the caller claims again, and the claim reports what is wrong.
        """
        validation.job_ref(job)
        key = self.keys.job(job).holder

        async def changed() -> bool:
            stream = self.store.watch(key, prefix=False, start_revision=revision + 1)
            try:
                async for batch in stream:
                    if batch.events:
                        return True
                return False
            finally:  # end the watch stream now, not when the generator is collected
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()

        try:
            return await asyncio.wait_for(changed(), timeout)
        except TimeoutError:
            return False
        except JobLeaseError as exc:
            log.debug("watch of %s's holder ended: %s", job, exc)
            return False

    async def claim_waiting(self, job: JobRef, owner: str, wait: float, *,
                            on_held: Callable[[HeldError], None] | None = None) -> Lease:
        """:meth:`claim`, retried for up to ``wait`` seconds (``inf``: forever)
        while someone else holds the job; the one waiting loop of the CLI's
        ``claim --wait`` and ``joblease run --wait``.

        - **Waiting is a watch**: after a refusal it waits on the holder key
          from the revision the refusal saw (:meth:`wait_for_holder_change`),
          so it claims as soon as the holder releases or expires, never a poll
          period late; each wait is capped at the job's TTL (a missed wake-up
          costs at most that), and a watch that ends early (an error) is
          followed by a backoff of 0.2 s doubling to 2 s, so it never spins.
        - **The guard**: while it waits it keeps an etcd session (a lease of
          the job's TTL) of its own, as proof that it is connected and
          running. If that session is lost (etcd unreachable for a TTL, the
          process paused past it) it raises :class:`WaitSessionLostError`
          instead of claiming later as though it had waited all along (the
          trap of etcd#19597, a waiting lock request outliving its session).
          The session is checked before every claim and ends a wait at once.
        - Only :class:`HeldError` is waited on: a job completed, failed or
          unregistered meanwhile raises that error at the next claim. Once
          ``wait`` has passed the last :class:`HeldError` is raised.

        ``on_held`` is called once per holder seen (owner and token), for
        progress messages. The waiting session is revoked before an error is
        raised (a claim that gives up leaves no waiter key behind), and in the
        background once the claim succeeded (its transaction deleted them).
        """
        if not wait >= 0:  # also refuses NaN
            raise InvalidInputError("the wait must be a number of seconds >= 0")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        guard: Session[Lease] | None = None
        ticket: Ticket | None = None  # our place in line for semaphore slots
        shown: tuple[str, int] | None = None
        backoff = 0.2
        try:
            while True:
                if guard is not None and not guard.alive:
                    raise WaitSessionLostError(
                        str(job), guard.lost_reason or "no keep-alive succeeded in time")
                try:
                    lease = await self.claim(job, owner, ticket=ticket)
                except SemaphoreFullError as full:
                    # In line for slots: a ticket (waiter keys bound to the guard
                    # session, so giving up or dying leaves nothing behind), then
                    # the semaphores' watched views until a slot or a place frees
                    # (a wake-up is local: only the claim first in line sends).
                    left = deadline - loop.time()
                    if left <= 0:
                        raise
                    if guard is None:
                        _, spec = await self._spec(job, self.keys.job(job))
                        guard = await self.sessions.guard(spec.lease_duration_seconds)
                    if ticket is None:
                        ticket = await self._take_ticket(job, owner, guard)
                    limit = min(left, float(guard.ttl))
                    began = loop.time()
                    await self._wait_unless_lost(self._wait_for_semaphores(job, full, limit),
                                                 guard)
                    if loop.time() - began >= limit * 0.9:
                        # Nothing changed for a while: read the job's spec again at
                        # the next claim (a waiter in line does not at each wake-up).
                        self._forget_spec(job)
                except HeldError as held:
                    left = deadline - loop.time()
                    if left <= 0:
                        raise
                    if guard is None:
                        _, spec = await self._spec(job, self.keys.job(job))
                        guard = await self.sessions.guard(spec.lease_duration_seconds)
                    if on_held is not None and shown != (held.owner, held.token):
                        shown = (held.owner, held.token)
                        on_held(held)
                    began = loop.time()
                    limit = min(left, float(guard.ttl))
                    changed = held.revision > 0 and await self._wait_unless_lost(
                        self.wait_for_holder_change(job, held.revision, limit), guard)
                    if not changed and loop.time() - began < limit * 0.9:
                        await self._wait_unless_lost(asyncio.sleep(min(backoff, left)), guard)
                        backoff = min(2.0, backoff * 2)
                    elif changed:
                        backoff = 0.2
                else:
                    if guard is not None:
                        # Claimed: the claim's transaction deleted our waiter keys,
                        # so the guard's etcd lease holds nothing; revoke it without
                        # keeping the new holder waiting for that round trip.
                        self._background.spawn(guard.close(revoke=True))
                        guard = None
                    return lease
        finally:
            if guard is not None:  # gave up, lost or failed: nothing left in line
                await guard.close(revoke=True)

    async def _semaphore_keys(self, job: JobRef) -> list[tuple[SemaphoreRef, SemaphoreKeys,
                                                                 int]]:
        _, spec = await self._spec(job, self.keys.job(job))
        return slots_plan.semaphore_refs(self.keys, job.namespace, spec.semaphores)

    async def _take_ticket(self, job: JobRef, owner: str, guard: Session[Lease]) -> Ticket:
        """Waiter keys for every semaphore the job needs, put in one transaction
        (one create revision: the same place in every line) bound to ``guard``."""
        refs = await self._semaphore_keys(job)
        ticket_id = uuid.uuid4().hex
        keys = tuple(k.waiter(ticket_id) for _, k, _ in refs)
        puts = [Put(k.waiter(ticket_id), WaiterRecord(str(job), owner, weight).encode(),
                    lease=guard.lease_id) for _, k, weight in refs]
        # Only if absent: a copy re-sent after an unknown outcome then finds the
        # first copy's keys and its create revision, our place in line.
        r = await self._write_idempotent([Compare(k, "create", "==", 0) for k in keys], puts,
                                         [Get(k) for k in keys])
        if r.succeeded:
            self._applied(r.revision, [(p.key, p.value, p.lease) for p in puts])
            return Ticket(r.revision, keys)
        mine = r.kv(0)
        assert mine is not None, "waiter keys bound to a live session vanished"
        return Ticket(mine.create_revision, keys)

    async def _wait_for_semaphores(self, job: JobRef, full: SemaphoreFullError,
                                   timeout: float) -> None:
        """After ``full``, until a slot or a waiter of one of the job's semaphores
        is deleted (or a limit changes), at most ``timeout`` seconds."""
        await self.wait_for_room(full, [k for _, k, _ in await self._semaphore_keys(job)],
                                 timeout)

    async def wait_for_slots(self, semaphores: Sequence[SemaphoreKeys], revision: int,
                             timeout: float) -> None:
        """Until a slot or a waiter of one of ``semaphores`` is deleted (or a limit
        changes) after ``revision``, at most ``timeout`` seconds: a watch per
        semaphore, never a poll."""

        async def watch(keys: SemaphoreKeys) -> None:
            stream = self.store.watch(keys.prefix, prefix=True, start_revision=revision + 1)
            try:
                async for batch in stream:
                    if any(e.kind == "delete" or e.kv.key == keys.spec for e in batch.events):
                        return
            finally:
                aclose = getattr(stream, "aclose", None)
                if aclose is not None:
                    await aclose()

        await until_first([watch(k) for k in semaphores], timeout)

    @staticmethod
    async def _wait_unless_lost(waiting: Awaitable[T], session: Session[Lease]) -> T | None:
        """``waiting``'s result, or ``None`` as soon as ``session`` is lost."""
        task = asyncio.ensure_future(waiting)
        lost = asyncio.ensure_future(session.wait_lost())
        try:
            await asyncio.wait({task, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, lost):
                t.cancel()
            await asyncio.gather(task, lost, return_exceptions=True)
        if task.cancelled():
            return None
        return task.result()  # raises what ``waiting`` raised

    # -- inspection --------------------------------------------------------------------------

    async def get(self, job: JobRef) -> JobState:
        validation.job_ref(job)
        return (await self._read_job(job))[2]

    async def history(self, job: JobRef) -> History:
        """The job's tenures (the last ``historyLimit`` claims), oldest first, with
        how each ended, from one read at one revision (docs/protocol.md,
        "Tenure history"). A job that keeps none, or is not registered, has none."""
        validation.job_ref(job)
        keys = self.keys.job(job)
        r = await self.retry_read(lambda: self.store.txn([], history_reads(keys)))
        return assemble_history(job, keys, r.revision, r.kv(0), r.kv(1), r.kv(2), r.kvs(3))

    async def _read_job(self, job: JobRef) -> tuple[JobKeys, dict[str, KeyValue], JobState]:
        """One linearizable read of every key of ``job``: the raw fields and the state."""
        keys = self.keys.job(job)
        revision, kvs = await self.store.get(keys.prefix, prefix=True)
        # Tenants can write any key under their prefix: a name that is not UTF-8
        # is not one of ours and must not stop the read.
        fields = {kv.key[len(keys.prefix):].decode(errors="replace"): kv for kv in kvs}
        return keys, fields, assemble(job, fields, revision)

    async def list(self, namespace: str | None = None) -> list[JobState]:
        """Every job (optionally of one namespace), from one consistent snapshot."""
        revision, grouped = await self._snapshot(namespace)
        return [assemble(job, fields, revision) for job, fields in sorted(grouped.items())]

    async def scan_jobs(self, namespace: str | None = None, *, keys_only: bool = False
                        ) -> tuple[int, Sequence[KeyValue]]:
        """Every key of every job of ``namespace`` (``None``: all) at one revision,
        without the keys of queues and semaphores (``<ns>/_queues/``,
        ``<ns>/_semaphores/``), which may be 100,000s of items nobody scanning
        jobs wants: read in pages of :data:`SCAN_PAGE` keys
        at the first page's revision, jumping over each namespace's queues. The
        memory is a page plus the jobs', whatever the queues hold. A compaction of
        that revision mid-scan starts the scan again."""
        start = self.keys.namespace_prefix(namespace)
        end = prefix_end(start)
        root = self.keys.root.encode() + b"/"
        for _ in range(5):
            revision, cursor = 0, start
            found: MutableSequence[KeyValue] = []
            try:
                while True:
                    current, kvs = await self.store.get(cursor, end=end, limit=SCAN_PAGE,
                                                        revision=revision, keys_only=keys_only)
                    revision = revision or current
                    for kv in kvs:
                        # <root>/<ns>/_queues/..., _semaphores/...: no job is named
                        # "_...", so skip each such subtree of the namespace at once
                        namespace_end = kv.key.find(b"/", len(root))
                        if kv.key.startswith(b"/_", namespace_end):
                            segment_end = kv.key.find(b"/", namespace_end + 1)
                            if segment_end > 0:
                                cursor = prefix_end(kv.key[:segment_end + 1])
                                break
                        found.append(kv)
                    else:
                        if len(kvs) < SCAN_PAGE:
                            return revision, found
                        cursor = kvs[-1].key + b"\0"
            except CompactedError:
                log.info("revision %d compacted during a scan of the jobs; scanning again",
                         revision)
        raise StoreUnavailableError("scan of the jobs kept falling behind compactions")

    async def _snapshot(self, namespace: str | None
                        ) -> tuple[int, dict[JobRef, dict[str, KeyValue]]]:
        revision, kvs = await self.scan_jobs(namespace)
        grouped: dict[JobRef, dict[str, KeyValue]] = defaultdict(dict)
        for kv in kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is not None:
                grouped[parsed[0]][parsed[1]] = kv
        return revision, grouped

    async def watch(self, namespace: str | None = None, *, history: bool = False
                    ) -> AsyncIterator[JobState]:
        """Every job's state from a consistent snapshot, then each change in
        revision order, one state per job per revision (etcd packs several
        revisions into one watch response; each is applied and reported on its
        own, so a claim and a release in one response are both seen).

        After a compaction, or a failure the store's watch does not resume by
        itself (etcd unreachable for a while), it resyncs from a new snapshot
        and reports jobs that vanished meanwhile as not registered, so a
        consumer always ends up with every job's latest state (intermediate
        states may be skipped then; none is ever reported out of order).
        Errors that retrying cannot fix (e.g. ``PermissionDeniedError``) are
        raised.

        ``history``: a change of a known job's tenure history (which lives
        outside its prefix: a refused completion counted, a ``revoked`` mark)
        is reported too, as the job's state at that revision with
        ``history_revision`` set; every state carries the newest such revision
        seen. Not for changes made while this watch was resyncing: a snapshot
        does not read the histories.
        """
        previous: set[JobRef] = set()
        history_seen: dict[JobRef, int] = {}
        delay = 0.1
        while True:
            try:
                revision, grouped = await self._snapshot(namespace)
            except StoreUnavailableError as exc:
                log.warning("watch snapshot failed (%s); retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)
                continue
            for job in sorted(previous - set(grouped)):
                yield assemble(job, {}, revision)  # vanished while we were not watching
            for job, fields in sorted(grouped.items()):
                yield assemble(job, fields, revision)
            try:
                async for batch in self.store.watch(self.keys.namespace_prefix(namespace),
                                                    prefix=True, start_revision=revision + 1):
                    delay = 0.1
                    for rev, events in _by_revision(batch.events):
                        touched: set[JobRef] = set()
                        for event in events:
                            parsed = self.keys.parse(event.kv.key)
                            if parsed is None:
                                owner = self.keys.parse_history(event.kv.key) if history else None
                                if owner is not None and owner in grouped:
                                    touched.add(owner)
                                    history_seen[owner] = rev
                                continue
                            job, field = parsed
                            touched.add(job)
                            if event.kind == "put":
                                grouped[job][field] = event.kv
                            else:
                                grouped[job].pop(field, None)
                        for job in sorted(touched):
                            fields = grouped.get(job, {})
                            yield assemble(job, fields, rev,
                                           history_revision=history_seen.get(job, 0))
                            if not fields:
                                grouped.pop(job, None)
                                history_seen.pop(job, None)
            except CompactedError as exc:
                log.warning("watch fell behind a compaction (%s); resyncing", exc)
                previous = set(grouped)
            except StoreUnavailableError as exc:
                previous = set(grouped)
                log.warning("watch failed (%s); resyncing from a snapshot in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(5.0, delay * 2)


def _by_revision(events: list[WatchEvent]) -> Iterator[tuple[int, list[WatchEvent]]]:
    """Split a watch batch into its revisions, in order (etcd sends events in
    revision order; a delete's ``mod_revision`` is the deletion's)."""
    for rev, group in itertools.groupby(events, key=lambda e: e.kv.mod_revision):
        yield rev, list(group)
