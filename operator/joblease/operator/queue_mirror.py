"""Each JobQueue's ``status`` and queue metrics, refreshed from etcd on a timer.

A queue's items live in etcd only and may number 100,000s, so nothing here is
per item: every ``interval`` seconds each known queue's counts are read with
``Queues.counts`` (count-only ranges: one small read-only transaction whatever
the number of items), its gauges set, and its status written at most once
(resourceVersion-conditional, only from counts read at a revision not older
than the status's ``etcdRevision``, and only when a fact changed). What the
operator keeps per queue is its name and two times; no etcd watch of the
queue's keys is opened (it would deliver every item's every change to the
operator, whose work must not grow with the items). A spec change is
refreshed at once (if the queue's last refresh is at least ``interval`` old,
else when it is due), so a status write per queue per interval is the most.

The queues known are the JobQueues kopf has handed to the handlers (create,
resume after a restart, update); the delete handler forgets one.
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
from joblease.errors import InvalidInputError, JobLeaseError, QueueNotFoundError
from joblease.keys import QueueRef
from joblease.operator.kube import ConflictError, InvalidError, KubeApi, KubeApiError, NotFoundError
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.queue_registration import retention_of, spec_matches
from joblease.operator.queue_status import same_facts, should_apply, status_from_counts
from joblease.operator.status import observed_generation_for
from joblease.queue import QueueCounts, Queues
from joblease.records import QueueSpec

log = logging.getLogger(__name__)

#: Seconds between two reads of a queue's counts (and at most one status write).
DEFAULT_INTERVAL = 5.0
#: Conditional writes re-read and re-decided in a row before waiting for the next round.
CONFLICT_RETRIES = 4
#: Finished items a refresh deletes at most (retention), so one round stays short.
PRUNE_PER_REFRESH = 1000


class QueueMirror:
    """Keeps JobQueue statuses and queue gauges in step with etcd (module docstring)."""

    def __init__(self, client: JobLeaseClient, kube: KubeApi, metrics: OperatorMetrics, *,
                 interval: float = DEFAULT_INTERVAL, concurrency: int = 8,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.queues = Queues(client)
        self.kube = kube
        self.metrics = metrics
        self.interval = interval
        self._clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        #: per queue: when its next refresh is due, when its last one started (monotonic)
        self._due: dict[QueueRef, float] = {}
        self._last: dict[QueueRef, float] = {}
        self._wake = asyncio.Event()

    def track(self, queue: QueueRef) -> None:
        """Refresh ``queue`` from now on, the first time as soon as the interval allows."""
        earliest = self._last.get(queue, float("-inf")) + self.interval
        self._due[queue] = max(time.monotonic(), earliest)
        self._wake.set()

    def untrack(self, queue: QueueRef) -> None:
        self._due.pop(queue, None)
        self._last.pop(queue, None)
        self.queues._specs.pop(queue, None)
        self.metrics.forget_queue(queue.namespace, queue.name)

    @property
    def tracked(self) -> list[QueueRef]:
        return sorted(self._due)

    async def run(self) -> None:
        """Refresh every due queue, then sleep until the next is due (or one is tracked)."""
        while True:
            now = time.monotonic()
            due = [q for q, at in self._due.items() if at <= now]
            for queue in due:
                self._due[queue] = now + self.interval
                self._last[queue] = now
            if due:
                await asyncio.gather(*(self._guarded_refresh(q) for q in due))
            self._wake.clear()
            upcoming = min(self._due.values(), default=None)
            timeout = self.interval if upcoming is None else max(0.0, upcoming - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _guarded_refresh(self, queue: QueueRef) -> None:
        async with self._limit:
            try:
                await self.refresh(queue)
            except (JobLeaseError, KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.metrics.queue_refreshes.labels("error").inc()
                log.warning("status of queue %s not refreshed (%s); retrying in %.0fs", queue,
                            exc, self.interval)
            except Exception:  # one queue's problem never stops the others
                self.metrics.queue_refreshes.labels("error").inc()
                self.metrics.mirror_errors.labels("write").inc()
                log.exception("status of queue %s not refreshed", queue)

    async def _read(self, queue: QueueRef) -> tuple[int, QueueCounts | None, QueueSpec | None]:
        """The counts (None: no queue) and the spec etcd holds, and the counts' revision."""
        try:
            _, spec = await self.queues.spec(queue, refresh=True)
            counts = await self.queues.counts(queue)
        except QueueNotFoundError:
            revision, _ = await self.queues.store.get(self.queues.keys(queue).spec)
            return revision, None, None
        return counts.revision, counts, spec

    async def refresh(self, queue: QueueRef) -> None:
        """Read the queue's counts once, set its gauges, write its status if it changed."""
        revision, counts, spec = await self._read(queue)
        if counts is None:
            self.metrics.queue_refreshes.labels("not_found").inc()
        else:
            self.metrics.queue_refreshes.labels("ok").inc()
            if queue in self._due:  # not forgotten while reading
                self.metrics.set_queue(queue.namespace, queue.name, pending=counts.pending,
                                       held=counts.held, failed=counts.failed,
                                       oldest_pending_age=counts.oldest_pending_age)
        try:
            obj = await self.kube.get_queue(queue)
            await self._write(queue, obj, revision, counts, spec)
            await self._prune(queue, obj, counts)
        except _ContendedError:
            log.info("status of queue %s kept conflicting; next round in %.0fs", queue,
                     self.interval)
        except NotFoundError:
            self.metrics.status_patches.labels("not_found").inc()

    async def _prune(self, queue: QueueRef, obj: dict[str, Any],
                     counts: QueueCounts | None) -> None:
        """Retention: finished items older than ``spec.ttlSecondsAfterFinished``
        are deleted, at most ``PRUNE_PER_REFRESH`` a round (docs/queues.md,
        "Prune"). Deleting a finished item is conditional on it (a retried one
        is kept), so a deposed leader doing it too is harmless."""
        if counts is None or not (counts.completed or counts.failed):
            return
        try:
            retention = retention_of(obj.get("spec"))
        except InvalidInputError as exc:
            log.warning("queue %s: %s; nothing pruned", queue, exc)
            return
        if retention is not None:
            pruned = await self.queues.prune(queue, retention, limit=PRUNE_PER_REFRESH)
            if pruned:
                log.info("queue %s: %d finished items past their retention deleted", queue,
                         pruned)

    async def _write(self, queue: QueueRef, obj: dict[str, Any], revision: int,
                          counts: QueueCounts | None, spec: QueueSpec | None) -> None:
        for _ in range(CONFLICT_RETRIES):
            meta = obj.get("metadata", {})
            if counts is None and meta.get("deletionTimestamp"):
                return  # our finalizer removed its keys: keep the last counts to the end
            previous = obj.get("status") or {}
            if not should_apply(previous, revision):
                self.metrics.status_patches.labels("stale").inc()
                return
            observed = observed_generation_for(
                int(meta.get("generation") or 0), spec_matches(obj.get("spec"), spec), previous)
            status = status_from_counts(counts, revision, spec, observed, previous,
                                        self._clock())
            if same_facts(previous, status):
                self.metrics.status_patches.labels("unchanged").inc()
                return
            try:
                await self.kube.replace_status(obj, status)
            except ConflictError:
                self.metrics.status_patches.labels("conflict").inc()
                obj = await self.kube.get_queue(queue)
                continue
            except InvalidError as exc:
                self.metrics.status_patches.labels("rejected").inc()
                log.warning("status of queue %s at revision %d refused by the API server: %s",
                            queue, revision, exc)
                return
            self.metrics.status_patches.labels("applied").inc()
            return
        self.metrics.status_patches.labels("contended").inc()
        raise _ContendedError


class _ContendedError(Exception):
    """The status kept conflicting; the next round tries again."""
