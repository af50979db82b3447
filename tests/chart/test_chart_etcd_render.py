"""The chart's bundled etcd, rendered by the real helm (no cluster: ``helm template``).

What is guaranteed: 1 or 3 members get the matching ``--initial-cluster`` and
quorum PodDisruptionBudget, TLS on the client and peer ports, probes on the
plain-HTTP metrics listener, the restricted security context with the data dir
on the volume; the operator's endpoints and client certificate point at the
members; ``etcd.enabled=false`` renders no etcd object and needs
``etcd.endpoints``; the schema and the templates refuse bad values clearly.
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest
import yaml

from tests.support.binaries import REPO_ROOT, helm_binary

CHART = REPO_ROOT / "charts" / "joblease-operator"
NS = "jl-system"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm_binary(), "template", "jl", str(CHART), "-n", NS, *args],
                          capture_output=True, text=True, timeout=120)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    result = helm_template(*args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind
              and (name is None or d["metadata"]["name"] == name)]
    return doc


def flags(container: dict[str, Any]) -> dict[str, str]:
    return dict(a.split("=", 1) for a in container["args"])


def operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    deployment = one(docs, "Deployment")
    return {e["name"]: e.get("value") for e in
            deployment["spec"]["template"]["spec"]["containers"][0]["env"]}


@pytest.mark.parametrize("replicas", [1, 3])
def test_members_initial_cluster_and_quorum(replicas: int) -> None:
    docs = render({"etcd.replicas": replicas})
    sts = one(docs, "StatefulSet", "jl-etcd")
    assert sts["spec"]["replicas"] == replicas
    assert sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "jl-etcd-peer"
    (etcd,) = sts["spec"]["template"]["spec"]["containers"]
    f = flags(etcd)
    peer = "jl-etcd-peer.jl-system.svc.cluster.local"
    assert f["--initial-cluster"] == ",".join(
        f"jl-etcd-{i}=https://jl-etcd-{i}.{peer}:2380" for i in range(replicas))
    assert f["--name"] == "$(POD_NAME)"
    assert f["--initial-advertise-peer-urls"] == f"https://$(POD_NAME).{peer}:2380"
    assert f["--advertise-client-urls"] == f"https://$(POD_NAME).{peer}:2379"
    assert f["--client-cert-auth"] == "true" and f["--peer-client-cert-auth"] == "true"
    assert f["--listen-metrics-urls"] == "http://0.0.0.0:2381"
    for probe, path in (("startupProbe", "/livez"), ("livenessProbe", "/livez"),
                        ("readinessProbe", "/readyz")):
        assert etcd[probe]["httpGet"] == {"path": path, "port": "metrics"}
    # the operator is given every member, over TLS, with the client certificate
    env = operator_env(docs)
    assert env["JOBLEASE_ETCD_ENDPOINTS"] == ",".join(
        f"https://jl-etcd-{i}.{peer}:2379" for i in range(replicas))
    assert env["JOBLEASE_ETCD_CERT_FILE"] == "/etc/joblease/etcd-tls/tls.crt"
    deployment = one(docs, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["etcd-tls"]["secret"]["secretName"] == "jl-etcd-client"
    pdb = one(docs, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == replicas // 2 + 1
    assert pdb["spec"]["selector"]["matchLabels"] == (
        sts["spec"]["selector"]["matchLabels"])


def test_members_run_restricted_with_data_on_the_volume() -> None:
    docs = render({})
    sts = one(docs, "StatefulSet")
    pod = sts["spec"]["template"]["spec"]
    (etcd,) = pod["containers"]
    assert etcd["image"] == "gcr.io/etcd-development/etcd:v3.6.16"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 65532
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = etcd["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert flags(etcd)["--data-dir"] == "/var/lib/etcd/data"
    # generated passwords only: the cheapest bcrypt etcd accepts (values.yaml says why)
    assert flags(etcd)["--bcrypt-cost"] == "4"
    (raised,) = one(render({"etcd.bcryptCost": 12}), "StatefulSet")["spec"]["template"][
        "spec"]["containers"]
    assert flags(raised)["--bcrypt-cost"] == "12"
    assert {"name": "data", "mountPath": "/var/lib/etcd"} in etcd["volumeMounts"]
    # persistence by default: a claim per member, no emptyDir
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "data"
    assert claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert "data" not in {v["name"] for v in pod["volumes"]}
    off = one(render({"etcd.persistence.enabled": False}), "StatefulSet")
    assert "volumeClaimTemplates" not in off["spec"]
    assert {"name": "data", "emptyDir": {}} in off["spec"]["template"]["spec"]["volumes"]
    # the member pods are not selected by the operator's Service or Deployment
    service = one(docs, "Service", "jl-joblease-operator-metrics")
    labels = sts["spec"]["template"]["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in service["spec"]["selector"].items())
    headless = one(docs, "Service", "jl-etcd-peer")
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True


def test_generated_certificates_cover_the_member_and_service_names() -> None:
    from cryptography import x509

    docs = render({})
    server = one(docs, "Secret", "jl-etcd-server-tls")["data"]
    client = one(docs, "Secret", "jl-etcd-client")["data"]
    assert server["ca.crt"] == client["ca.crt"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(server["tls.crt"]))
    names = cert.extensions.get_extension_for_class(
        x509.SubjectAlternativeName).value.get_values_for_type(x509.DNSName)
    assert "*.jl-etcd-peer.jl-system.svc.cluster.local" in names
    assert "jl-etcd.jl-system.svc" in names and "jl-etcd" in names
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert x509.oid.ExtendedKeyUsageOID.SERVER_AUTH in usage
    assert x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH in usage  # peer TLS


def test_worker_secret_copies_go_to_the_listed_namespaces() -> None:
    docs = render({"etcd.workerSecret.namespaces": ["team-a", "team-b"],
                   # only without isolation (tests/chart/test_chart_isolation.py)
                   "etcd.bundledAuth": False, "tenantCredentials.enabled": False})
    copies = [d for d in docs if d["kind"] == "Secret"
              and d["metadata"]["name"] == "joblease-etcd-client"]
    assert sorted(d["metadata"]["namespace"] for d in copies) == ["team-a", "team-b"]
    client = one(docs, "Secret", "jl-etcd-client")
    assert all(d["data"] == client["data"] for d in copies)


def test_user_supplied_certificate_secrets_are_used_and_none_generated() -> None:
    docs = render({"etcd.certificates.serverSecretName": "my-etcd-server",
                   "etcd.certificates.clientSecretName": "my-etcd-client",
                   "etcd.certificates.workerSecretName": "my-etcd-worker"})
    # (the injection webhook's serving certificate is not an etcd one, nor the root
    # user's password)
    assert not [d for d in docs if d["kind"] == "Secret"
                and not d["metadata"]["name"].endswith(("-webhook-tls", "-etcd-root"))]
    sts = one(docs, "StatefulSet")
    volumes = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert volumes["tls"]["secret"]["secretName"] == "my-etcd-server"
    deployment = one(docs, "Deployment")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["etcd-tls"]["secret"]["secretName"] == "my-etcd-client"
    assert volumes["worker-tls"]["secret"]["secretName"] == "my-etcd-worker"


def test_own_etcd_renders_no_etcd_objects() -> None:
    docs = render({"etcd.enabled": False, "etcd.endpoints": ["https://etcd.example:2379"],
                   "etcd.tls.secretName": "mine", "tenantCredentials.enabled": False})
    etcd_objects = [(d["kind"], d["metadata"]["name"]) for d in docs
                    if d["metadata"].get("labels", {}).get("app.kubernetes.io/component")
                    == "etcd" or "etcd" in d["metadata"]["name"]]
    assert etcd_objects == []
    # the one Secret left is the injection webhook's serving certificate
    kinds = {d["kind"] for d in docs if not d["metadata"]["name"].endswith("-webhook-tls")}
    assert not kinds & {"StatefulSet", "PodDisruptionBudget", "Secret"}
    env = operator_env(docs)
    assert env["JOBLEASE_ETCD_ENDPOINTS"] == "https://etcd.example:2379"


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "etcd.replicas=2"], "at '/etcd/replicas': value must be one of 1, 3"),
    (["--set", "etcd.enabled=false"], "at '/etcd/endpoints': minItems: got 0, want 1"),
    (["--set", "etcd.persistence.size=lots"], "at '/etcd/persistence/size'"),
    (["--set", "etcd.workerSecret.namespaces[0]=Team_A"],
     "at '/etcd/workerSecret/namespaces/0'"),
    (["--set", "etcd.bogus=1"], "additional properties 'bogus' not allowed"),
    (["--set", "etcd.bcryptCost=3"], "at '/etcd/bcryptCost': minimum: got 3, want 4"),
    (["--set", "etcd.bcryptCost=32"], "at '/etcd/bcryptCost': maximum: got 32, want 31"),
], ids=["two-members", "own-etcd-without-endpoints",
        "bad-size", "bad-namespace", "unknown-key", "bcrypt-too-low", "bcrypt-too-high"])
def test_schema_refuses_bad_values(args: list[str], message: str) -> None:
    result = helm_template(*args)
    assert result.returncode != 0, result.stdout
    assert "values don't meet the specifications of the schema" in result.stderr, result.stderr
    assert message in result.stderr, result.stderr


@pytest.mark.parametrize(("args", "message"), [
    (["--set", "etcd.certificates.serverSecretName=only-server"],
     "set both serverSecretName and clientSecretName"),
    # an upgrade of a release that named its own etcd never switches etcd silently
    (["--set-json", 'etcd.endpoints=["etcd.etcd.svc:2379"]'],
     "etcd.endpoints is for your own etcd: set etcd.enabled=false with it"),
    (["--set", "etcd.tls.secretName=mine"], "etcd.tls is for your own etcd"),
], ids=["half-supplied-certificates", "endpoints-with-bundled-etcd", "tls-with-bundled-etcd"])
def test_templates_refuse_contradicting_etcd_values(args: list[str], message: str) -> None:
    result = helm_template(*args)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr
