"""Isolation by default (issue 28), as the real helm renders it (no cluster:
``helm template``).

What is guaranteed with the chart's defaults: the bundled etcd gets a root user
whose Secret exists only in the release namespace and which the operator
connects with (and turns etcd auth on with); the workers' client certificate
names no etcd user and is only mounted into the operator, which copies it into
the tenant Secrets; injected sidecars mount the namespace's tenant Secret and
nothing of the release namespace; the operator may list/watch Namespaces and
touch only the tenant Secret's name. Configurations that cannot work are refused
naming the value, and nothing is rendered.
"""

from __future__ import annotations

import base64
import json
import subprocess
from typing import Any

import pytest
import yaml
from cryptography import x509

from tests.support.binaries import REPO_ROOT, helm_binary

CHART = REPO_ROOT / "charts" / "joblease-operator"
NS = "jl-system"
TENANT_SECRET = "joblease-etcd-credentials"


def helm_template(values: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    sets: list[str] = []
    for key, value in values.items():
        sets += ["--set-json", f"{key}={json.dumps(value)}"]
    return subprocess.run([helm_binary(), "template", "jl", str(CHART), "-n", NS, *sets],
                          capture_output=True, text=True, timeout=120)


def render(values: dict[str, Any]) -> list[dict[str, Any]]:
    result = helm_template(values)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind
              and (name is None or d["metadata"]["name"] == name)]
    return doc


def operator_pod(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(docs, "Deployment")["spec"]["template"]["spec"]
    return spec


def operator_env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in operator_pod(docs)["containers"][0]["env"]}


def test_defaults_run_the_bundled_etcd_with_auth_and_the_operator_as_root() -> None:
    docs = render({})
    root = one(docs, "Secret", "jl-etcd-root")
    assert root["metadata"]["namespace"] == NS
    assert base64.b64decode(root["data"]["username"]).decode() == "root"
    assert len(base64.b64decode(root["data"]["password"])) >= 32
    # kept on uninstall: a persistent etcd's root password must outlive the release
    assert root["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    env = operator_env(docs)
    assert env["JOBLEASE_ETCD_ENABLE_AUTH"] == "1"
    assert env["JOBLEASE_ETCD_USERNAME"] == {"secretKeyRef": {"name": "jl-etcd-root",
                                                              "key": "username"}}
    assert env["JOBLEASE_ETCD_PASSWORD_FILE"] == "/etc/joblease/etcd-auth/password"
    volumes = {v["name"]: v for v in operator_pod(docs)["volumes"]}
    assert volumes["etcd-auth"]["secret"]["secretName"] == "jl-etcd-root"
    # tenants on, following the webhook's opt-in label, with the workers' TLS files
    assert env["JOBLEASE_TENANT_CREDENTIALS"] == "1"
    assert env["JOBLEASE_TENANT_NAMESPACE_LABEL"] == "joblease.io/inject=enabled"
    assert env["JOBLEASE_TENANT_TLS_DIR"] == "/etc/joblease/worker-tls"
    assert env["JOBLEASE_TENANT_ROTATION_GRACE"] == "150"
    assert volumes["worker-tls"]["secret"]["secretName"] == "jl-etcd-worker-tls"


def test_no_secret_of_the_release_leaves_its_namespace() -> None:
    """The operator's full-access certificate and the root password stay in the
    release namespace; the workers' certificate names no etcd user (with auth on
    it grants nothing without the namespace's own password)."""
    docs = render({})
    secrets = [d for d in docs if d["kind"] == "Secret"]
    assert {d["metadata"]["namespace"] for d in secrets} == {NS}
    worker = one(docs, "Secret", "jl-etcd-worker-tls")
    cert = x509.load_pem_x509_certificate(base64.b64decode(worker["data"]["tls.crt"]))
    cn = cert.subject.get_attributes_for_oid(x509.oid.NameOID.COMMON_NAME)[0].value
    assert cn == "joblease-worker"
    client = one(docs, "Secret", "jl-etcd-client")
    assert worker["data"]["tls.crt"] != client["data"]["tls.crt"]
    assert worker["data"]["ca.crt"] == client["data"]["ca.crt"]


def test_injected_sidecars_mount_the_tenant_secret_only() -> None:
    docs = render({})
    settings = json.loads(one(docs, "ConfigMap", "jl-joblease-operator-injection")
                          ["data"]["settings.json"])
    assert settings["tenantCredentials"] is True
    assert settings["etcdTlsSecret"] == TENANT_SECRET


def test_operator_rbac_is_namespaces_read_and_the_tenant_secret_name() -> None:
    docs = render({})
    rules = [r for d in docs if d["kind"] in ("Role", "ClusterRole")
             for r in d.get("rules") or []]
    namespaces = [r for r in rules if "namespaces" in r["resources"]]
    assert namespaces == [{"apiGroups": [""], "resources": ["namespaces"],
                           "verbs": ["list", "watch"]}]
    secrets = [r for r in rules if "secrets" in r["resources"]]
    assert secrets == [
        {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
        {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [TENANT_SECRET],
         "verbs": ["get", "update", "delete"]}]


@pytest.mark.parametrize(("values", "message"), [
    ({"etcd.workerSecret.namespaces": ["team-a"]},
     "etcd.workerSecret.namespaces copies the operator's client certificate"),
    ({"etcd.bundledAuth": False},
     "tenantCredentials.enabled=true needs etcd auth: set etcd.bundledAuth=true"),
    ({"etcd.enabled": False, "etcd.endpoints": ["https://etcd.example:2379"]},
     "tenantCredentials.enabled=true with your own etcd (etcd.enabled=false) needs etcd "
     "auth on and the operator as root: set etcd.auth.secretName"),
    ({"etcd.certificates.serverSecretName": "s", "etcd.certificates.clientSecretName": "c"},
     "needs etcd.certificates.workerSecretName"),
    ({"webhook.namespaceSelector": {"matchLabels": {"a": "1", "b": "2"}}},
     "webhook.namespaceSelector.matchLabels needs exactly one label"),
], ids=["worker-secret-copies-with-auth", "tenants-without-bundled-auth",
        "tenants-with-own-etcd-without-root", "own-certificates-without-worker-certificate",
        "two-opt-in-labels"])
def test_configurations_that_cannot_isolate_are_refused_naming_the_value(
        values: dict[str, Any], message: str) -> None:
    result = helm_template(values)
    assert result.returncode != 0, result.stdout
    assert message in result.stderr, result.stderr
    assert result.stdout == ""  # nothing rendered


def test_the_unisolated_setup_stays_available_when_asked_for_explicitly() -> None:
    """Both switches off: the old copies of the client certificate, no auth."""
    docs = render({"etcd.bundledAuth": False, "tenantCredentials.enabled": False,
                   "etcd.workerSecret.namespaces": ["team-a"]})
    assert one(docs, "Secret", "joblease-etcd-client")["metadata"]["namespace"] == "team-a"
    env = operator_env(docs)
    assert "JOBLEASE_ETCD_ENABLE_AUTH" not in env and "JOBLEASE_TENANT_CREDENTIALS" not in env
    assert not [d for d in docs if d["metadata"]["name"] == "jl-etcd-root"]
