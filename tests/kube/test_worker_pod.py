"""examples/worker-pod.yaml passes server-side dry-run on a real kube-apiserver
(native-sidecar fields, probes, downward API, the JobLease against its CRD)."""

from __future__ import annotations

import json

import pytest

from tests.support.binaries import REPO_ROOT
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube

MANIFEST = REPO_ROOT / "examples" / "worker-pod.yaml"


def test_worker_pod_manifest_server_dry_run(crds_installed: ControlPlane,
                                            namespace: str) -> None:
    r = crds_installed.kubectl("apply", "--dry-run=server", "-n", namespace,
                               "-f", str(MANIFEST), "-o", "json")
    assert r.returncode == 0, r.stderr
    items = json.loads(r.stdout)["items"]
    job = next(i for i in items if i["kind"] == "Job")
    (sidecar,) = job["spec"]["template"]["spec"]["initContainers"]
    assert sidecar["restartPolicy"] == "Always"  # the server kept the native-sidecar field
    assert sidecar["startupProbe"]["httpGet"]["path"] == "/readyz"
