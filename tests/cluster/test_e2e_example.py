"""``kubectl apply -f examples/worker-pod.yaml``, unmodified, works the first time.

The file goes into namespace ``default`` exactly as a user would apply it, after
``helm install`` of the chart as docs/helm.md says (the shared ``joblease_release``:
release ``joblease`` in ``joblease-system``, whose bundled etcd is the
``joblease-etcd.joblease-system.svc`` the example names; ``default`` is labelled
``joblease.io/inject=enabled``, so the operator gives it the tenant Secret the
example mounts: the chart's defaults, etcd auth on). Its image references are the
ones imported into the node (``hack/build-images``); nothing is pulled. Real pods,
operator and etcd.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.support.cluster import Cluster
from tests.support.pods import (
    EXAMPLE,
    etcd_state,
    example_docs,
    job_condition,
    pod_logs,
    wait_phase,
)
from tests.support.release import Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

NS = "default"


def test_example_worker_job_completes_and_the_joblease_shows_the_pods_claim(
        cluster: Cluster, joblease_release: Release) -> None:
    docs = example_docs()
    name = docs["JobLease"]["metadata"]["name"]
    assert name == docs["Job"]["metadata"]["name"] == "nightly-report"
    try:
        began = time.monotonic()
        applied = cluster.kubectl("apply", "-n", NS, "-f", str(EXAMPLE))
        assert applied.returncode == 0, applied.stderr
        status = wait_phase(cluster, NS, name, "Completed", timeout=300)
        print(f"\nkubectl apply -> JobLease Completed: {time.monotonic() - began:.1f}s")
        outcome = wait_until(lambda: job_condition(cluster, NS, name), timeout=240,
                             interval=0.5, what="the Job Complete or Failed")
        assert outcome == "Complete"

        pods = json.loads(cluster.kubectl("get", "pods", "-n", NS, "-l", f"job-name={name}",
                                          "-o", "json", check=True).stdout)["items"]
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        (pod,) = pods
        assert pod["status"]["phase"] == "Succeeded"
        pod_name = pod["metadata"]["name"]
        owner = f"{pod_name}/{pod['metadata']['uid']}"  # the sidecar's POD_NAME/POD_UID

        # the JobLease as `kubectl get jl` prints it, and its status
        table = cluster.kubectl("get", "jl", name, "-n", NS, check=True).stdout
        header, row = table.splitlines()
        assert header.split()[:7] == ["NAME", "PHASE", "HOLDER", "COMPLETED", "BY",
                                      "GENERATION", "TOKEN"], table
        token = status["fencingToken"]
        # no holder any more (an empty column), completed by the pod
        assert row.split()[:5] == [name, "Completed", owner, "1", str(token)], table
        assert status["completedBy"] == owner and status["holderIdentity"] == "", status
        assert status["generation"] == 1 and status["attempts"] == 1, status
        assert status["result"] == {"items": 3}, status
        (completed,) = [c for c in status["conditions"] if c["type"] == "Completed"]
        assert completed["status"] == "True", completed
        assert completed["message"] == (f"completed by {owner} with token {token} "
                                        "(generation 1)"), completed

        # etcd holds the same completion, by the pod's sidecar, under the pod's token
        state = etcd_state(joblease_release, NS, name)
        assert state is not None and state["phase"] == "Completed", state
        assert state["result"]["owner"] == owner and state["result"]["token"] == token, state
        worker_log = pod_logs(cluster, NS, pod_name, "worker")
        assert f"holding the lease with token {token}" in worker_log, worker_log
        assert "complete -> 200" in worker_log, worker_log
    finally:
        cluster.kubectl("delete", "-n", NS, "-f", str(EXAMPLE), "--wait=true",
                        "--timeout=120s", timeout=180)
