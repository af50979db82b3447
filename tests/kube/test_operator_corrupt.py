"""One job's bad etcd data, or a job etcd does not know, against the real operator.

Real etcd, real kube-apiserver, the operator as a real process (the helpers of
``test_operator``). Tenants may write anything under their own etcd prefix, so
an undecodable value is input: it must be reported for that one job (status
phase ``Corrupt`` with a ``Corrupt`` condition, a Warning Event, a metric) while
every other job, in every namespace, keeps being mirrored, also after a restart
with the bad value still in etcd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.store import Delete, Put
from tests.support.controlplane import ControlPlane
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for

pytestmark = pytest.mark.kube

SPEC = {"leaseDurationSeconds": 30, "maxAttempts": 3}


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status.get("conditions") or []}


def corrupt(status: dict[str, Any]) -> bool:
    c = conditions(status).get("Corrupt", {})
    return status.get("phase") == "Corrupt" and c.get("status") == "True"


def metric(text: str, name: str) -> float:
    values = [float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(name + " ") or line.startswith(name + "{")]
    return sum(values)


@pytest.fixture
def second_namespace(crds_installed: ControlPlane, namespace: str) -> str:
    """A second fresh namespace whose name starts with the first one's."""
    name = f"{namespace}-b"
    crds_installed.kubectl("create", "namespace", name, check=True)
    return name


@pytest.fixture
async def two_namespace_operator(crds_installed: ControlPlane, namespace: str,
                                 second_namespace: str, etcd_config: EtcdConfig,
                                 tmp_path: Path, request: pytest.FixtureRequest
                                 ) -> AsyncIterator[OperatorProcess]:
    """The operator serving both namespaces (one glob: ``<first>*``)."""
    op = OperatorProcess(crds_installed, etcd_config, f"{namespace}*", tmp_path / "operator.log")
    async with running_operator(op, request) as running:
        yield running


async def test_one_jobs_undecodable_records_do_not_stop_the_operator_for_other_jobs(
        crds_installed: ControlPlane, namespace: str, second_namespace: str,
        two_namespace_operator: OperatorProcess, client: JobLeaseClient) -> None:
    op = two_namespace_operator
    a, b = Kube(crds_installed, namespace), Kube(crds_installed, second_namespace)
    jobs = {(a, "good"): JobRef(namespace, "good"), (a, "bad-result"): JobRef(namespace,
                                                                             "bad-result"),
            (b, "good"): JobRef(second_namespace, "good"),
            (b, "bad-holder"): JobRef(second_namespace, "bad-holder")}
    for kube, name in jobs:
        await kube.apply(name, SPEC)
    for (kube, name), job in jobs.items():
        async def registered(job: JobRef = job) -> bool:
            return (await client.get(job)).registered
        await wait_for(f"{job} registered", registered)
        await kube.status_where(name, "Pending", lambda s: s["phase"] == "Pending")

    # A tenant writes garbage under its own jobs' prefixes: a non-JSON result in one
    # namespace, a holder of the wrong shape in the other.
    bad_result, bad_holder = jobs[(a, "bad-result")], jobs[(b, "bad-holder")]
    await client.store.txn([], [Put(client.keys.job(bad_result).result, b"{not json")], [])
    await client.store.txn(
        [], [Put(client.keys.job(bad_holder).holder, b'{"owner": 42, "claimId": []}')], [])

    # The other jobs keep being mirrored, in both namespaces.
    good_a = await client.claim(jobs[(a, "good")], "worker-a")
    good_b = await client.claim(jobs[(b, "good")], "worker-b")
    for kube, lease in ((a, good_a), (b, good_b)):
        s = await kube.status_where("good", "Claimed", lambda s: s["phase"] == "Claimed")
        assert s["fencingToken"] == lease.token and s["holderIdentity"] == lease.owner

    # The bad ones say what is wrong, in their status and in a Warning Event.
    s = await a.status_where("bad-result", "Corrupt", corrupt)
    assert "result" in conditions(s)["Corrupt"]["message"]
    assert conditions(s)["Completed"]["status"] == "Unknown"
    s = await b.status_where("bad-holder", "Corrupt", corrupt)
    assert "holder" in conditions(s)["Corrupt"]["message"]
    assert conditions(s)["Registered"]["status"] == "True"
    for kube, name in ((a, "bad-result"), (b, "bad-holder")):
        async def warned(kube: Kube = kube, name: str = name) -> bool:
            return "Corrupt" in await kube.event_reasons(name)
        await wait_for(f"Corrupt event for {name}", warned)
    assert metric(op.metrics(), "joblease_operator_corrupt_records_total") >= 2

    # A key whose job name no JobLease can have is skipped: "good?x" must not be
    # mirrored into the JobLease "good" (the URL's query would cut the name there).
    fake_spec = b'{"leaseDurationSeconds": 30, "maxAttempts": 3}'
    await client.store.txn([], [Put(client.keys.namespace_prefix(namespace) + b"good?x/spec",
                                    fake_spec)], [])

    async def skipped() -> bool:
        return metric(op.metrics(),
                      'joblease_operator_mirror_errors_total{stage="invalid_name"}') >= 1
    await wait_for("the invalid job name to be skipped", skipped)
    s = await a.status("good")
    assert s["phase"] == "Claimed" and s["fencingToken"] == good_a.token
    assert metric(op.metrics(), 'joblease_operator_jobs{phase="Corrupt"}') == 2

    # A restart with the bad values still in etcd: the operator stays up and serves.
    op.stop()
    op.start()
    await op.wait_ready()
    await good_a.complete({"rows": 1})
    await good_b.release()
    await a.status_where("good", "Completed", lambda s: s["phase"] == "Completed")
    await b.status_where("good", "Pending after release", lambda s: (
        s["phase"] == "Pending" and s["holderIdentity"] == ""))
    assert corrupt(await a.status("bad-result")) and corrupt(await b.status("bad-holder"))
    assert op.proc is not None and op.proc.poll() is None, "the operator exited"
    assert op.probe("/healthz") == 200 and op.starts == 2

    # Removing the bad value brings the job back to what etcd says.
    await client.store.txn([], [Delete(client.keys.job(bad_result).result)], [])
    s = await a.status_where("bad-result", "Pending again", lambda s: s["phase"] == "Pending")
    assert conditions(s)["Corrupt"]["status"] == "False"


async def test_a_joblease_etcd_does_not_know_is_not_registered_not_pending(
        crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig,
        tmp_path: Path, client: JobLeaseClient) -> None:
    kube = Kube(crds_installed, namespace)
    op = OperatorProcess(crds_installed, etcd_config, namespace, tmp_path / "operator.log")
    op.start()
    try:
        await op.wait_ready()
        job = JobRef(namespace, "orphan")
        await kube.apply("orphan", SPEC)
        await kube.status_where("orphan", "Pending", lambda s: s["phase"] == "Pending")
        await client.unregister(job)  # out of band: the keys go, the resource stays
        s = await kube.status_where("orphan", "NotRegistered",
                                    lambda s: s["phase"] == "NotRegistered")
        c = conditions(s)
        assert (c["Registered"]["status"], c["Registered"]["reason"]) == ("False",
                                                                          "NotRegistered")
        assert (c["Claimed"]["status"], c["Claimed"]["reason"]) == ("False", "NotRegistered")
        assert c["Failed"]["status"] == "False"
    except BaseException:
        print(op.log_tail())
        raise
    finally:
        op.stop()
