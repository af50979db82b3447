"""Doc blocks that need only the Kubernetes API, run by bash as written against the test
control plane (a real kube-apiserver; no kubelet or controller-manager, so objects are
stored and validated but no pod runs: what the pods then do is tests/cluster's).

- docs/helm.md's upgrade block ("CRDs: installed once, never upgraded by Helm"), after the
  install it follows (steps 1 and 2a of the install block, also as written): the CRDs
  applied server-side over the installed ones, and ``helm upgrade --reuse-values`` of
  release ``joblease`` in ``joblease-system`` deployed as revision 2;
- step 2b of the install (the operator against your own etcd), once the Secrets it names exist;
- docs/helm.md's opt-in block ("Sidecar injection webhook") and docs/fencing.md's ledger
  block ("In a cluster: the example ledger") in namespace ``team-a``, which both name.

kubectl and helm are the tests' pinned binaries, first on PATH (step 0 of the install,
which puts them there, is run by tests/support/release.py ``install_as_documented``)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.binaries import REPO_ROOT, helm_binary, kubectl_binary
from tests.support.cli import doc_block
from tests.support.controlplane import ControlPlane
from tests.support.release import HELM_DOC, documented_install_steps

pytestmark = pytest.mark.kube

FENCING_DOC = REPO_ROOT / "docs" / "fencing.md"


def _doc_env(cp: ControlPlane, tmp_path: Path) -> dict[str, str]:
    tools = [str(Path(kubectl_binary()).parent), str(Path(helm_binary()).parent)]
    env = {**os.environ, "KUBECONFIG": str(cp.kubeconfig),
           "PATH": os.pathsep.join([*tools, os.environ["PATH"]])}
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        env[var] = str(tmp_path / var.lower())
    return env


def _run_bash(script: str, env: dict[str, str], cwd: Path = REPO_ROOT
              ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def _bash(script: str, env: dict[str, str], cwd: Path = REPO_ROOT) -> str:
    done = _run_bash(script, env, cwd)
    assert done.returncode == 0, f"{script}\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def documented_release(control_plane: ControlPlane) -> Iterator[None]:
    """Release ``joblease`` in ``joblease-system``, as docs/helm.md names it; uninstalled
    afterwards (its webhook configuration is cluster-scoped). The namespace stays: no
    controller-manager runs to finalize its deletion."""
    yield
    control_plane.helm("uninstall", "joblease", "-n", "joblease-system")


def test_the_crd_upgrade_block_upgrades_the_documented_install(
        control_plane: ControlPlane, crds_installed: ControlPlane, documented_release: None,
        tmp_path: Path) -> None:
    steps = documented_install_steps()
    upgrade = doc_block(HELM_DOC, "sh", "CRDs: installed once, never upgraded by Helm")
    assert "helm upgrade joblease" in upgrade
    env = _doc_env(control_plane, tmp_path)
    _bash("\n".join(steps["1"] + steps["2a"]), env)
    _bash(upgrade, env)
    history = json.loads(_bash("helm history joblease -n joblease-system -o json", env))
    assert [(h["revision"], h["status"]) for h in history] == [
        (1, "superseded"), (2, "deployed")]
    for crd in ("jobleases", "jobqueues", "jobsemaphores"):
        managers = json.loads(control_plane.kubectl(
            "get", "crd", f"{crd}.joblease.io", "-o", "json", "--show-managed-fields",
            check=True).stdout
        )["metadata"]["managedFields"]
        assert any(m["manager"] == "kubectl" and m["operation"] == "Apply"
                   for m in managers), managers  # server-side, by step 1 and the block


@pytest.fixture
def team_a(control_plane: ControlPlane) -> Iterator[str]:
    """Namespace ``team-a``, which the blocks assume exists; the label and the ledger
    removed afterwards (the namespace itself cannot be finalized here)."""
    if control_plane.kubectl("get", "namespace", "team-a").returncode != 0:
        control_plane.kubectl("create", "namespace", "team-a", check=True)
    yield "team-a"
    control_plane.kubectl("label", "namespace", "team-a", "joblease.io/inject-")
    control_plane.kubectl("delete", "-n", "team-a", "-f",
                          str(REPO_ROOT / "examples" / "ledger.yaml"), "--wait=false")


def test_the_team_a_opt_in_and_ledger_blocks_apply_as_written(
        control_plane: ControlPlane, team_a: str, tmp_path: Path) -> None:
    opt_in = doc_block(HELM_DOC, "sh", "Sidecar injection webhook")
    ledger = doc_block(FENCING_DOC, "sh", "In a cluster: the example ledger")
    assert "team-a" in opt_in and "examples/ledger.yaml" in ledger
    env = _doc_env(control_plane, tmp_path)
    _bash(opt_in, env)
    _bash(ledger, env)
    labels = json.loads(control_plane.kubectl("get", "namespace", team_a, "-o", "json",
                                              check=True).stdout)["metadata"]["labels"]
    assert labels.get("joblease.io/inject") == "enabled"
    for kind in ("deployment", "service"):  # 'Deployment + Service "ledger"'
        control_plane.kubectl("get", kind, "ledger", "-n", team_a, check=True)


def test_the_own_etcd_install_step_installs_as_written(
        control_plane: ControlPlane, crds_installed: ControlPlane, documented_release: None,
        tmp_path: Path) -> None:
    """Step 2b of docs/helm.md's install, as written, once the two Secrets it names exist
    in ``joblease-system`` (the reader's own: the chart refuses a missing root Secret):
    the operator is given the two endpoints of the block's ``--set-json``."""
    step = "\n".join(documented_install_steps()["2b"])
    assert "--set etcd.enabled=false" in step
    cp = control_plane
    if cp.kubectl("get", "namespace", "joblease-system").returncode != 0:
        cp.kubectl("create", "namespace", "joblease-system", check=True)
    for secret, data in (("etcd-client-tls", ["ca.crt=-", "tls.crt=-", "tls.key=-"]),
                         ("etcd-credentials", ["username=root", "password=not-used-here"])):
        cp.kubectl("delete", "secret", secret, "-n", "joblease-system", "--ignore-not-found")
        cp.kubectl("create", "secret", "generic", secret, "-n", "joblease-system",
                   *[f"--from-literal={d}" for d in data], check=True)
    try:
        _bash(step, _doc_env(cp, tmp_path))
        deployment = json.loads(cp.kubectl(
            "get", "deployment", "joblease-joblease-operator", "-n", "joblease-system", "-o",
            "json", check=True).stdout)
    finally:
        for secret in ("etcd-client-tls", "etcd-credentials"):
            cp.kubectl("delete", "secret", secret, "-n", "joblease-system", "--ignore-not-found")
    env = {e["name"]: e.get("value")
           for e in deployment["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["JOBLEASE_ETCD_ENDPOINTS"] == "https://etcd-0.etcd:2379,https://etcd-1.etcd:2379"


def _crd_managers(cp: ControlPlane, crd: str) -> list[dict[str, Any]]:
    managers: list[dict[str, Any]] = json.loads(cp.kubectl(
        "get", "crd", crd, "-o", "json", "--show-managed-fields", check=True).stdout
    )["metadata"]["managedFields"]
    return managers


def test_the_crd_upgrade_block_takes_over_crds_that_helm_install_created(
        tmp_path: Path) -> None:
    """docs/helm.md's upgrade block, as written, where the reader skipped step 1 and
    ``helm install`` created the CRDs (so the API server records ``helm`` as their
    manager) and the chart's CRD has changed since: it applies the new CRD and
    upgrades. Without the block's ``--force-conflicts`` the same apply is refused as a
    conflict with ``helm``, which is why the block carries it.

    Its own control plane (API server and etcd): the shared one's CRDs were created
    by ``kubectl apply`` and other tests rely on them."""
    upgrade = doc_block(HELM_DOC, "sh", "CRDs: installed once, never upgraded by Helm")
    assert "--force-conflicts" in upgrade
    # the chart as it was: its JobLease CRD without the Holder printer column
    old = tmp_path / "old"
    chart = Path("charts") / "joblease-operator"
    shutil.copytree(REPO_ROOT / chart, old / chart)
    old_crd = old / chart / "crds" / "jobleases.joblease.io.yaml"
    holder = ("        - name: Holder\n          type: string\n"
              "          jsonPath: .status.holderIdentity\n")
    assert holder in old_crd.read_text()
    old_crd.write_text(old_crd.read_text().replace(holder, "", 1))
    crd = "jobleases.joblease.io"

    def columns(cp: ControlPlane) -> list[str]:
        obj = json.loads(cp.kubectl("get", "crd", crd, "-o", "json", check=True).stdout)
        return [c["name"] for c in obj["spec"]["versions"][0]["additionalPrinterColumns"]]

    with ControlPlane() as cp:
        env = _doc_env(cp, tmp_path)
        _bash("\n".join(documented_install_steps()["2a"]), env, cwd=old)  # no step 1
        assert "Holder" not in columns(cp)
        assert any(m["manager"] == "helm" for m in _crd_managers(cp, crd))

        unforced = _run_bash(upgrade.replace(" --force-conflicts", ""), env)
        assert unforced.returncode != 0 and "conflict" in unforced.stderr.lower(), (
            unforced.stdout, unforced.stderr)
        assert "Holder" not in columns(cp)  # refused whole: nothing changed

        _bash(upgrade, env)
        assert "Holder" in columns(cp)
        assert any(m["manager"] == "kubectl" and m["operation"] == "Apply"
                   for m in _crd_managers(cp, crd))
        history = json.loads(_bash("helm history joblease -n joblease-system -o json", env))
        assert [(h["revision"], h["status"]) for h in history] == [
            (1, "superseded"), (2, "deployed")]
