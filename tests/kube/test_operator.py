"""The operator as a real process against a real kube-apiserver and a real etcd.

etcd is the source of truth; each JobLease's status must follow it, may lag,
and must never move backwards. Every wait is a condition with a deadline.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, StaleTokenError
from joblease.errors import NotRegisteredError
from joblease.lease import LeaseState
from joblease.records import Tenure, TenureEnd
from tests.support.controlplane import ControlPlane
from tests.support.operator import (
    Kube,
    OperatorProcess,
    joblease,
    running_operator,
    wait_for,
)
from tests.support.status_history import StatusWatch, regressions
from tests.support.waiting import claim_when_free

pytestmark = pytest.mark.kube
T = TypeVar("T")


@pytest.fixture
def kube(crds_installed: ControlPlane, namespace: str) -> Kube:
    return Kube(crds_installed, namespace)


@pytest.fixture
async def operator(crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
                   tmp_path: Path, request: pytest.FixtureRequest
                   ) -> AsyncIterator[OperatorProcess]:
    op = OperatorProcess(crds_installed, etcd_config, namespace, tmp_path / "operator.log")
    async with running_operator(op, request) as running:
        yield running


def stat(status: dict[str, Any], *keys: str) -> tuple[Any, ...]:
    return tuple(status.get(k) for k in keys)


# ----------------------------------------------------------------------------- tests
async def test_claim_and_completion_are_mirrored_into_status(
        kube: Kube, operator: OperatorProcess, client: JobLeaseClient) -> None:
    job = JobRef(kube.ns, "report")
    await kube.apply("report", {"leaseDurationSeconds": 6, "maxAttempts": 3,
                                "parameters": {"day": "2025-01-01"}})

    async def registered() -> bool:
        return (await client.get(job)).registered
    await wait_for("registration in etcd", registered)
    await kube.status_where("report", "Pending and observed", lambda s: (
        s["phase"] == "Pending" and s.get("observedGeneration") == 1))

    # A spec change is registered again and observed under the new generation.
    await kube.apply("report", {"leaseDurationSeconds": 7, "maxAttempts": 3,
                                "parameters": {"day": "2025-01-02"}})

    async def reregistered() -> bool:
        spec = (await client.get(job)).spec
        return spec is not None and spec.lease_duration_seconds == 7
    await wait_for("new spec in etcd", reregistered)
    await kube.status_where("report", "observedGeneration 2",
                            lambda s: s.get("observedGeneration") == 2)

    lease = await client.claim(job, "worker-a")
    claimed_at = time.monotonic()
    s = await kube.status_where("report", "Claimed by worker-a",
                                lambda s: s["phase"] == "Claimed", timeout=15)
    lag = time.monotonic() - claimed_at
    assert stat(s, "holderIdentity", "generation", "fencingToken") == (
        "worker-a", lease.generation, lease.token)
    assert s["attempts"] == 1 and "leaseExpiryTime" in s

    await lease.complete({"rows": 42})
    s = await kube.status_where("report", "Completed", lambda s: s["phase"] == "Completed")
    assert s["result"] == {"rows": 42} and s["resultTruncated"] is False
    assert s["fencingToken"] == lease.token and s["holderIdentity"] == ""
    conds = {c["type"]: c["status"] for c in s["conditions"]}
    assert conds == {"Registered": "True", "Claimed": "False", "Completed": "True",
                     "Failed": "False", "Corrupt": "False"}
    await wait_for("Claimed and Completed events",
                   lambda: _reasons(kube, "report", {"Claimed", "Completed"}))
    assert "joblease_operator_watch_events_total" in operator.metrics()
    assert operator.probe("/healthz") == 200 and operator.probe("/readyz") == 200
    print(f"status lag claim->visible via kubectl polling: {lag:.3f}s")
    lag_line = [line for line in operator.metrics().splitlines()
                if line.startswith("joblease_operator_status_lag_seconds_")]
    print("\n".join(lag_line))


async def _reasons(kube: Kube, name: str, wanted: set[str]) -> list[str] | None:
    reasons = await kube.event_reasons(name)
    return reasons if wanted <= set(reasons) else None


async def test_expired_holder_shows_pending_then_failed_when_attempts_run_out(
        kube: Kube, operator: OperatorProcess, etcd_config: EtcdConfig,
        client: JobLeaseClient) -> None:
    job = JobRef(kube.ns, "flaky")
    await kube.apply("flaky", {"leaseDurationSeconds": 2, "maxAttempts": 2})
    await kube.status_where("flaky", "Pending", lambda s: s["phase"] == "Pending")

    for attempt in (1, 2):
        async with JobLeaseClient(etcd_config) as worker:
            lease = await worker.claim(job, f"worker-{attempt}")
            await kube.status_where("flaky", f"claim {attempt}", lambda s, t=lease.token: (
                s.get("fencingToken") == t and s["phase"] == "Claimed"))
            await worker.close(revoke=False)  # the worker dies: no keep-alive, no release
        if attempt == 1:
            s = await kube.status_where("flaky", "Pending again after expiry", lambda s: (
                s["phase"] == "Pending" and s["attempts"] == 1), timeout=20)
            assert s["holderIdentity"] == ""
    s = await kube.status_where("flaky", "Failed", lambda s: s["phase"] == "Failed",
                                timeout=20)
    assert s["attempts"] == 2 and s["generation"] == 2
    assert {c["type"]: c["status"] for c in s["conditions"]}["Failed"] == "True"
    assert (await client.get(job)).phase.value == "Failed"
    await wait_for("Expired and Failed events",
                   lambda: _reasons(kube, "flaky", {"Claimed", "Expired", "Failed"}))
    # Two claims, one Claimed Event with count 2 (event_recorder aggregates repeats;
    # the second claim's PATCH may come up to 2 s after its status).
    await wait_for("one Claimed Event counting both claims",
                   lambda: _counts(kube, "flaky", "Claimed", [2]), timeout=15)


async def _counts(kube: Kube, name: str, reason: str, wanted: list[int]) -> list[int] | None:
    r = await kube.run("get", "events", "-o", "json", "--field-selector",
                       f"involvedObject.name={name},reason={reason}")
    counts = [e.get("count") for e in json.loads(r.stdout)["items"]] if r.returncode == 0 else []
    return counts if counts == wanted else None


CLAIMER = """
import asyncio, json, sys
from joblease import JobLeaseClient, JobRef, JobLeaseError
async def main():
    async with JobLeaseClient() as c:
        lease = await c.claim(JobRef(sys.argv[1], sys.argv[2]), "worker-a")
        print(json.dumps({"token": lease.token, "generation": lease.generation}), flush=True)
        await asyncio.to_thread(sys.stdin.readline)
        try:
            await lease.complete({"by": "a"})
            print(json.dumps({"completed": True}), flush=True)
        except JobLeaseError as e:
            print(json.dumps(e.to_dict()), flush=True)
asyncio.run(main())
"""


async def test_seed_example_paused_holder_is_replaced_and_its_late_completion_rejected(
        kube: Kube, operator: OperatorProcess, etcd_config: EtcdConfig,
        client: JobLeaseClient) -> None:
    job = JobRef(kube.ns, "seed")
    await kube.apply("seed", {"leaseDurationSeconds": 2, "maxAttempts": 5})
    await kube.status_where("seed", "Pending", lambda s: s["phase"] == "Pending")
    env = dict(os.environ, JOBLEASE_ETCD_ENDPOINTS=",".join(etcd_config.endpoints),
               JOBLEASE_ROOT=etcd_config.root)
    a = await asyncio.create_subprocess_exec(
        sys.executable, "-c", CLAIMER, job.namespace, job.name, env=env,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    assert a.stdout is not None and a.stdin is not None
    try:
        a_claim = json.loads(await asyncio.wait_for(a.stdout.readline(), 30))
        await kube.status_where("seed", "A holds", lambda s: s.get("fencingToken") == a_claim[
            "token"])
        a.send_signal(signal.SIGSTOP)  # A pauses beyond its lease

        b = await claim_when_free(client, job, "worker-b", timeout=20, interval=0.2)
        assert b.token > a_claim["token"] and b.generation == a_claim["generation"] + 1
        await kube.status_where("seed", "B holds with the larger token", lambda s: (
            stat(s, "holderIdentity", "fencingToken", "generation") == (
                "worker-b", b.token, b.generation)))

        a.send_signal(signal.SIGCONT)  # A resumes and tries to complete
        a.stdin.write(b"complete\n")
        await a.stdin.drain()
        a_outcome = json.loads(await asyncio.wait_for(a.stdout.readline(), 30))
        assert a_outcome["error"] == "stale", a_outcome
        assert a_outcome["currentToken"] == b.token
        with pytest.raises(StaleTokenError):
            await client.lease_for(job, "worker-a", a_claim["token"])  # from elsewhere too
    finally:
        if a.returncode is None:
            a.send_signal(signal.SIGCONT)
            a.kill()
        await a.wait()
    s = await kube.status(job.name)
    assert stat(s, "holderIdentity", "fencingToken") == ("worker-b", b.token)
    await b.complete({"by": "b"})
    s = await kube.status_where("seed", "Completed by B", lambda s: s["phase"] == "Completed")
    assert s["fencingToken"] == b.token and s["result"] == {"by": "b"}


async def test_status_converges_after_operator_is_killed_mid_run_and_never_regresses(
        kube: Kube, operator: OperatorProcess, client: JobLeaseClient) -> None:
    """The operator is SIGKILLed twice mid-run: every status converges to etcd and
    never regresses, and each job's tenure history (which the operator never
    writes) is whole after the restarts."""
    names = [f"busy-{i}" for i in range(3)]  # claimed and released over and over
    finished = [f"done-{i}" for i in range(4)]  # completed one by one during the kills
    for name in names + finished:
        await kube.apply(name, {"leaseDurationSeconds": 5, "maxAttempts": 0})
    for name in names + finished:
        await kube.status_where(name, "Pending", lambda s: s["phase"] == "Pending")
    watch = StatusWatch(kube.cp.kubeconfig, kube.ns)
    stop = asyncio.Event()
    rounds = 0

    async def workload() -> None:
        nonlocal rounds
        while not stop.is_set():
            for name in names:
                lease = await client.claim(JobRef(kube.ns, name), f"w{rounds}")
                await lease.release()
            if rounds % 5 == 0 and rounds // 5 < len(finished):
                name = finished[rounds // 5]
                lease = await client.claim(JobRef(kube.ns, name), f"w{rounds}")
                await lease.complete({"name": name})
            rounds += 1
            await asyncio.sleep(0.05)

    async def mirrored_more(since: int) -> bool:
        """The running operator wrote statuses of the workload's claims after ``since``
        (a count of the watch's events): a few per busy JobLease."""
        return watch.events >= since + 2 * len(names)

    async def claims_more(since: int) -> bool:
        return rounds >= since + 3

    work = asyncio.create_task(workload())
    try:
        for _ in range(2):
            await wait_for("the operator to mirror the workload",
                           lambda n=watch.events: mirrored_more(n), 60)
            operator.kill()  # SIGKILL mid-run
            await wait_for("claims while no operator runs", lambda n=rounds: claims_more(n))
            operator.start()
            await operator.wait_ready()
        await wait_for("the restarted operator to mirror the workload",
                       lambda n=watch.events: mirrored_more(n), 60)
    finally:
        stop.set()
        await work
    for name in names:  # completions continue too
        lease = await client.claim(JobRef(kube.ns, name), "finisher")
        await lease.complete({"name": name})
    for name in finished[(rounds + 4) // 5:]:  # the workload was too quick for these
        lease = await client.claim(JobRef(kube.ns, name), "late")
        await lease.complete({"name": name})
    try:
        for name in names + finished:
            truth = await client.get(JobRef(kube.ns, name))
            s = await kube.status_where(name, "converged to etcd", lambda s, t=truth: (
                s["phase"] == "Completed" and s["generation"] == t.generation
                and s["fencingToken"] == t.token and s["etcdRevision"] >= t.mod_revision))
            assert s["result"] == {"name": name}
            # the tenure history (the CRD's default historyLimit, 10) survived the
            # operator's kills and restarts: the last ten claims, none missing
            history = await client.history(JobRef(kube.ns, name))
            assert [t.generation for t in history.tenures] == list(
                range(max(1, truth.generation - 9), truth.generation + 1))
            assert [t.end for t in history.tenures] == [
                *[TenureEnd.RELEASED] * (len(history.tenures) - 1), TenureEnd.COMPLETED]
            assert history.tenures[-1].token == truth.token

            async def watched(t: Any = truth, n: str = name) -> bool:
                last = watch.last(n)
                return last.get("phase") == "Completed" and last.get("fencingToken") == t.token
            await wait_for(f"the watch to see {name} Completed", watched)
    finally:
        watch.stop()
    assert not watch.gaps, watch.gaps
    assert regressions(watch.snapshot()) == [], regressions(watch.snapshot())


async def test_delete_while_held_removes_etcd_keys_and_holder_learns_it_lost(
        kube: Kube, operator: OperatorProcess, client: JobLeaseClient) -> None:
    job = JobRef(kube.ns, "doomed")
    await kube.apply("doomed", {"leaseDurationSeconds": 3})
    await kube.status_where("doomed", "Pending", lambda s: s["phase"] == "Pending")
    obj = await kube.get("doomed")
    assert obj is not None and "joblease.io/finalizer" in obj["metadata"]["finalizers"]
    lease = await client.claim(job, "holder")
    r = await kube.run("delete", "jl", "doomed", "--wait=false")
    assert r.returncode == 0, r.stderr

    async def unregistered() -> bool:
        return not (await client.get(job)).registered
    await wait_for("etcd keys removed", unregistered)
    assert await asyncio.wait_for(lease.wait_done(), timeout=10) is LeaseState.LOST
    assert "deleted" in (lease.lost_reason or "")

    async def gone() -> bool:
        return await kube.get("doomed") is None
    await wait_for("finalizer released and object gone", gone)
    with pytest.raises(NotRegisteredError):
        await client.claim(job, "late")


INVALID = [
    ({"leaseDurationSeconds": 1}, "greater than or equal to 2"),
    ({"maxAttempts": 2}, "spec.leaseDurationSeconds: Required value"),
    ({"leaseDurationSeconds": 10, "maxAttempts": -1}, "greater than or equal to 0"),
]


async def test_invalid_joblease_is_refused_by_the_server_with_a_clear_message(
        kube: Kube) -> None:
    for spec, message in INVALID:
        r = await kube.run("apply", "-f", "-", input=joblease("bad", spec))
        assert r.returncode != 0 and message in r.stderr, (spec, r.stderr)
        assert await kube.get("bad") is None


def _short(tenure: Tenure) -> tuple[Any, ...]:
    """What ``status.recentTenures`` says of a tenure of ``joblease history``."""
    return (tenure.generation, tenure.token, tenure.owner, tenure.end.value,
            tenure.refused_completions)


def _recent(status: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(t["generation"], t["token"], t["holder"], t["end"], t["refusedCompletions"])
            for t in status.get("recentTenures") or []]


async def test_status_shows_the_recent_tenures_of_the_seed_as_the_history_tells_them(
        kube: Kube, operator: OperatorProcess, etcd_config: EtcdConfig,
        client: JobLeaseClient) -> None:
    """The seed in the order of docs/history.md: A claims and stops renewing
    (its client closes without revoking: no keep-alive reaches etcd), B claims
    once etcd expired A's lease and completes, then A's late completion is
    refused. That refusal changes only the history (outside the job's prefix):
    the status still follows it. The short form is the history's own reading
    (``JobLeaseClient.history``), newest first, with A's Expired Warning Event
    naming its generation, token and holder."""
    job = JobRef(kube.ns, "story")
    await kube.apply("story", {"leaseDurationSeconds": 2, "maxAttempts": 3})
    await kube.status_where("story", "Pending, no tenure yet", lambda s: (
        s["phase"] == "Pending" and s.get("recentTenures") == []))
    async with JobLeaseClient(etcd_config) as worker_a:
        a = await worker_a.claim(job, "worker-a")
        s = await kube.status_where("story", "A open", lambda s: _recent(s) == [
            (1, a.token, "worker-a", "open", 0)])
        await worker_a.close(revoke=False)  # A stalls: nothing renews its lease
    b = await claim_when_free(client, job, "worker-b", timeout=20, interval=0.2)
    await b.complete({"rows": 1})
    await kube.status_where("story", "Completed", lambda s: s["phase"] == "Completed")
    with pytest.raises(StaleTokenError):
        await client.complete_for(job, "worker-a", a.token, {"rows": 1})
    history = await client.history(job)
    assert [_short(t) for t in history.tenures] == [
        (1, a.token, "worker-a", "expired", 1), (2, b.token, "worker-b", "completed", 0)]
    s = await kube.status_where("story", "A expired with its refusal counted", lambda s: (
        _recent(s) == [_short(t) for t in reversed(history.tenures)]))
    a_line, b_line = s["recentTenures"][1], s["recentTenures"][0]
    assert "endedAt" not in a_line and a_line["claimedAt"] and b_line["endedAt"]
    r = await kube.run("get", "jl", "story", "-o", "yaml")
    assert r.returncode == 0, r.stderr
    assert "recentTenures:" in r.stdout and "refusedCompletions: 1" in r.stdout

    async def expired_event() -> dict[str, Any] | None:
        return next((e for e in await kube.events("story") if e["reason"] == "Expired"), None)
    event = await wait_for("A's Expired Event", expired_event)
    assert event["type"] == "Warning"
    assert f"holder worker-a (generation 1, token {a.token}) lost the job" in event["message"]


async def test_a_release_is_a_normal_released_event_and_no_history_keeps_no_short_form(
        kube: Kube, operator: OperatorProcess, client: JobLeaseClient) -> None:
    """With a history, the history tells a release from an expiry: a Normal
    ``Released`` Event, no ``Expired`` Warning. With ``historyLimit: 0`` there is
    nothing to tell them apart by (etcd's watch shows the holder key deleted
    either way): ``status.recentTenures`` is absent and the Event stays the
    ``Expired`` Warning that says it may have been a release."""
    kept, plain = JobRef(kube.ns, "kept"), JobRef(kube.ns, "plain")
    await kube.apply("kept", {"leaseDurationSeconds": 30})
    await kube.apply("plain", {"leaseDurationSeconds": 30, "historyLimit": 0})
    for name in ("kept", "plain"):
        await kube.status_where(name, "Pending", lambda s: s["phase"] == "Pending")
    for job in (kept, plain):
        lease = await client.claim(job, "worker")
        await kube.status_where(job.name, "Claimed", lambda s: s["phase"] == "Claimed")
        await lease.release()
        await kube.status_where(job.name, "Pending again", lambda s: (
            s["phase"] == "Pending" and s["attempts"] == 1))
    s = await kube.status_where("kept", "released in the short form", lambda s: (
        [t["end"] for t in s.get("recentTenures") or []] == ["released"]))
    assert s["recentTenures"][0]["holder"] == "worker"
    assert "recentTenures" not in await kube.status("plain")

    async def released() -> list[dict[str, Any]] | None:
        events = await kube.events("kept")
        return events if any(e["reason"] == "Released" for e in events) else None
    events = await wait_for("a Released Event", released)
    assert [e["type"] for e in events if e["reason"] == "Released"] == ["Normal"]
    assert "Expired" not in [e["reason"] for e in events]
    await wait_for("the Expired Event of the job without history",
                   lambda: _reasons(kube, "plain", {"Claimed", "Expired"}))
