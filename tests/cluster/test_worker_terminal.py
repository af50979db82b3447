"""Worker Jobs in terminal cases end with an outcome the Job controller understands.

Real pods on the session cluster: an etcd pod behind a Service in the test's
own namespace (there is no chart etcd here), a "tools" pod of the project
image to register / claim / complete jobs with the ``joblease`` CLI
(``kubectl exec``), and worker Jobs built from ``examples/worker-pod.yaml``.

Changed from the example, and why:
- ``JOBLEASE_ETCD_ENDPOINTS`` points at this test's etcd (``http://etcd:2379``,
  plain HTTP): the TLS env (CA, client cert, key), the ``etcd-client`` Secret
  volume and its mount are dropped, since this etcd has no TLS;
- ``JOBLEASE_JOB_NAME`` and the Job's name are per case, and the JobLease
  object is not applied (no operator runs here: the jobs are registered in
  etcd directly with ``joblease register``, which is what the operator does);
- ``imagePullPolicy: Never`` and the image references of the imported images
  (nothing is pulled).
- the loss test only: ``JOBLEASE_EXAMPLE_HOLD_FILE`` on the worker (the work
  lasts until a file that never appears, so the loss lands mid-work) and
  ``backoffLimit: 0`` (one pod to look at: the job is unregistered, a retry
  pod would only fail on "not registered").
Everything else - the native sidecar with its startup probe on ``/readyz``,
``shareProcessNamespace``, the security contexts, the worker script from the
ConfigMap, ``podReplacementPolicy`` and ``podFailurePolicy`` - is the example's.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
import yaml

from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster, image_ref

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

MANIFEST = REPO_ROOT / "examples" / "worker-pod.yaml"
ETCD = "http://etcd:2379"
#: generous: the machine is loaded; a hang is "still running after this"
JOB_DEADLINE = 240.0


def _docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _etcd(namespace: str) -> str:
    labels = {"app": "etcd"}
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "etcd", "namespace": namespace, "labels": labels},
         "spec": {"containers": [{
             "name": "etcd", "image": image_ref("gcr.io/etcd-development/etcd"),
             "imagePullPolicy": "Never",
             "command": ["/usr/local/bin/etcd", "--name", "etcd",
                         "--data-dir", "/var/lib/etcd",
                         "--listen-client-urls", "http://0.0.0.0:2379",
                         "--advertise-client-urls", ETCD,
                         "--listen-peer-urls", "http://127.0.0.1:2380",
                         "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
                         "--initial-cluster", "etcd=http://127.0.0.1:2380"],
             "ports": [{"containerPort": 2379}],
             "readinessProbe": {"httpGet": {"path": "/health", "port": 2379},
                                "periodSeconds": 1},
             "volumeMounts": [{"name": "data", "mountPath": "/var/lib/etcd"}]}],
             "volumes": [{"name": "data", "emptyDir": {}}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "etcd", "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"port": 2379, "targetPort": 2379}]}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "tools", "namespace": namespace},
         "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
             "name": "tools", "image": image_ref("ghcr.io/joblease/joblease"),
             "imagePullPolicy": "Never", "command": ["sleep", "3600"],
             "env": [{"name": "JOBLEASE_ETCD_ENDPOINTS", "value": ETCD}]}]}},
    ]})


def _joblease(cluster: Cluster, namespace: str, *args: str) -> dict[str, Any]:
    """``joblease ARGS -o json`` in the tools pod (retried while etcd's Service
    is not answering yet: the CLI exits 10 when etcd is unreachable)."""
    deadline = time.monotonic() + 120
    while True:
        r = cluster.kubectl("exec", "tools", "-n", namespace, "--", "joblease", *args,
                            "-n", namespace, "-o", "json", timeout=90)
        if r.returncode == 0:
            out: dict[str, Any] = json.loads(r.stdout)
            return out
        if r.returncode != 10 or time.monotonic() > deadline:
            raise AssertionError(f"joblease {' '.join(args)} -> {r.returncode}: "
                                 f"{r.stdout}{r.stderr}")
        time.sleep(1)  # poll interval; the deadline bounds the wait


def _worker_job(namespace: str, job_name: str, *, hold: bool = False) -> str:
    """The example's ConfigMap and Job, changed as the module docstring says."""
    docs = _docs()
    config_map = copy.deepcopy(docs["ConfigMap"])
    config_map["metadata"]["namespace"] = namespace
    job = copy.deepcopy(docs["Job"])
    job["metadata"] = {"name": job_name, "namespace": namespace}
    spec = job["spec"]["template"]["spec"]
    (sidecar,) = spec["initContainers"]
    (worker,) = spec["containers"]
    sidecar["imagePullPolicy"] = worker["imagePullPolicy"] = "Never"
    sidecar["image"] = image_ref("ghcr.io/joblease/joblease")
    worker["image"] = image_ref("docker.io/curlimages/curl")
    tls = {"JOBLEASE_ETCD_CA_FILE", "JOBLEASE_ETCD_CERT_FILE", "JOBLEASE_ETCD_KEY_FILE"}
    env = [e for e in sidecar["env"] if e["name"] not in tls]
    for e in env:
        if e["name"] == "JOBLEASE_ETCD_ENDPOINTS":
            e["value"] = ETCD
        if e["name"] == "JOBLEASE_JOB_NAME":
            e["value"] = job_name
    sidecar["env"] = env
    sidecar["volumeMounts"] = [m for m in sidecar["volumeMounts"] if m["name"] != "etcd-client"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] != "etcd-client"]
    if hold:
        worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_FILE",
                              "value": "/run/joblease/never"})
        job["spec"]["backoffLimit"] = 0
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [config_map, job]})


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
                         f"(it hangs):\n{_describe(cluster, namespace, name)}")


def _pods(cluster: Cluster, namespace: str, job: str) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "pods", "-n", namespace, "-l", f"job-name={job}", "-o", "json",
                        check=True)
    items: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return items


def _describe(cluster: Cluster, namespace: str, job: str) -> str:
    pods = cluster.kubectl("describe", "pods", "-n", namespace, "-l", f"job-name={job}").stdout
    logs = cluster.kubectl("logs", "-n", namespace, "-l", f"job-name={job}",
                           "--all-containers", "--prefix").stdout
    return pods + "\n" + logs


def _worker_status(pod: dict[str, Any]) -> dict[str, Any]:
    (status,) = [s for s in pod["status"]["containerStatuses"] if s["name"] == "worker"]
    terminated: dict[str, Any] = status["state"]["terminated"]
    return terminated


@pytest.fixture
def etcd_ns(cluster: Cluster, namespace: str) -> str:
    cluster.apply(_etcd(namespace))
    for pod in ("etcd", "tools"):
        cluster.kubectl("wait", "--for=condition=Ready", f"pod/{pod}", "-n", namespace,
                        "--timeout=300s", check=True, timeout=320)
    return namespace


def test_completed_joblease_job_succeeds_without_the_work(cluster: Cluster, etcd_ns: str
                                                         ) -> None:
    ns, name = etcd_ns, "done-report"
    _joblease(cluster, ns, "register", name, "--ttl", "10", "--max-attempts", "0")
    claim = _joblease(cluster, ns, "claim", name, "--owner", "earlier-pod")
    done = _joblease(cluster, ns, "complete", name, "--owner", "earlier-pod",
                     "--token", str(claim["token"]), "--result", '{"items": 3}')
    cluster.apply(_worker_job(ns, name))
    assert _wait_job(cluster, ns, name) == "Complete", _describe(cluster, ns, name)
    (pod,) = _pods(cluster, ns, name)
    assert pod["status"]["phase"] == "Succeeded"
    assert _worker_status(pod)["exitCode"] == 0
    worker_log = cluster.kubectl("logs", pod["metadata"]["name"], "-n", ns, "-c", "worker",
                                 check=True).stdout
    assert "already completed: nothing to do" in worker_log, worker_log
    assert "work item" not in worker_log and "holding the lease" not in worker_log
    # etcd still holds the earlier completion, untouched
    state = _joblease(cluster, ns, "get", name)
    assert state["result"]["token"] == done["token"] == claim["token"], state
    assert state["result"]["owner"] == "earlier-pod"


def test_exhausted_joblease_job_fails_with_the_reason(cluster: Cluster, etcd_ns: str) -> None:
    ns, name = etcd_ns, "spent-report"
    _joblease(cluster, ns, "register", name, "--ttl", "10", "--max-attempts", "1")
    claim = _joblease(cluster, ns, "claim", name, "--owner", "earlier-pod")
    _joblease(cluster, ns, "release", name, "--owner", "earlier-pod",
              "--token", str(claim["token"]))
    cluster.apply(_worker_job(ns, name))
    assert _wait_job(cluster, ns, name) == "Failed", _describe(cluster, ns, name)
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
    describe = cluster.kubectl("describe", "pod", pod["metadata"]["name"], "-n", ns,
                               check=True).stdout
    assert "has used 1 of 1 attempts" in describe, describe
    sidecar_log = cluster.kubectl("logs", pod["metadata"]["name"], "-n", ns, "-c", "joblease",
                                  check=True).stdout
    assert "job has no attempts left" in sidecar_log, sidecar_log
    job = json.loads(cluster.kubectl("get", "job", name, "-n", ns, "-o", "json",
                                     check=True).stdout)
    failed = [c for c in job["status"]["conditions"] if c["type"] == "Failed"]
    assert failed and failed[0]["reason"] == "PodFailurePolicy", failed
    state = _joblease(cluster, ns, "get", name)
    assert state["generation"] == 1 and state["holder"] is None, state


def test_lease_lost_mid_work_stops_the_worker_and_fails_the_pod(cluster: Cluster, etcd_ns: str
                                                                ) -> None:
    ns, name = etcd_ns, "lost-report"
    _joblease(cluster, ns, "register", name, "--ttl", "4", "--max-attempts", "0")
    cluster.apply(_worker_job(ns, name, hold=True))
    # the worker holds the lease and is mid-work
    deadline = time.monotonic() + JOB_DEADLINE
    while True:
        logs = cluster.kubectl("logs", "-n", ns, "-l", f"job-name={name}", "-c", "worker").stdout
        if "work item 3" in logs:
            break
        assert time.monotonic() < deadline, _describe(cluster, ns, name)
        time.sleep(1)  # poll interval; the deadline bounds the wait
    _joblease(cluster, ns, "unregister", name)  # the job vanishes from under the holder
    assert _wait_job(cluster, ns, name) == "Failed", _describe(cluster, ns, name)
    (pod,) = _pods(cluster, ns, name)
    assert pod["status"]["phase"] == "Failed"
    terminated = _worker_status(pod)
    assert terminated["exitCode"] == 143, terminated  # SIGTERM from the sidecar
    pod_name = pod["metadata"]["name"]
    worker_log = cluster.kubectl("logs", pod_name, "-n", ns, "-c", "worker", check=True).stdout
    assert "complete ->" not in worker_log, worker_log  # stopped before any completion
    sidecar_log = cluster.kubectl("logs", pod_name, "-n", ns, "-c", "joblease",
                                  check=True).stdout
    assert "lease lost" in sidecar_log and "sent SIGTERM to the worker" in sidecar_log, \
        sidecar_log
