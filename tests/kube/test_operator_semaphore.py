"""JobSemaphores with the operator as a real process, a real kube-apiserver and a real etcd.

A JobSemaphore is created in etcd with its limit, follows limit changes, is deleted
with its resource (every key of it: spec, slots, waiters); its status holds the
holders, live slots and waiters ``Semaphores.status()`` reads, never moves
backwards, and its gauges follow; its Events (``SlotGranted``, ``Saturated``,
``HasRoom``) are aggregated with a count. Claims go through the library, as workers'
would. Every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.errors import SemaphoreNotFoundError
from joblease.keys import SemaphoreRef
from joblease.lease import Lease
from joblease.records import SemaphoreUse
from joblease.semaphore import Semaphores, SemaphoreStatus
from tests.support.controlplane import ControlPlane
from tests.support.etcd_keys import snapshot
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for
from tests.support.status_history import StatusWatch

pytestmark = pytest.mark.kube

#: The operator's refresh interval in these tests (the default is 5 s).
INTERVAL = 0.5


class SemaphoreOperator(OperatorProcess):
    def environment(self) -> dict[str, str]:
        return dict(super().environment(), JOBLEASE_QUEUE_INTERVAL=str(INTERVAL))


@pytest.fixture
def kube(crds_installed: ControlPlane, namespace: str) -> Kube:
    return Kube(crds_installed, namespace)


@pytest.fixture
async def operator(crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
                   tmp_path: Path, request: pytest.FixtureRequest
                   ) -> AsyncIterator[SemaphoreOperator]:
    op = SemaphoreOperator(crds_installed, etcd_config, namespace, tmp_path / "operator.log")
    async with running_operator(op, request) as running:
        yield running


async def apply(kube: Kube, name: str, limit: int) -> None:
    doc = json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobSemaphore",
                      "metadata": {"name": name}, "spec": {"limit": limit}})
    r = await kube.run("apply", "-f", "-", input=doc)
    assert r.returncode == 0, r.stderr


async def status(kube: Kube, name: str) -> dict[str, Any]:
    obj = await kube.get_object("jsem", name)
    return dict((obj or {}).get("status") or {})


def conditions(s: dict[str, Any]) -> dict[str, str]:
    return {c["type"]: c["status"] for c in s.get("conditions", [])}


def expected(state: SemaphoreStatus) -> dict[str, Any]:
    return {"limit": state.limit, "live": state.live, "waiters": state.waiters,
            "holders": [{"slot": h.index, "holder": h.holder, "owner": h.owner,
                         "token": h.token} for h in state.holders]}


async def mirrored(kube: Kube, sems: Semaphores, ref: SemaphoreRef, *, live: int,
                   waiters: int, timeout: float = 30.0) -> tuple[dict[str, Any], SemaphoreStatus]:
    """Wait until the status holds exactly what etcd has (read after the status, so
    with no change in flight the two are the same revision's state), with ``live``
    slots and ``waiters`` waiting."""
    async def probe() -> tuple[dict[str, Any], SemaphoreStatus] | None:
        s = await status(kube, ref.name)
        try:
            state = await sems.status(ref)
        except SemaphoreNotFoundError:
            return None  # the operator has not created it yet
        if (state.live, state.waiters) != (live, waiters):
            return None
        if s and {k: s.get(k) for k in ("limit", "live", "waiters", "holders")} == expected(
                state):
            assert s["etcdRevision"] <= state.revision
            return s, state
        return None
    return await wait_for(f"status of {ref}: {live} live, {waiters} waiting", probe, timeout)


def metric(text: str, name: str, ns: str, sem: str) -> float | None:
    m = re.search(rf'^{name}{{namespace="{ns}",semaphore="{sem}"}} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


async def gauges(operator: OperatorProcess, ns: str, sem: str, want: tuple[float, ...]
                 ) -> tuple[float | None, ...]:
    async def probe() -> tuple[float | None, ...] | None:
        text = await asyncio.to_thread(operator.metrics)
        got = tuple(metric(text, f"joblease_operator_semaphore_{n}", ns, sem)
                    for n in ("limit", "live_slots", "waiters"))
        return got if got == want else None
    return await wait_for(f"semaphore gauges {want}", probe)


async def test_a_jobsemaphore_is_created_mirrored_followed_and_deleted_in_etcd(
        kube: Kube, operator: SemaphoreOperator, client: JobLeaseClient) -> None:
    ref = SemaphoreRef(kube.ns, "db")
    sems = Semaphores(client)
    watch = StatusWatch(kube.cp.kubeconfig, kube.ns, plural="jobsemaphores")
    leases: list[Lease] = []
    waiting: asyncio.Task[Lease] | None = None
    try:
        await apply(kube, "db", 2)

        async def limit_is(want: int) -> bool:
            try:
                return (await sems.status(ref)).limit == want
            except SemaphoreNotFoundError:
                return False
        await wait_for("semaphore in etcd with limit 2", lambda: limit_is(2))
        s, _ = await mirrored(kube, sems, ref, live=0, waiters=0)
        assert s["observedGeneration"] == 1 and s["holders"] == []
        assert conditions(s) == {"Registered": "True", "Saturated": "False"}

        # Claims through the library take the slots; a third waits in line.
        jobs = [JobRef(kube.ns, f"uses-db-{i}") for i in range(3)]
        for job in jobs:
            await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=3,
                                               semaphores=(SemaphoreUse("db", 1),)))
        leases = [await client.claim(job, f"worker-{i}") for i, job in enumerate(jobs[:2])]
        waiting = asyncio.create_task(client.claim_waiting(jobs[2], "worker-2", wait=60))
        s, state = await mirrored(kube, sems, ref, live=2, waiters=1)
        assert sorted(h["holder"] for h in s["holders"]) == sorted(
            h.holder for h in state.holders) and len(s["holders"]) == 2
        assert {h["owner"] for h in s["holders"]} == {"worker-0", "worker-1"}
        assert {h["token"] for h in s["holders"]} == {
            lease.slots[0].token for lease in leases}
        assert conditions(s) == {"Registered": "True", "Saturated": "True"}
        assert await gauges(operator, kube.ns, "db", (2.0, 2.0, 1.0))

        # Limit raised: etcd follows, the waiter gets in at once.
        await apply(kube, "db", 3)
        await wait_for("limit 3 in etcd", lambda: limit_is(3))
        leases.append(await asyncio.wait_for(waiting, 30))
        waiting = None
        s, _ = await mirrored(kube, sems, ref, live=3, waiters=0)
        assert s["limit"] == 3 and conditions(s)["Saturated"] == "True"
        await wait_for("observedGeneration 2", lambda: _where(
            kube, "db", lambda s: s.get("observedGeneration") == 2))
        assert await gauges(operator, kube.ns, "db", (3.0, 3.0, 0.0))

        # A release frees its slot: the status follows.
        await leases.pop(0).release()
        s, _ = await mirrored(kube, sems, ref, live=2, waiters=0)
        assert conditions(s)["Saturated"] == "False"

        # Events: one SlotGranted series for the three grants (each seen in some
        # status: mirrored() waited for each), showing the latest; saturation and
        # room again (a status read between the limit's raise and the waiter's grant
        # may add one of each more).
        last = leases[-1].slots[0].token
        sem_events = await wait_for("the semaphore's Events", lambda: _events_where(
            kube, "db", lambda e: e.get("SlotGranted", {}).get("count") == 3
            and "HasRoom" in e))
        granted = sem_events["SlotGranted"]
        assert granted["type"] == "Normal" and granted["involvedObject"]["kind"] == "JobSemaphore"
        assert f"owner worker-2, token {last})" in granted["message"], granted["message"]
        assert sem_events["Saturated"]["count"] >= 1 and sem_events["HasRoom"]["count"] >= 1
        assert set(sem_events) == {"SlotGranted", "Saturated", "HasRoom"}, sem_events

        # delete: the finalizer waits until every key of the semaphore is gone.
        prefix = sems.keys(ref).prefix
        r = await kube.run("delete", "jsem", "db", "--wait=true", "--timeout=60s")
        assert r.returncode == 0, r.stderr
        assert await snapshot(client.store, prefix) == {}
        assert await kube.get_object("jsem", "db") is None
        text = operator.metrics()
        for name in ("limit", "live_slots", "waiters"):
            assert metric(text, f"joblease_operator_semaphore_{name}", kube.ns, "db") is None
    finally:
        watch.stop()
        if waiting is not None:
            waiting.cancel()
            await asyncio.gather(waiting, return_exceptions=True)
        await asyncio.gather(*(lease.release() for lease in leases), return_exceptions=True)
    served = [x for x in watch.served["db"] if x]
    assert len(served) >= 3, served
    revisions = [x["etcdRevision"] for x in served]
    assert revisions == sorted(revisions), revisions


async def _events_where(kube: Kube, name: str, check: Any) -> dict[str, Any] | None:
    """The JobSemaphore's Events by reason (one series each), once ``check`` holds."""
    obj = await kube.get_object("jsem", name)
    assert obj is not None
    r = await kube.run("get", "events", "-o", "json", "--field-selector",
                       f"involvedObject.uid={obj['metadata']['uid']}")
    assert r.returncode == 0, r.stderr
    by_reason: dict[str, dict[str, Any]] = {}
    for e in json.loads(r.stdout)["items"]:
        assert e["reason"] not in by_reason, f"two {e['reason']} Events, not one with a count"
        by_reason[e["reason"]] = e
    return by_reason if check(by_reason) else None


async def _where(kube: Kube, name: str, check: Any) -> dict[str, Any] | None:
    s = await status(kube, name)
    return s if s and check(s) else None
