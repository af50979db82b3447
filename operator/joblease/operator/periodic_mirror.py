"""A status mirror on a timer: the shape the JobQueue and JobSemaphore mirrors share.

Every ``interval`` seconds each tracked resource is read from etcd once (the
subclass's :meth:`PeriodicMirror.read`: one small read-only transaction), its
gauges set, and its ``status`` written at most once: resourceVersion-conditional
(a conflict re-reads the object and decides again, :data:`CONFLICT_RETRIES`
times), only from a state read at a revision not older than the status's
``etcdRevision`` (never backwards), and only when a fact changed. A timer, not a
watch: the operator's work per resource stays one read per interval however
busy the resource is (a queue's items, a semaphore's slots).

The resources tracked are those kopf has handed to the handlers (create, resume
after a restart, update); the delete handler untracks one. A spec change is
refreshed at once if the last refresh is at least ``interval`` old, else when it
is due, so one status write per resource per interval is the most.
"""

from __future__ import annotations

import abc
import asyncio
import datetime as dt
import logging
import time
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

import aiohttp
from prometheus_client import Counter

from joblease.errors import JobLeaseError
from joblease.operator.kube import ConflictError, InvalidError, KubeApi, KubeApiError, NotFoundError
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.queue_status import should_apply

log = logging.getLogger(__name__)

#: Seconds between two reads of a resource's state (and at most one status write).
DEFAULT_INTERVAL = 5.0
#: Conditional writes re-read and re-decided in a row before waiting for the next round.
CONFLICT_RETRIES = 4

RefT = TypeVar("RefT", bound=Hashable)
StateT = TypeVar("StateT")


class PeriodicMirror(abc.ABC, Generic[RefT, StateT]):
    """Keeps one kind's statuses and gauges in step with etcd (module docstring).

    A subclass says what it mirrors: :attr:`kind` (for logs), how to :meth:`read`
    the state and :meth:`fetch` the object, the :meth:`status` to write, its
    gauges (:meth:`set_gauges`, :meth:`forget`), its refresh counter
    (:meth:`refreshes`), and optionally work :meth:`after_write`."""

    kind: str

    def __init__(self, kube: KubeApi, metrics: OperatorMetrics, *,
                 interval: float = DEFAULT_INTERVAL, concurrency: int = 8,
                 clock: Callable[[], dt.datetime] = lambda: dt.datetime.now(dt.UTC)) -> None:
        self.kube = kube
        self.metrics = metrics
        self.interval = interval
        self._clock = clock
        self._limit = asyncio.Semaphore(concurrency)
        #: per resource: when its next refresh is due, when its last one started (monotonic)
        self._due: dict[RefT, float] = {}
        self._last: dict[RefT, float] = {}
        self._wake = asyncio.Event()

    # -- what a subclass says ----------------------------------------------------------------
    @abc.abstractmethod
    async def read(self, ref: RefT) -> tuple[int, StateT | None]:
        """The state etcd holds (None: no such resource in etcd) and its revision."""

    @abc.abstractmethod
    async def fetch(self, ref: RefT) -> dict[str, Any]:
        """The Kubernetes object (raises NotFoundError)."""

    @abc.abstractmethod
    def status(self, obj: dict[str, Any], revision: int, state: StateT | None,
               previous: dict[str, Any], now: dt.datetime) -> dict[str, Any]:
        """The complete status to write for ``state`` read at ``revision``."""

    @abc.abstractmethod
    def same_facts(self, previous: dict[str, Any], status: dict[str, Any]) -> bool:
        """True when writing ``status`` over ``previous`` would change no fact."""

    @abc.abstractmethod
    def refreshes(self) -> Counter:
        """The refresh counter (labels ok, not_found, error)."""

    @abc.abstractmethod
    def set_gauges(self, ref: RefT, state: StateT) -> None: ...

    @abc.abstractmethod
    def forget(self, ref: RefT) -> None:
        """Drop what is kept for ``ref`` (its gauges, caches) once untracked."""

    async def after_write(self, ref: RefT, obj: dict[str, Any], state: StateT | None) -> None:
        """Work after the status write of a refresh (a queue's retention)."""

    def written(self, obj: dict[str, Any], previous: dict[str, Any],
                status: dict[str, Any]) -> None:
        """``status`` replaced ``previous`` on ``obj`` (the API server took it): a
        semaphore's Events. Called once per status actually written, never for a
        refused, stale or unchanged one."""

    # -- tracking ----------------------------------------------------------------------------
    def track(self, ref: RefT) -> None:
        """Refresh ``ref`` from now on, the first time as soon as the interval allows."""
        earliest = self._last.get(ref, float("-inf")) + self.interval
        self._due[ref] = max(time.monotonic(), earliest)
        self._wake.set()

    def untrack(self, ref: RefT) -> None:
        self._due.pop(ref, None)
        self._last.pop(ref, None)
        self.forget(ref)

    @property
    def tracked(self) -> list[RefT]:
        return sorted(self._due, key=str)

    # -- the loop ----------------------------------------------------------------------------
    async def run(self) -> None:
        """Refresh everything due, then sleep until the next is due (or one is tracked)."""
        while True:
            now = time.monotonic()
            due = [r for r, at in self._due.items() if at <= now]
            for ref in due:
                self._due[ref] = now + self.interval
                self._last[ref] = now
            if due:
                await asyncio.gather(*(self._guarded_refresh(r) for r in due))
            self._wake.clear()
            upcoming = min(self._due.values(), default=None)
            timeout = self.interval if upcoming is None else max(0.0, upcoming - time.monotonic())
            try:
                await asyncio.wait_for(self._wake.wait(), timeout)
            except TimeoutError:
                pass

    async def _guarded_refresh(self, ref: RefT) -> None:
        async with self._limit:
            try:
                await self.refresh(ref)
            except (JobLeaseError, KubeApiError, aiohttp.ClientError, TimeoutError) as exc:
                self.refreshes().labels("error").inc()
                log.warning("status of %s %s not refreshed (%s); retrying in %.0fs", self.kind,
                            ref, exc, self.interval)
            except Exception:  # one resource's problem never stops the others
                self.refreshes().labels("error").inc()
                self.metrics.mirror_errors.labels("write").inc()
                log.exception("status of %s %s not refreshed", self.kind, ref)

    async def refresh(self, ref: RefT) -> None:
        """Read the state once, set the gauges, write the status if it changed."""
        revision, state = await self.read(ref)
        if state is None:
            self.refreshes().labels("not_found").inc()
        else:
            self.refreshes().labels("ok").inc()
            if ref in self._due:  # not forgotten while reading
                self.set_gauges(ref, state)
        try:
            obj = await self.fetch(ref)
            await self._write(ref, obj, revision, state)
            await self.after_write(ref, obj, state)
        except _ContendedError:
            log.info("status of %s %s kept conflicting; next round in %.0fs", self.kind, ref,
                     self.interval)
        except NotFoundError:
            self.metrics.status_patches.labels("not_found").inc()

    async def _write(self, ref: RefT, obj: dict[str, Any], revision: int,
                     state: StateT | None) -> None:
        for _ in range(CONFLICT_RETRIES):
            meta = obj.get("metadata", {})
            if state is None and meta.get("deletionTimestamp"):
                return  # our finalizer removed its keys: keep the last state to the end
            previous = obj.get("status") or {}
            if not should_apply(previous, revision):
                self.metrics.status_patches.labels("stale").inc()
                return
            status = self.status(obj, revision, state, previous, self._clock())
            if self.same_facts(previous, status):
                self.metrics.status_patches.labels("unchanged").inc()
                return
            try:
                await self.kube.replace_status(obj, status)
            except ConflictError:
                self.metrics.status_patches.labels("conflict").inc()
                obj = await self.fetch(ref)
                continue
            except InvalidError as exc:
                self.metrics.status_patches.labels("rejected").inc()
                log.warning("status of %s %s at revision %d refused by the API server: %s",
                            self.kind, ref, revision, exc)
                return
            self.metrics.status_patches.labels("applied").inc()
            self.written(obj, previous, status)
            return
        self.metrics.status_patches.labels("contended").inc()
        raise _ContendedError


class _ContendedError(Exception):
    """The status kept conflicting; the next round tries again."""
