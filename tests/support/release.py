"""A helm release of the chart in one namespace, driven by the real helm and kubectl.

Used by the cluster tests (tests/cluster/conftest.py gives the fixtures): each
release has private helm directories, so test runs never share helm state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

from tests.support.binaries import REPO_ROOT, helm_binary, kubectl_binary
from tests.support.cluster import Cluster
from tests.support.waiting import wait_until

#: The namespace label injection and tenants follow, and the tenant Secret's name.
INJECT_LABEL = "joblease.io/inject=enabled"
TENANT_SECRET = "joblease-etcd-credentials"

CHART = REPO_ROOT / "charts" / "joblease-operator"
# The members' data in an emptyDir: the test cluster has a default StorageClass,
# but its pool of local volumes is finite (tests/support/cluster/) and a volume is
# not reused once its claim goes, so only the tests about persistence claim one.
TEST_CLUSTER_VALUES = ["--set", "etcd.persistence.enabled=false"]
#: after TEST_CLUSTER_VALUES: one PersistentVolumeClaim per member, as by default
PERSISTENT_VALUES = ["--set", "etcd.persistence.enabled=true"]


class Release:
    """A helm release of the chart in one namespace (private helm dirs)."""

    def __init__(self, cluster: Cluster, namespace: str, helm_home: Path,
                 name: str = "jl") -> None:
        self.cluster = cluster
        self.namespace = namespace
        self.name = name
        # the chart's fullname: the release name alone when it contains the chart's name
        self.fullname = name if "joblease-operator" in name else f"{name}-joblease-operator"
        self.etcd = f"{self.name}-etcd"
        self.env = dict(os.environ, KUBECONFIG=str(cluster.kubeconfig))
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            self.env[var] = str(helm_home / var.lower())

    def helm(self, *args: str, timeout: float = 300) -> str:
        result = subprocess.run([helm_binary(), *args, "-n", self.namespace],
                                capture_output=True, text=True, timeout=timeout, env=self.env)
        assert result.returncode == 0, f"helm {args}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def kubectl(self, *args: str, timeout: float = 60) -> str:
        result = self.cluster.kubectl(*args, "-n", self.namespace, timeout=timeout)
        assert result.returncode == 0, f"kubectl {args}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def get(self, kind: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(self.kubectl("get", kind, name, "-o", "json"))
        return obj

    def diagnostics(self) -> str:
        out = self.cluster.kubectl("get", "all,jobleases", "-n", self.namespace, "-o", "wide")
        pods = self.cluster.kubectl("describe", "pods", "-n", self.namespace)
        logs = self.cluster.kubectl("logs", "-n", self.namespace, "--all-containers",
                                    "--prefix", "-l", "app.kubernetes.io/instance=jl",
                                    "--tail=40")
        return "\n".join((out.stdout, pods.stdout[-6000:], logs.stdout, logs.stderr))

    def wait_ready(self, timeout: float = 600) -> None:
        for kind, name in (("statefulset", self.etcd), ("deployment", self.fullname)):
            result = self.cluster.kubectl("rollout", "status", f"{kind}/{name}", "-n",
                                          self.namespace, f"--timeout={int(timeout)}s",
                                          timeout=timeout + 30)
            assert result.returncode == 0, (
                f"{kind}/{name} not ready: {result.stderr}\n{self.diagnostics()}")

    def operator_pod(self) -> dict[str, Any]:
        pods = json.loads(self.kubectl(
            "get", "pods", "-o", "json", "-l",
            f"app.kubernetes.io/name=joblease-operator,app.kubernetes.io/instance={self.name}"))
        running = [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]
        assert len(running) == 1, [p["metadata"]["name"] for p in pods["items"]]
        pod: dict[str, Any] = running[0]
        return pod

    def wait_registered(self, name: str, timeout: float = 300) -> dict[str, Any]:
        """Wait until the operator registered the JobLease in etcd (Pending + etcdRevision)."""
        def status() -> dict[str, Any] | None:
            st: dict[str, Any] = self.get("joblease", name).get("status") or {}
            if st.get("phase") == "Pending" and int(st.get("etcdRevision") or 0) > 0:
                return st
            return None
        try:
            found: dict[str, Any] = wait_until(status, timeout=timeout,
                                               what=f"JobLease {name} Pending", interval=1)
        except Exception as e:
            raise AssertionError(f"{e}\n{self.diagnostics()}") from e
        return found

    def apply_joblease(self, name: str) -> None:
        self.cluster.apply(json.dumps({
            "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3}}))

    def install(self, *values: str, timeout: float = 600) -> None:
        """``helm install`` with the test cluster's values plus ``values``, then wait
        until the etcd StatefulSet and the operator Deployment are ready."""
        self.helm("install", self.name, str(CHART), *TEST_CLUSTER_VALUES, *values)
        self.wait_ready(timeout)

    def uninstall(self, *namespaces: str) -> None:
        """``helm uninstall`` (waiting), then drop the finalizers the JobLeases of the
        release's namespace and of ``namespaces`` keep once the operator is gone
        (docs/helm.md), so that those namespaces can go away."""
        subprocess.run([helm_binary(), "uninstall", self.name, "-n", self.namespace, "--wait",
                        "--timeout", "120s"], capture_output=True, text=True, timeout=180,
                       env=self.env)
        for ns in (self.namespace, *namespaces):
            self.cluster.kubectl("patch", "jobleases", "--all", "-n", ns, "--type=merge",
                                 "-p", '{"metadata":{"finalizers":null}}')

    def opt_in(self, namespace: str, timeout: float = 120) -> None:
        """Label ``namespace`` for injection (the chart's default opt-in) and wait for
        the tenant Secret the operator makes there: the namespace's own etcd user and
        the workers' TLS files, what examples/worker-pod.yaml mounts. Nothing else
        is needed (no copy of the release's certificate)."""
        self.cluster.kubectl("label", "namespace", namespace, INJECT_LABEL, "--overwrite",
                             check=True)
        self.wait_tenant_secret(namespace, timeout)

    def wait_tenant_secret(self, namespace: str, timeout: float = 120) -> None:
        """Wait for the tenant Secret the operator makes in an opted-in namespace."""
        wait_until(lambda: self.cluster.kubectl("get", "secret", TENANT_SECRET, "-n",
                                                namespace).returncode == 0,
                   timeout=timeout, what=f"the tenant Secret in {namespace}", interval=0.5)


#: docs/helm.md: its first ``sh`` block is the install a newcomer copies
HELM_DOC = REPO_ROOT / "docs" / "helm.md"


def documented_install_steps() -> dict[str, list[str]]:
    """The commands of docs/helm.md's first ``sh`` block, by the step each comment
    heading names (``# 0.``, ``# 1.``, ``# 2a.``, ...), comments left out."""
    block = HELM_DOC.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    steps: dict[str, list[str]] = {}
    current = ""
    for line in block.splitlines():
        heading = re.match(r"# (\w+)\. ", line)
        if heading:
            current = heading.group(1)
            steps[current] = []
        elif line.strip() and not line.lstrip().startswith("#"):
            assert current, f"a command before the first step heading: {line}"
            steps[current].append(line)  # a trailing comment is bash's to drop
    return steps


def install_as_documented(rel: Release, timeout: float = 600) -> None:
    """Run docs/helm.md's install as written, with bash in the repository: step 0
    (the pinned kubectl and helm on PATH), 1 (the CRDs), 2a (the operator with the
    chart's own etcd, the chart's defaults) and 3 (opt ``default`` in); then wait until
    the release is ready and the operator made the tenant Secret in ``default``.

    Step 0's first line, ``python3 -m venv .venv && pip install -e '.[test]'``, is left
    out: the test already runs in that virtualenv (hack/test made it), and a reinstall
    under the running tests would change their own packages. That its PATH line then
    finds the very kubectl and helm the tests use is checked."""
    assert (rel.name, rel.namespace) == ("joblease", "joblease-system"), (
        "docs/helm.md installs release joblease in joblease-system")
    steps = documented_install_steps()
    assert steps["0"][0].startswith("python3 -m venv .venv"), steps["0"]
    commands = steps["0"][1:] + steps["1"] + steps["2a"] + steps["3"]
    script = "set -euo pipefail\n" + "\n".join(commands) + "\ncommand -v kubectl helm\n"
    result = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=rel.env,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, (
        f"docs/helm.md's install failed:\n{script}\n{result.stdout}\n{result.stderr}")
    # the same files, however reached: a worktree's .venv may be a link to the main one
    found = [os.path.realpath(p) for p in result.stdout.strip().splitlines()[-2:]]
    assert found == [os.path.realpath(p) for p in (kubectl_binary(), helm_binary())], (
        f"docs/helm.md's PATH finds {found}, the tests use "
        f"{[kubectl_binary(), helm_binary()]}")
    rel.wait_ready(timeout)
    rel.wait_tenant_secret("default")
