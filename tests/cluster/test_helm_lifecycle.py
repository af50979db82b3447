"""``helm uninstall`` and a later ``helm install`` behave as docs/helm.md says.

(``helm upgrade`` with a changed value is tests/cluster/test_chart_etcd.py's
``test_upgrade_keeps_the_certificates_and_the_registrations``: the operator rolls,
the certificates and the registration stay.)

Real pods on the session cluster: a release of this test's own with
``etcd.persistence.enabled=true`` (one member, its claim bound to a local volume
of the cluster), and "tools" pods of the project image that complete a job with
the real client (tests/support/claim_driver.py) and read etcd with the
``joblease`` CLI. What the docs promise, checked one by one: the uninstall
removes every object of the release (Deployment, ServiceAccount, RBAC, Services,
the etcd StatefulSet, PodDisruptionBudget and certificate Secrets) but the etcd
root password's Secret (kept: the etcd claim stays, with auth on), keeps the
CRD, every JobLease (with its status) and the etcd claim; while no operator
runs, deleting a JobLease hangs on its finalizer; a new install with the same
release name finds the job data again, with new certificates, and its operator
finishes the pending deletion.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.load import ClaimLoad, apply_jobleases, start_tools_pod, wait_registered
from tests.support.release import CHART, PERSISTENT_VALUES, TEST_CLUSTER_VALUES, Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

NAMESPACED_KINDS = ("deployments,statefulsets,replicasets,pods,services,serviceaccounts,"
                    "secrets,configmaps,poddisruptionbudgets,roles,rolebindings")
CLUSTER_KINDS = "clusterroles,clusterrolebindings"


def release_objects(rel: Release, kinds: str, namespaced: bool) -> list[str]:
    """The objects labelled as this release's (chart labels), ``kind/name``."""
    args = ["get", kinds, "-l", f"app.kubernetes.io/instance={rel.name}", "-o", "name"]
    if namespaced:
        args += ["-n", rel.namespace]
    result = rel.cluster.kubectl(*args)
    assert result.returncode == 0, result.stderr
    return sorted(result.stdout.split())


def etcd_job(rel: Release, pod: str, name: str) -> dict[str, Any]:
    """``joblease get`` (the CLI) in a tools pod: the job as etcd holds it."""
    out = rel.cluster.kubectl("exec", pod, "-n", rel.namespace, "--", "joblease", "get", name,
                              "-n", rel.namespace, "-o", "json", timeout=120)
    assert out.returncode == 0, (out.stdout, out.stderr)
    job: dict[str, Any] = json.loads(out.stdout)
    return job


def test_uninstall_keeps_crd_joblease_and_claims_and_a_reinstall_finds_the_jobs(
        release: Release, cluster: Cluster) -> None:
    rel = release
    rel.install(*PERSISTENT_VALUES)
    apply_jobleases(rel, ["done", "waiting"])
    tools = start_tools_pod(rel)  # meanwhile the operator registers them
    wait_registered(rel, ["done", "waiting"])
    load = ClaimLoad(rel, tools, ["done"], releases=0)
    (final,) = load.wait_done()
    (completion,) = load.acknowledged("complete")
    token = completion["token"]
    wait_until(lambda: rel.get("joblease", "done").get("status", {}).get("phase") == "Completed",
               timeout=120, what="done Completed", interval=0.5)
    before = rel.get("joblease", "done")["status"]
    assert before["fencingToken"] == token and final["result_token"] == token
    ca_before = rel.get("secret", f"{rel.etcd}-server-tls")["data"]["ca.crt"]
    claim = rel.get("pvc", f"data-{rel.etcd}-0")
    rel.kubectl("delete", "pod", tools, "--wait=false")
    installed = release_objects(rel, NAMESPACED_KINDS, True)
    for expected in (f"deployment.apps/{rel.fullname}", f"statefulset.apps/{rel.etcd}",
                     f"serviceaccount/{rel.fullname}", f"secret/{rel.etcd}-server-tls",
                     f"secret/{rel.etcd}-client", f"poddisruptionbudget.policy/{rel.etcd}"):
        assert expected in installed, installed
    assert release_objects(rel, CLUSTER_KINDS, False)

    rel.helm("uninstall", rel.name, "--wait", "--timeout", "300s")

    # every object of the release is gone, cluster-scoped ones too, but the etcd root
    # password (helm.sh/resource-policy: keep: the kept etcd has auth on with it) ...
    root_secret = f"secret/{rel.etcd}-root"
    assert root_secret in installed, installed
    root_before = rel.get("secret", f"{rel.etcd}-root")["data"]["password"]
    wait_until(lambda: release_objects(rel, NAMESPACED_KINDS, True) == [root_secret],
               timeout=180, what="the release's objects deleted but its root Secret",
               interval=1)
    assert release_objects(rel, CLUSTER_KINDS, False) == []
    # ... but the CRD, the JobLeases with their status, and the etcd claim stay
    assert cluster.kubectl("get", "crd", "jobleases.joblease.io").returncode == 0
    assert rel.get("joblease", "done")["status"] == before
    assert rel.get("joblease", "waiting")["status"]["phase"] == "Pending"
    kept = rel.get("pvc", f"data-{rel.etcd}-0")
    assert kept["metadata"]["uid"] == claim["metadata"]["uid"]
    assert kept["status"]["phase"] == "Bound"
    # no operator: a deletion waits on the finalizer (kubectl gives up, the object stays)
    hung = rel.cluster.kubectl("delete", "joblease", "waiting", "-n", rel.namespace,
                               "--timeout=5s", timeout=60)
    assert hung.returncode != 0 and "timed out" in hung.stderr, (hung.stdout, hung.stderr)
    waiting = rel.get("joblease", "waiting")
    assert waiting["metadata"]["deletionTimestamp"]
    assert "joblease.io/finalizer" in waiting["metadata"]["finalizers"]

    # a new install with the same name: new certificates, the same job data
    rel.helm("install", rel.name, str(CHART), *TEST_CLUSTER_VALUES, *PERSISTENT_VALUES)
    tools = start_tools_pod(rel, "tools-again")  # starts while etcd and the operator do
    rel.wait_ready()
    assert rel.get("secret", f"{rel.etcd}-server-tls")["data"]["ca.crt"] != ca_before
    # the same root password: the new operator authenticates to the kept etcd with it
    assert rel.get("secret", f"{rel.etcd}-root")["data"]["password"] == root_before
    assert rel.get("pvc", f"data-{rel.etcd}-0")["metadata"]["uid"] == claim["metadata"]["uid"]
    # the new operator finishes the deletion that was waiting (keys, then finalizer) ...
    gone = rel.cluster.kubectl("wait", "--for=delete", "joblease/waiting", "-n", rel.namespace,
                               "--timeout=300s", timeout=330)
    assert gone.returncode == 0, f"{gone.stderr}\n{rel.diagnostics()}"
    # ... and etcd still has the completed job, with the token of its completion (a fresh
    # etcd would not have it: the operator would register it anew, Pending)
    job = etcd_job(rel, tools, "done")
    assert (job["phase"], job["token"], job["generation"]) == (
        "Completed", token, completion["generation"]), job
    status = rel.get("joblease", "done")["status"]
    assert (status["phase"], status["fencingToken"]) == ("Completed", token), status
