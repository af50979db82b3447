"""Each JobSemaphore's ``status`` and semaphore metrics, refreshed from etcd on a timer.

The JobSemaphore twin of :mod:`joblease.operator.queue_mirror`: every
``interval`` seconds each known semaphore is read with ``Semaphores.status``
(one read-only transaction: spec, slots, waiters), its gauges set, and its
status written at most once (resourceVersion-conditional, only from a state read
at a revision not older than the status's ``etcdRevision``, and only when a fact
changed). Slots come and go with every claim; a timer, not a watch, keeps the
operator's work per semaphore at one read per interval however busy it is.

The semaphores known are the JobSemaphores kopf has handed to the handlers
(create, resume after a restart, update); the delete handler forgets one.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable
from typing import Any

import aiohttp

from joblease.client import JobLeaseClient
from joblease.errors import JobLeaseError, SemaphoreNotFoundError
from joblease.keys import SemaphoreRef
from joblease.operator.kube import ConflictError, InvalidError, KubeApi, KubeApiError, NotFoundError
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.queue_mirror import CONFLICT_RETRIES, DEFAULT_INTERVAL
from joblease.operator.semaphore_registration import spec_matches
from joblease.operator.semaphore_status import same_facts, should_apply, status_from_semaphore
from joblease.operator.status import observed_generation_for
from joblease.semaphore import Semaphores, SemaphoreStatus

log = logging.getLogger(__name__)

__all__ = ["DEFAULT_INTERVAL", "SemaphoreMirror"]


class SemaphoreMirror:
    """Keeps JobSemaphore statuses and semaphore gauges in step with etcd (module docstring)."""

    def __init__(self, client: JobLeaseClient, kube: KubeApi, metrics: OperatorMetrics, *,
                 interval: float = DEFAULT_INTERVAL, concurrency: int = 8,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.semaphores = Semaphores(client)
        self.kube = kube
        self.metrics = metrics
        self.interval = interval
        self._clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        #: per semaphore: when its next refresh is due, when its last one started (monotonic)
        self._due: dict[SemaphoreRef, float] = {}
        self._last: dict[SemaphoreRef, float] = {}
        self._wake = asyncio.Event()

    def track(self, ref: SemaphoreRef) -> None:
        """Refresh ``ref`` from now on, the first time as soon as the interval allows."""
        earliest = self._last.get(ref, float("-inf")) + self.interval
        self._due[ref] = max(time.monotonic(), earliest)
        self._wake.set()

    def untrack(self, ref: SemaphoreRef) -> None:
        self._due.pop(ref, None)
        self._last.pop(ref, None)
        self.metrics.forget_semaphore(ref.namespace, ref.name)

    @property
    def tracked(self) -> list[SemaphoreRef]:
        return sorted(self._due, key=str)

    async def run(self) -> None:
        """Refresh every due semaphore, then sleep until the next is due (or one is tracked)."""
        while True:
            now = time.monotonic()
            due = [s for s, at in self._due.items() if at <= now]
            for ref in due:
                self._due[ref] = now + self.interval
                self._last[ref] = now
            if due:
                await asyncio.gather(*(self._guarded_refresh(s) for s in due))
            self._wake.clear()
            upcoming = min(self._due.values(), default=None)
            timeout = self.interval if upcoming is None else max(0.0, upcoming - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _guarded_refresh(self, ref: SemaphoreRef) -> None:
        async with self._limit:
            try:
                await self.refresh(ref)
            except (JobLeaseError, KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.metrics.semaphore_refreshes.labels("error").inc()
                log.warning("status of semaphore %s not refreshed (%s); retrying in %.0fs", ref,
                            exc, self.interval)
            except Exception:  # one semaphore's problem never stops the others
                self.metrics.semaphore_refreshes.labels("error").inc()
                self.metrics.mirror_errors.labels("write").inc()
                log.exception("status of semaphore %s not refreshed", ref)

    async def _read(self, ref: SemaphoreRef) -> tuple[int, SemaphoreStatus | None]:
        """The state (None: no semaphore) and the revision it was read at."""
        try:
            state = await self.semaphores.status(ref)
        except SemaphoreNotFoundError:
            revision, _ = await self.semaphores.store.get(self.semaphores.keys(ref).spec)
            return revision, None
        return state.revision, state

    async def refresh(self, ref: SemaphoreRef) -> None:
        """Read the semaphore once, set its gauges, write its status if it changed."""
        revision, state = await self._read(ref)
        if state is None:
            self.metrics.semaphore_refreshes.labels("not_found").inc()
        else:
            self.metrics.semaphore_refreshes.labels("ok").inc()
            if ref in self._due:  # not forgotten while reading
                self.metrics.set_semaphore(ref.namespace, ref.name, limit=state.limit,
                                           live=state.live, waiters=state.waiters)
        try:
            await self._write(ref, await self.kube.get_semaphore(ref), revision, state)
        except _ContendedError:
            log.info("status of semaphore %s kept conflicting; next round in %.0fs", ref,
                     self.interval)
        except NotFoundError:
            self.metrics.status_patches.labels("not_found").inc()

    async def _write(self, ref: SemaphoreRef, obj: dict[str, Any], revision: int,
                     state: SemaphoreStatus | None) -> None:
        for _ in range(CONFLICT_RETRIES):
            meta = obj.get("metadata", {})
            if state is None and meta.get("deletionTimestamp"):
                return  # our finalizer removed its keys: keep the last state to the end
            previous = obj.get("status") or {}
            if not should_apply(previous, revision):
                self.metrics.status_patches.labels("stale").inc()
                return
            observed = observed_generation_for(
                int(meta.get("generation") or 0),
                spec_matches(obj.get("spec"), state.limit if state else None), previous)
            status = status_from_semaphore(state, revision, observed, previous, self._clock())
            if same_facts(previous, status):
                self.metrics.status_patches.labels("unchanged").inc()
                return
            try:
                await self.kube.replace_status(obj, status)
            except ConflictError:
                self.metrics.status_patches.labels("conflict").inc()
                obj = await self.kube.get_semaphore(ref)
                continue
            except InvalidError as exc:
                self.metrics.status_patches.labels("rejected").inc()
                log.warning("status of semaphore %s at revision %d refused by the API server: %s",
                            ref, revision, exc)
                return
            self.metrics.status_patches.labels("applied").inc()
            return
        self.metrics.status_patches.labels("contended").inc()
        raise _ContendedError


class _ContendedError(Exception):
    """The status kept conflicting; the next round tries again."""
