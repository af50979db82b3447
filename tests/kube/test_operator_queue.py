"""JobQueues with the operator as a real process, a real kube-apiserver and a real etcd.

A JobQueue is created in etcd with its spec, follows spec changes, is deleted with
its resource; its status holds the counts ``Queues.counts()`` reads, never moves
backwards, and costs the operator no memory per item. Every wait is a condition
with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.errors import AttemptsExhaustedError, QueueNotFoundError
from joblease.keys import ItemRef, QueueRef
from joblease.queue import QueueCounts, Queues
from joblease.records import QueueSpec
from tests.support.controlplane import ControlPlane
from tests.support.etcd_keys import snapshot
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for
from tests.support.status_history import StatusWatch

pytestmark = pytest.mark.kube

#: The operator's refresh interval in these tests (the default is 5 s).
INTERVAL = 0.5
COUNTS = ("pending", "held", "completed", "failed", "total")
MIB = 1024 * 1024


class QueueOperator(OperatorProcess):
    def environment(self) -> dict[str, str]:
        return dict(super().environment(), JOBLEASE_QUEUE_INTERVAL=str(INTERVAL))

    def rss(self) -> int:
        """The operator process's resident set size in bytes (``/proc``)."""
        assert self.proc is not None and self.proc.poll() is None, "operator exited"
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        m = re.search(r"^VmRSS:\s+(\d+) kB$", text, re.M)
        assert m, text
        return int(m.group(1)) * 1024


@pytest.fixture
def kube(crds_installed: ControlPlane, namespace: str) -> Kube:
    return Kube(crds_installed, namespace)


@pytest.fixture
async def operator(crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
                   tmp_path: Path, request: pytest.FixtureRequest
                   ) -> AsyncIterator[QueueOperator]:
    op = QueueOperator(crds_installed, etcd_config, namespace, tmp_path / "operator.log")
    async with running_operator(op, request) as running:
        yield running


def jobqueue(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobQueue",
                       "metadata": {"name": name}, "spec": spec})


async def apply(kube: Kube, name: str, spec: dict[str, Any]) -> None:
    r = await kube.run("apply", "-f", "-", input=jobqueue(name, spec))
    assert r.returncode == 0, r.stderr


async def status(kube: Kube, name: str) -> dict[str, Any]:
    obj = await kube.get_object("jq", name)
    return dict((obj or {}).get("status") or {})


def conditions(s: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in s.get("conditions", [])}


async def counts_mirrored(kube: Kube, queues: Queues, q: QueueRef, *,
                          timeout: float = 30.0) -> tuple[dict[str, Any], QueueCounts]:
    """Wait until the status holds exactly the counts etcd has (read after the status,
    so with no change in flight the two are the same revision's counts)."""
    async def probe() -> tuple[dict[str, Any], QueueCounts] | None:
        s = await status(kube, q.name)
        try:
            counts = await queues.counts(q)
        except QueueNotFoundError:
            return None  # the operator has not created it yet
        if s and {k: s.get(k) for k in COUNTS} == {k: getattr(counts, k) for k in COUNTS}:
            assert s["etcdRevision"] <= counts.revision
            return s, counts
        return None
    return await wait_for(f"status of {q} equal to Queues.counts()", probe, timeout)


def metric(text: str, name: str, ns: str, queue: str) -> float | None:
    m = re.search(rf'^{name}{{namespace="{ns}",queue="{queue}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def never_backwards(served: list[dict[str, Any]]) -> list[str]:
    """Steps back in one JobQueue's served statuses, for a history without retries or
    spec changes in between: etcdRevision, completed, failed and total never decrease."""
    found, last = [], {}
    for n, s in enumerate(x for x in served if x):
        for field in ("etcdRevision", "completed", "failed", "total"):
            if field in s and s[field] < last.get(field, 0):
                found.append(f"#{n}: {field} {last[field]} -> {s[field]}")
            last[field] = max(last.get(field, 0), s.get(field, 0))
    return found


# ----------------------------------------------------------------------------- tests
async def test_a_jobqueue_is_created_followed_counted_and_deleted_in_etcd(
        kube: Kube, operator: QueueOperator, client: JobLeaseClient) -> None:
    q = QueueRef(kube.ns, "files")
    queues = Queues(client)
    watch = StatusWatch(kube.cp.kubeconfig, kube.ns, plural="jobqueues")
    try:
        await apply(kube, "files", {"leaseDurationSeconds": 5, "maxAttempts": 1})

        async def created() -> QueueSpec | None:
            try:
                return (await queues.spec(q, refresh=True))[1]
            except QueueNotFoundError:
                return None
        # the CRD's default historyLimit (3 tenures per item) reaches etcd
        assert await wait_for("queue in etcd", created) == QueueSpec(5, 1, history_limit=3)
        s = await wait_for("Registered and observed", lambda: _where(kube, "files", lambda s: (
            conditions(s).get("Registered") == "True" and s.get("observedGeneration") == 1)))
        assert {k: s[k] for k in COUNTS} == dict.fromkeys(COUNTS, 0)
        assert conditions(s) == {"Registered": "True", "Suspended": "False", "Idle": "True",
                                 "HasFailedItems": "False"}

        # Items through the library; claims and completions move the counts.
        await queues.enqueue(q, [(f"f{i}", {"n": i}) for i in range(6)])
        done = await queues.claim(ItemRef(q, "f0"), "worker-a")
        await done.complete({"ok": True})
        await queues.claim(ItemRef(q, "f1"), "worker-a")  # stays held
        gone = await queues.claim(ItemRef(q, "f2"), "worker-b")
        await gone.release()
        with pytest.raises(AttemptsExhaustedError):  # its one attempt is used: now failed
            await queues.claim(ItemRef(q, "f2"), "worker-b")
        s, counts = await counts_mirrored(kube, queues, q)
        assert (counts.pending, counts.held, counts.completed, counts.failed, counts.total) == (
            3, 1, 1, 1, 6)
        assert s["oldestPendingAgeSeconds"] >= 0 and s["completionsPerMinute"] >= 0
        assert conditions(s) == {"Registered": "True", "Suspended": "False", "Idle": "False",
                                 "HasFailedItems": "True"}
        text = await wait_for("queue gauges", lambda: _metrics_with(operator, kube.ns, 3.0))
        assert metric(text, "joblease_operator_queue_held_items", kube.ns, "files") == 1
        assert metric(text, "joblease_operator_queue_failed_items", kube.ns, "files") == 1
        assert metric(text, "joblease_operator_queue_oldest_pending_age_seconds", kube.ns,
                      "files") is not None

        # suspend toggled: etcd's spec follows, and the status says so.
        for suspend, generation in ((True, 2), (False, 3)):
            await apply(kube, "files", {"leaseDurationSeconds": 5, "maxAttempts": 1,
                                        "suspend": suspend})

            async def followed(want: bool = suspend) -> bool:
                return (await queues.spec(q, refresh=True))[1].suspend is want
            await wait_for(f"suspend {suspend} in etcd", followed)
            await wait_for(f"observedGeneration {generation}", lambda g=generation, w=suspend:
                           _where(kube, "files", lambda s: (
                               s.get("observedGeneration") == g
                               and conditions(s)["Suspended"] == str(w))))

        # delete: the finalizer waits until the queue's keys are gone.
        prefix = queues.keys(q).prefix
        r = await kube.run("delete", "jq", "files", "--wait=true", "--timeout=60s")
        assert r.returncode == 0, r.stderr
        assert await snapshot(client.store, prefix) == {}
        assert await kube.get_object("jq", "files") is None
        text = operator.metrics()
        assert metric(text, "joblease_operator_queue_pending_items", kube.ns, "files") is None
    finally:
        watch.stop()
    served = watch.served["files"]
    assert len([s for s in served if s]) >= 3, served
    assert never_backwards(served) == [], served


async def _where(kube: Kube, name: str, check: Any) -> dict[str, Any] | None:
    s = await status(kube, name)
    return s if s and check(s) else None


async def _metrics_with(operator: OperatorProcess, ns: str, pending: float) -> str | None:
    text = await asyncio.to_thread(operator.metrics)
    got = metric(text, "joblease_operator_queue_pending_items", ns, "files")
    return text if got == pending else None


async def test_a_sharded_jobqueue_has_its_items_from_creation(
        kube: Kube, operator: QueueOperator, client: JobLeaseClient) -> None:
    q = QueueRef(kube.ns, "indexed")
    queues = Queues(client)
    await apply(kube, "indexed", {"leaseDurationSeconds": 5, "shards": 4})
    s, counts = await counts_mirrored(kube, queues, q)
    assert (counts.total, counts.pending) == (4, 4) and s["observedGeneration"] == 1
    assert sorted(i.item.id for i in await queues.items(q)) == ["0", "1", "2", "3"]
    # An update of another field keeps the items (re-enqueueing the shards is a no-op).
    lease = await queues.claim(ItemRef(q, "2"), "worker")
    await lease.complete(None)
    await apply(kube, "indexed", {"leaseDurationSeconds": 9, "shards": 4})
    await wait_for("new TTL in etcd", lambda: _ttl_is(queues, q, 9))
    s, counts = await counts_mirrored(kube, queues, q)
    assert (counts.total, counts.completed, counts.pending) == (4, 1, 3)


async def test_finished_items_past_their_retention_are_pruned_and_semaphores_registered(
        kube: Kube, operator: QueueOperator, client: JobLeaseClient) -> None:
    """``ttlSecondsAfterFinished``: the operator deletes finished items past it
    (open ones stay); ``semaphores`` reach etcd's queue spec."""
    q = QueueRef(kube.ns, "kept")
    queues = Queues(client)
    await apply(kube, "kept", {"leaseDurationSeconds": 5, "ttlSecondsAfterFinished": 0,
                               "semaphores": [{"name": "db"}]})
    await wait_for("queue in etcd", lambda: _exists(queues, q))
    _, spec = await queues.spec(q, refresh=True)
    assert [(u.name, u.weight) for u in spec.semaphores] == [("db", 1)]
    await apply(kube, "kept", {"leaseDurationSeconds": 5, "ttlSecondsAfterFinished": 0})
    await wait_for("semaphores dropped in etcd", lambda: _no_semaphores(queues, q))
    await queues.enqueue(q, [("done", 1), ("open", 2)])
    lease = await queues.claim(ItemRef(q, "done"), "w")
    await lease.complete("ok")

    async def pruned() -> bool:
        return [s.item.id for s in await queues.items(q)] == ["open"]
    await wait_for("the finished item pruned", pruned)


async def _exists(queues: Queues, q: QueueRef) -> bool:
    try:
        await queues.spec(q, refresh=True)
    except QueueNotFoundError:
        return False
    return True


async def _no_semaphores(queues: Queues, q: QueueRef) -> bool:
    return not (await queues.spec(q, refresh=True))[1].semaphores


async def _ttl_is(queues: Queues, q: QueueRef, ttl: int) -> bool:
    return (await queues.spec(q, refresh=True))[1].lease_duration_seconds == ttl


async def test_an_old_status_is_not_overwritten_with_older_counts(
        kube: Kube, operator: QueueOperator, client: JobLeaseClient) -> None:
    """A status whose etcdRevision is ahead of etcd (as if written by a newer read) is
    left alone: the operator only applies counts read at a revision not older."""
    q = QueueRef(kube.ns, "files")
    queues = Queues(client)
    await apply(kube, "files", {"leaseDurationSeconds": 5})
    await wait_for("registered", lambda: _where(
        kube, "files", lambda s: conditions(s).get("Registered") == "True"))
    ahead = (await queues.counts(q)).revision + 1_000_000
    r = await kube.run("patch", "jq", "files", "--subresource=status", "--type=merge", "-p",
                       json.dumps({"status": {"etcdRevision": ahead, "total": 99}}))
    assert r.returncode == 0, r.stderr
    seen = _counter(await asyncio.to_thread(operator.metrics), "status_patches", "stale")
    await queues.enqueue(q, [("a", 1)])
    # Several refreshes with a change in etcd: each is refused as stale, none applied.
    await wait_for("stale refusals counted", lambda: _counter_reaches(
        operator, "status_patches", "stale", seen + 3))
    s = await status(kube, "files")
    assert (s["etcdRevision"], s["total"]) == (ahead, 99)


def _counter(text: str, name: str, result: str) -> float:
    m = re.search(rf'^joblease_operator_{name}_total{{result="{result}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else 0.0


async def _counter_reaches(operator: OperatorProcess, name: str, result: str,
                           at_least: float) -> bool:
    return _counter(await asyncio.to_thread(operator.metrics), name, result) >= at_least


async def refreshes(operator: OperatorProcess, n: int) -> None:
    """Until the operator has read queue counts ``n`` more times (a steady state)."""
    seen = _counter(await asyncio.to_thread(operator.metrics), "queue_refreshes", "ok")
    await wait_for(f"{n} queue refreshes", lambda: _counter_reaches(
        operator, "queue_refreshes", "ok", seen + n))


async def test_many_items_cost_the_operator_no_memory_and_are_counted_exactly(
        kube: Kube, operator: QueueOperator, client: JobLeaseClient) -> None:
    """100,000 items (about 35 s here, so in the default run): the operator's RSS
    stays within 20 MiB of its RSS with none, and the status counts equal etcd's.
    And so does a restarted operator's, with the items already there."""
    items = 100_000
    q = QueueRef(kube.ns, "big")
    queues = Queues(client)
    await apply(kube, "big", {"leaseDurationSeconds": 30})
    await wait_for("registered", lambda: _where(
        kube, "big", lambda s: conditions(s).get("Registered") == "True"), timeout=30)
    await refreshes(operator, 3)  # the steady state without items
    before = operator.rss()
    batch = 5_000
    for start in range(0, items, batch):
        await queues.enqueue(q, [(f"i{n:06d}", {"n": n})
                                 for n in range(start, min(items, start + batch))])
    leases = [await queues.claim_next(q, "worker") for _ in range(5)]
    for lease in leases[:3]:
        assert lease is not None
        await lease.complete(None)
    _, counts = await counts_mirrored(kube, queues, q, timeout=60)
    assert (counts.total, counts.completed, counts.held, counts.pending) == (
        items, 3, 2, items - 5)
    await refreshes(operator, 3)  # more refreshes at that size
    after = operator.rss()
    # A restart with the items there: its JobLease watch snapshot and kopf's resume read
    # etcd and the API afresh, and neither may read the items (JobLeaseClient.scan_jobs).
    operator.stop()
    operator.start()
    await operator.wait_ready()
    await refreshes(operator, 3)
    await counts_mirrored(kube, queues, q, timeout=60)
    restarted = operator.rss()
    print(f"operator RSS with 0 items {before / MIB:.1f} MiB, with {items} "
          f"{after / MIB:.1f} MiB ({(after - before) / MIB:+.1f} MiB), restarted with them "
          f"{restarted / MIB:.1f} MiB ({(restarted - before) / MIB:+.1f} MiB)")
    assert after - before < 20 * MIB, (before, after)
    assert restarted - before < 20 * MIB, (before, restarted)

