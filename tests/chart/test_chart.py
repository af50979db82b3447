"""The Helm chart against the real API server and the real helm binary.

What is guaranteed: the chart lints strictly; every documented values variant
renders to objects the API server accepts (server-side dry run, so admission
and schema validation run); an install creates the Deployment, RBAC and an
Established CRD; values.schema.json refuses bad values with a message that
names the field; ``helm uninstall`` leaves the CRD and existing JobLeases.
No kubelet runs here, so pods never start; that is expected.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.chart import CHART, helm_ok, release_name, set_args
from tests.support.controlplane import ControlPlane
from tests.support.waiting import wait_until

pytestmark = pytest.mark.kube

CRD_NAME = "jobleases.joblease.io"

# A minimal stand-in for prometheus-operator's ServiceMonitor CRD: enough for the
# API server to accept (and dry-run) a ServiceMonitor object.
SERVICE_MONITOR_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "servicemonitors.monitoring.coreos.com"},
    "spec": {
        "group": "monitoring.coreos.com", "scope": "Namespaced",
        "names": {"kind": "ServiceMonitor", "listKind": "ServiceMonitorList",
                  "plural": "servicemonitors", "singular": "servicemonitor"},
        "versions": [{"name": "v1", "served": True, "storage": True, "schema": {
            "openAPIV3Schema": {"type": "object", "properties": {"spec": {
                "type": "object", "x-kubernetes-preserve-unknown-fields": True}}}}}],
    },
}


# ----------------------------------------------------------------------------- helpers
def render(cp: ControlPlane, namespace: str, values: dict[str, Any], *extra: str
           ) -> list[dict[str, Any]]:
    out = helm_ok(cp, "template", release_name(namespace), str(CHART), "-n", namespace,
                  *set_args(values), *extra)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def deployment_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def install(cp: ControlPlane, namespace: str, values: dict[str, Any]) -> str:
    """``helm install`` without --wait: no kubelet runs, pods never become ready."""
    release = release_name(namespace)
    helm_ok(cp, "install", release, str(CHART), "-n", namespace, *set_args(values))
    return release


@pytest.fixture
def helm_release(control_plane: ControlPlane, namespace: str) -> Iterator[list[str]]:
    """Releases installed by the test are uninstalled afterwards (cluster-scoped RBAC too)."""
    releases: list[str] = []
    yield releases
    for release in releases:
        control_plane.helm("uninstall", release, "-n", namespace)


# ----------------------------------------------------------------------------- variants
def variants(namespace: str) -> dict[str, dict[str, Any]]:
    return {
        "default": {},
        "namespaced": {"scope": "namespaced", "watchNamespaces": [namespace, "default"]},
        "tls-and-auth": {"etcd.enabled": False,
                         "etcd.endpoints": ["https://etcd-0.etcd:2379", "https://etcd-1.etcd:2379"],
                         "etcd.tls.secretName": "etcd-client-tls",
                         "etcd.auth.secretName": "etcd-credentials",
                         "etcd.serverName": "etcd.example.internal"},
        "service-monitor": {"metrics.serviceMonitor.enabled": True,
                            "metrics.serviceMonitor.labels": {"release": "prometheus"}},
        "tenant-credentials": {"tenantCredentials.enabled": True, "etcd.enabled": False,
                               "etcd.endpoints": ["https://etcd.etcd.svc:2379"],
                               "etcd.auth.secretName": "etcd-root-credentials"},
        "existing-service-account-no-rbac": {"serviceAccount.create": False,
                                             "serviceAccount.name": "ops-sa",
                                             "rbac.create": False},
    }


VARIANTS = list(variants("x"))


# ----------------------------------------------------------------------------- tests
def test_chart_lints_clean_in_strict_mode(control_plane: ControlPlane) -> None:
    for values in variants("some-namespace").values():
        out = helm_ok(control_plane, "lint", "--strict", str(CHART), *set_args(values))
        assert "1 chart(s) linted, 0 chart(s) failed" in out, out
        assert "[WARNING]" not in out and "[ERROR]" not in out, out


@pytest.mark.parametrize("variant", VARIANTS)
def test_rendered_variant_is_accepted_by_the_api_server(
        crds_installed: ControlPlane, namespace: str, variant: str) -> None:
    cp = crds_installed
    values = variants(namespace)[variant]
    docs = render(cp, namespace, values, "--include-crds")
    kinds = sorted(d["kind"] for d in docs)
    if variant == "service-monitor":
        cp.kubectl("apply", "-f", "-", input=json.dumps(SERVICE_MONITOR_CRD), check=True)
        cp.kubectl("wait", "--for=condition=Established",
                   "crd/servicemonitors.monitoring.coreos.com", "--timeout=60s", check=True)
        assert "ServiceMonitor" in kinds
    else:
        assert "ServiceMonitor" not in kinds, "rendered although not enabled"
    stream = "\n---\n".join(yaml.safe_dump(d) for d in docs)
    applied = cp.kubectl("apply", "--dry-run=server", "-f", "-", input=stream)
    assert applied.returncode == 0, f"{applied.stderr}\n--- rendered ---\n{stream}"
    # the dry run saw each object (a typo in a kind would have failed above)
    assert applied.stdout.count("(server dry run)") == len(docs), applied.stdout


def test_deployment_runs_restricted_with_the_operator_flags(control_plane: ControlPlane,
                                                            namespace: str) -> None:
    docs = render(control_plane, namespace, variants(namespace)["tls-and-auth"])
    (deployment,) = by_kind(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "RollingUpdate",
                                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    c = deployment_container(docs)
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert isinstance(sc["runAsUser"], int) and sc["runAsUser"] != 0
    assert isinstance(sc["runAsGroup"], int) and sc["runAsGroup"] != 0
    assert {"name": "tmp", "mountPath": "/tmp"} in c["volumeMounts"]
    assert c["args"][0] == "operator" and "--all-namespaces" in c["args"]
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    env = {e["name"]: e for e in c["env"]}
    assert env["JOBLEASE_ETCD_ENDPOINTS"]["value"] == (
        "https://etcd-0.etcd:2379,https://etcd-1.etcd:2379")
    assert env["JOBLEASE_ETCD_CA_FILE"]["value"].startswith("/etc/joblease/etcd-tls/")
    assert env["JOBLEASE_ETCD_PASSWORD_FILE"]["value"] == "/etc/joblease/etcd-auth/password"
    assert "JOBLEASE_ETCD_PASSWORD" not in env, "the password must come as a file"
    assert env["JOBLEASE_ETCD_USERNAME"]["valueFrom"]["secretKeyRef"] == {
        "name": "etcd-credentials", "key": "username"}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    # and the injection webhook's serving certificate (webhook.enabled by default)
    webhook_tls = secrets.pop("webhook-tls")
    assert webhook_tls == f"{deployment['metadata']['name']}-webhook-tls"
    assert secrets == {"etcd-tls": "etcd-client-tls", "etcd-auth": "etcd-credentials"}
    for doc in docs:  # recommended labels on every object
        labels = doc["metadata"]["labels"]
        for key in ("app.kubernetes.io/name", "app.kubernetes.io/instance",
                    "app.kubernetes.io/version", "app.kubernetes.io/managed-by"):
            assert key in labels, (doc["kind"], key)


def test_operator_flags_in_the_chart_are_accepted_by_the_operator_cli(
        control_plane: ControlPlane, namespace: str) -> None:
    """The args the chart passes parse with the real ``joblease operator`` command."""
    from joblease.operator.command import operator_command

    for variant in ("default", "namespaced"):
        args = deployment_container(render(control_plane, namespace,
                                           variants(namespace)[variant]))["args"]
        assert args[0] == "operator"
        ctx = operator_command.make_context("operator", list(args[1:]))
        assert ctx.params["metrics_port"] == 8080
        assert ctx.params["leader_election"] is True
        assert ctx.params["leader_election_ttl"] == 10
        if variant == "namespaced":
            assert ctx.params["namespaces"] == (namespace, "default")
        else:
            assert ctx.params["all_namespaces"] is True


def test_replicas_get_a_disruption_budget_anti_affinity_and_the_election(
        control_plane: ControlPlane, namespace: str) -> None:
    """Several replicas: one active through the etcd election, a PDB that keeps one,
    preferred anti-affinity (a single-node cluster still schedules them)."""
    docs = render(control_plane, namespace, {"replicaCount": 3})
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["type"] == "RollingUpdate"
    args = deployment_container(docs)["args"]
    assert "--leader-election" in args and "--leader-election-ttl=10" in args
    selector = deployment["spec"]["selector"]["matchLabels"]
    (pdb,) = [d for d in by_kind(docs, "PodDisruptionBudget")
              if d["metadata"]["name"] == deployment["metadata"]["name"]]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    anti = deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname",
                                       "labelSelector": {"matchLabels": selector}}
    required = render(control_plane, namespace, {"replicaCount": 2,
                                                 "podAntiAffinity": "required"})
    (deployment,) = by_kind(required, "Deployment")
    assert "requiredDuringSchedulingIgnoredDuringExecution" in (
        deployment["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"])
    # One replica: no operator PDB (it would block every drain of the node), no rule.
    single = render(control_plane, namespace, {})
    assert [d["metadata"]["name"] for d in by_kind(single, "PodDisruptionBudget")] == [
        f"{release_name(namespace)}-etcd"]
    (deployment,) = by_kind(single, "Deployment")
    assert "affinity" not in deployment["spec"]["template"]["spec"]


def test_disabling_the_election_is_refused_with_replicas_or_a_rolling_update(
        control_plane: ControlPlane, namespace: str) -> None:
    off = {"operator.leaderElection.enabled": False}
    for values, message in (
            ({**off, "replicaCount": 2}, "it needs replicaCount 1"),
            (off, "needs strategy.type Recreate")):
        result = control_plane.helm("template", "x", str(CHART), *set_args(values))
        assert result.returncode != 0 and message in result.stderr, result.stderr
    docs = render(control_plane, namespace, {**off, "strategy": {"type": "Recreate"}})
    assert "--no-leader-election" in deployment_container(docs)["args"]


@pytest.mark.parametrize(("values", "message"), [
    ({"metrics.port": -1}, "at '/metrics/port': minimum: got -1, want 1"),
    ({"metrics.service.port": 70000}, "at '/metrics/service/port': maximum"),
    ({"scope": "galaxy"}, "at '/scope': value must be one of 'cluster', 'namespaced'"),
    ({"scope": "namespaced"}, "at '/watchNamespaces': minItems: got 0, want 1"),
    ({"watchNamespaces": ["team-*"]}, "at '/watchNamespaces/0'"),
    ({"etcd.enabled": False, "etcd.endpoints": []}, "at '/etcd/endpoints': minItems"),
    ({"replicaCount": 0}, "at '/replicaCount': minimum: got 0, want 1"),
    ({"operator.leaderElection.leaseDurationSeconds": 1},
     "at '/operator/leaderElection/leaseDurationSeconds': minimum: got 1, want 2"),
    ({"replicas": 2}, "additional properties 'replicas' not allowed"),
], ids=["negative-port", "port-too-large", "unknown-scope", "namespaced-without-namespaces",
        "glob-namespace", "no-etcd-endpoint", "no-replica", "election-ttl-too-short",
        "unknown-key"])
def test_values_schema_refuses_bad_values(control_plane: ControlPlane, values: dict[str, Any],
                                          message: str) -> None:
    result = control_plane.helm("template", "bad", str(CHART), *set_args(values))
    assert result.returncode != 0, result.stdout
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


def test_install_creates_the_operator_and_an_established_crd(
        control_plane: ControlPlane, namespace: str, helm_release: list[str]) -> None:
    cp = control_plane
    release = install(cp, namespace, {})
    helm_release.append(release)
    fullname = f"{release}-joblease-operator"
    deployment = json.loads(cp.kubectl("get", "deployment", fullname, "-n", namespace,
                                       "-o", "json", check=True).stdout)
    assert deployment["spec"]["template"]["spec"]["serviceAccountName"] == fullname
    for kind, name in (("serviceaccount", fullname), ("service", f"{fullname}-metrics")):
        cp.kubectl("get", kind, name, "-n", namespace, check=True)
    cluster_name = f"{fullname}-{namespace}"[:63].rstrip("-")
    for kind in ("clusterrole", "clusterrolebinding"):
        cp.kubectl("get", kind, cluster_name, check=True)
    waited = cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}",
                        "--timeout=60s")
    assert waited.returncode == 0, waited.stderr
    served = json.loads(cp.kubectl("get", "crd", CRD_NAME, "-o", "json", check=True).stdout)
    chart_crd = yaml.safe_load((CHART / "crds" / f"{CRD_NAME}.yaml").read_text())
    assert served["spec"]["versions"][0]["name"] == chart_crd["spec"]["versions"][0]["name"]
    status = json.loads(helm_ok(cp, "status", release, "-n", namespace, "-o", "json"))
    assert status["info"]["status"] == "deployed"
    notes = helm_ok(cp, "get", "notes", release, "-n", namespace)
    assert f"rollout status deployment/{fullname}" in notes, notes
    assert "kubectl apply --server-side" in notes and "Scope: cluster" in notes, notes


def test_uninstall_leaves_the_crd_and_existing_jobleases(
        control_plane: ControlPlane, namespace: str, tmp_path: Path) -> None:
    cp = control_plane
    release = install(cp, namespace, {})
    cp.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s",
               check=True)
    joblease = {"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
                "metadata": {"name": "survivor", "namespace": namespace},
                "spec": {"leaseDurationSeconds": 10}}
    cp.kubectl("apply", "-f", "-", input=json.dumps(joblease), check=True)

    helm_ok(cp, "uninstall", release, "-n", namespace, "--wait", "--timeout", "60s")

    fullname = f"{release}-joblease-operator"
    wait_until(lambda: "NotFound" in cp.kubectl(
        "get", "deployment", fullname, "-n", namespace).stderr, 30.0,
        "the Deployment to be gone", interval=0.2)
    assert cp.kubectl("get", "crd", CRD_NAME).returncode == 0, "helm uninstall removed the CRD"
    kept = cp.kubectl("get", "jobleases", "survivor", "-n", namespace, "-o", "json")
    assert kept.returncode == 0, kept.stderr
    assert json.loads(kept.stdout)["spec"]["leaseDurationSeconds"] == 10


def test_install_with_a_missing_etcd_root_secret_is_refused_naming_the_value(
        control_plane: ControlPlane, namespace: str) -> None:
    """Against a real API server (helm's lookup answers only there; ``helm template``
    cannot know): your own etcd with tenants needs the root credentials' Secret, and
    an install naming one that does not exist fails, creating nothing."""
    cp = control_plane
    values = {"etcd.enabled": False, "etcd.endpoints": ["https://etcd.example:2379"],
              "etcd.auth.secretName": "no-such-root-secret"}
    result = cp.helm("install", release_name(namespace), str(CHART), "-n", namespace,
                     *set_args(values))
    assert result.returncode != 0, result.stdout
    assert (f"etcd.auth.secretName: Secret no-such-root-secret does not exist in namespace "
            f"{namespace}") in result.stderr, result.stderr
    listed = cp.helm("list", "-n", namespace, "-q")
    assert release_name(namespace) not in listed.stdout
