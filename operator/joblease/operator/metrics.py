"""Prometheus metrics and health endpoints on the operator's own port.

No JobLease metric has a per-object label (a namespace/name label would grow
without bound with the number of jobs); per-job detail is in each resource's
status. The queue and semaphore gauges are the exceptions, labelled by
namespace and queue (semaphore): a queue is one Kubernetes object holding any
number of items (a semaphore, any number of slots), so their series grow with
the number of JobQueues and JobSemaphores (a handful per team), never with items
or slots, and a deleted one's series are removed.

Endpoints (one small aiohttp server): ``/metrics``, ``/healthz`` (the
process's loops are alive: the etcd watch task has not died) and ``/readyz``
(etcd answers a read; on the active replica also: kopf has started). A standby
replica is ready: readiness means "serving", not "leading".
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from joblease.records import Phase

log = logging.getLogger(__name__)


class OperatorMetrics:
    """The operator's metrics, in a registry of their own (tests create many)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.status_patches = Counter(
            "joblease_operator_status_patches_total",
            "Status writes by result: applied, unchanged, stale (older revision refused), "
            "conflict (re-read and re-decided), contended (still conflicting after several "
            "re-reads: re-queued with backoff), not_found, rejected (422), error.",
            ["result"], registry=r)
        self.watch_events = Counter(
            "joblease_operator_watch_events_total",
            "Job states received from the etcd watch (snapshot included).", registry=r)
        self.history_reads = Counter(
            "joblease_operator_history_reads_total",
            "Bounded etcd reads of a job's last tenures for status.recentTenures (one per "
            "status write of a change, none for a job keeping no history).", registry=r)
        self.resyncs = Counter(
            "joblease_operator_resyncs_total",
            "Times the mirror (re)started its etcd watch from a fresh snapshot.", registry=r)
        self.status_lag = Histogram(
            "joblease_operator_status_lag_seconds",
            "From receiving an etcd change to its status write being accepted.",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r)
        self.events_posted = Counter(
            "joblease_operator_events_total",
            "Kubernetes Events recorded, by reason (a repeat counts again; it is written as "
            "the existing Event's count).", ["reason"], registry=r)
        self.event_writes = Counter(
            "joblease_operator_event_writes_total",
            "Event writes to the API server, by outcome: create (a new Event), patch (a "
            "repeat's count on the existing one), failed.", ["verb"], registry=r)
        self.corrupt_records = Counter(
            "joblease_operator_corrupt_records_total",
            "Job states received whose stored records cannot be decoded (the job's status "
            "shows phase Corrupt; the other jobs are mirrored as usual).", registry=r)
        self.mirror_errors = Counter(
            "joblease_operator_mirror_errors_total",
            "Jobs the mirror skipped or retried after an unexpected error, by stage: "
            "invalid_name (an etcd key whose job name no JobLease can have), observe, write.",
            ["stage"], registry=r)
        self.leader = Gauge(
            "joblease_operator_leader",
            "1 while this replica is the active one (runs kopf's handlers and the mirror), "
            "0 while it stands by (serves probes, metrics and the webhook only).", registry=r)
        self.jobs = Gauge(
            "joblease_operator_jobs", "Jobs known from etcd, by phase.", ["phase"], registry=r)
        labels = ["namespace", "queue"]
        self.queue_pending = Gauge(
            "joblease_operator_queue_pending_items",
            "Items of the queue claimable now (its depth), as last read from etcd.", labels,
            registry=r)
        self.queue_held = Gauge(
            "joblease_operator_queue_held_items",
            "Items of the queue with a live holder, as last read from etcd.", labels, registry=r)
        self.queue_failed = Gauge(
            "joblease_operator_queue_failed_items",
            "Items of the queue that used maxAttempts claims without a result (until retried).",
            labels, registry=r)
        self.queue_oldest_pending_age = Gauge(
            "joblease_operator_queue_oldest_pending_age_seconds",
            "Age of the queue's oldest claimable item (0 when none is pending), from the "
            "enqueuer's clock.", labels, registry=r)
        self.queue_refreshes = Counter(
            "joblease_operator_queue_refreshes_total",
            "Reads of a queue's counts by result: ok, not_found (no queue in etcd), error.",
            ["result"], registry=r)
        for result in ("ok", "not_found", "error"):
            self.queue_refreshes.labels(result)
        # Semaphores the same way: one series per JobSemaphore, never per slot.
        labels = ["namespace", "semaphore"]
        self.semaphore_limit = Gauge(
            "joblease_operator_semaphore_limit",
            "The semaphore's limit (slots live at once), as last read from etcd.", labels,
            registry=r)
        self.semaphore_live = Gauge(
            "joblease_operator_semaphore_live_slots",
            "Slots of the semaphore held by live claims, as last read from etcd.", labels,
            registry=r)
        self.semaphore_waiters = Gauge(
            "joblease_operator_semaphore_waiters",
            "Claims waiting in line for slots of the semaphore, as last read from etcd.",
            labels, registry=r)
        self.semaphore_refreshes = Counter(
            "joblease_operator_semaphore_refreshes_total",
            "Reads of a semaphore by result: ok, not_found (no semaphore in etcd), error.",
            ["result"], registry=r)
        for result in ("ok", "not_found", "error"):
            self.semaphore_refreshes.labels(result)
        for phase in Phase:
            self.jobs.labels(phase.value).set(0)
        for result in ("applied", "unchanged", "stale", "conflict", "contended", "not_found",
                       "rejected", "error"):
            self.status_patches.labels(result)
        for stage in ("invalid_name", "observe", "write"):
            self.mirror_errors.labels(stage)

    def set_queue(self, namespace: str, queue: str, *, pending: int, held: int, failed: int,
                  oldest_pending_age: float | None) -> None:
        self.queue_pending.labels(namespace, queue).set(pending)
        self.queue_held.labels(namespace, queue).set(held)
        self.queue_failed.labels(namespace, queue).set(failed)
        self.queue_oldest_pending_age.labels(namespace, queue).set(oldest_pending_age or 0.0)

    def forget_queue(self, namespace: str, queue: str) -> None:
        """Remove a deleted queue's series (they would otherwise stay at their last value)."""
        for gauge in (self.queue_pending, self.queue_held, self.queue_failed,
                      self.queue_oldest_pending_age):
            try:
                gauge.remove(namespace, queue)
            except KeyError:
                pass

    def set_semaphore(self, namespace: str, semaphore: str, *, limit: int, live: int,
                      waiters: int) -> None:
        self.semaphore_limit.labels(namespace, semaphore).set(limit)
        self.semaphore_live.labels(namespace, semaphore).set(live)
        self.semaphore_waiters.labels(namespace, semaphore).set(waiters)

    def forget_semaphore(self, namespace: str, semaphore: str) -> None:
        """Remove a deleted semaphore's series (they would otherwise stay at their last value)."""
        for gauge in (self.semaphore_limit, self.semaphore_live, self.semaphore_waiters):
            try:
                gauge.remove(namespace, semaphore)
            except KeyError:
                pass

    def render(self) -> bytes:
        return generate_latest(self.registry)


Check = Callable[[], Awaitable[bool]]


async def serve(metrics: OperatorMetrics, host: str, port: int, *, healthy: Check,
                ready: Check) -> web.AppRunner:
    """Start the HTTP server; the caller stops it with ``await runner.cleanup()``."""

    async def probe(check: Check) -> web.Response:
        try:
            ok = await asyncio.wait_for(check(), timeout=3)
        except Exception as exc:  # a probe answers, it does not raise
            return web.Response(status=503, text=f"not ok: {exc}\n")
        return web.Response(status=200 if ok else 503, text="ok\n" if ok else "not ok\n")

    async def metrics_view(_: web.Request) -> web.Response:
        return web.Response(body=metrics.render(),
                            headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_: web.Request) -> web.Response:
        return await probe(healthy)

    async def readyz(_: web.Request) -> web.Response:
        return await probe(ready)

    app = web.Application()
    app.router.add_get("/metrics", metrics_view)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    log.info("metrics and probes on http://%s:%d (/metrics /healthz /readyz)", host, port)
    return runner
