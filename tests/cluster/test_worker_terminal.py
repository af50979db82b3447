"""Worker Jobs in terminal cases end with an outcome the Job controller understands.

Real pods on the session cluster, against the shared release (its operator
registers each JobLease in its bundled etcd and mirrors etcd into the status;
tests/cluster/conftest.py ``joblease_release``): worker Jobs and pods built
from ``examples/worker-pod.yaml`` (tests/support/worker_pods.py; per test
only the names, and for the held cases a hold file the worker waits for, so
a loss lands mid-work, and ``backoffLimit: 0``, one pod to look at). Each
terminal state is reached the way users reach it, through pods: a Job that
completes the JobLease, a holder pod deleted with no attempts left, the
JobLease deleted under a holder. Every wait has a deadline: a hang fails the
test.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.worker_pods import (
    SIDECAR,
    WORKER,
    describe,
    joblease,
    start_holder,
    wait_log,
    wait_status,
    worker_job,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

#: generous: the machine is loaded; a hang is "still running after this"
JOB_DEADLINE = 240.0


def _register(cluster: Cluster, ns: str, name: str, *, ttl: int, max_attempts: int) -> None:
    cluster.apply(joblease(ns, name, ttl=ttl, max_attempts=max_attempts))
    wait_status(cluster, ns, name, "registration",
                lambda s: s.get("phase") == "Pending" and int(s.get("etcdRevision") or 0) > 0)


def _wait_job(cluster: Cluster, namespace: str, name: str) -> str:
    """``Complete`` or ``Failed`` within the deadline; a hang fails the test."""
    deadline = time.monotonic() + JOB_DEADLINE
    while time.monotonic() < deadline:
        r = cluster.kubectl("get", "job", name, "-n", namespace, "-o", "json", timeout=30)
        if r.returncode == 0:
            for c in json.loads(r.stdout).get("status", {}).get("conditions", []):
                if c["type"] in ("Complete", "Failed") and c["status"] == "True":
                    return str(c["type"])
        time.sleep(1)  # poll interval; the deadline bounds the wait
    raise AssertionError(f"job {name} neither Complete nor Failed after {JOB_DEADLINE}s "
                         f"(it hangs):\n{describe(cluster, namespace, f'job-name={name}')}")


def _pods(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={job}", "-o", "json",
                        check=True)
    items: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return items


def _worker_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == WORKER]
    terminated: dict[str, Any] = status["state"]["terminated"]
    return terminated


def _logs(cluster: Cluster, ns: str, pod: dict[str, Any], container: str) -> str:
    return cluster.kubectl("logs", pod["metadata"]["name"], "-n", ns, "-c", container,
                           check=True).stdout


def _events(cluster: Cluster, ns: str, name: str) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "events", "-n", ns, "-o", "json", "--field-selector",
                        f"involvedObject.kind=JobLease,involvedObject.name={name}", check=True)
    items: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return items


def test_completed_joblease_job_succeeds_without_the_work(cluster: Cluster,
                                                          worker_namespace: str) -> None:
    ns, name = worker_namespace, "done-report"
    _register(cluster, ns, name, ttl=10, max_attempts=0)
    # a first Job does the work and completes the JobLease
    cluster.apply(worker_job(ns, f"{name}-first", name))
    assert _wait_job(cluster, ns, f"{name}-first") == "Complete"
    done = wait_status(cluster, ns, name, "Completed", lambda s: s.get("phase") == "Completed")
    (first,) = _pods(cluster, ns, f"{name}-first")
    assert done["result"] == {"items": 3}, done
    # a Job started afterwards ends Succeeded, doing nothing
    cluster.apply(worker_job(ns, name, name))
    assert _wait_job(cluster, ns, name) == "Complete", describe(cluster, ns, f"job-name={name}")
    (pod,) = _pods(cluster, ns, name)
    assert pod["status"]["phase"] == "Succeeded"
    assert _worker_status(pod)["exitCode"] == 0
    worker_log = _logs(cluster, ns, pod, WORKER)
    assert "already completed: nothing to do" in worker_log, worker_log
    assert "work item" not in worker_log and "holding the lease" not in worker_log
    assert "job already completed; nothing to do" in _logs(cluster, ns, pod, SIDECAR)
    # the earlier completion stands, untouched: same token, same generation
    status = wait_status(cluster, ns, name, "Completed", lambda s: s.get("phase") == "Completed")
    assert status["fencingToken"] == done["fencingToken"], (status, done)
    assert status["generation"] == done["generation"] == 1, status
    assert f"holding the lease with token {done['fencingToken']}" in _logs(
        cluster, ns, first, WORKER)


def test_exhausted_joblease_job_fails_with_the_reason(cluster: Cluster,
                                                      worker_namespace: str) -> None:
    ns, name = worker_namespace, "spent-report"
    _register(cluster, ns, name, ttl=10, max_attempts=1)
    # the only attempt: a pod claims, is deleted mid-work, releases on SIGTERM
    start_holder(cluster, ns, name, "only-attempt")
    cluster.kubectl("delete", "pod", "only-attempt", "-n", ns, "--wait=false", check=True)
    failed_status = wait_status(cluster, ns, name, "Failed", lambda s: s.get("phase") == "Failed")
    assert failed_status["attempts"] == 1 and failed_status["holderIdentity"] == ""
    cluster.apply(worker_job(ns, name, name))
    assert _wait_job(cluster, ns, name) == "Failed", describe(cluster, ns, f"job-name={name}")
    pods = _pods(cluster, ns, name)
    # podFailurePolicy: exit 6 fails the Job at once, no retry pod
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    (pod,) = pods
    assert pod["status"]["phase"] == "Failed"
    terminated = _worker_status(pod)
    assert terminated["exitCode"] == 6, terminated
    # the reason is the worker's termination message, so kubectl describe shows it
    assert "the job cannot run: exhausted" in terminated.get("message", ""), terminated
    assert "has used 1 of 1 attempts" in terminated["message"]
    describe_pod = cluster.kubectl("describe", "pod", pod["metadata"]["name"], "-n", ns,
                                   check=True).stdout
    assert "has used 1 of 1 attempts" in describe_pod, describe_pod
    assert "job has no attempts left" in _logs(cluster, ns, pod, SIDECAR)
    job = json.loads(cluster.kubectl("get", "job", name, "-n", ns, "-o", "json",
                                     check=True).stdout)
    failed = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["reason"] == "PodFailurePolicy", failed
    # the JobLease says why too: a Warning Event from the operator, and its status
    events = [e for e in _events(cluster, ns, name) if e["reason"] == "Failed"]
    assert events and events[0]["type"] == "Warning", _events(cluster, ns, name)
    assert "all 1 attempts used without a result" in events[0]["message"], events
    status = wait_status(cluster, ns, name, "Failed", lambda s: s.get("phase") == "Failed")
    assert status["generation"] == 1 and status["holderIdentity"] == "", status
    cond = {c["type"]: c for c in status["conditions"]}
    assert cond["Failed"]["status"] == "True", cond


def test_lease_lost_mid_work_stops_the_worker_and_fails_the_pod(cluster: Cluster,
                                                                worker_namespace: str) -> None:
    ns, name = worker_namespace, "lost-report"
    _register(cluster, ns, name, ttl=4, max_attempts=0)
    cluster.apply(worker_job(ns, name, name, hold=True, backoff_limit=0))
    (pod,) = _wait_pods(cluster, ns, name)
    wait_log(cluster, ns, pod["metadata"]["name"], WORKER, "work item 3", JOB_DEADLINE)
    # the JobLease is deleted: the operator's finalizer unregisters the job in etcd,
    # from under the holder
    cluster.kubectl("delete", "joblease", name, "-n", ns, "--wait=false", check=True)
    assert _wait_job(cluster, ns, name) == "Failed", describe(cluster, ns, f"job-name={name}")
    (pod,) = _pods(cluster, ns, name)
    assert pod["status"]["phase"] == "Failed"
    terminated = _worker_status(pod)
    assert terminated["exitCode"] == 143, terminated  # SIGTERM from the sidecar
    worker_log = _logs(cluster, ns, pod, WORKER)
    assert "complete ->" not in worker_log, worker_log  # stopped before any completion
    sidecar_log = _logs(cluster, ns, pod, SIDECAR)
    assert "lease lost" in sidecar_log and "sent SIGTERM to the worker" in sidecar_log, \
        sidecar_log


def _wait_pods(cluster: Cluster, ns: str, job: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + JOB_DEADLINE
    while not (pods := _pods(cluster, ns, job)):
        assert time.monotonic() < deadline, f"no pod of job {job}"
        time.sleep(0.5)  # poll interval; the deadline bounds the wait
    return pods
