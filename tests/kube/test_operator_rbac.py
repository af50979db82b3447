"""The chart's RBAC is sufficient and minimal, proven with the operator's own identity.

The chart is installed (scope: namespaced); the operator then runs as a real
process authenticated as the chart's ServiceAccount (a TokenRequest token),
with the exact args and env of the installed Deployment. It must take a
JobLease through its whole life (registration, claim, completion, delete with
the finalizer released and the etcd keys removed) without one forbidden
request. ``kubectl auth can-i`` then shows what it may not do.

A cluster-scoped operator is not run as a process here: it would put its
finalizer on every other test's JobLeases in this shared API server. Its
ClusterRole is checked with ``can-i`` instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from joblease import EtcdConfig, JobLeaseClient, JobRef
from tests.support.chart import CHART, helm_ok, release_name, set_args
from tests.support.controlplane import ControlPlane
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for

pytestmark = pytest.mark.kube

# ----------------------------------------------------------------------------- helpers
def installed_deployment(cp: ControlPlane, namespace: str, release: str) -> dict[str, Any]:
    """The Deployment as helm installed it (``helm get manifest``), not a re-render."""
    manifest = helm_ok(cp, "get", "manifest", release, "-n", namespace)
    (deployment,) = [d for d in yaml.safe_load_all(manifest)
                     if d and d["kind"] == "Deployment"]
    return dict(deployment)


def token_kubeconfig(cp: ControlPlane, namespace: str, sa: str, path: Path) -> Path:
    """A kubeconfig with a TokenRequest token for an *existing* ServiceAccount (the
    chart's). ``ControlPlane.service_account_kubeconfig`` creates the account first
    and does not yet recognise kubectl's "already exists" message."""
    token = cp.kubectl("create", "token", sa, "-n", namespace, "--duration=1h",
                       check=True).stdout.strip()
    view = cp.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json",
                      check=True)
    cluster = json.loads(view.stdout)["clusters"][0]["cluster"]
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "test", "cluster": cluster}],
        "users": [{"name": sa, "user": {"token": token}}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": sa}}],
        "current-context": "test",
    }))
    path.chmod(0o600)
    return path


def can_i(cp: ControlPlane, sa: str, *what: str) -> str:
    result = cp.kubectl("auth", "can-i", *what, f"--as={sa}")
    assert result.stdout.strip() in ("yes", "no"), result.stdout + result.stderr
    return result.stdout.strip()


class ChartOperator(OperatorProcess):
    """The operator started with the installed Deployment's args and env."""

    def __init__(self, cp: ControlPlane, etcd: EtcdConfig, namespace: str, log: Path,
                 container: dict[str, Any], kubeconfig: Path) -> None:
        super().__init__(cp, etcd, namespace, log)
        args = list(container["args"])
        assert args[0] == "operator", args  # the image's ENTRYPOINT is `joblease`
        # --webhook-*: the injection webhook needs its mounted certificate and settings,
        # which a local process lacks; it is tested on the cluster (test_injection.py)
        self.argv = [self._local(a) for a in args[1:] if not a.startswith("--webhook-")]
        values = {e["name"]: e["value"] for e in container["env"] if "value" in e}
        inherited = {k: v for k, v in os.environ.items()
                     if not k.startswith(("JOBLEASE_", "KUBERNETES_"))}
        self.env = {**inherited, **values, "KUBECONFIG": str(kubeconfig)}

    def _local(self, arg: str) -> str:
        """Only where to listen changes: loopback and a free port instead of 0.0.0.0:8080."""
        if arg.startswith("--metrics-host="):
            return "--metrics-host=127.0.0.1"
        if arg.startswith("--metrics-port="):
            return f"--metrics-port={self.port}"
        return arg

    def start(self) -> ChartOperator:
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"===== operator {' '.join(self.argv)} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "joblease.operator", *self.argv], env=self.env,
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self


@pytest.fixture
def release(crds_installed: ControlPlane, namespace: str, etcd_config: EtcdConfig
            ) -> Iterator[str]:
    cp = crds_installed
    name = release_name(namespace)
    helm_ok(cp, "install", name, str(CHART), "-n", namespace, *set_args({
        "scope": "namespaced", "watchNamespaces": [namespace], "etcd.enabled": False,
        "etcd.endpoints": list(etcd_config.endpoints), "etcd.root": etcd_config.root,
        "operator.watchTimeoutSeconds": 60,
        # this etcd has no auth: tenants could not work (the chart refuses them)
        "tenantCredentials.enabled": False,
    }))
    yield name
    cp.helm("uninstall", name, "-n", namespace)


@pytest.fixture
async def chart_operator(crds_installed: ControlPlane, namespace: str, release: str,
                         etcd_config: EtcdConfig, tmp_path: Path,
                         request: pytest.FixtureRequest) -> AsyncIterator[ChartOperator]:
    cp = crds_installed
    deployment = installed_deployment(cp, namespace, release)
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    # A TokenRequest token for the chart's ServiceAccount (it exists already).
    kubeconfig = token_kubeconfig(cp, namespace, pod["serviceAccountName"],
                                  tmp_path / "operator.kubeconfig")
    op = ChartOperator(cp, etcd_config, namespace, tmp_path / "operator.log", container,
                       kubeconfig)
    async with running_operator(op, request) as running:
        yield running


# How a refused request shows in the operator's log: our KubeApi raises "HTTP 403: ...",
# kopf raises APIForbiddenError, aiohttp prints "403, message='Forbidden'", kopf's
# own RBAC self-check says "Not enough permissions". A bare "403" is not matched: it
# also turns up in log timestamps (",403") and revisions, which once failed CI.
FORBIDDEN = ("HTTP 403", "403, message", "orbidden", "Not enough permissions")


def forbidden_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if any(sign in line for sign in FORBIDDEN)]


# ----------------------------------------------------------------------------- tests
def test_forbidden_lines_finds_refusals_and_not_timestamps_or_revisions() -> None:
    log = "\n".join([
        "2026-12-03 13:32:49,403 INFO kopf.objects: registered ns/nightly in etcd (revision 2669)",
        "2026-12-03 13:32:50,001 INFO kopf.objects: registered ns/other in etcd (revision 14030)",
        "2026-12-03 13:32:51,000 ERROR joblease: HTTP 403: events is forbidden: User ...",
        "kopf._cogs.clients.errors.APIForbiddenError: ('jobleases.joblease.io is forbidden', {})",
        "aiohttp.client_exceptions.ClientResponseError: 403, message='Forbidden', url=...",
        "2026-12-03 13:32:52,000 WARNING kopf.activities: Not enough permissions to watch",
    ])
    assert forbidden_lines(log) == log.splitlines()[2:]


async def test_operator_with_the_chart_rbac_runs_a_joblease_through_its_life(
        crds_installed: ControlPlane, namespace: str, chart_operator: ChartOperator,
        client: JobLeaseClient) -> None:
    kube = Kube(crds_installed, namespace)  # a user with admin rights applies JobLeases
    job = JobRef(namespace, "nightly")
    await kube.apply("nightly", {"leaseDurationSeconds": 10, "maxAttempts": 3})

    async def registered() -> bool:
        return (await client.get(job)).registered
    await wait_for("registration in etcd", registered)
    await kube.status_where("nightly", "Pending", lambda s: s["phase"] == "Pending")

    lease = await client.claim(job, "worker-a")
    s = await kube.status_where("nightly", "Claimed", lambda s: s["phase"] == "Claimed")
    assert (s["holderIdentity"], s["fencingToken"], s["generation"]) == (
        "worker-a", lease.token, lease.generation)

    await lease.complete({"rows": 7})
    s = await kube.status_where("nightly", "Completed", lambda s: s["phase"] == "Completed")
    assert s["result"] == {"rows": 7} and s["fencingToken"] == lease.token

    async def events_posted() -> list[str] | None:
        reasons = await kube.event_reasons("nightly")
        return reasons if {"Claimed", "Completed"} <= set(reasons) else None
    await wait_for("Claimed and Completed events (events create)", events_posted)

    obj = await kube.get("nightly")
    assert obj is not None and "joblease.io/finalizer" in obj["metadata"]["finalizers"]
    deleted = await kube.run("delete", "jl", "nightly", "--wait=false")
    assert deleted.returncode == 0, deleted.stderr

    async def gone() -> bool:
        return await kube.get("nightly") is None
    await wait_for("the JobLease to be gone (finalizer released)", gone)

    async def keys_removed() -> bool:
        _, kvs = await client.store.get(client.keys.job(job).prefix, prefix=True,
                                        keys_only=True)
        return not kvs
    await wait_for("the job's etcd keys to be removed", keys_removed)

    assert chart_operator.proc is not None and chart_operator.proc.poll() is None
    assert not forbidden_lines(chart_operator.log_tail(2000)), "\n".join(
        forbidden_lines(chart_operator.log_tail(2000)))


def test_namespaced_operator_cannot_reach_beyond_its_grants(
        crds_installed: ControlPlane, namespace: str, release: str) -> None:
    cp = crds_installed
    sa = f"system:serviceaccount:{namespace}:{release}-joblease-operator"
    granted = [
        ("list", "jobleases.joblease.io", "-n", namespace),
        ("watch", "jobleases.joblease.io", "-n", namespace),
        ("patch", "jobleases.joblease.io", "-n", namespace),
        ("update", "jobleases.joblease.io", "--subresource=status", "-n", namespace),
        # JobSemaphores: kopf's handlers (finalizer) and the status refresher
        ("watch", "jobsemaphores.joblease.io", "-n", namespace),
        ("patch", "jobsemaphores.joblease.io", "-n", namespace),
        ("update", "jobsemaphores.joblease.io", "--subresource=status", "-n", namespace),
        ("create", "events", "-n", namespace),
        ("patch", "events", "-n", namespace),  # a repeat's count (event_recorder)
        ("watch", "customresourcedefinitions.apiextensions.k8s.io"),
        # kopf matches its namespace list against the cluster's namespaces
        ("list", "namespaces"),
        ("watch", "namespaces"),
    ]
    for what in granted:
        assert can_i(cp, sa, *what) == "yes", what
    refused = [
        ("list", "secrets", "--all-namespaces"),
        ("get", "secrets", "-n", namespace),
        ("get", "secrets/other", "-n", namespace),
        # this release's etcd needs no client Secret (no TLS), so the webhook's
        # missing-Secret check has no name to read: no Secret at all is granted
        ("get", "secrets/joblease-etcd-client", "-n", namespace),
        ("get", "secrets/joblease-etcd-client", "-n", "default"),  # not a watched namespace
        ("delete", "pods", "-n", namespace),
        ("create", "deployments.apps", "-n", namespace),
        ("create", "pods", "-n", namespace),
        ("list", "jobleases.joblease.io", "-n", "default"),  # not a watched namespace
        ("list", "jobleases.joblease.io", "--all-namespaces"),
        ("delete", "jobleases.joblease.io", "-n", namespace),
        ("create", "jobleases.joblease.io", "-n", namespace),
        ("delete", "jobsemaphores.joblease.io", "-n", namespace),
        ("create", "jobsemaphores.joblease.io", "-n", namespace),
        ("list", "jobsemaphores.joblease.io", "-n", "default"),  # not a watched namespace
        ("get", f"namespaces/{namespace}"),
        ("delete", "namespaces"),
        ("update", "customresourcedefinitions.apiextensions.k8s.io"),
        ("create", "clusterroles.rbac.authorization.k8s.io"),
    ]
    for what in refused:
        assert can_i(cp, sa, *what) == "no", what


def test_cluster_scope_rbac_grants_jobleases_everywhere_and_nothing_else(
        crds_installed: ControlPlane, namespace: str) -> None:
    cp = crds_installed
    name = release_name(namespace)
    helm_ok(cp, "install", name, str(CHART), "-n", namespace)
    try:
        sa = f"system:serviceaccount:{namespace}:{name}-joblease-operator"
        for ns in (namespace, "default", "kube-system"):
            for verb in ("get", "list", "watch", "patch"):
                assert can_i(cp, sa, verb, "jobleases.joblease.io", "-n", ns) == "yes"
            assert can_i(cp, sa, "update", "jobleases.joblease.io", "--subresource=status",
                         "-n", ns) == "yes"
            assert can_i(cp, sa, "create", "events", "-n", ns) == "yes"
            assert can_i(cp, sa, "patch", "events", "-n", ns) == "yes"
            # the defaults: per-namespace tenants, whose one Secret name the operator
            # creates, reads, replaces and deletes (and the webhook looks up)
            for verb in ("get", "update", "delete"):
                assert can_i(cp, sa, verb, "secrets/joblease-etcd-credentials",
                             "-n", ns) == "yes"
            assert can_i(cp, sa, "create", "secrets", "-n", ns) == "yes"
            assert can_i(cp, sa, "get", "secrets/joblease-etcd-client", "-n", ns) == "no"
            assert can_i(cp, sa, "get", "secrets/other", "-n", ns) == "no"
            # the slot webhook reads a CronJob's last slot (a Job made from it by hand)
            assert can_i(cp, sa, "get", "cronjobs.batch", "-n", ns) == "yes"
            for verb in ("list", "watch", "update"):
                assert can_i(cp, sa, verb, "cronjobs.batch", "-n", ns) == "no"
            assert can_i(cp, sa, "get", "jobs.batch", "-n", ns) == "no"
        assert can_i(cp, sa, "list", "jobleases.joblease.io", "--all-namespaces") == "yes"
        for what in [("list", "secrets", "--all-namespaces"),
                     ("delete", "pods", "-n", namespace),
                     ("create", "deployments.apps", "-n", namespace),
                     ("delete", "jobleases.joblease.io", "-n", "default"),
                     ("delete", "events", "-n", namespace),
                     ("get", "namespaces/default"),
                     ("update", "namespaces"),
                     ("delete", "customresourcedefinitions.apiextensions.k8s.io")]:
            assert can_i(cp, sa, *what) == "no", what
        # tenants follow the injection label: Namespaces are listed and watched
        assert can_i(cp, sa, "list", "namespaces") == "yes"
        assert can_i(cp, sa, "watch", "namespaces") == "yes"
        rendered = json.loads(cp.kubectl("get", "clusterrole", "-l",
                                         f"app.kubernetes.io/instance={name}", "-o",
                                         "json", check=True).stdout)
        assert len(rendered["items"]) == 2  # JobLeases + CRD discovery, nothing else
    finally:
        cp.helm("uninstall", name, "-n", namespace)
