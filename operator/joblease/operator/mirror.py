"""One etcd watch -> each JobLease's ``status``, coalesced per job, never backwards.

``JobLeaseClient.watch`` gives every job's state from a consistent snapshot,
then each change in revision order (resyncing from a new snapshot after a
compaction). The mirror:

1. derives Kubernetes Events from consecutive states of a job (before any
   coalescing, so a claim followed quickly by an expiry still shows both);
2. keeps only the newest pending state per job (a burst of changes becomes one
   status write) and runs at most one writer per job;
3. writes the status only when the state's revision is strictly newer than
   the ``status.etcdRevision`` it read from the API server, with a
   ``resourceVersion``-conditional PUT. A write based on a stale read fails
   with 409 and is re-decided on a fresh read, so even two operator
   processes overlapping during a rollout cannot move a status backwards.

A job that keeps a tenure history also gets ``status.recentTenures``: with
each status write of a change of the job, or of its history alone (the watch
reports those too), one bounded range read of its last tenures at the very
revision of the state being written (:func:`joblease.history.recent_tenures`),
so the short form moves forward with the rest of the status and never back.
The same reading tells an ``Expired`` Event from a ``Released`` or ``Revoked``
one (:func:`joblease.operator.events.refine_ends`).

The cache of the last object read or written per job (its
``status.etcdRevision`` is the "last applied revision";
:mod:`joblease.operator.object_cache`, compressed) is seeded from the API
server on first use, so a restarted operator continues where the status is.

Each job is handled on its own: stored values are tenant-writable input, so a
job whose records cannot be decoded arrives as phase ``Corrupt`` (see
:func:`joblease.client.assemble`) and gets that status, a Warning Event, a log
line and a metric; an etcd key whose job name no JobLease can have is skipped;
an unexpected error while handling one job is logged, counted and retried with
backoff for that job. None of them stops the watch, so every other job keeps
being mirrored, and a restart with the bad value still in etcd does the same.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import fnmatch
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from joblease import validation
from joblease.background import BackgroundTasks
from joblease.client import JobLeaseClient, assemble
from joblease.errors import (
    CompactedError,
    InvalidInputError,
    JobLeaseError,
    StoreUnavailableError,
)
from joblease.history import recent_tenures
from joblease.keys import JobRef
from joblease.operator.event_recorder import EventRecorder
from joblease.operator.events import JobEvent, derive_events, refine_ends
from joblease.operator.kube import (
    ConflictError,
    InvalidError,
    KubeApi,
    KubeApiError,
    NotFoundError,
)
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.object_cache import ObjectCache
from joblease.operator.registration import spec_matches
from joblease.operator.status import (
    DEFAULT_RESULT_LIMIT,
    RECENT_TENURES,
    history_changed,
    observed_generation_for,
    recent_tenures_status,
    same_facts,
    should_apply,
    status_from_state,
)
from joblease.records import JobState, Phase, Tenure

log = logging.getLogger(__name__)


class _ContendedError(Exception):
    """The status write kept conflicting; the entry goes back to the queue."""


_TRANSIENT = (KubeApiError, aiohttp.ClientError, TimeoutError, StoreUnavailableError,
              _ContendedError)
#: Conditional writes re-read and re-decided in a row before the job is re-queued.
CONFLICT_RETRIES = 8
#: Invalid job names remembered (to log each once); beyond that they are only counted.
_INVALID_NAMES_KEPT = 1024


@dataclass
class _Pending:
    state: JobState
    events: list[JobEvent] = field(default_factory=list)
    received: float = field(default_factory=time.monotonic)  # oldest coalesced change

    def merge(self, newer: _Pending) -> _Pending:
        """Keep the newest state, every event and the oldest receipt time."""
        state = newer.state if newer.state.revision >= self.state.revision else self.state
        return _Pending(state, self.events + newer.events, min(self.received, newer.received))


def _being_deleted(obj: dict[str, Any], state: JobState) -> bool:
    """True when ``state`` says "not registered" of a JobLease that is being deleted.

    Our finalizer removed its keys; writing that state would replace the last
    status (e.g. ``Completed``, generation 2) with ``NotRegistered``, generation
    0: a status going backwards, and the last one watchers see before the object
    is gone. Checked on every (re)read, since a conflicting write re-reads an
    object whose ``deletionTimestamp`` may be new.
    """
    return not state.registered and bool(obj.get("metadata", {}).get("deletionTimestamp"))


class Mirror:
    """Keeps JobLease statuses in step with etcd (see the module docstring)."""

    def __init__(
        self,
        client: JobLeaseClient,
        kube: KubeApi,
        metrics: OperatorMetrics,
        *,
        namespaces: Sequence[str] = (),
        concurrency: int = 32,
        result_limit: int = DEFAULT_RESULT_LIMIT,
        clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC),
        events: EventRecorder | None = None,
    ) -> None:
        self.client = client
        self.kube = kube
        self.metrics = metrics
        self.events = events or EventRecorder(kube, metrics, instance=kube.instance)
        self.namespaces = tuple(namespaces)  # empty: every namespace
        self.result_limit = result_limit
        self._clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        self._pending: dict[JobRef, _Pending] = {}
        self._writers: dict[JobRef, asyncio.Task[None]] = {}
        self._objects = ObjectCache()  # the last object read or written, per job
        self._previous: dict[JobRef, JobState] = {}
        self._phases: dict[JobRef, Phase] = {}
        self._background = BackgroundTasks()
        self._invalid_names: set[JobRef] = set()
        self.states_seen = 0

    # -- the watch ---------------------------------------------------------------------------

    def _selected(self, namespace: str) -> bool:
        return not self.namespaces or any(fnmatch.fnmatchcase(namespace, pattern)
                                          for pattern in self.namespaces)

    def _watch_namespace(self) -> str | None:
        """Watch one namespace's prefix when that is all we serve, else the whole root."""
        if len(self.namespaces) == 1 and not any(c in self.namespaces[0] for c in "*?["):
            return self.namespaces[0]
        return None

    async def run(self) -> None:
        """Watch forever; after an etcd failure start again from a fresh snapshot.

        A new watch's snapshot only has the jobs that exist: a job removed while
        the watch was down would keep its last status forever. So after a
        failure, the jobs known before it that are gone from etcd are reported
        as not registered first (from one read of the keys, at a revision older
        than the new watch's snapshot, so nothing goes backwards).
        """
        delay = 0.5
        gap: set[JobRef] = set()  # jobs known before a failure, not yet re-checked
        while True:
            self.metrics.resyncs.inc()
            try:
                if gap:
                    await self._report_vanished(gap)
                    gap = set()
                async for state in self.client.watch(self._watch_namespace(), history=True):
                    delay = 0.5
                    try:
                        self.observe(state)
                    except Exception:  # one job's problem never stops the others
                        self.metrics.mirror_errors.labels("observe").inc()
                        log.exception("state of %s at revision %d skipped", state.job,
                                      state.revision)
            except JobLeaseError as exc:
                gap |= set(self._previous)
                log.warning("etcd watch failed (%s); resyncing in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(30.0, delay * 2)

    async def _report_vanished(self, known: set[JobRef]) -> None:
        """Observe "not registered" for each job of ``known`` that has no key now."""
        namespace = self._watch_namespace()
        revision, kvs = await self.client.scan_jobs(namespace, keys_only=True)
        present = {parsed[0] for kv in kvs if (parsed := self.client.keys.parse(kv.key))}
        for job in sorted(known - present):
            log.info("%s vanished from etcd while the watch was down", job)
            self.observe(assemble(job, {}, revision))

    def _valid_name(self, job: JobRef) -> bool:
        """False (logged once, counted) for a key no JobLease can own, e.g. a tenant's
        ``<root>/<ns>/Bad Name/result``: there is no resource to mirror it into."""
        try:
            validation.job_ref(job)
        except InvalidInputError as exc:
            self.metrics.mirror_errors.labels("invalid_name").inc()
            if job not in self._invalid_names and len(self._invalid_names) < _INVALID_NAMES_KEPT:
                self._invalid_names.add(job)
                log.warning("etcd keys of %r skipped: %s", str(job), exc)
            return False
        return True

    def observe(self, state: JobState) -> None:
        """Take one state from the watch: events, the phase gauge, then a status write.

        States of one job arrive in revision order (several in a row when one etcd
        response carries several revisions); one older than the last seen is
        ignored, so neither events nor the status ever go backwards.
        """
        job = state.job
        if not self._selected(job.namespace) or not self._valid_name(job):
            return
        previous = self._previous.get(job)
        if previous is not None and state.revision < previous.revision:
            log.debug("state of %s at revision %d is older than %d; ignored", job,
                      state.revision, previous.revision)
            return
        self.states_seen += 1
        self.metrics.watch_events.inc()
        if state.corrupt is not None:
            self.metrics.corrupt_records.inc()
            if previous is None or previous.corrupt != state.corrupt:
                log.warning("%s at revision %d: %s; its status shows phase Corrupt, other "
                            "jobs are not affected", job, state.revision, state.corrupt)
        elif previous is not None and previous.corrupt is not None:
            log.info("%s at revision %d: every stored record decodes again", job,
                     state.revision)
        events = derive_events(previous, state)
        known = state.registered or state.corrupt is not None
        self._set_phase(job, state.phase if known else None)
        if known:
            self._previous[job] = state
        else:
            self._previous.pop(job, None)
        self.offer(state, events)

    def _set_phase(self, job: JobRef, phase: Phase | None) -> None:
        old = self._phases.pop(job, None)
        if old is not None:
            self.metrics.jobs.labels(old.value).dec()
        if phase is not None:
            self._phases[job] = phase
            self.metrics.jobs.labels(phase.value).inc()

    def refresh(self, job: JobRef) -> None:
        """Re-read ``job`` from etcd and re-decide its status (after its spec changed:
        ``observedGeneration`` may move even when etcd's registration did not)."""
        self._background.spawn(self._refresh(job))

    async def _refresh(self, job: JobRef) -> None:
        try:
            state = await self.client.get(job)
        except JobLeaseError as exc:
            log.info("refresh of %s skipped: %s", job, exc)
            return
        except Exception:  # e.g. a key under the job's prefix that is not UTF-8
            self.metrics.mirror_errors.labels("observe").inc()
            log.exception("refresh of %s skipped", job)
            return
        self._objects.discard(job)  # the resource changed: read it again
        self.offer(state, [])

    # -- coalescing writers ------------------------------------------------------------------

    def offer(self, state: JobState, events: list[JobEvent]) -> None:
        entry = _Pending(state, list(events))
        before = self._pending.get(state.job)
        self._pending[state.job] = before.merge(entry) if before else entry
        if state.job not in self._writers:
            task = asyncio.create_task(self._drain(state.job))
            self._writers[state.job] = task

    async def _drain(self, job: JobRef) -> None:
        """Write ``job``'s newest pending state, one write at a time per job.

        The pending entry is taken only once a write slot is free, so every
        change that arrives while this job waits merges into the one write.
        A write that fails (transiently, by contention, or by a bug) puts its
        entry back, merged with anything newer that arrived meanwhile, and is
        retried with backoff: the newest state is never dropped.
        """
        backoff = 0.2
        try:
            while job in self._pending:
                async with self._limit:
                    entry = self._pending.pop(job, None)
                    if entry is None:
                        break
                    try:
                        await self._write(job, entry)
                        backoff = 0.2
                        continue
                    except _TRANSIENT as exc:
                        if not isinstance(exc, _ContendedError):
                            self.metrics.status_patches.labels("error").inc()
                        log.warning("status of %s not written (%s); retrying in %.1fs",
                                    job, exc, backoff)
                    except Exception:  # a bug must not silently end this job's writer
                        self.metrics.mirror_errors.labels("write").inc()
                        log.exception("status of %s not written; retrying in %.1fs",
                                      job, backoff)
                    newer = self._pending.get(job)
                    self._pending[job] = entry.merge(newer) if newer else entry
                    self._objects.discard(job)
                await asyncio.sleep(backoff)  # outside the slot: others keep writing
                backoff = min(10.0, backoff * 2)
        finally:
            self._writers.pop(job, None)

    async def _lease_remaining(self, state: JobState) -> int | None:
        if state.holder is None or not state.holder.lease_id:
            return None
        try:
            return await self.client.store.time_to_live(state.holder.lease_id)
        except JobLeaseError:
            return None  # an estimate only; never worth failing the write

    async def _recent_tenures(self, state: JobState) -> tuple[Tenure, ...] | None:
        """The status's short form of the history, as of ``state.revision`` (one
        bounded range read); None when that revision is compacted away (the
        status keeps its previous short form: an older one is never written
        over a newer, and a newer one cannot be had at this revision)."""
        try:
            tenures, _ = await recent_tenures(self.client.store, self.client.keys.job(state.job),
                                              state, RECENT_TENURES)
        except CompactedError as exc:
            log.info("recent tenures of %s at revision %d not read: %s", state.job,
                     state.revision, exc)
            return None
        if state.generation > 0:  # else nothing was read: no claim, no tenure
            self.metrics.history_reads.inc()
        return tenures

    async def _write(self, job: JobRef, entry: _Pending) -> None:
        state = entry.state
        tenures: tuple[Tenure, ...] | None = None  # read at most once per write
        read = False
        obj = self._objects.get(job)
        try:
            if obj is None or not state.registered:
                # An unregistered job is decided on a fresh read: the cached object
                # predates a deletion that began since (see _being_deleted).
                obj = await self.kube.get(job)
            for _ in range(CONFLICT_RETRIES):
                if _being_deleted(obj, state):
                    self._objects.discard(job)
                    return
                previous = obj.get("status") or {}
                if not should_apply(previous, state):
                    self.metrics.status_patches.labels("stale").inc()
                    break
                meta = obj.get("metadata", {})
                observed = observed_generation_for(
                    int(meta.get("generation") or 0), spec_matches(obj.get("spec"), state.spec),
                    previous)
                keeps_history = state.spec is not None and state.spec.history_limit > 0
                now = self._clock()
                if keeps_history and not read and history_changed(
                        previous, status_from_state(state, observed, previous, now,
                                                    result_limit=self.result_limit), state):
                    # the two reads at once: one round trip added to the write, not two
                    remaining, tenures = await asyncio.gather(
                        self._lease_remaining(state), self._recent_tenures(state))
                    read = True
                else:
                    remaining = await self._lease_remaining(state)
                status = status_from_state(state, observed, previous, now,
                                           lease_remaining=remaining,
                                           result_limit=self.result_limit)
                if keeps_history:
                    kept = previous.get("recentTenures")
                    if tenures is not None:
                        status["recentTenures"] = recent_tenures_status(tenures)
                    elif isinstance(kept, list):
                        status["recentTenures"] = kept
                if same_facts(previous, status):
                    self.metrics.status_patches.labels("unchanged").inc()
                    break
                try:
                    obj = await self.kube.replace_status(obj, status)
                except ConflictError:
                    self.metrics.status_patches.labels("conflict").inc()
                    obj = await self.kube.get(job)
                    continue
                except InvalidError as exc:
                    # Retrying the same content cannot help; a newer state may.
                    self.metrics.status_patches.labels("rejected").inc()
                    log.warning("status of %s at revision %d refused by the API server: %s",
                                job, state.revision, exc)
                    self._objects.discard(job)
                    return
                self.metrics.status_patches.labels("applied").inc()
                self.metrics.status_lag.observe(time.monotonic() - entry.received)
                log.debug("status of %s: %s at revision %d", job, status["phase"],
                          state.revision)
                break
            else:
                # Someone else keeps changing the object: give the slot back and try
                # again later with this entry (and anything newer merged into it).
                self.metrics.status_patches.labels("contended").inc()
                raise _ContendedError(f"{CONFLICT_RETRIES} conflicting writes in a row")
        except NotFoundError:
            self.metrics.status_patches.labels("not_found").inc()
            self._objects.discard(job)
            return
        if state.registered or state.corrupt is not None:
            self._objects.put(job, obj)
        else:
            self._objects.discard(job)
        for event in refine_ends(entry.events, tenures or ()):
            # Informational, written in the background (aggregated: event_recorder).
            self.events.record(obj, event)

    async def close(self) -> None:
        writers = list(self._writers.values())
        for task in writers:
            task.cancel()
        await asyncio.gather(*writers, return_exceptions=True)
        await self._background.cancel()
        await self.events.close()
