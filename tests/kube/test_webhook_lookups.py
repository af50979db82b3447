"""The webhook's advisory lookups against a real kube-apiserver.

Real: kube-apiserver (and its etcd), the operator's API client (``KubeApi``) with
the admin kubeconfig, the webhook server over TLS on a loopback port. Not here:
the API server calling the webhook (tests/cluster/test_injection.py) and the
chart's RBAC for the Secret lookup (tests/chart/test_chart_webhook_render.py renders it).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joblease.operator.injection import JOB_ANNOTATION, QUEUE_ANNOTATION, SidecarSettings
from joblease.operator.kube import KubeApi, login
from joblease.operator.webhook import (
    PATH,
    WebhookConfig,
    WebhookServer,
    kube_lookup,
    kube_queue_lookup,
    kube_secret_lookup,
)
from tests.support.controlplane import ControlPlane
from tests.support.webhook_tls import post_review, write_cert

pytestmark = pytest.mark.kube

#: The unisolated setup's settings (the copied client certificate, no tenants): the
#: Secret these tests create or leave out is that one.
CLIENT_CERT = SidecarSettings(etcd_tls_secret="joblease-etcd-client", tenant_credentials=False)


@pytest.fixture
def kubeconfig_env(crds_installed: ControlPlane) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(crds_installed.kubeconfig))
        yield


def _sidecar_env(response: dict[str, Any]) -> dict[str, str]:
    (sidecar,) = json.loads(base64.b64decode(response["patch"]))[0]["value"]
    return {e["name"]: e.get("value") for e in sidecar["env"]}


def _review(namespace: str) -> dict[str, Any]:
    pod = {"metadata": {"generateName": "w-", "namespace": namespace,
                        "annotations": {JOB_ANNOTATION: "report"}},
           "spec": {"securityContext": {"runAsUser": 65532},
                    "containers": [{"name": "worker", "image": "busybox"}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "namespace": namespace, "operation": "CREATE",
                        "object": pod}}


async def test_a_namespace_without_the_etcd_client_secret_gets_a_warning_not_a_hang(
        crds_installed: ControlPlane, namespace: str, kubeconfig_env: None,
        tmp_path: Path) -> None:
    """The namespace is opted in but was never given the etcd client Secret: the pod
    would stay Pending (FailedMount) with nothing saying why. The webhook admits it
    with a warning naming the Secret and the chart value that provides it; once the
    Secret exists, the warning goes."""
    cp = crds_installed
    write_cert(tmp_path, "webhook")
    kube = KubeApi(login)
    config = WebhookConfig(port=0, host="127.0.0.1", cert_file=str(tmp_path / "tls.crt"),
                           key_file=str(tmp_path / "tls.key"), settings=CLIENT_CERT)
    srv = WebhookServer(config, kube_lookup(kube.get), kube_secret_lookup(kube.get_secret))
    await srv.start()
    try:
        assert srv.port is not None
        status, answer = await post_review(srv.port, tmp_path, PATH, _review(namespace))
        assert status == 200
        response = answer["response"]
        assert response["allowed"] is True and response["patch"]
        assert response["warnings"] == [
            f"joblease: JobLease {namespace}/report does not exist (yet): the sidecar waits "
            "for its registration and the pod fails (exit 3, not registered) if it never "
            "comes",
            f"joblease: Secret {namespace}/joblease-etcd-client does not exist: the pod "
            "cannot start (Pending, FailedMount) until it does; with the chart's bundled "
            "etcd, list the namespace in etcd.workerSecret.namespaces (helm upgrade ... "
            f"--set 'etcd.workerSecret.namespaces[0]={namespace}', keeping the namespaces "
            "listed before); with your own etcd, copy its client Secret there under that "
            "name (webhook.sidecar.etcdClientSecret)"]
        assert "JOBLEASE_LEASE_TTL" not in _sidecar_env(response)  # no JobLease: no hint
        cp.kubectl("create", "secret", "generic", "joblease-etcd-client", "-n", namespace,
                   "--from-literal=ca.crt=x", check=True)
        cp.kubectl("apply", "-n", namespace, "-f", "-", check=True, input=json.dumps({
            "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
            "metadata": {"name": "report"}, "spec": {"leaseDurationSeconds": 10}}))
        status, answer = await post_review(srv.port, tmp_path, PATH, _review(namespace))
        assert status == 200 and answer["response"]["patch"]
        assert "warnings" not in answer["response"], answer["response"]
        # the JobLease's TTL, read back from the API server, as the sidecar's hint
        assert _sidecar_env(answer["response"])["JOBLEASE_LEASE_TTL"] == "10"
    finally:
        await srv.stop()
        await kube.close()


async def test_a_queue_pod_whose_jobqueue_is_missing_gets_a_warning(
        crds_installed: ControlPlane, namespace: str, kubeconfig_env: None,
        tmp_path: Path) -> None:
    """Queue mode looks up the JobQueue the pod names, as a job pod's JobLease: missing,
    a warning (the sidecar would wait and fail); applied, none."""
    cp = crds_installed
    write_cert(tmp_path, "webhook")
    kube = KubeApi(login)
    config = WebhookConfig(port=0, host="127.0.0.1", cert_file=str(tmp_path / "tls.crt"),
                           key_file=str(tmp_path / "tls.key"), settings=CLIENT_CERT)
    srv = WebhookServer(config, kube_lookup(kube.get), kube_secret_lookup(kube.get_secret),
                        queue_lookup=kube_queue_lookup(kube.get_queue))
    review = _review(namespace)
    pod = review["request"]["object"]
    pod["metadata"]["annotations"] = {QUEUE_ANNOTATION: "files"}
    pod["spec"]["restartPolicy"] = "Always"
    cp.kubectl("create", "secret", "generic", "joblease-etcd-client", "-n", namespace,
               "--from-literal=ca.crt=x", check=True)
    await srv.start()
    try:
        assert srv.port is not None
        status, answer = await post_review(srv.port, tmp_path, PATH, review)
        assert status == 200 and answer["response"]["patch"]
        assert answer["response"]["warnings"] == [
            f"joblease: JobQueue {namespace}/files does not exist (yet): the sidecar waits "
            "for the queue and the pod fails (exit 3, not found) if it never comes"]
        cp.kubectl("apply", "-n", namespace, "-f", "-", check=True, input=json.dumps({
            "apiVersion": "joblease.io/v1alpha1", "kind": "JobQueue",
            "metadata": {"name": "files"}, "spec": {"leaseDurationSeconds": 10}}))
        status, answer = await post_review(srv.port, tmp_path, PATH, review)
        assert status == 200 and answer["response"]["patch"]
        assert "warnings" not in answer["response"], answer["response"]
        # queue claims take no TTL hint: none is passed
        assert "JOBLEASE_LEASE_TTL" not in _sidecar_env(answer["response"])
    finally:
        await srv.stop()
        await kube.close()
