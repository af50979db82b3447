"""The injection patch (joblease.operator.injection.plan), applied with a real RFC 6902
implementation (``jsonpatch``, kopf's own dependency) to pods as the API server
sends them. Nothing is faked: these are pure functions of dicts.

The reference is examples/worker-pod.yaml: its Job's pod template with the
sidecar, its volumes and the worker's joblease variables taken out, annotated,
and injected, must get back the example's sidecar and wiring.
"""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
import yaml

from joblease.operator import injection
from joblease.operator.injection import (
    INJECTED_ANNOTATION,
    JOB_ANNOTATION,
    InjectionRefused,
    SidecarSettings,
    plan,
)
from joblease.operator.webhook import review_response
from tests.support.binaries import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "worker-pod.yaml"
SETTINGS = SidecarSettings()  # the chart's defaults for release joblease in joblease-system
#: The unisolated setup (etcd.bundledAuth=false, tenantCredentials.enabled=false): the
#: copied client certificate, no credentials.
CLIENT_CERT = SidecarSettings(etcd_tls_secret="joblease-etcd-client", tenant_credentials=False)
NS = "team-a"


def _example_job() -> dict[str, Any]:
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    return job


def _example_pod() -> dict[str, Any]:
    template = _example_job()["spec"]["template"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": copy.deepcopy(template["metadata"]),
            "spec": copy.deepcopy(template["spec"])}


def _bare_pod(**notes: str) -> dict[str, Any]:
    """The example's pod as a user would write it for injection: no sidecar, no
    joblease volumes or variables, no shareProcessNamespace; annotated."""
    pod = _example_pod()
    spec = pod["spec"]
    del spec["initContainers"], spec["shareProcessNamespace"]
    spec["volumes"] = [v for v in spec["volumes"] if v["name"] == "worker-script"]
    (worker,) = spec["containers"]
    del worker["env"]
    worker["volumeMounts"] = [m for m in worker["volumeMounts"] if m["name"] == "worker-script"]
    pod["metadata"]["annotations"] = {JOB_ANNOTATION: "nightly-report", **notes}
    return pod


def _inject(pod: dict[str, Any], settings: SidecarSettings = SETTINGS,
            **kw: Any) -> tuple[dict[str, Any], list[str]]:
    result = plan(pod, settings, namespace=NS, **kw)
    patched: dict[str, Any] = jsonpatch.apply_patch(pod, result.patch)
    return patched, result.warnings


def _env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env", [])}


def _mounts(container: dict[str, Any]) -> dict[str, str]:
    return {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}


def test_injected_pod_has_the_example_sidecar_and_wiring() -> None:
    pod, warnings = _inject(_bare_pod())
    example = _example_pod()["spec"]
    spec = pod["spec"]
    (sidecar,) = spec["initContainers"]
    (want,) = example["initContainers"]
    assert sidecar["name"] == want["name"] == "joblease"
    assert sidecar["image"] == want["image"] == "ghcr.io/joblease/joblease-sidecar:0.1.0"
    assert "args" not in sidecar and "args" not in want  # the image's entrypoint, no args
    assert sidecar["restartPolicy"] == "Always"
    # every variable of the example's sidecar, with the example's value
    got = _env(sidecar)
    for name, value in _env(want).items():
        assert got.get(name) == value, (name, got.get(name), value)
    assert got["JOBLEASE_SIDECAR_PORT"] == "8470" and got["JOBLEASE_SIDECAR_PROBE_PORT"] == "8471"
    # the probes: startup on /readyz (the gate), liveness on /healthz, the probe port
    assert sidecar["startupProbe"]["httpGet"] == {"path": "/readyz", "port": 8471}
    assert sidecar["startupProbe"]["failureThreshold"] == want["startupProbe"]["failureThreshold"]
    assert sidecar["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": 8471}
    assert [p["containerPort"] for p in sidecar["ports"]] == [8471]
    # restricted: the example's container settings, plus non-root with a seccomp profile
    for key, value in want["securityContext"].items():
        assert sidecar["securityContext"][key] == value
    assert sidecar["securityContext"]["runAsNonRoot"] is True
    assert sidecar["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert sidecar["resources"] == want["resources"]
    # same mount paths as the example (the volumes' names are the webhook's own)
    assert set(_mounts(sidecar)) == set(_mounts(want)) == {"/run/joblease", "/etc/joblease/etcd"}
    # the worker: the example's variables and the token volume at the same path
    (worker,) = spec["containers"]
    assert _env(worker) == _env(example["containers"][0])
    assert _mounts(worker)["/run/joblease"] == _mounts(sidecar)["/run/joblease"]
    assert _mounts(worker)["/opt/worker"] == "worker-script"  # the user's mount is kept
    # pod level: process namespace shared (on-loss signal), the volumes
    assert spec["shareProcessNamespace"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["joblease-run"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "1Mi"}
    # one volume for the tenant Secret, TLS files and credentials as the example has them
    assert volumes["joblease-etcd-tls"]["secret"]["secretName"] == "joblease-etcd-credentials"
    assert [i["key"] for i in volumes["joblease-etcd-tls"]["secret"]["items"]] == [
        "ca.crt", "tls.crt", "tls.key", "username", "password"]
    assert "joblease-etcd-auth" not in volumes
    assert "worker-script" in volumes
    assert pod["metadata"]["annotations"][INJECTED_ANNOTATION] == "true"
    assert warnings == []  # the pod runs as 65532, the sidecar's user


def test_pod_without_the_annotation_gets_no_patch() -> None:
    pod = _bare_pod()
    del pod["metadata"]["annotations"]
    assert plan(pod, SETTINGS, namespace=NS).patch == []
    pod["metadata"]["annotations"] = {"other.io/x": "1"}
    assert plan(pod, SETTINGS, namespace=NS).patch == []


def test_injecting_an_injected_pod_again_changes_nothing() -> None:
    once, _ = _inject(_bare_pod())
    assert plan(once, SETTINGS, namespace=NS).patch == []


def test_a_hand_written_sidecar_is_left_alone_with_a_warning() -> None:
    pod = _example_pod()
    pod["metadata"]["annotations"] = {JOB_ANNOTATION: "nightly-report"}
    result = plan(pod, SETTINGS, namespace=NS)
    assert result.patch == []
    assert any("already has a container named 'joblease'" in w for w in result.warnings)


def test_reinvocation_completes_containers_added_after_injection() -> None:
    once, _ = _inject(_bare_pod())
    once["spec"]["containers"].append({"name": "late", "image": "x",
                                       "env": [{"name": "A", "value": "1"}]})
    twice, _ = _inject(once)
    late = twice["spec"]["containers"][1]
    assert _env(late) == {"A": "1", "JOBLEASE_SIDECAR_URL": "http://127.0.0.1:8470",
                          "JOBLEASE_TOKEN_FILE": "/run/joblease/token",
                          "JOBLEASE_WORKER_PID_FILE": "/run/joblease/worker.pid"}
    assert _mounts(late) == {"/run/joblease": "joblease-run"}
    assert len(twice["spec"]["initContainers"]) == 1  # no second sidecar
    assert twice["spec"]["containers"][0] == once["spec"]["containers"][0]


def test_sidecar_goes_first_and_other_init_containers_get_the_wiring() -> None:
    pod = _bare_pod()
    pod["spec"]["initContainers"] = [{"name": "migrate", "image": "x"}]
    patched, _ = _inject(pod)
    names = [c["name"] for c in patched["spec"]["initContainers"]]
    assert names == ["joblease", "migrate"]
    migrate = patched["spec"]["initContainers"][1]
    assert "restartPolicy" not in migrate
    assert _env(migrate)["JOBLEASE_TOKEN_FILE"] == "/run/joblease/token"
    assert _mounts(migrate) == {"/run/joblease": "joblease-run"}


def test_variables_the_pod_already_sets_are_kept() -> None:
    pod = _bare_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "JOBLEASE_SIDECAR_URL", "value": "http://localhost:8470"}]
    patched, _ = _inject(pod)
    env = patched["spec"]["containers"][0]["env"]
    assert [e["value"] for e in env if e["name"] == "JOBLEASE_SIDECAR_URL"] == [
        "http://localhost:8470"]


def test_annotations_choose_on_loss_ports_token_and_process_name() -> None:
    pod = _bare_pod(**{"joblease.io/on-loss": "none", "joblease.io/api-port": "9000",
                       "joblease.io/probe-port": "9001",
                       "joblease.io/api-token-secret": "api-token",
                       "joblease.io/worker-process-name": "report"})
    patched, _ = _inject(pod)
    spec = patched["spec"]
    sidecar, worker = spec["initContainers"][0], spec["containers"][0]
    env = _env(sidecar)
    assert env["JOBLEASE_SIDECAR_ON_LOSS"] == "none"
    assert env["JOBLEASE_SIDECAR_PORT"] == "9000" and env["JOBLEASE_SIDECAR_PROBE_PORT"] == "9001"
    assert env["JOBLEASE_WORKER_PROCESS_NAME"] == "report"
    assert env["JOBLEASE_SIDECAR_API_TOKEN_FILE"] == "/etc/joblease/api-token/token"
    assert "JOBLEASE_WORKER_PID_FILE" not in env  # nobody is signalled
    assert sidecar["startupProbe"]["httpGet"]["port"] == 9001
    assert _env(worker)["JOBLEASE_SIDECAR_URL"] == "http://127.0.0.1:9000"
    assert _env(worker)["JOBLEASE_API_TOKEN_FILE"] == "/etc/joblease/api-token/token"
    assert _mounts(worker)["/etc/joblease/api-token"] == "joblease-api-token"
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["joblease-api-token"]["secret"] == {
        "secretName": "api-token", "items": [{"key": "token", "path": "token"}]}
    assert "shareProcessNamespace" not in spec  # on-loss none: not needed


def test_tenant_credentials_mount_the_namespace_secret() -> None:
    # your own etcd: its TLS Secret (CA only here) beside the tenant Secret
    settings = SidecarSettings(tenant_credentials=True, etcd_tls_secret="joblease-etcd-client",
                               etcd_cert_key="", etcd_key_key="")
    patched, _ = _inject(_bare_pod(), settings)
    sidecar = patched["spec"]["initContainers"][0]
    env = _env(sidecar)
    # files, not variables: a rotation changes both, and the sidecar re-reads them
    assert env["JOBLEASE_ETCD_USERNAME_FILE"] == "/etc/joblease/etcd-auth/username"
    assert "JOBLEASE_ETCD_USERNAME" not in env
    assert env["JOBLEASE_ETCD_PASSWORD_FILE"] == "/etc/joblease/etcd-auth/password"
    assert env["JOBLEASE_ETCD_CA_FILE"] == "/etc/joblease/etcd/ca.crt"
    assert "JOBLEASE_ETCD_CERT_FILE" not in env  # CA only: the client key stays out
    volumes = {v["name"]: v for v in patched["spec"]["volumes"]}
    assert volumes["joblease-etcd-auth"]["secret"] == {
        "secretName": "joblease-etcd-credentials",
        "items": [{"key": "username", "path": "username"},
                  {"key": "password", "path": "password"}]}
    assert volumes["joblease-etcd-tls"]["secret"]["items"] == [{"key": "ca.crt",
                                                                "path": "ca.crt"}]


def test_plain_text_etcd_mounts_no_tls_secret() -> None:
    settings = SidecarSettings(etcd_tls_secret="", etcd_endpoints="http://etcd:2379")
    patched, _ = _inject(_bare_pod(), settings)
    sidecar = patched["spec"]["initContainers"][0]
    assert not any(k.startswith("JOBLEASE_ETCD_CA") for k in _env(sidecar))
    assert "joblease-etcd-tls" not in {v["name"] for v in patched["spec"]["volumes"]}


def test_pod_user_is_inherited_and_a_different_worker_user_is_warned_about() -> None:
    patched, _ = _inject(_bare_pod())
    assert "runAsUser" not in patched["spec"]["initContainers"][0]["securityContext"]
    pod = _bare_pod()
    del pod["spec"]["securityContext"]["runAsUser"]
    pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = 1000
    patched, warnings = _inject(pod)
    assert patched["spec"]["initContainers"][0]["securityContext"]["runAsUser"] == 65532
    assert any("'worker' runs as uid 1000" in w for w in warnings), warnings


def test_missing_joblease_is_admitted_with_a_warning() -> None:
    result = plan(_bare_pod(), SETTINGS, namespace=NS, joblease_exists=False)
    assert result.patch
    assert any("JobLease team-a/nightly-report does not exist" in w for w in result.warnings)
    assert not plan(_bare_pod(), SETTINGS, namespace=NS, joblease_exists=True).warnings


def test_the_joblease_ttl_is_passed_to_the_sidecar_as_a_hint() -> None:
    """A found JobLease's TTL becomes the sidecar's JOBLEASE_LEASE_TTL (its first grant
    beside the spec read); without one (not found, lookup failed) the variable is not
    set at all, nor in queue mode, whose claims take no hint."""
    pod, _ = _inject(_bare_pod(), joblease_exists=True, lease_ttl=45)
    (sidecar,) = pod["spec"]["initContainers"]
    assert _env(sidecar)["JOBLEASE_LEASE_TTL"] == "45"
    assert _env(sidecar)["JOBLEASE_JOB_NAME"] == "nightly-report"
    for exists in (None, False, True):
        pod, _ = _inject(_bare_pod(), joblease_exists=exists)
        assert "JOBLEASE_LEASE_TTL" not in _env(pod["spec"]["initContainers"][0])
    queue_pod = _bare_pod()
    queue_pod["metadata"]["annotations"] = {"joblease.io/queue": "files"}
    pod, _ = _inject(queue_pod, joblease_exists=True, lease_ttl=45)
    assert "JOBLEASE_LEASE_TTL" not in _env(pod["spec"]["initContainers"][0])


@pytest.mark.parametrize(("joblease", "hint"), [
    ({"spec": {"leaseDurationSeconds": 30, "maxAttempts": 3}}, 30),
    ({"spec": {"leaseDurationSeconds": 2}}, 2),
    ({"spec": {"leaseDurationSeconds": 86400}}, 86400),
    # nothing the CRD would have let through: no hint rather than a wrong one
    ({"spec": {"leaseDurationSeconds": 1}}, None),
    ({"spec": {"leaseDurationSeconds": 86401}}, None),
    ({"spec": {"leaseDurationSeconds": "30"}}, None),
    ({"spec": {"leaseDurationSeconds": 30.0}}, None),
    ({"spec": {"leaseDurationSeconds": True}}, None),
    ({"spec": {}}, None),
    ({"spec": None}, None),
    ({}, None),
    (None, None),
])
def test_lease_ttl_hint_is_the_spec_ttl_within_the_crd_bounds(
        joblease: dict[str, Any] | None, hint: int | None) -> None:
    assert injection.lease_ttl_hint(joblease) == hint


@pytest.mark.parametrize(("notes", "says"), [
    ({JOB_ANNOTATION: "Nightly_Report"}, "invalid annotation joblease.io/job: 'Nightly_Report'"),
    ({JOB_ANNOTATION: ""}, "invalid annotation joblease.io/job: ''"),
    ({"joblease.io/on-loss": "kill"}, "invalid annotation joblease.io/on-loss: 'kill' is not one"),
    ({"joblease.io/api-port": "http"}, "invalid annotation joblease.io/api-port: 'http'"),
    ({"joblease.io/probe-port": "70000"}, "invalid annotation joblease.io/probe-port: '70000'"),
    ({"joblease.io/api-port": "8471"}, "both are 8471"),
    ({"joblease.io/api-token-secret": "No/Such"}, "joblease.io/api-token-secret: 'No/Such'"),
    ({"joblease.io/worker-process-name": "a b"}, "joblease.io/worker-process-name: 'a b'"),
    ({"joblease.io/onloss": "none"}, "unknown annotation joblease.io/onloss"),
    ({"joblease.io/startup-wait-seconds": "0"}, "joblease.io/startup-wait-seconds: '0'"),
    ({"joblease.io/startup-wait-seconds": "1h"}, "joblease.io/startup-wait-seconds: '1h'"),
    ({"joblease.io/startup-wait-seconds": "2147483648"},
     "joblease.io/startup-wait-seconds: '2147483648' is not a number of seconds"),
])
def test_invalid_annotations_are_refused_naming_the_annotation(notes: dict[str, str],
                                                               says: str) -> None:
    pod = _bare_pod(**notes)
    with pytest.raises(InjectionRefused) as err:
        plan(pod, SETTINGS, namespace=NS)
    assert says in str(err.value)


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: s["volumes"].append({"name": "joblease-run", "emptyDir": {}}),
     "already has a volume named 'joblease-run'"),
    (lambda s: s["containers"][0]["volumeMounts"].append(
        {"name": "worker-script", "mountPath": "/run/joblease"}),
     "already mounts /run/joblease"),
    (lambda s: s["containers"][0].setdefault("ports", []).append({"containerPort": 8470}),
     "uses port 8470"),
    (lambda s: s.update(shareProcessNamespace=False), "signal needs spec.shareProcessNamespace"),
])
def test_conflicting_pods_are_refused_with_the_reason(change: Any, says: str) -> None:
    pod = _bare_pod()
    change(pod["spec"])
    with pytest.raises(InjectionRefused, match=says):
        plan(pod, SETTINGS, namespace=NS)


def test_settings_from_the_chart_json_refuse_unknown_keys() -> None:
    s = SidecarSettings.from_json({"image": "img:1", "args": ["run", "sidecar"],
                                   "etcdEndpoints": "https://e:2379"})
    assert s.image == "img:1" and s.args == ("run", "sidecar")
    with pytest.raises(ValueError, match="unknown sidecar settings"):
        SidecarSettings.from_json({"imagee": "x"})
    with pytest.raises(ValueError, match="image must not be empty"):
        SidecarSettings.from_json({"image": ""})


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "namespace": NS, "operation": "CREATE",
                        "kind": {"group": "", "version": "v1", "kind": "Pod"}, "object": pod}}


def test_review_response_carries_the_patch_or_the_refusal() -> None:
    pod = _bare_pod()
    answer = review_response(_review(pod), SETTINGS, exists=False)
    response = answer["response"]
    assert answer["kind"] == "AdmissionReview" and response["uid"] == "u-1"
    assert response["allowed"] is True and response["patchType"] == "JSONPatch"
    patch = json.loads(base64.b64decode(response["patch"]))
    assert patch == plan(pod, SETTINGS, namespace=NS).patch
    assert response["warnings"][0].startswith("joblease: JobLease team-a/nightly-report")
    refused = review_response(_review(_bare_pod(**{"joblease.io/on-loss": "kill"})),
                              SETTINGS)["response"]
    assert refused["allowed"] is False and refused["status"]["code"] == 400
    assert "joblease.io/on-loss" in refused["status"]["message"]
    assert "patch" not in refused
    untouched = review_response(_review({"metadata": {"name": "p"}, "spec": {}}),
                                SETTINGS)["response"]
    assert untouched == {"uid": "u-1", "allowed": True}
    with pytest.raises(ValueError):
        review_response({"request": {"object": {}}}, SETTINGS)


def test_json_pointer_escaping_of_the_annotation_key() -> None:
    assert injection.escape_pointer("joblease.io/injected") == "joblease.io~1injected"
    assert injection.escape_pointer("a~b/c") == "a~0b~1c"


def test_on_loss_exit_shares_the_process_namespace_and_warns_that_exit_ends_nothing() -> None:
    """A native sidecar's exit does not end the pod (the kubelet restarts it): with
    on-loss exit only the SIGTERM the sidecar sends first stops the worker, so the
    pod gets the shared process namespace that signal needs, and a warning."""
    pod, warnings = _inject(_bare_pod(**{"joblease.io/on-loss": "exit"}))
    assert pod["spec"]["shareProcessNamespace"] is True
    env = _env(pod["spec"]["initContainers"][0])
    assert env["JOBLEASE_SIDECAR_ON_LOSS"] == "exit"
    assert env["JOBLEASE_WORKER_PID_FILE"] == "/run/joblease/worker.pid"
    (warning,) = warnings
    assert warning.startswith("joblease.io/on-loss: exit: the injected sidecar is a native "
                              "sidecar, whose exit does not end the pod")
    shown = review_response(_review(_bare_pod(**{"joblease.io/on-loss": "exit"})),
                            SETTINGS, exists=True)["response"]["warnings"]
    assert shown == [f"joblease: {warning}"]  # what kubectl prints after "Warning: "


def test_on_loss_exit_without_a_shared_process_namespace_is_refused() -> None:
    pod = _bare_pod(**{"joblease.io/on-loss": "exit"})
    pod["spec"]["shareProcessNamespace"] = False
    with pytest.raises(InjectionRefused, match=r"on-loss: exit needs spec\.shareProcessNamespace"):
        plan(pod, SETTINGS, namespace=NS)


def test_on_loss_exit_warns_about_a_worker_the_sidecar_cannot_signal() -> None:
    pod = _bare_pod(**{"joblease.io/on-loss": "exit"})
    pod["spec"]["containers"][0]["securityContext"]["runAsUser"] = 1000
    _, warnings = _inject(pod)
    assert any("exit: container 'worker' runs as uid 1000" in w for w in warnings), warnings


def test_a_host_network_pod_is_refused_its_lease_api_would_be_the_nodes() -> None:
    pod = _bare_pod()
    pod["spec"]["hostNetwork"] = True
    with pytest.raises(InjectionRefused, match=r"spec\.hostNetwork is true: the "
                                               r"sidecar's lease API"):
        plan(pod, SETTINGS, namespace=NS)


def test_a_missing_etcd_client_secret_is_warned_about_naming_what_provides_it() -> None:
    """The kubelet cannot mount a missing Secret: the pod would stay Pending
    (FailedMount) with nothing saying why. The warning names the Secret and the
    chart value that puts it in the namespace."""
    result = plan(_bare_pod(), CLIENT_CERT, namespace=NS, joblease_exists=True,
                  missing_secrets={"joblease-etcd-client"})
    assert result.patch
    (warning,) = result.warnings
    assert warning.startswith("Secret team-a/joblease-etcd-client does not exist: the pod "
                              "cannot start (Pending, FailedMount) until it does")
    assert "--set 'etcd.workerSecret.namespaces[0]=team-a'" in warning
    assert "webhook.sidecar.etcdClientSecret" in warning
    tenant = SidecarSettings(tenant_credentials=True, etcd_tls_secret="joblease-etcd-client")
    (warning,) = plan(_bare_pod(), tenant, namespace=NS, joblease_exists=True,
                      missing_secrets={"joblease-etcd-credentials"}).warnings
    assert warning.startswith("Secret team-a/joblease-etcd-credentials does not exist")
    assert "once the namespace is labelled for injection" in warning
    # only the installation's Secrets are looked up, and only missing ones warned about
    assert injection.installation_secrets(CLIENT_CERT) == ["joblease-etcd-client"]
    assert injection.installation_secrets(tenant) == ["joblease-etcd-client",
                                                      "joblease-etcd-credentials"]
    assert not plan(_bare_pod(), CLIENT_CERT, namespace=NS, joblease_exists=True,
                    missing_secrets={"joblease-etcd-credentials"}).warnings
    # the chart's default (bundled etcd, tenants): one Secret carries TLS and credentials,
    # looked up (and warned about) once
    bundled = SidecarSettings(tenant_credentials=True,
                              etcd_tls_secret="joblease-etcd-credentials")
    assert injection.installation_secrets(bundled) == ["joblease-etcd-credentials"]
    (warning,) = plan(_bare_pod(), bundled, namespace=NS, joblease_exists=True,
                      missing_secrets={"joblease-etcd-credentials"}).warnings
    assert "once the namespace is labelled for injection" in warning


def _docs_job() -> dict[str, Any]:
    """The Job of docs/sidecar.md's "Injection" section, as written."""
    text = (REPO_ROOT / "docs" / "sidecar.md").read_text()
    section = text.split("\n## Injection\n", 1)[1]
    block = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    job: dict[str, Any] = yaml.safe_load(block)
    return job


def test_the_docs_injection_job_as_written_runs_the_examples_worker_script() -> None:
    job = _docs_job()
    assert job["kind"] == "Job"
    template = job["spec"]["template"]
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template["metadata"],
           "spec": template["spec"]}
    patched, _ = _inject(pod)
    spec = patched["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["containers"] + spec["initContainers"]:
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{c['name']} mounts {m['name']}, which has no volume"
    (worker,) = spec["containers"]
    (example,) = _inject(_bare_pod())[0]["spec"]["containers"]
    assert worker["command"] == example["command"] == ["sh", "/opt/worker/worker.sh"]
    assert worker["volumeMounts"] == example["volumeMounts"]
    assert _env(worker) == _env(example)
    (script_mount,) = [m for m in worker["volumeMounts"] if m["mountPath"] == "/opt/worker"]
    config_map = volumes[script_mount["name"]]["configMap"]["name"]
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    (example_map,) = [d for d in docs if d["kind"] == "ConfigMap"]
    assert example_map["metadata"]["name"] == config_map and "worker.sh" in example_map["data"]
    (joblease,) = [d for d in docs if d["kind"] == "JobLease"]
    assert template["metadata"]["annotations"][JOB_ANNOTATION] == joblease["metadata"]["name"]


def _startup_threshold(notes: dict[str, str]) -> int:
    pod = _bare_pod()
    pod["metadata"]["annotations"] = notes
    injected = jsonpatch.apply_patch(pod, plan(pod, SETTINGS, namespace=NS).patch)
    (sidecar,) = injected["spec"]["initContainers"]
    assert sidecar["startupProbe"]["periodSeconds"] == 1
    threshold: int = sidecar["startupProbe"]["failureThreshold"]
    return threshold


def test_the_startup_wait_is_ten_minutes_but_a_draining_pod_waits_for_its_first_item() -> None:
    """The sidecar's startup probe (period 1 s) gates the worker on the first lease; its
    failureThreshold is how long the kubelet lets the sidecar wait before restarting it.
    A JobLease's pod or one item's pod: 10 minutes; a queue pod that drains waits as
    long as the queue is empty (a restart would only lose its place in a semaphore's
    line); the annotation sets either."""
    assert _startup_threshold({JOB_ANNOTATION: "nightly-report"}) == 600
    assert _startup_threshold({"joblease.io/queue": "q", "joblease.io/item": "a"}) == 600
    assert _startup_threshold({"joblease.io/queue": "q"}) == 2**31 - 1
    assert _startup_threshold({JOB_ANNOTATION: "nightly-report",
                               "joblease.io/startup-wait-seconds": "7200"}) == 7200
    assert _startup_threshold({"joblease.io/queue": "q",
                               "joblease.io/startup-wait-seconds": "60"}) == 60
