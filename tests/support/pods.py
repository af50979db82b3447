"""Looking into pods, JobLeases and etcd on the test cluster, for the end-to-end tests.

Everything goes through the real kubectl (``Cluster.kubectl``): ``kubectl exec`` into
a container, the JobLease status as the API server serves it, and the job's state as
etcd holds it (``joblease get`` run inside the operator pod, with the operator's own
etcd credentials: the test process cannot reach the cluster's etcd directly).
"""

from __future__ import annotations

import copy
import json
import subprocess
from collections.abc import Callable
from typing import Any

import yaml

from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster
from tests.support.release import Release
from tests.support.waiting import wait_until


def exec_in(cluster: Cluster, namespace: str, pod: str, container: str, *argv: str,
            timeout: float = 90) -> subprocess.CompletedProcess[str]:
    """``kubectl exec`` ``argv`` in one container (not checked: callers look at the code)."""
    return cluster.kubectl("exec", pod, "-n", namespace, "-c", container, "--", *argv,
                           timeout=timeout)


def joblease_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The JobLease's ``status`` as the API server serves it (None if there is no such
    object, {} if it has no status yet)."""
    r = cluster.kubectl("get", "joblease", name, "-n", namespace, "-o", "json", timeout=30)
    if r.returncode != 0:
        return None
    status: dict[str, Any] = json.loads(r.stdout).get("status") or {}
    return status


def wait_joblease(cluster: Cluster, namespace: str, name: str,
                  check: Callable[[dict[str, Any]], bool], what: str,
                  timeout: float = 240) -> dict[str, Any]:
    """Wait until ``check(status)`` holds for the JobLease's status; return that status.
    The failure names the last status seen."""
    seen: list[dict[str, Any] | None] = [None]

    def ready() -> dict[str, Any] | None:
        status = joblease_status(cluster, namespace, name)
        seen[0] = status
        return status if status is not None and check(status) else None

    try:
        found: dict[str, Any] = wait_until(ready, timeout=timeout, interval=0.5,
                                           what=f"JobLease {namespace}/{name}: {what}")
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {seen[0]}") from exc
    return found


def wait_phase(cluster: Cluster, namespace: str, name: str, phase: str,
               timeout: float = 240) -> dict[str, Any]:
    """Wait until the JobLease's ``status.phase`` is ``phase``; return the status."""
    return wait_joblease(cluster, namespace, name, lambda s: s.get("phase") == phase,
                         f"phase {phase}", timeout)


def etcd_state(release: Release, namespace: str, name: str) -> dict[str, Any] | None:
    """The job's state in the release's etcd (``joblease get -o json`` in the operator
    pod); None if the job is not registered there (exit 3)."""
    pod = release.operator_pod()["metadata"]["name"]
    r = exec_in(release.cluster, release.namespace, pod, "operator",
                "joblease", "get", name, "-n", namespace, "-o", "json")
    if r.returncode == 3:
        return None
    assert r.returncode == 0, f"joblease get {namespace}/{name} -> {r.returncode}: {r.stderr}"
    state: dict[str, Any] = json.loads(r.stdout)
    return state


def container_id(pod: dict[str, Any], container: str) -> str:
    """The runtime's id of ``container`` (a container or an init/sidecar container)."""
    status = pod.get("status", {})
    for s in status.get("initContainerStatuses", []) + status.get("containerStatuses", []):
        if s["name"] == container and s.get("containerID"):
            return str(s["containerID"]).split("://", 1)[1]
    raise AssertionError(f"pod {pod['metadata']['name']} has no running {container!r}")


def pod_logs(cluster: Cluster, namespace: str, pod: str, container: str) -> str:
    r = cluster.kubectl("logs", pod, "-n", namespace, "-c", container, timeout=30)
    return r.stdout + r.stderr


EXAMPLE = REPO_ROOT / "examples" / "worker-pod.yaml"


def example_docs() -> dict[str, dict[str, Any]]:
    """examples/worker-pod.yaml by kind (JobLease, ConfigMap, Job)."""
    return {d["kind"]: d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d}


def example_worker_pod(namespace: str, name: str, job: str, *,
                       sidecar_env: dict[str, str] | None = None,
                       worker_env: dict[str, str] | None = None,
                       script: str | None = None) -> dict[str, Any]:
    """A bare Pod with the pod template of examples/worker-pod.yaml's Job (the native
    sidecar, its probes, the shared process namespace, the security contexts, the etcd
    client Secret of the shared release), changed only as the arguments say:
    ``JOBLEASE_JOB_NAME`` is ``job``; ``sidecar_env`` / ``worker_env`` set or add
    variables; ``script`` names a ConfigMap whose ``worker.sh`` the worker runs
    instead of the example's (the default: the example's ConfigMap, which the caller
    applies). A bare Pod rather than a Job: the tests decide which pod runs when."""
    template = copy.deepcopy(example_docs()["Job"]["spec"]["template"])
    pod: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod",
                           "metadata": {"name": name, "namespace": namespace,
                                        "labels": template["metadata"]["labels"]},
                           "spec": template["spec"]}
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    (worker,) = spec["containers"]
    for container, extra in ((sidecar, {"JOBLEASE_JOB_NAME": job, **(sidecar_env or {})}),
                             (worker, worker_env or {})):
        env = container.setdefault("env", [])
        for key, value in extra.items():
            env[:] = [e for e in env if e["name"] != key] + [{"name": key, "value": value}]
    if script is not None:
        for volume in spec["volumes"]:
            if volume["name"] == "worker-script":
                volume["configMap"]["name"] = script
    return pod


def job_condition(cluster: Cluster, namespace: str, name: str) -> str | None:
    """``Complete`` or ``Failed`` once the Job has that condition, else None."""
    r = cluster.kubectl("get", "job", name, "-n", namespace, "-o", "json", timeout=30)
    if r.returncode != 0:
        return None
    for c in json.loads(r.stdout).get("status", {}).get("conditions", []):
        if c["type"] in ("Complete", "Failed") and c["status"] == "True":
            return str(c["type"])
    return None
