"""The sidecar's image in the example worker pod completes its JobLease.

The pod is the Job of ``examples/worker-pod.yaml`` (via tests/support/worker_pods.py),
whose sidecar is the Go sidecar's image (``ghcr.io/joblease/joblease-sidecar:0.1.0``,
built by ``hack/build-images sidecar`` from sidecar-go/), run by its entrypoint with
no arguments. Its environment (etcd over TLS with the release's client Secret, token
file, on-loss, on-final, probes, security context, limits) is the example's,
unmodified; the test checks that. The worker waits for a hold file (``hold=True``, the worker's
environment only) so the sidecar's memory can be read while it holds.

Everything is real: the test cluster's node (kubelet, containerd, runc), the chart's
operator and bundled etcd (the shared ``joblease_release``), the curl worker. The
memory working set (cgroup v1 ``memory.usage_in_bytes - total_inactive_file``, as
the kubelet reports it) is printed, not asserted: it is a measurement
(docs/benchmarks.md, "In a pod on the test cluster").
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest

from tests.support.cluster import Cluster, container_cgroup
from tests.support.pods import etcd_state, job_condition, pod_logs
from tests.support.release import Release
from tests.support.waiting import wait_until
from tests.support.worker_pods import (
    SIDECAR,
    WORKER,
    container_id,
    example_docs,
    finish_work,
    joblease,
    owner_of,
    wait_log,
    wait_status,
    worker_job,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

GO_IMAGE = "ghcr.io/joblease/joblease-sidecar:0.1.0"
NAME = "go-report"
MIB = 1024 * 1024


def _go_job(ns: str) -> str:
    """The example Job (claiming ``NAME``); asserts its sidecar container is the
    example's, with the Go sidecar's image and no arguments."""
    doc = json.loads(worker_job(ns, NAME, NAME, hold=True))
    job = doc["items"][1]
    (sidecar,) = job["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["image"] == GO_IMAGE and "args" not in sidecar
    (example,) = copy.deepcopy(example_docs()["Job"]["spec"]["template"]["spec"]
                               ["initContainers"])
    for e in example["env"]:
        if e["name"] == "JOBLEASE_JOB_NAME":
            e["value"] = NAME  # the one name that differs: this test's JobLease
    assert sidecar == example
    return json.dumps(doc)


def _memory(cluster: Cluster, pod: dict[str, Any]) -> dict[str, float]:
    """The sidecar container's memory cgroup (v1), MiB: usage, working set, RSS."""
    cg = container_cgroup(cluster, container_id(pod, SIDECAR), "memory")
    usage = int((cg / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
    inactive = int(stat.get("total_inactive_file", 0))
    return {"usage": usage / MIB, "working_set": max(0, usage - inactive) / MIB,
            "rss": int(stat.get("total_rss", 0)) / MIB}


@pytest.mark.node  # reads the sidecar container's memory cgroup on the node
def test_the_example_job_with_the_go_sidecar_image_completes_its_joblease(
        cluster: Cluster, joblease_release: Release, worker_namespace: str) -> None:
    ns = worker_namespace
    cluster.apply(joblease(ns, NAME, ttl=30, max_attempts=3))
    wait_status(cluster, ns, NAME, "registration",
                lambda s: s.get("phase") == "Pending" and int(s.get("etcdRevision") or 0) > 0)
    cluster.apply(_go_job(ns))

    def the_pod() -> dict[str, Any] | None:
        pods = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", f"job-name={NAME}",
                                          "-o", "json", check=True).stdout)["items"]
        return pods[0] if pods else None
    pod = wait_until(the_pod, timeout=120, interval=0.5, what="the Job's pod")
    pod_name = pod["metadata"]["name"]
    wait_log(cluster, ns, pod_name, WORKER, "holding the lease with token")
    pod = cluster.pod(pod_name, ns)
    assert pod is not None
    owner = owner_of(pod)
    (status,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == SIDECAR]
    assert status["image"] == GO_IMAGE, status  # the sidecar's own image runs
    held = wait_status(cluster, ns, NAME, "the pod's claim",
                       lambda s: s.get("holderIdentity") == owner)

    # Settle after the claim (as bench/e2e.py: 5 s) so start-up allocations are done;
    # a measurement pause, not a synchronisation.
    time.sleep(5)
    mem = _memory(cluster, pod)
    print(f"\nGo sidecar container while holding: usage {mem['usage']:.1f} MiB, "
          f"working set {mem['working_set']:.1f} MiB, rss {mem['rss']:.1f} MiB")

    finish_work(cluster, ns, pod_name)
    done = wait_status(cluster, ns, NAME, "completion", lambda s: s.get("phase") == "Completed")
    token = done["fencingToken"]
    assert token == held["fencingToken"] and done["result"] == {"items": 3}, done
    assert wait_until(lambda: job_condition(cluster, ns, NAME), timeout=240, interval=0.5,
                      what="the Job Complete or Failed") == "Complete"
    state = etcd_state(joblease_release, ns, NAME)
    assert state is not None and state["phase"] == "Completed", state
    assert state["result"]["owner"] == owner and state["result"]["token"] == token, state
    worker_log = pod_logs(cluster, ns, pod_name, WORKER)
    assert f"holding the lease with token {token}" in worker_log, worker_log
    assert "complete -> 200" in worker_log, worker_log
    sidecar_log = pod_logs(cluster, ns, pod_name, SIDECAR)
    assert '"msg":"job completed"' in sidecar_log, sidecar_log
