"""examples/worker-pod.yaml has the native-sidecar shape the sidecar relies on.

(Server-side dry-run against a real kube-apiserver: tests/kube/test_worker_pod.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "examples" / "worker-pod.yaml"


def _docs() -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def _pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = _docs()["Job"]["spec"]["template"]["spec"]
    return spec


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def test_sidecar_is_a_native_sidecar_with_a_startup_probe() -> None:
    spec = _pod_spec()
    (sidecar,) = spec["initContainers"]
    assert sidecar["restartPolicy"] == "Always"
    # the product's one sidecar: the Go binary's image, run by its own entrypoint
    assert sidecar["image"] == "ghcr.io/joblease/joblease-sidecar:0.1.0"
    assert "args" not in sidecar and "command" not in sidecar
    probe = sidecar["startupProbe"]["httpGet"]
    assert probe["path"] == "/readyz"
    ports = {p["name"]: p["containerPort"] for p in sidecar["ports"]}
    assert ports[probe["port"]] == 8471  # the probe listener (kubelet dials the pod IP)
    assert spec["shareProcessNamespace"] is True


def test_downward_api_and_shared_token_volume() -> None:
    spec = _pod_spec()
    sidecar, worker = spec["initContainers"][0], spec["containers"][0]
    env = _env(sidecar)
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_UID"] == {"fieldRef": {"fieldPath": "metadata.uid"}}
    assert env["JOBLEASE_JOB_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["JOBLEASE_JOB_NAME"] == _docs()["JobLease"]["metadata"]["name"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in (sidecar, worker):
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        assert "emptyDir" in volumes[mounts["/run/joblease"]]
    assert _env(worker)["JOBLEASE_TOKEN_FILE"] == env["JOBLEASE_TOKEN_FILE"] \
        == "/run/joblease/token"
    assert _env(worker)["JOBLEASE_SIDECAR_URL"] == "http://127.0.0.1:8470"
    # the worker's pid file is where the sidecar looks for it
    assert _env(worker)["JOBLEASE_WORKER_PID_FILE"] == env["JOBLEASE_WORKER_PID_FILE"]
    # same non-root user in both containers: the loss signal is permitted
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["restartPolicy"] == "Never"


def test_embedded_worker_script_matches_the_example() -> None:
    script = _docs()["ConfigMap"]["data"]["worker.sh"]
    assert script == (ROOT / "examples" / "workers" / "worker.sh").read_text()
