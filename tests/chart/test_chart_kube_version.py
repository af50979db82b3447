"""The chart's ``kubeVersion`` (Kubernetes 1.29+, for native sidecars), checked by the real
helm: an older cluster is refused before anything is rendered or created, with the
message docs/helm.md quotes; the pinned helm's own default (its release's stamp,
``HELM_KUBE_VERSION``) renders, so `helm template` without ``--kube-version`` works."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.binaries import REPO_ROOT, helm_binary, versions

CHART = REPO_ROOT / "charts" / "joblease-operator"
REFUSAL = ("chart requires kubeVersion: >=1.29.0-0 which is incompatible with "
           "Kubernetes v1.28.0")


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), "template", "jl", str(CHART), "-n", "jl-system",
                           *args], capture_output=True, text=True, timeout=120)


def test_an_older_kubernetes_is_refused_with_the_documented_message() -> None:
    refused = helm_template("--kube-version", "1.28.0")
    assert refused.returncode != 0 and refused.stdout == "", refused.stdout
    assert REFUSAL in refused.stderr, refused.stderr
    assert REFUSAL in (REPO_ROOT / "docs" / "helm.md").read_text().replace("\n", " ")


def test_the_oldest_supported_and_helms_own_default_render(tmp_path: Path) -> None:
    assert helm_template("--kube-version", "1.29.0").returncode == 0
    default = helm_template()
    assert default.returncode == 0, default.stderr
    # helm's default Kubernetes version is its release's stamp, not the unstamped v1.20
    probe = tmp_path / "probe"
    (probe / "templates").mkdir(parents=True)
    (probe / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (probe / "templates" / "v.yaml").write_text(
        "kubeVersion: {{ .Capabilities.KubeVersion.Version }}\n")
    shown = subprocess.run([helm_binary(), "template", "p", str(probe)],
                           capture_output=True, text=True, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert f"kubeVersion: {versions()['HELM_KUBE_VERSION']}.0" in shown.stdout, shown.stdout
