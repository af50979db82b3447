"""The mirror in this process, with faults injected around real components.

Real etcd, real kube-apiserver, the operator's own API client and mirror (no
kopf: jobs are registered directly with the client, which is what the
operator's handlers do). Faults are injected by wrapping: another writer
changes the object before a status write (a real 409 from the API server), or
the etcd store's watch breaks and its reads wait while the test changes etcd
through a second, unwrapped client.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.errors import StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.operator.kube import KubeApi, login
from joblease.operator.metrics import OperatorMetrics
from joblease.operator.mirror import CONFLICT_RETRIES, Mirror
from joblease.store import KeyValue, WatchBatch
from tests.support.controlplane import ControlPlane
from tests.support.mirror_fakes import settle
from tests.support.operator import Kube, wait_for
from tests.support.status_history import StatusWatch, regressions

pytestmark = pytest.mark.kube

SPEC = {"leaseDurationSeconds": 30, "maxAttempts": 3}
#: A finalizer of the test's, standing in for kopf's on a JobLease being deleted.
HOLD = "test.joblease.io/hold"


@pytest.fixture
def kubeconfig_env(crds_installed: ControlPlane) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(crds_installed.kubeconfig))
        yield


@contextlib.asynccontextmanager
async def running(mirror: Mirror) -> AsyncIterator[None]:
    task = asyncio.create_task(mirror.run())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await mirror.close()
        await mirror.kube.close()


class ContendedKube(KubeApi):
    """The real API client; before each of its first ``conflicts`` status writes
    another writer (kubectl, a real write) changes the object, so the API server
    answers the write with a real 409 Conflict."""

    def __init__(self, cp: ControlPlane, conflicts: int) -> None:
        super().__init__(login)
        self.cp, self.conflicts, self.writes = cp, conflicts, 0

    async def replace_status(self, obj: dict[str, Any], status: dict[str, Any]
                             ) -> dict[str, Any]:
        self.writes += 1
        if self.writes <= self.conflicts:
            meta = obj["metadata"]
            await asyncio.to_thread(
                self.cp.kubectl, "-n", meta["namespace"], "annotate", "--overwrite",
                "jl", meta["name"], f"test.joblease.io/bump={self.writes}", check=True)
        return await super().replace_status(obj, status)


async def test_a_status_write_that_keeps_conflicting_is_retried_not_dropped(
        crds_installed: ControlPlane, namespace: str, client: JobLeaseClient,
        kubeconfig_env: None) -> None:
    """The mirror in this process (no kopf: the job is registered directly) with the
    real API client; one more conflict than the mirror re-reads in a row."""
    kube = Kube(crds_installed, namespace)
    job = JobRef(namespace, "contended")
    await kube.apply("contended", SPEC)
    api = ContendedKube(crds_installed, conflicts=CONFLICT_RETRIES + 1)
    metrics = OperatorMetrics()
    mirror = Mirror(client, api, metrics, namespaces=(namespace,))
    async with running(mirror):
        revision = await client.register(job, JobSpec(30, max_attempts=3))
        s = await kube.status_where("contended", "Pending after the conflicts",
                                    lambda s: s.get("phase") == "Pending", timeout=60)
        assert s["etcdRevision"] >= revision
        assert api.writes > CONFLICT_RETRIES + 1
        assert metrics.status_patches.labels("contended")._value.get() >= 1
        # The job's newest state still follows (nothing was left behind).
        lease = await client.claim(job, "worker")
        s = await kube.status_where("contended", "Claimed",
                                    lambda s: s.get("phase") == "Claimed", timeout=30)
        assert s["fencingToken"] == lease.token
        await lease.release()


class BreakableStore:
    """The real etcd store; ``break_watch()`` ends the open watch with
    StoreUnavailableError and makes reads and new watches wait until ``heal()``."""

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        self._broken = asyncio.Event()
        self._healthy = asyncio.Event()
        self._healthy.set()
        self.failed_watches = 0

    def break_watch(self) -> None:
        self._healthy.clear()
        self._broken.set()

    def heal(self) -> None:
        self._broken.clear()
        self._healthy.set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: bytes, **kw: Any) -> tuple[int, list[KeyValue]]:
        await self._healthy.wait()
        return await self.inner.get(key, **kw)

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int
                    ) -> AsyncIterator[WatchBatch]:
        await self._healthy.wait()
        stream = self.inner.watch(key, prefix=prefix, start_revision=start_revision)
        it = stream.__aiter__()
        try:
            while True:
                nxt = asyncio.ensure_future(it.__anext__())
                broken = asyncio.ensure_future(self._broken.wait())
                done, _ = await asyncio.wait({nxt, broken},
                                             return_when=asyncio.FIRST_COMPLETED)
                broken.cancel()
                if nxt not in done:
                    nxt.cancel()
                    await asyncio.gather(nxt, return_exceptions=True)
                    self.failed_watches += 1
                    raise StoreUnavailableError("injected: the watch stream broke")
                try:
                    batch = nxt.result()
                except StopAsyncIteration:
                    return
                yield batch
        finally:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()


async def test_a_job_removed_while_the_watch_was_down_is_reported_not_registered(
        crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
        client: JobLeaseClient, kubeconfig_env: None) -> None:
    """A new watch's snapshot lists only the jobs that exist; the mirror must still
    notice the ones that vanished in the gap (issue 20, 16)."""
    kube = Kube(crds_installed, namespace)
    gone, kept = JobRef(namespace, "gone"), JobRef(namespace, "kept")
    for job in (gone, kept):
        await kube.apply(job.name, SPEC)
        await client.register(job, JobSpec(30, max_attempts=3))
    store = BreakableStore(EtcdStore(etcd_config))
    mirrored = JobLeaseClient(etcd_config, store=store)  # type: ignore[arg-type]
    mirror = Mirror(mirrored, KubeApi(login), OperatorMetrics(), namespaces=(namespace,))
    try:
        async with running(mirror):
            for job in (gone, kept):
                await kube.status_where(job.name, "Pending", lambda s: s["phase"] == "Pending")
            store.break_watch()

            async def broke() -> bool:
                return store.failed_watches > 0
            await wait_for("the mirror's watch to break", broke, timeout=10, interval=0.05)
            # While the mirror cannot read: one job goes, the other is claimed.
            await client.unregister(gone)
            lease = await client.claim(kept, "worker")
            store.heal()
            s = await kube.status_where("gone", "NotRegistered",
                                        lambda s: s["phase"] == "NotRegistered")
            assert {c["type"]: c["status"] for c in s["conditions"]}["Registered"] == "False"
            s = await kube.status_where("kept", "Claimed", lambda s: s["phase"] == "Claimed")
            assert s["fencingToken"] == lease.token
            await lease.release()
    finally:
        await mirrored.close()


async def test_a_completed_joblease_being_deleted_keeps_its_completed_status(
        crds_installed: ControlPlane, namespace: str, client: JobLeaseClient,
        kubeconfig_env: None) -> None:
    """Deleting a Completed JobLease: its finalizer (here the test, as kopf's handler
    does: unregister in etcd, then drop the finalizer) removes the etcd keys while
    the object still exists. The "not registered" state that follows is never
    written to it, so the last status watchers see is still the completion and the
    served history never steps back (tests/support/status_history.py)."""
    kube = Kube(crds_installed, namespace)
    job = JobRef(namespace, "finished")
    await kube.apply(job.name, SPEC)
    await kube.run("patch", "jl", job.name, "--type=merge", "-p",
                   json.dumps({"metadata": {"finalizers": [HOLD]}}))
    watch = StatusWatch(crds_installed.kubeconfig, namespace)
    mirror = Mirror(client, KubeApi(login), OperatorMetrics(), namespaces=(namespace,))
    try:
        async with running(mirror):
            await client.register(job, JobSpec(30, max_attempts=3))
            lease = await client.claim(job, "worker")
            await lease.complete({"rows": 3})
            done = await kube.status_where(job.name, "Completed",
                                           lambda s: s.get("phase") == "Completed")
            deleted = await kube.run("delete", "jl", job.name, "--wait=false")
            assert deleted.returncode == 0, deleted.stderr
            await client.unregister(job)

            async def settled() -> bool:
                """The mirror observed the unregistration and finished writing."""
                return (job not in mirror._previous and job not in mirror._pending
                        and job not in mirror._writers)
            await wait_for("the mirror to take the unregistration", settled, timeout=30,
                           interval=0.05)
            obj = await kube.get(job.name)
            assert obj is not None and obj["metadata"].get("deletionTimestamp")
            kept = {k: obj["status"].get(k) for k in ("phase", "generation", "attempts",
                                                      "etcdRevision", "fencingToken")}
            assert kept == {k: done.get(k) for k in kept}
    finally:
        await kube.run("patch", "jl", job.name, "--type=merge", "-p",
                       json.dumps({"metadata": {"finalizers": None}}))
        watch.stop()
    assert regressions(watch.snapshot()) == []


class HeldHistoryStore:
    """The real etcd store; reads at a past revision (the mirror's read of a
    job's recent tenures) wait until ``go`` is set, so a test decides when such
    a read's answer arrives."""

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        self.waiting, self.go = asyncio.Event(), asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: bytes, **kw: Any) -> tuple[int, list[KeyValue]]:
        if kw.get("revision"):
            self.waiting.set()
            await self.go.wait()
        return await self.inner.get(key, **kw)


async def test_a_late_read_of_older_tenures_never_replaces_newer_ones(
        crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
        client: JobLeaseClient, kubeconfig_env: None) -> None:
    """Two mirrors (an old and a new operator during a rollout): the old one's
    read of the recent tenures at the first claim's revision is answered only
    after the new one wrote the status of a later claim. The old write then
    meets a real 409, is re-decided on the fresh object and refused as stale:
    the status keeps the newer short form."""
    kube = Kube(crds_installed, namespace)
    job = JobRef(namespace, "rollout")
    await kube.apply(job.name, SPEC)
    await client.register(job, JobSpec(30, max_attempts=3, history_limit=10))
    first = await client.claim(job, "w1")
    old_state = await client.get(job)
    store = HeldHistoryStore(EtcdStore(etcd_config))
    slow_client = JobLeaseClient(etcd_config, store=store)  # type: ignore[arg-type]
    slow_metrics = OperatorMetrics()
    slow = Mirror(slow_client, KubeApi(login), slow_metrics, namespaces=(namespace,))
    fast = Mirror(client, KubeApi(login), OperatorMetrics(), namespaces=(namespace,))
    try:
        slow.offer(old_state, [])
        await asyncio.wait_for(store.waiting.wait(), 30)
        await first.release()
        second = await client.claim(job, "w2")
        fast.offer(await client.get(job), [])
        await settle(fast)
        newer = [(t["holder"], t["end"]) for t in (await kube.status(job.name))["recentTenures"]]
        assert newer == [("w2", "open"), ("w1", "released")]
        store.go.set()
        await settle(slow)
        s = await kube.status(job.name)
        assert [(t["holder"], t["end"]) for t in s["recentTenures"]] == newer
        assert s["fencingToken"] == second.token
        assert slow_metrics.status_patches.labels("conflict")._value.get() == 1
        assert slow_metrics.status_patches.labels("stale")._value.get() == 1
        await second.release()
    finally:
        for mirror in (slow, fast):
            await mirror.close()
            await mirror.kube.close()
        await slow_client.close()
