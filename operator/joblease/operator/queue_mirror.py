"""Each JobQueue's ``status`` and queue metrics, refreshed from etcd on a timer
(:mod:`joblease.operator.periodic_mirror`), and its retention applied.

A queue's items live in etcd only and may number 100,000s, so nothing here is
per item: each refresh reads the queue's counts with ``Queues.counts``
(count-only ranges: one small read-only transaction whatever the number of
items). What the operator keeps per queue is its name and two times; no etcd
watch of the queue's keys is opened (it would deliver every item's every change
to the operator, whose work must not grow with the items).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from prometheus_client import Counter

from joblease.client import JobLeaseClient
from joblease.errors import InvalidInputError, QueueNotFoundError
from joblease.keys import QueueRef
from joblease.operator.kube import KubeApi
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.periodic_mirror import CONFLICT_RETRIES, DEFAULT_INTERVAL, PeriodicMirror
from joblease.operator.queue_registration import retention_of, spec_matches
from joblease.operator.queue_status import same_facts, status_from_counts
from joblease.operator.status import observed_generation_for
from joblease.queue import QueueCounts, Queues
from joblease.records import QueueSpec

log = logging.getLogger(__name__)

__all__ = ["CONFLICT_RETRIES", "DEFAULT_INTERVAL", "PRUNE_PER_REFRESH", "QueueMirror"]

#: Finished items a refresh deletes at most (retention), so one round stays short.
PRUNE_PER_REFRESH = 1000


@dataclass(frozen=True)
class QueueReading:
    counts: QueueCounts
    spec: QueueSpec | None


class QueueMirror(PeriodicMirror[QueueRef, QueueReading]):
    """Keeps JobQueue statuses and queue gauges in step with etcd (module docstring)."""

    kind = "queue"

    def __init__(self, client: JobLeaseClient, kube: KubeApi, metrics: OperatorMetrics,
                 **options: Any) -> None:
        super().__init__(kube, metrics, **options)
        self.queues = Queues(client)

    async def read(self, ref: QueueRef) -> tuple[int, QueueReading | None]:
        try:
            _, spec = await self.queues.spec(ref, refresh=True)
            counts = await self.queues.counts(ref)
        except QueueNotFoundError:
            revision, _ = await self.queues.store.get(self.queues.keys(ref).spec)
            return revision, None
        return counts.revision, QueueReading(counts, spec)

    async def fetch(self, ref: QueueRef) -> dict[str, Any]:
        return await self.kube.get_queue(ref)

    def status(self, obj: dict[str, Any], revision: int, state: QueueReading | None,
               previous: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
        spec = state.spec if state else None
        observed = observed_generation_for(
            int(obj.get("metadata", {}).get("generation") or 0),
            spec_matches(obj.get("spec"), spec), previous)
        return status_from_counts(state.counts if state else None, revision, spec, observed,
                                  previous, now)

    def same_facts(self, previous: dict[str, Any], status: dict[str, Any]) -> bool:
        return same_facts(previous, status)

    def refreshes(self) -> Counter:
        return self.metrics.queue_refreshes

    def set_gauges(self, ref: QueueRef, state: QueueReading) -> None:
        counts = state.counts
        self.metrics.set_queue(ref.namespace, ref.name, pending=counts.pending,
                               held=counts.held, failed=counts.failed,
                               oldest_pending_age=counts.oldest_pending_age)

    def forget(self, ref: QueueRef) -> None:
        self.queues.forget_spec(ref)
        self.metrics.forget_queue(ref.namespace, ref.name)

    async def after_write(self, ref: QueueRef, obj: dict[str, Any],
                          state: QueueReading | None) -> None:
        """Retention: finished items older than ``spec.ttlSecondsAfterFinished``
        are deleted, at most ``PRUNE_PER_REFRESH`` a round (docs/queues.md,
        "Prune"). Deleting a finished item is conditional on it (a retried one
        is kept), so a deposed leader doing it too is harmless."""
        counts = state.counts if state else None
        if counts is None or not (counts.completed or counts.failed):
            return
        try:
            retention = retention_of(obj.get("spec"))
        except InvalidInputError as exc:
            log.warning("queue %s: %s; nothing pruned", ref, exc)
            return
        if retention is not None:
            pruned = await self.queues.prune(ref, retention, limit=PRUNE_PER_REFRESH)
            if pruned:
                log.info("queue %s: %d finished items past their retention deleted", ref,
                         pruned)
