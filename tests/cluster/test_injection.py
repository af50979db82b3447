"""Sidecar injection on the real cluster: the chart's webhook, called by the API server.

Real: the session cluster (kube-apiserver calls the webhook's Service over TLS
with the chart-generated CA), the shared chart release ``joblease`` in
``joblease-system`` (webhook enabled, the chart's defaults), the bundled etcd,
the operator, the project image as the injected sidecar and the curl stand-in
running examples/worker-pod.yaml's worker script.

Most cases use ``kubectl create --dry-run=server``: the API server runs the
whole admission chain (our webhook included: it declares ``sideEffects: None``)
and returns the object as it would be stored, without creating a pod. Only the
end-to-end case runs a real Job.

"Webhook down" is the chart's own MutatingWebhookConfiguration and Service
(``helm template``, a release named ``down`` whose operator does not run: the
Service has no endpoints), applied for a namespace label of its own so that it
touches nothing else.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.binaries import REPO_ROOT, helm_binary
from tests.support.cluster import Cluster, image_ref
from tests.support.pods import job_condition
from tests.support.release import CHART
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

EXAMPLE = REPO_ROOT / "examples" / "worker-pod.yaml"
LABEL = "joblease.io/inject"
JOB_DEADLINE = 300.0


def _example(kind: str) -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == kind]
    return doc


def _pod(namespace: str, name: str, annotations: dict[str, str] | None = None
         ) -> dict[str, Any]:
    """A pod the way a user writes it for injection: no sidecar, no joblease wiring."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {
        "restartPolicy": "Never",
        "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "worker", "image": image_ref("docker.io/curlimages/curl"),
                        "imagePullPolicy": "Never", "command": ["true"]}]}}


def _dry_run(cluster: Cluster, obj: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                           input=json.dumps(obj), timeout=60)


def _admitted(cluster: Cluster, obj: dict[str, Any]) -> dict[str, Any]:
    r = _dry_run(cluster, obj)
    assert r.returncode == 0, r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def _injected(pod: dict[str, Any]) -> bool:
    inits = pod["spec"].get("initContainers") or []
    return any(c["name"] == "joblease" for c in inits)


def _label(cluster: Cluster, namespace: str, value: str) -> None:
    cluster.kubectl("label", "namespace", namespace, f"{LABEL}={value}", "--overwrite",
                    check=True)


def _wait_webhook_serving(cluster: Cluster, namespace: str) -> None:
    """Until the shared release's webhook answers (its pod may still be starting)."""
    probe = _pod(namespace, "probe", {"joblease.io/job": "probe"})

    def ready() -> bool:
        r = _dry_run(cluster, probe)
        return r.returncode == 0 and _injected(json.loads(r.stdout))
    wait_until(ready, timeout=180, what="the webhook injecting", interval=1)


@pytest.fixture
def inject_namespace(cluster: Cluster, worker_namespace: str) -> str:
    """This test's namespace, opted in (label) and given the etcd client Secret."""
    _label(cluster, worker_namespace, "enabled")
    _wait_webhook_serving(cluster, worker_namespace)
    return worker_namespace


def _describe(cluster: Cluster, namespace: str) -> str:
    pods = cluster.kubectl("describe", "pods", "-n", namespace).stdout
    logs = cluster.kubectl("logs", "-n", namespace, "-l", "job-name=report",
                           "--all-containers", "--prefix", "--tail=30").stdout
    op = cluster.kubectl("logs", "-n", "joblease-system", "deploy/joblease-joblease-operator",
                         "--tail=30").stdout
    return f"{pods[-5000:]}\n{logs}\n{op}"


def test_annotated_job_pod_gets_the_sidecar_and_completes_its_joblease(
        cluster: Cluster, inject_namespace: str) -> None:
    ns = inject_namespace
    config_map = _example("ConfigMap")
    config_map["metadata"] = {"name": "report-worker", "namespace": ns}
    cluster.apply(json.dumps({
        "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
        "metadata": {"name": "report", "namespace": ns},
        "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3}}))
    # the example's Job without any of the sidecar wiring: an annotation instead
    pod = _pod(ns, "unused", {"joblease.io/job": "report"})
    spec = pod["spec"]
    (worker,) = spec["containers"]
    worker["command"] = ["sh", "/opt/worker/worker.sh"]
    worker["volumeMounts"] = [{"name": "worker-script", "mountPath": "/opt/worker",
                               "readOnly": True}]
    spec["volumes"] = [{"name": "worker-script", "configMap": {"name": "report-worker"}}]
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "report", "namespace": ns},
           "spec": {"backoffLimit": 0, "podReplacementPolicy": "Failed",
                    "template": {"metadata": {"annotations": pod["metadata"]["annotations"]},
                                 "spec": spec}}}
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [config_map, job]}))

    state = wait_until(lambda: job_condition(cluster, ns, "report"), timeout=JOB_DEADLINE,
                       what="Job report Complete or Failed", interval=1)
    assert state == "Complete", _describe(cluster, ns)
    (stored,) = json.loads(cluster.kubectl("get", "pods", "-n", ns, "-l", "job-name=report",
                                           "-o", "json", check=True).stdout)["items"]
    assert stored["metadata"]["annotations"]["joblease.io/injected"] == "true"
    (sidecar,) = stored["spec"]["initContainers"]
    assert sidecar["name"] == "joblease" and sidecar["restartPolicy"] == "Always"
    assert stored["spec"]["shareProcessNamespace"] is True
    # the JobLease existed when the pod was admitted: its TTL is the sidecar's hint (and
    # the hinted sidecar held and completed, above)
    hint = {e["name"]: e.get("value") for e in sidecar["env"]}.get("JOBLEASE_LEASE_TTL")
    assert hint == "30", sidecar["env"]
    env = {e["name"]: e.get("value") for e in stored["spec"]["containers"][0]["env"]}
    assert env["JOBLEASE_SIDECAR_URL"] == "http://127.0.0.1:8470"
    log = cluster.kubectl("logs", stored["metadata"]["name"], "-n", ns, "-c", "worker",
                          check=True).stdout
    assert "holding the lease with token" in log and "complete -> 200" in log, log

    def completed() -> dict[str, Any] | None:
        r = cluster.kubectl("get", "joblease", "report", "-n", ns, "-o", "json", check=True)
        status: dict[str, Any] = json.loads(r.stdout).get("status") or {}
        return status if status.get("phase") == "Completed" else None
    status = wait_until(completed, timeout=120, what="JobLease report Completed", interval=1)
    assert stored["metadata"]["name"] in json.dumps(status), status  # the pod was the owner


def test_only_annotated_pods_in_opted_in_namespaces_are_injected(
        cluster: Cluster, inject_namespace: str, namespace: str) -> None:
    plain_ns = f"{namespace[:50]}-plain"
    cluster.kubectl("create", "namespace", plain_ns, check=True)
    try:
        annotated = {"joblease.io/job": "anything"}
        # control: the webhook is up and injects here; it looked the JobLease up (with the
        # operator's RBAC) and warns that there is none
        r = _dry_run(cluster, _pod(inject_namespace, "a", annotated))
        assert r.returncode == 0 and _injected(json.loads(r.stdout)), r.stderr
        assert (f"Warning: joblease: JobLease {inject_namespace}/anything does not exist"
                in r.stderr), r.stderr
        # no annotation, opted-in namespace: stored exactly as sent
        pod = _pod(inject_namespace, "b")
        stored = _admitted(cluster, pod)
        assert stored["spec"]["containers"][0].get("env") is None
        assert not stored["spec"].get("initContainers")
        assert "annotations" not in stored["metadata"]
        # annotation, namespace without the label: never sent to the webhook
        stored = _admitted(cluster, _pod(plain_ns, "c", annotated))
        assert not _injected(stored)
        assert "joblease.io/injected" not in stored["metadata"]["annotations"]
        assert stored["spec"].get("shareProcessNamespace") is None
    finally:
        cluster.kubectl("delete", "namespace", plain_ns, "--wait=false")


def test_invalid_annotation_is_refused_with_the_reason(cluster: Cluster,
                                                       inject_namespace: str) -> None:
    for notes, says in (
            ({"joblease.io/job": "report", "joblease.io/on-loss": "kill"},
             "invalid annotation joblease.io/on-loss: 'kill' is not one of signal, exit, none"),
            ({"joblease.io/job": "Bad_Name"}, "invalid annotation joblease.io/job: 'Bad_Name'"),
            ({"joblease.io/job": "report", "joblease.io/onloss": "none"},
             "unknown annotation joblease.io/onloss")):
        r = _dry_run(cluster, _pod(inject_namespace, "bad", notes))
        assert r.returncode != 0, r.stdout
        assert "denied the request" in r.stderr and says in r.stderr, r.stderr
    # nothing was created
    pods = cluster.kubectl("get", "pods", "-n", inject_namespace, "-o", "name", check=True)
    assert pods.stdout.strip() == ""


def _render_down(namespace: str, tmp: Path) -> list[dict[str, Any]]:
    """The chart's webhook Service and configuration for a release ``down`` in
    ``namespace`` whose operator is not installed (the Service has no endpoints),
    selecting namespaces labelled ``joblease.io/inject=<namespace>``."""
    out = subprocess.run(
        [helm_binary(), "template", "down", str(CHART), "-n", namespace,
         "--show-only", "templates/webhook.yaml",
         "--set", f"webhook.namespaceSelector.matchLabels.joblease\\.io/inject={namespace}"],
        capture_output=True, text=True, timeout=120,
        env={"HELM_CACHE_HOME": str(tmp / "c"), "HELM_CONFIG_HOME": str(tmp / "g"),
             "HELM_DATA_HOME": str(tmp / "d"), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout)
            if d and d["kind"] in ("Service", "MutatingWebhookConfiguration")]
    assert len(docs) == 2
    return docs


def test_webhook_down_fail_refuses_annotated_pods_and_ignore_admits_them(
        cluster: Cluster, namespace: str, tmp_path: Path) -> None:
    _label(cluster, namespace, namespace)
    docs = _render_down(namespace, tmp_path)
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    assert config["webhooks"][0]["failurePolicy"] == "Fail"  # the chart's default
    annotated = _pod(namespace, "a", {"joblease.io/job": "report"})
    try:
        cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))

        def refused() -> subprocess.CompletedProcess[str] | None:
            # the API server's webhook informer may take a moment to see the new config
            r = _dry_run(cluster, annotated)
            return r if r.returncode != 0 else None
        r = wait_until(refused, timeout=60, what="the Fail configuration in effect",
                       interval=0.5)
        # refused: no pod runs without its sidecar while no replica answers
        assert 'failed calling webhook "inject.joblease.io"' in r.stderr, r.stderr
        # an unannotated pod in the same namespace is never sent to the webhook
        assert _admitted(cluster, _pod(namespace, "b"))["metadata"]["name"] == "b"

        # what --set webhook.failurePolicy=Ignore renders (the schema's other value)
        config["webhooks"][0]["failurePolicy"] = "Ignore"
        cluster.apply(json.dumps(config))

        def admitted() -> dict[str, Any] | None:
            r = _dry_run(cluster, annotated)
            return json.loads(r.stdout) if r.returncode == 0 else None
        stored = wait_until(admitted, timeout=60, what="the Ignore configuration in effect",
                            interval=0.5)
        # admitted unchanged
        assert not _injected(stored)
        assert "joblease.io/injected" not in stored["metadata"]["annotations"]
    finally:
        cluster.kubectl("delete", "-f", "-", "--wait=false",
                        input=json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
