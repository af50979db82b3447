"""Worker pods and Jobs built from ``examples/worker-pod.yaml``, for the cluster tests
and ``bench/e2e.py``.

What a test changes in the example is passed in explicitly (names, the
JobLease, a hold file, extra sidecar settings) and nothing else: the images
are the example's references (the node has them imported, so
``IfNotPresent`` pulls nothing), the etcd endpoint and TLS Secret are the
example's (``joblease-etcd-client`` in the pod's namespace, see the
``worker_namespace`` fixture), and the sidecar, probes, security contexts and
worker script are the example's.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from typing import Any

import yaml

from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster, kill_containers

MANIFEST = REPO_ROOT / "examples" / "worker-pod.yaml"
#: Inside the pods' shared emptyDir: the example worker "works" until it exists.
HOLD_FILE = "/run/joblease/done"
SIDECAR = "joblease"
WORKER = "worker"


def example_docs() -> dict[str, dict[str, Any]]:
    """The example's documents by kind (JobLease, ConfigMap, Job)."""
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def joblease(namespace: str, name: str, *, ttl: int, max_attempts: int) -> str:
    doc = copy.deepcopy(example_docs()["JobLease"])
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"] = {"leaseDurationSeconds": ttl, "maxAttempts": max_attempts}
    return json.dumps(doc)


def config_map(namespace: str) -> dict[str, Any]:
    doc = copy.deepcopy(example_docs()["ConfigMap"])
    doc["metadata"]["namespace"] = namespace
    return doc


def _pod_spec(job_name: str, *, hold: bool, sidecar_env: dict[str, str] | None
              ) -> dict[str, Any]:
    spec: dict[str, Any] = copy.deepcopy(example_docs()["Job"]["spec"]["template"]["spec"])
    (sidecar,) = spec["initContainers"]
    (worker,) = spec["containers"]
    for e in sidecar["env"]:
        if e["name"] == "JOBLEASE_JOB_NAME":
            e["value"] = job_name
    for key, value in (sidecar_env or {}).items():
        # one entry per name: a variable the example sets is replaced, not repeated
        sidecar["env"] = [e for e in sidecar["env"] if e["name"] != key]
        sidecar["env"].append({"name": key, "value": value})
    if hold:
        worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_FILE", "value": HOLD_FILE})
    return spec


def worker_job(namespace: str, name: str, job_name: str, *, hold: bool = False,
               backoff_limit: int | None = None) -> str:
    """The example's ConfigMap and Job, the Job named ``name`` claiming ``job_name``."""
    job = copy.deepcopy(example_docs()["Job"])
    job["metadata"] = {"name": name, "namespace": namespace}
    job["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = job_name
    job["spec"]["template"]["spec"] = _pod_spec(job_name, hold=hold, sidecar_env=None)
    if backoff_limit is not None:
        job["spec"]["backoffLimit"] = backoff_limit
    return json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": [config_map(namespace), job]})


def pod_doc(namespace: str, name: str, job_name: str, *, hold: bool = True,
            sidecar_env: dict[str, str] | None = None) -> dict[str, Any]:
    """One pod of the example Job's pod template, claiming ``job_name`` (its
    ConfigMap not included: see :func:`worker_pod`)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "labels": {"app.kubernetes.io/name": job_name}},
            "spec": _pod_spec(job_name, hold=hold, sidecar_env=sidecar_env)}


def worker_pod(namespace: str, name: str, job_name: str, *, hold: bool = True,
               sidecar_env: dict[str, str] | None = None) -> str:
    """One pod of the example Job's pod template (plus its ConfigMap), without the
    Job: fault tests start pods one at a time, so they know which one holds."""
    pod = pod_doc(namespace, name, job_name, hold=hold, sidecar_env=sidecar_env)
    return json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": [config_map(namespace), pod]})


def owner_of(pod: dict[str, Any]) -> str:
    """The owner identity the example's sidecar claims with (``POD_NAME/POD_UID``)."""
    return f"{pod['metadata']['name']}/{pod['metadata']['uid']}"


def container_id(pod: dict[str, Any], container: str) -> str:
    """The runtime's id of ``container`` (an init/sidecar or a regular container)."""
    statuses = (pod["status"].get("initContainerStatuses", [])
                + pod["status"].get("containerStatuses", []))
    for status in statuses:
        if status["name"] == container and status.get("containerID"):
            return str(status["containerID"]).split("://", 1)[1]
    raise AssertionError(f"no running container {container} in {pod['metadata']['name']}")


def _running(pod: dict[str, Any], container: str) -> bool:
    statuses = (pod["status"].get("initContainerStatuses", [])
                + pod["status"].get("containerStatuses", []))
    return any(s["name"] == container and "running" in (s.get("state") or {})
               for s in statuses)


def operator_pod(cluster: Cluster) -> tuple[str, str]:
    """``(namespace, name)`` of a running operator pod of the installed release (one
    release at a time on the test cluster: the ``release`` fixture refuses a second)."""
    r = cluster.kubectl("get", "pods", "-A", "-l", "app.kubernetes.io/name=joblease-operator",
                        "-o", "json", timeout=60)
    pods = json.loads(r.stdout)["items"] if r.returncode == 0 else []
    for pod in pods:
        if pod["status"].get("phase") == "Running" and not pod["metadata"].get(
                "deletionTimestamp"):
            return pod["metadata"]["namespace"], pod["metadata"]["name"]
    raise AssertionError(f"no running operator pod: {r.stdout}{r.stderr}")


def joblease_cli(cluster: Cluster, namespace: str, pod: str, *args: str,
                 timeout: float = 120) -> dict[str, Any]:
    """``joblease ARGS -n NAMESPACE -o json`` as etcd holds it, for a test about worker
    pod ``pod``: run in the release's operator pod, whose image has the CLI and whose
    environment has the etcd endpoint and TLS files (the sidecar image is the Go
    binary alone). Retried while etcd (or the operator pod) is unreachable."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            op_namespace, op_pod = operator_pod(cluster)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)  # poll interval; the deadline bounds the wait
            continue
        r = cluster.kubectl("exec", op_pod, "-n", op_namespace, "-c", "operator", "--",
                            "joblease", *args, "-n", namespace, "-o", "json", timeout=90)
        if r.returncode == 0:
            out: dict[str, Any] = json.loads(r.stdout)
            return out
        if r.returncode != 10 or time.monotonic() > deadline:
            raise AssertionError(f"joblease {' '.join(args)} (for {pod}) -> {r.returncode}: "
                                 f"{r.stdout}{r.stderr}")
        time.sleep(1)  # poll interval; the deadline bounds the wait


def wait_worker_running(cluster: Cluster, namespace: str, pod: str,
                        timeout: float = 240) -> dict[str, Any]:
    """The pod once its worker container runs. A claim (Claimed, or the sidecar's
    "held" log line) comes first: the kubelet starts the worker only after the
    sidecar's startup probe passed, a moment later, so an exec right after a claim
    can find no worker yet."""
    deadline = time.monotonic() + timeout
    while True:
        current = get_pod(cluster, namespace, pod)
        if _running(current, WORKER):
            return current
        assert time.monotonic() < deadline, f"{pod}: worker never started"
        time.sleep(0.5)  # poll interval; the deadline bounds the wait


def finish_work(cluster: Cluster, namespace: str, pod: str) -> None:
    """Let a held worker (``hold=True``) finish: its work lasts until the hold file exists."""
    wait_worker_running(cluster, namespace, pod)
    cluster.kubectl("exec", pod, "-n", namespace, "-c", WORKER, "--", "touch", HOLD_FILE,
                    check=True, timeout=90)


def describe(cluster: Cluster, namespace: str, selector: str) -> str:
    """``kubectl describe`` and both containers' logs of the pods ``selector`` picks."""
    pods = cluster.kubectl("describe", "pods", "-n", namespace, "-l", selector).stdout
    logs = cluster.kubectl("logs", "-n", namespace, "-l", selector, "--all-containers",
                           "--prefix", "--tail=60").stdout
    return pods[-8000:] + "\n" + logs


def joblease_status(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    r = cluster.kubectl("get", "joblease", name, "-n", namespace, "-o", "json", timeout=30)
    if r.returncode != 0:
        return {}
    status: dict[str, Any] = json.loads(r.stdout).get("status") or {}
    return status


def wait_status(cluster: Cluster, namespace: str, name: str, what: str,
                predicate: Any, timeout: float = 240) -> dict[str, Any]:
    """Poll the JobLease's status (the operator's mirror of etcd) until ``predicate``."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = joblease_status(cluster, namespace, name)
        if predicate(status):
            return status
        time.sleep(0.5)  # poll interval; the deadline bounds the wait
    pods = describe(cluster, namespace, f"app.kubernetes.io/name={name}")
    raise AssertionError(f"JobLease {namespace}/{name}: no {what} after {timeout}s; "
                         f"status {status}\n{pods}")


def get_pod(cluster: Cluster, namespace: str, name: str) -> dict[str, Any]:
    pod = cluster.pod(name, namespace)
    assert pod is not None, f"pod {namespace}/{name} not found"
    return pod


def wait_log(cluster: Cluster, namespace: str, pod: str, container: str, text: str,
             timeout: float = 240) -> str:
    deadline = time.monotonic() + timeout
    logs = ""
    while time.monotonic() < deadline:
        logs = cluster.kubectl("logs", pod, "-n", namespace, "-c", container).stdout
        if text in logs:
            return logs
        time.sleep(0.5)  # poll interval; the deadline bounds the wait
    raise AssertionError(f"{pod}/{container} never logged {text!r}:\n{logs[-3000:]}")


@dataclass
class Takeover:
    """One holder pod lost (deleted or killed), the waiting pod claiming next, as
    etcd recorded it (``joblease get``: generation, token, ``claimedAt``)."""

    before: dict[str, Any]  # the job's state while the first pod held it
    after: dict[str, Any]  # the job's state once the second pod holds it
    lost_at: float  # wall clock when the loss was caused
    holder: dict[str, Any]  # the first pod
    waiter: dict[str, Any]  # the second pod

    @property
    def seconds(self) -> float:
        """Loss to the next claim: ``claimedAt`` is the claimer's wall clock, the same
        kernel clock as this process's (every pod runs on this machine)."""
        return float(self.after["holder"]["claimedAt"]) - self.lost_at


def start_holder(cluster: Cluster, namespace: str, job: str, pod: str,
                 sidecar_env: dict[str, str] | None = None) -> dict[str, Any]:
    """Start ``pod`` (worker held mid-work) and wait until etcd, through the operator's
    status, says it holds ``job``."""
    cluster.apply(worker_pod(namespace, pod, job, sidecar_env=sidecar_env))
    wait_log(cluster, namespace, pod, SIDECAR, '"lease held"')
    obj = get_pod(cluster, namespace, pod)
    wait_status(cluster, namespace, job, f"claim by {pod}",
                lambda s: s.get("holderIdentity") == owner_of(obj))
    return obj


def takeover(cluster: Cluster, namespace: str, job: str, how: str, prefix: str,
             waiter_env: dict[str, str] | None = None) -> Takeover:
    """Pods ``<prefix>-a`` and ``<prefix>-b`` start together; one holds ``job``, the other
    waits (its sidecar has been refused at least once: "held by another owner").
    Then ``how``: ``delete`` (``kubectl delete pod`` of the holder: the kubelet
    stops the worker, then SIGTERMs the sidecar, which releases) or ``kill``
    (SIGKILL to every process of the holder's containers, from the node: nothing
    releases, the etcd lease must expire). ``waiter_env`` goes to both sidecars
    (either may end up waiting). Returns once etcd shows the waiter as the holder."""
    if how not in ("delete", "kill"):
        raise ValueError(f"how={how!r}: 'delete' or 'kill'")
    names = [f"{prefix}-a", f"{prefix}-b"]
    for name in names:
        cluster.apply(worker_pod(namespace, name, job, sidecar_env=waiter_env))
    pods = {name: get_pod(cluster, namespace, name) for name in names}
    status = wait_status(cluster, namespace, job, "a claim by either pod",
                         lambda s: s.get("holderIdentity") in {owner_of(p)
                                                               for p in pods.values()})
    (holder_name,) = [n for n, p in pods.items() if owner_of(p) == status["holderIdentity"]]
    (waiter_name,) = [n for n in names if n != holder_name]
    wait_log(cluster, namespace, waiter_name, SIDECAR, "held by another owner")
    holder, waiter = get_pod(cluster, namespace, holder_name), pods[waiter_name]
    before = joblease_cli(cluster, namespace, waiter_name, "get", job)
    assert before["holder"]["owner"] == owner_of(holder), before
    lost_at = lose(cluster, namespace, holder, how)
    after = wait_claimed(cluster, namespace, job, waiter)
    return Takeover(before, after, lost_at, holder, waiter)


def lose(cluster: Cluster, namespace: str, holder: dict[str, Any], how: str) -> float:
    """Take the holder pod away (``delete`` or ``kill``, see :func:`takeover`); returns
    the wall-clock moment the loss was caused."""
    name = holder["metadata"]["name"]
    if how == "kill":
        holder = wait_worker_running(cluster, namespace, name)
    if how == "delete":
        lost_at = time.time()
        cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false", check=True)
        return lost_at
    if how == "kill":
        # the sidecar first: a worker dying first would have the kubelet SIGTERM the
        # sidecar (a graceful release) before its own SIGKILL arrives
        ids = [container_id(holder, SIDECAR), container_id(holder, WORKER)]
        lost_at = time.time()
        kill_containers(cluster, ids)
        return lost_at
    raise ValueError(f"how={how!r}: 'delete' or 'kill'")


def wait_claimed(cluster: Cluster, namespace: str, job: str, waiter: dict[str, Any],
                 timeout: float = 240) -> dict[str, Any]:
    """The job's etcd state once ``waiter`` holds it (read through its own sidecar)."""
    name = waiter["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while True:
        state = joblease_cli(cluster, namespace, name, "get", job)
        if (state.get("holder") or {}).get("owner") == owner_of(waiter):
            return state
        assert time.monotonic() < deadline, f"{name} never claimed: {state}"
        time.sleep(0.2)  # poll interval; claimedAt, not this loop, is the measurement
