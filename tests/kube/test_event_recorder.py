"""Repeated Events are aggregated with ``count``, against a real kube-apiserver.

Real: kube-apiserver (and its etcd), the operator's API client (``KubeApi``) with
the admin kubeconfig, the recorder the mirror uses, a JobLease created with
kubectl (the Events' involved object). The recorder's monotonic clock is injected
where a test needs the aggregation window to pass without waiting ten minutes.
The operator process itself writes aggregated Events in
tests/kube/test_operator.py (a job claimed twice: one Claimed Event, count 2).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest

from joblease.operator.event_recorder import EventRecorder
from joblease.operator.events import JobEvent
from joblease.operator.kube import KubeApi, login
from joblease.operator.metrics import OperatorMetrics
from tests.support.controlplane import ControlPlane
from tests.support.operator import joblease

pytestmark = pytest.mark.kube


def claimed(token: int) -> JobEvent:
    return JobEvent("Normal", "Claimed", f"claimed by w: generation {token}, fencing token "
                                         f"{token}")


def expired(token: int) -> JobEvent:
    return JobEvent("Warning", "Expired", f"holder w (token {token}) vanished")


class Cluster:
    """kubectl for one namespace, in a thread."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.ns = cp, namespace

    async def kubectl(self, *args: str, stdin: str | None = None) -> str:
        r = await asyncio.to_thread(self.cp.kubectl, "-n", self.ns, *args, input=stdin)
        assert r.returncode == 0, r.stderr
        return r.stdout

    async def joblease(self, name: str) -> dict[str, Any]:
        await self.kubectl("apply", "-f", "-", stdin=joblease(
            name, {"leaseDurationSeconds": 10, "maxAttempts": 100}))
        obj: dict[str, Any] = json.loads(await self.kubectl("get", "jl", name, "-o", "json"))
        return obj

    async def events(self, obj: dict[str, Any]) -> list[dict[str, Any]]:
        """Every Event of ``obj`` (by uid), by reason then name."""
        items: list[dict[str, Any]] = json.loads(await self.kubectl(
            "get", "events", "-o", "json", "--field-selector",
            f"involvedObject.uid={obj['metadata']['uid']}"))["items"]
        return sorted(items, key=lambda e: (e["reason"], e["metadata"]["name"]))


@pytest.fixture
async def cluster(crds_installed: ControlPlane, namespace: str,
                  monkeypatch: pytest.MonkeyPatch) -> Cluster:
    monkeypatch.setenv("KUBECONFIG", str(crds_installed.kubeconfig))
    return Cluster(crds_installed, namespace)


@pytest.fixture
async def api() -> AsyncIterator[KubeApi]:
    kube = KubeApi(login)
    try:
        yield kube
    finally:
        await kube.close()


def writes(metrics: OperatorMetrics) -> dict[str, float]:
    return {verb: metrics.event_writes.labels(verb)._value.get()
            for verb in ("create", "patch", "failed")}


async def test_a_job_claimed_repeatedly_has_one_event_with_count_n(
        cluster: Cluster, api: KubeApi) -> None:
    obj = await cluster.joblease("retried")
    metrics = OperatorMetrics()
    recorder = EventRecorder(api, metrics, instance="test", patch_interval=0.05)
    for token in range(1, 4):  # spaced out: each repeat is its own PATCH
        recorder.record(obj, claimed(token))
        await recorder.wait()
    for token in range(4, 11):  # a burst: joins one write (the count is not lost)
        recorder.record(obj, claimed(token))
    await recorder.wait()
    (event,) = await cluster.events(obj)
    assert (event["reason"], event["type"], event["count"]) == ("Claimed", "Normal", 10)
    assert event["message"] == claimed(10).message  # the latest occurrence's
    assert event["involvedObject"]["name"] == "retried"
    assert event["firstTimestamp"] <= event["lastTimestamp"]
    w = writes(metrics)
    assert w["create"] == 1 and w["failed"] == 0
    assert 3 <= w["patch"] < 9  # 2 spaced repeats + the burst in fewer writes than 7


async def test_different_reasons_and_objects_stay_separate_events(
        cluster: Cluster, api: KubeApi) -> None:
    first, second = await cluster.joblease("first"), await cluster.joblease("second")
    recorder = EventRecorder(api, OperatorMetrics(), instance="test", patch_interval=0)
    for token in (1, 2, 3):
        recorder.record(first, claimed(token))
        recorder.record(first, expired(token))
    recorder.record(second, claimed(9))
    await recorder.wait()
    assert [(e["reason"], e["count"]) for e in await cluster.events(first)] == [
        ("Claimed", 3), ("Expired", 3)]
    assert [(e["reason"], e["count"]) for e in await cluster.events(second)] == [
        ("Claimed", 1)]


async def test_a_deleted_event_is_created_again_with_the_count_so_far(
        cluster: Cluster, api: KubeApi) -> None:
    obj = await cluster.joblease("pruned")
    metrics = OperatorMetrics()
    recorder = EventRecorder(api, metrics, instance="test", patch_interval=0)
    recorder.record(obj, claimed(1))
    await recorder.wait()
    (gone,) = await cluster.events(obj)
    await cluster.kubectl("delete", "event", gone["metadata"]["name"])
    recorder.record(obj, claimed(2))  # its PATCH finds nothing: 404 -> create
    await recorder.wait()
    (event,) = await cluster.events(obj)
    assert event["metadata"]["name"] != gone["metadata"]["name"]
    assert (event["count"], event["message"]) == (2, claimed(2).message)
    assert writes(metrics) == {"create": 2, "patch": 0, "failed": 0}
    recorder.record(obj, claimed(3))  # and the new Event is the one patched from now on
    await recorder.wait()
    assert [(e["metadata"]["name"], e["count"]) for e in await cluster.events(obj)] == [
        (event["metadata"]["name"], 3)]


async def test_a_repeat_after_the_window_starts_a_new_event(
        cluster: Cluster, api: KubeApi) -> None:
    obj = await cluster.joblease("rare")
    now = [1000.0]
    recorder = EventRecorder(api, OperatorMetrics(), instance="test", window=600,
                             patch_interval=0, clock=lambda: now[0])
    recorder.record(obj, claimed(1))
    await recorder.wait()
    now[0] += 599  # within the window of the previous occurrence
    recorder.record(obj, claimed(2))
    await recorder.wait()
    now[0] += 601
    recorder.record(obj, claimed(3))
    await recorder.wait()
    assert sorted((e["count"], e["message"]) for e in await cluster.events(obj)) == [
        (1, claimed(3).message), (2, claimed(2).message)]


async def test_the_cache_is_bounded_and_an_evicted_series_starts_a_new_event(
        cluster: Cluster, api: KubeApi) -> None:
    """Memory stays fixed whatever the number of JobLeases: the least recently used
    series goes, and its next occurrence is a new Event (never a PATCH of an Event
    the recorder no longer knows, and never a lost occurrence)."""
    objs = [await cluster.joblease(f"many-{i}") for i in range(3)]
    recorder = EventRecorder(api, OperatorMetrics(), instance="test", capacity=2,
                             patch_interval=0)
    for obj in objs:
        recorder.record(obj, claimed(1))
        await recorder.wait()
        assert len(recorder) <= 2
    recorder.record(objs[0], claimed(2))  # many-0 was evicted by many-2
    recorder.record(objs[2], claimed(2))  # many-2 is still cached: a PATCH
    await recorder.wait()
    assert len(recorder) == 2
    assert sorted(e["count"] for e in await cluster.events(objs[0])) == [1, 1]
    assert [e["count"] for e in await cluster.events(objs[2])] == [2]
