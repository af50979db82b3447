"""The protocol's entry point: register, claim, inspect and watch jobs.

Claim (invariant 1) is one etcd transaction:

    if  mod(spec) == the spec revision we know   (registered, spec unchanged)
    and create(holder) == 0                      (no live holder)
    and version(result) == 0                     (not completed)
    and version(claims) < maxAttempts            (attempts left; skipped if unlimited)
    then put holder (bound to this client's etcd lease), put claims, get claims
    else get spec, holder, result, claims        (to say exactly why not)

The commit revision is the fencing token; ``claims``' version after the put is
the generation. Both come back in the same round trip. The spec is read once
and cached: a changed spec fails the first compare and is re-read.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, TypeVar

from joblease import validation
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    CompactedError,
    CorruptRecordError,
    HeldError,
    LeaseLostError,
    LeaseNotFoundError,
    NotRegisteredError,
    OutcomeUnknownError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.keys import JobKeys, JobRef, KeySpace
from joblease.lease import Lease
from joblease.records import Holder, JobSpec, JobState, ResultRecord, decoding
from joblease.session import Session
from joblease.store import Compare, Delete, Get, KeyValue, Put, Store, TxnResult, WatchEvent

log = logging.getLogger(__name__)
T = TypeVar("T")


def assemble(job: JobRef, fields: dict[str, KeyValue], revision: int) -> JobState:
    """Build a :class:`JobState` from a job's keys (``spec``/``holder``/``claims``/``result``).

    Never raises for stored data: a record that cannot be decoded is left empty
    and named in ``JobState.corrupt`` (phase ``Corrupt``), so one bad job never
    stops a reader (list, watch, the operator) of every other job.
    """
    spec_kv, holder_kv = fields.get("spec"), fields.get("holder")
    claims_kv, result_kv = fields.get("claims"), fields.get("result")
    generation = claims_kv.version if claims_kv else 0
    problems: list[str] = []
    spec = holder = result = None
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
    )


class JobLeaseClient:
    """Register, claim, complete, inspect and watch jobs in etcd.

    ``async with JobLeaseClient(EtcdConfig(endpoints=("127.0.0.1:2379",))) as c:``
    """

    def __init__(self, config: EtcdConfig | None = None, *, store: Store | None = None,
                 margin: float | None = None) -> None:
        self.config = config or EtcdConfig.from_env()
        self.store: Store = store if store is not None else EtcdStore(self.config)
        self.keys = KeySpace(self.config.root)
        self._margin = margin
        self._specs: dict[JobRef, tuple[int, JobSpec]] = {}
        self._sessions: dict[int, Session] = {}
        self._session_locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        self._background: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> JobLeaseClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing. With ``revoke`` (default) held jobs become claimable at
        once; without, they stay held until etcd expires them (``claim`` in a
        short-lived CLI process uses that)."""
        sessions, self._sessions = list(self._sessions.values()), {}
        for s in sessions:
            await s.close(revoke=revoke)
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        await self.store.close()

    # -- registration ------------------------------------------------------------------------

    async def register(self, job: JobRef, spec: JobSpec) -> int:
        """Create or update the registration; idempotent. Returns the etcd revision."""
        validation.job_ref(job)
        validation.ttl(spec.lease_duration_seconds)
        validation.max_attempts(spec.max_attempts)
        validation.json_payload(spec.parameters, "parameters", validation.MAX_PARAMETERS_BYTES)
        keys = self.keys.job(job)
        value = spec.encode()
        r = await self._write_idempotent(
            [Compare(keys.spec, "value", "==", value)], [Get(keys.spec)], [Put(keys.spec, value)])
        return r.revision

    async def unregister(self, job: JobRef) -> int:
        """Delete every key of the job; a live holder learns it lost at its next check."""
        validation.job_ref(job)
        keys = self.keys.job(job)
        self._specs.pop(job, None)
        r = await self._write_idempotent([], [Delete(keys.prefix, prefix=True)], [])
        return r.revision

    async def _write_idempotent(self, compares: list[Compare], success: list[Any],
                                failure: list[Any]) -> TxnResult:
        """Writes whose repetition is harmless may be re-sent after an unknown outcome."""
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
        if refresh or job not in self._specs:
            _, kvs = await self.store.get(keys.spec)
            if not kvs:
                self._specs.pop(job, None)
                raise NotRegisteredError(str(job))
            self._specs[job] = (kvs[0].mod_revision, JobSpec.decode(kvs[0].value))
        return self._specs[job]

    async def _session(self, ttl: int) -> Session:
        session = self._sessions.get(ttl)
        if session is not None and session.alive and session.remaining() >= 0.5:
            return session  # the hot path takes no lock
        async with self._session_locks[ttl]:
            session = self._sessions.get(ttl)
            if session is None or not session.alive or session.remaining() < 0.5:
                if session is not None:
                    self._drop_session(session, "replaced by a fresh session")
                session = await Session(self.store, ttl, margin=self._margin,
                                        check_holders=Lease.check_all).start()
                self._sessions[ttl] = session
            return session

    def _drop_session(self, session: Session, reason: str) -> None:
        """Stop using ``session``: its handles are lost; its etcd lease is revoked
        in the background so the jobs it held become claimable at once."""
        if self._sessions.get(session.ttl) is session:
            del self._sessions[session.ttl]
        session.lose(reason)
        task = asyncio.create_task(session.close(revoke=True))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def claim(self, job: JobRef, owner: str) -> Lease:
        """Claim ``job`` for ``owner`` in one etcd transaction.

        Raises :class:`NotRegisteredError`, :class:`HeldError`,
        :class:`AlreadyCompletedError` or :class:`AttemptsExhaustedError`
        saying why not.
        """
        validation.job_ref(job)
        validation.owner(owner)
        keys = self.keys.job(job)
        refresh = False
        for _ in range(4):
            spec_revision, spec = await self._spec(job, keys, refresh=refresh)
            session = await self._session(spec.lease_duration_seconds)
            claim_id = uuid.uuid4().hex
            holder_value = Holder.encode_value(owner, claim_id, spec.lease_duration_seconds,
                                               time.time())
            claim_value = json.dumps({"owner": owner, "claimId": claim_id},
                                     separators=(",", ":")).encode()
            compares = [
                Compare(keys.spec, "mod", "==", spec_revision),
                Compare(keys.holder, "create", "==", 0),
                Compare(keys.result, "version", "==", 0),
            ]
            if spec.max_attempts > 0:
                compares.append(Compare(keys.claims, "version", "<", spec.max_attempts))
            try:
                r = await self.store.txn(
                    compares,
                    [Put(keys.holder, holder_value, lease=session.lease_id),
                     Put(keys.claims, claim_value), Get(keys.claims)],
                    [Get(keys.spec), Get(keys.holder), Get(keys.result), Get(keys.claims)],
                )
            except LeaseNotFoundError:
                # etcd expired our session lease before we noticed; start a new one.
                self._drop_session(session, "etcd no longer knows the lease")
                continue
            except OutcomeUnknownError:
                lease = await self._resolve_ambiguous_claim(job, keys, owner, claim_id,
                                                            holder_value, session)
                if lease is not None:
                    return lease
                continue
            if r.succeeded:
                claims = r.kv(2)
                assert claims is not None
                return Lease(store=self.store, session=session, job=job, keys=keys,
                             owner=owner, claim_id=claim_id, token=r.revision,
                             generation=claims.version, ttl=spec.lease_duration_seconds,
                             holder_value=holder_value)
            refresh = self._refused(job, r, spec_revision)
        raise StoreUnavailableError(f"claim of {job} did not settle after several attempts")

    def _refused(self, job: JobRef, r: TxnResult, spec_revision: int) -> bool:
        """Raise the error that explains a failed claim; return True if the spec
        merely changed (re-read it and try again)."""
        spec_kv, holder_kv, result_kv, claims_kv = r.kv(0), r.kv(1), r.kv(2), r.kv(3)
        if spec_kv is None:
            self._specs.pop(job, None)
            raise NotRegisteredError(str(job))
        generation = claims_kv.version if claims_kv else 0
        if result_kv is not None:
            rec = ResultRecord.decode(result_kv.value)
            raise AlreadyCompletedError(str(job), rec.owner, rec.token, rec.generation)
        if holder_kv is not None:
            owner = str(Holder.decode_value(holder_kv.value).get("owner"))
            raise HeldError(str(job), owner, holder_kv.create_revision, generation)
        if spec_kv.mod_revision != spec_revision:
            return True
        spec = JobSpec.decode(spec_kv.value)
        if spec.max_attempts and generation >= spec.max_attempts:
            raise AttemptsExhaustedError(str(job), generation, spec.max_attempts)
        return True  # raced with a change that is gone again; just retry

    async def _resolve_ambiguous_claim(
        self, job: JobRef, keys: JobKeys, owner: str, claim_id: str, holder_value: bytes,
        session: Session,
    ) -> Lease | None:
        """Invariant 7: a claim whose response was lost is resolved by reading back.

        The holder record carries our unique claim id, so "my claim committed"
        is told apart from "someone else holds it". If ours is not there, the
        request may still be in flight; revoking the session's etcd lease makes
        any late copy fail (a put bound to a revoked lease is refused), after
        which "not claimed" is final. Returns the lease, or ``None`` to retry.
        """
        fields = await self._read_back(job)
        holder = fields.get("holder")
        if holder is not None and holder.value == holder_value:
            claims = fields.get("claims")
            log.info("ambiguous claim of %s resolved by read-back: committed", job)
            return Lease(store=self.store, session=session, job=job, keys=keys, owner=owner,
                         claim_id=claim_id, token=holder.create_revision,
                         generation=claims.version if claims else 0,
                         ttl=session.ttl, holder_value=holder_value)
        log.info("ambiguous claim of %s not visible; revoking lease %x so it cannot commit late",
                 job, session.lease_id)
        self._drop_session(session, "revoked to settle an ambiguous claim")
        await self._retry_read(lambda: self.store.revoke(session.lease_id))
        claims = fields.get("claims")
        if claims is not None and json.loads(claims.value).get("claimId") == claim_id:
            raise LeaseLostError(str(job), 0, "the claim committed but its lease is already gone")
        return None

    async def _read_back(self, job: JobRef) -> dict[str, KeyValue]:
        async def read() -> dict[str, KeyValue]:
            return (await self._read_job(job))[1]
        return await self._retry_read(read)

    async def _retry_read(self, fn: Callable[[], Awaitable[T]], timeout: float = 30.0) -> T:
        deadline = time.monotonic() + timeout
        delay = 0.05
        while True:
            try:
                return await fn()
            except StoreUnavailableError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(delay)
                delay = min(1.0, delay * 2)

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
        return Lease(store=self.store, session=None, job=job, keys=keys, owner=owner,
                     claim_id=h.claim_id, token=token, generation=state.generation,
                     ttl=int(holder.get("ttl", 0)), holder_value=holder_kv.value)

    # -- inspection --------------------------------------------------------------------------

    async def get(self, job: JobRef) -> JobState:
        validation.job_ref(job)
        return (await self._read_job(job))[2]

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

    async def _snapshot(self, namespace: str | None
                        ) -> tuple[int, dict[JobRef, dict[str, KeyValue]]]:
        revision, kvs = await self.store.get(self.keys.namespace_prefix(namespace), prefix=True)
        grouped: dict[JobRef, dict[str, KeyValue]] = defaultdict(dict)
        for kv in kvs:
            parsed = self.keys.parse(kv.key)
            if parsed is not None:
                grouped[parsed[0]][parsed[1]] = kv
        return revision, grouped

    async def watch(self, namespace: str | None = None) -> AsyncIterator[JobState]:
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
        """
        previous: set[JobRef] = set()
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
                                continue
                            job, field = parsed
                            touched.add(job)
                            if event.kind == "put":
                                grouped[job][field] = event.kv
                            else:
                                grouped[job].pop(field, None)
                        for job in sorted(touched):
                            fields = grouped.get(job, {})
                            yield assemble(job, fields, rev)
                            if not fields:
                                grouped.pop(job, None)
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
