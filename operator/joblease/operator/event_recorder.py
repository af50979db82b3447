"""Kubernetes Events of JobLeases and JobSemaphores, aggregated with ``count`` as
Kubernetes' own recorder does.

A job claimed, expired and claimed again (attempts left), or a ``Failed`` job
reported again, would otherwise leave one Event object per occurrence. Like
client-go's event correlator, a repeat of an Event of the same involved object
(its ``uid``), ``type`` and ``reason`` within :data:`WINDOW` seconds of the
previous occurrence does not create an Event: it patches the existing one's
``count``, ``lastTimestamp`` and ``message`` (the latest occurrence's: ours carry
the holder, generation and token, so two occurrences rarely have the same text,
and client-go's aggregator also groups similar events whatever their message and
shows the latest one). ``kubectl describe jl`` then shows ``x5 over 3m`` and the
newest message instead of five rows.

Writes per series are coalesced: at most one request in flight, and a repeat
within :data:`PATCH_INTERVAL` of the series' last write waits for it, so a burst
of n repeats costs one PATCH carrying count n instead of n writes. The count is
never lost by coalescing, only written a moment later.

The API server is the truth, not the cache: a PATCH answered 404 (the Event was
deleted, or aged out after the API server's event TTL) or 409 creates a new
Event carrying the count so far. The cache holds at most :data:`CAPACITY` series
(least recently used evicted first; an evicted series' next occurrence starts a
new Event), so its memory is fixed whatever the number of JobLeases. Events are
best effort and informational (docs/operator.md); a write that fails is logged
and counted, and the next occurrence of the series retries it.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import aiohttp

from joblease.background import BackgroundTasks
from joblease.operator.events import JobEvent
from joblease.operator.kube import COMPONENT, ConflictError, KubeApiError, NotFoundError
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.registration import GROUP, KIND, VERSION

log = logging.getLogger(__name__)

#: Seconds after an occurrence within which a repeat joins its series (client-go: 10 min).
WINDOW = 600.0
#: Series remembered at most (client-go's correlator caches 4096 too).
CAPACITY = 4096
#: Seconds between two writes of one series; repeats in between merge into the next.
PATCH_INTERVAL = 2.0
#: The API server's limit on ``message`` is 1 KiB for core/v1 Events shown by kubectl.
MESSAGE_LIMIT = 1024


class EventApi(Protocol):
    """The two Event calls the recorder makes (:class:`joblease.operator.kube.KubeApi`)."""

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]
                          ) -> dict[str, Any]: ...


_Key = tuple[str, str, str, str, str]  # namespace, involved name, uid, type, reason


@dataclass
class _Series:
    """One Event object and the occurrences it stands for."""

    namespace: str
    involved: dict[str, str]
    type: str
    reason: str
    message: str
    first: str  # RFC 3339, seconds: what core/v1 Events carry
    last: str
    seen: float  # monotonic time of the latest occurrence
    count: int = 1
    written: int = 0  # the count the API server has
    name: str | None = None  # the Event's name, once created
    last_write: float = field(default=-1e18)
    writer: asyncio.Future[None] | None = None


def _stamp(now: dt.datetime) -> str:
    return now.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class EventRecorder:
    """Records :class:`JobEvent` s of JobLeases as aggregated core/v1 Events."""

    def __init__(self, api: EventApi, metrics: OperatorMetrics, *, instance: str,
                 window: float = WINDOW, capacity: int = CAPACITY,
                 patch_interval: float = PATCH_INTERVAL,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self._api = api
        self._metrics = metrics
        self._instance = instance
        self._window = window
        self._capacity = capacity
        self._patch_interval = patch_interval
        self._clock = clock
        self._wall = wall
        self._series: OrderedDict[_Key, _Series] = OrderedDict()
        self._background = BackgroundTasks()

    def __len__(self) -> int:
        """Series cached now (at most ``capacity``)."""
        return len(self._series)

    def record(self, obj: dict[str, Any], event: JobEvent) -> None:
        """Note one occurrence of ``event`` for ``obj`` (a JobLease unless its ``kind``
        says otherwise); written in the background."""
        meta = obj["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], meta.get("uid", "")
        key: _Key = (namespace, name, uid, event.type, event.reason)
        now, stamp = self._clock(), _stamp(self._wall())
        message = event.message[:MESSAGE_LIMIT]
        series = self._series.get(key)
        if series is not None and now - series.seen <= self._window:
            series.count += 1
            series.message, series.last, series.seen = message, stamp, now
            self._series.move_to_end(key)
        else:
            series = _Series(namespace=namespace, involved={
                "apiVersion": str(obj.get("apiVersion") or f"{GROUP}/{VERSION}"),
                "kind": str(obj.get("kind") or KIND), "name": name,
                "namespace": namespace, "uid": uid},
                type=event.type, reason=event.reason, message=message, first=stamp,
                last=stamp, seen=now)
            self._series[key] = series
            self._series.move_to_end(key)
            while len(self._series) > self._capacity:
                self._series.popitem(last=False)  # a pending write keeps its own reference
        self._metrics.events_posted.labels(event.reason).inc()
        if series.writer is None:
            series.writer = self._background.spawn(self._write(series))

    async def _write(self, series: _Series) -> None:
        """Bring the API server's Event up to ``series.count``; one writer per series."""
        try:
            while series.written < series.count:
                if series.name is not None:
                    wait = series.last_write + self._patch_interval - self._clock()
                    if wait > 0:
                        await asyncio.sleep(wait)  # repeats meanwhile join this write
                count = series.count
                try:
                    await self._send(series, count)
                except (KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                    self._metrics.event_writes.labels("failed").inc()
                    log.info("event %s for %s/%s not written: %s", series.reason,
                             series.namespace, series.involved["name"], exc)
                    return  # best effort: the next occurrence retries
                series.written, series.last_write = count, self._clock()
        finally:
            series.writer = None

    async def _send(self, series: _Series, count: int) -> None:
        if series.name is not None:
            patch = {"count": count, "lastTimestamp": series.last, "message": series.message}
            try:
                await self._api.patch_event(series.namespace, series.name, patch)
                self._metrics.event_writes.labels("patch").inc()
                return
            except (NotFoundError, ConflictError):
                # Deleted (or aged out) meanwhile: the count lives on in a new Event.
                series.name = None
        created = await self._api.create_event(series.namespace, self._body(series, count))
        self._metrics.event_writes.labels("create").inc()
        series.name = str(created["metadata"]["name"])

    def _body(self, series: _Series, count: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"generateName": f"{series.involved['name']}.",
                         "namespace": series.namespace},
            "involvedObject": series.involved,
            "type": series.type, "reason": series.reason, "message": series.message,
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT, "reportingInstance": self._instance,
            "firstTimestamp": series.first, "lastTimestamp": series.last, "count": count,
        }

    async def wait(self) -> None:
        """Until every write started so far has ended (tests, shutdown)."""
        await self._background.wait()

    async def close(self) -> None:
        await self._background.cancel()
