"""The chart's refusals and rules around injection, rendered by the real helm (no
cluster: ``helm template``).

What is guaranteed: tenant credentials without etcd auth (every injected
sidecar's claim would fail) are refused at render time naming the values; the
operator may read the one etcd client Secret name injected pods mount (the
webhook warns when it is missing), and no other Secret.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import yaml

from tests.support.binaries import REPO_ROOT, helm_binary

CHART = REPO_ROOT / "charts" / "joblease-operator"
NS = "jl-system"
OWN_ETCD = {"etcd.enabled": False, "etcd.endpoints": ["https://etcd.example:2379"],
            "etcd.auth.secretName": "etcd-root"}


def helm_template(values: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    sets: list[str] = []
    for key, value in values.items():
        sets += ["--set-json", f"{key}={json.dumps(value)}"]
    return subprocess.run([helm_binary(), "template", "jl", str(CHART), "-n", NS, *sets, *args],
                          capture_output=True, text=True, timeout=120)


def render(values: dict[str, Any], *args: str) -> list[dict[str, Any]]:
    result = helm_template(values, *args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def secret_rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [rule for d in docs if d["kind"] in ("Role", "ClusterRole")
            for rule in d.get("rules") or [] if "secrets" in rule["resources"]]


def test_tenant_credentials_without_etcd_auth_are_refused_naming_the_values() -> None:
    result = helm_template({"etcd.bundledAuth": False})
    assert result.returncode != 0
    assert ("tenantCredentials.enabled=true needs etcd auth: set etcd.bundledAuth=true"
            in result.stderr), result.stderr
    assert result.stdout == ""  # nothing rendered
    docs = render({"tenantCredentials.enabled": True, **OWN_ETCD})
    assert any(d["kind"] == "Deployment" for d in docs)


#: The setup without isolation (no etcd auth, no tenants): asked for explicitly.
UNISOLATED = {"etcd.bundledAuth": False, "tenantCredentials.enabled": False}
TENANT_RULES = [
    {"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["secrets"],
     "resourceNames": ["joblease-etcd-credentials"], "verbs": ["get", "update", "delete"]}]


def test_the_operator_may_read_only_the_etcd_client_secret_injected_pods_mount() -> None:
    get_only = {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get"]}
    # the defaults: the tenant Secret is the one injected pods mount
    assert secret_rules(render({})) == TENANT_RULES
    assert secret_rules(render(UNISOLATED)) == [
        {**get_only, "resourceNames": ["joblease-etcd-client"]}]
    own = {**OWN_ETCD, "etcd.tls.secretName": "my-etcd-tls"}
    assert secret_rules(render(own)) == [*TENANT_RULES,
                                         {**get_only, "resourceNames": ["my-etcd-tls"]}]
    assert secret_rules(render({**UNISOLATED,
                                "webhook.sidecar.etcdClientSecret": "worker-tls"})) == [
        {**get_only, "resourceNames": ["worker-tls"]}]
    assert secret_rules(render({**UNISOLATED, "webhook.enabled": False})) == []
    # namespaced scope: the same single name, in each served namespace
    docs = render({**UNISOLATED, "scope": "namespaced", "watchNamespaces": ["a", "b"]})
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["a", "b"]
    assert secret_rules(roles) == [{**get_only, "resourceNames": ["joblease-etcd-client"]}] * 2


def test_helm_template_shows_a_fresh_webhook_certificate_whose_ca_is_the_ca_bundle() -> None:
    """What docs/helm.md says of ``helm template``: it cannot look the installed
    Secret up, so each render generates a new certificate (an upgrade keeps the
    installed one: tests/cluster/test_chart_etcd.py); the webhook trusts its CA."""
    def webhook_tls() -> tuple[dict[str, str], str]:
        docs = render({})
        (secret,) = [d for d in docs if d["kind"] == "Secret"
                     and d["metadata"]["name"].endswith("-webhook-tls")]
        (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
        return secret["data"], config["webhooks"][0]["clientConfig"]["caBundle"]
    first, first_bundle = webhook_tls()
    second, second_bundle = webhook_tls()
    assert first_bundle == first["ca.crt"] and second_bundle == second["ca.crt"]
    assert first["tls.crt"] != second["tls.crt"]


def test_the_webhook_sees_queue_pods_and_the_jobs_of_queue_templates_only() -> None:
    """Pods annotated joblease.io/job or joblease.io/queue; Jobs whose pod template names a
    queue (their CronJob slot is copied into the template); both behind the same namespace
    opt-in. The operator may read CronJobs (a hand-made Job's last slot) and nothing else
    of batch."""
    docs = render({})
    (config,) = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"]
    pods, jobs = config["webhooks"]
    assert pods["name"] == "inject.joblease.io" and jobs["name"] == "slots.joblease.io"
    assert pods["rules"][0]["resources"] == ["pods"]
    assert "'joblease.io/queue' in object.metadata.annotations" in (
        pods["matchConditions"][0]["expression"])
    assert jobs["rules"] == [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                              "operations": ["CREATE"], "resources": ["jobs"],
                              "scope": "Namespaced"}]
    assert jobs["clientConfig"]["service"]["path"] == "/mutate-jobs"
    assert jobs["clientConfig"]["caBundle"] == pods["clientConfig"]["caBundle"]
    assert jobs["namespaceSelector"] == pods["namespaceSelector"]
    assert ("'joblease.io/queue' in object.spec.template.metadata.annotations"
            in jobs["matchConditions"][0]["expression"])
    batch = [rule for d in docs if d["kind"] in ("Role", "ClusterRole")
             for rule in d.get("rules") or [] if "batch" in rule["apiGroups"]]
    assert batch == [{"apiGroups": ["batch"], "resources": ["cronjobs"], "verbs": ["get"]}]
    off = render({"webhook.enabled": False})
    assert not [d for d in off if d["kind"] == "MutatingWebhookConfiguration"]
    assert not [rule for d in off if d["kind"] in ("Role", "ClusterRole")
                for rule in d.get("rules") or [] if "batch" in rule["apiGroups"]]
