"""Each JobSemaphore's ``status`` and semaphore metrics, refreshed from etcd on a timer
(:mod:`joblease.operator.periodic_mirror`).

Each refresh reads the semaphore with ``Semaphores.status`` (one read-only
transaction: spec, slots, waiters). Slots come and go with every claim; a timer,
not a watch, keeps the operator's work per semaphore at one read per interval
however busy it is. Each status written also gives the semaphore's Events
(:mod:`joblease.operator.semaphore_events`), through the operator's one
aggregating :class:`~joblease.operator.event_recorder.EventRecorder`.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from prometheus_client import Counter

from joblease.client import JobLeaseClient
from joblease.errors import SemaphoreNotFoundError
from joblease.keys import SemaphoreRef
from joblease.operator.event_recorder import EventRecorder
from joblease.operator.kube import KubeApi
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.periodic_mirror import DEFAULT_INTERVAL, PeriodicMirror
from joblease.operator.semaphore_events import derive_semaphore_events
from joblease.operator.semaphore_registration import spec_matches
from joblease.operator.semaphore_status import same_facts, status_from_semaphore
from joblease.operator.status import observed_generation_for
from joblease.semaphore import Semaphores, SemaphoreStatus

__all__ = ["DEFAULT_INTERVAL", "SemaphoreMirror"]


class SemaphoreMirror(PeriodicMirror[SemaphoreRef, SemaphoreStatus]):
    """Keeps JobSemaphore statuses and semaphore gauges in step with etcd (module docstring)."""

    kind = "semaphore"

    def __init__(self, client: JobLeaseClient, kube: KubeApi, metrics: OperatorMetrics,
                 *, events: EventRecorder | None = None, **options: Any) -> None:
        super().__init__(kube, metrics, **options)
        self.semaphores = Semaphores(client)
        self.events = events or EventRecorder(kube, metrics, instance=kube.instance)

    async def read(self, ref: SemaphoreRef) -> tuple[int, SemaphoreStatus | None]:
        try:
            state = await self.semaphores.status(ref)
        except SemaphoreNotFoundError:
            revision, _ = await self.semaphores.store.get(self.semaphores.keys(ref).spec)
            return revision, None
        return state.revision, state

    async def fetch(self, ref: SemaphoreRef) -> dict[str, Any]:
        return await self.kube.get_semaphore(ref)

    def status(self, obj: dict[str, Any], revision: int, state: SemaphoreStatus | None,
               previous: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
        observed = observed_generation_for(
            int(obj.get("metadata", {}).get("generation") or 0),
            spec_matches(obj.get("spec"), state.limit if state else None), previous)
        return status_from_semaphore(state, revision, observed, previous, now)

    def same_facts(self, previous: dict[str, Any], status: dict[str, Any]) -> bool:
        return same_facts(previous, status)

    def written(self, obj: dict[str, Any], previous: dict[str, Any],
                status: dict[str, Any]) -> None:
        for event in derive_semaphore_events(previous, status):
            self.events.record(obj, event)

    def refreshes(self) -> Counter:
        return self.metrics.semaphore_refreshes

    def set_gauges(self, ref: SemaphoreRef, state: SemaphoreStatus) -> None:
        self.metrics.set_semaphore(ref.namespace, ref.name, limit=state.limit,
                                   live=state.live, waiters=state.waiters)

    def forget(self, ref: SemaphoreRef) -> None:
        self.metrics.forget_semaphore(ref.namespace, ref.name)
