"""The slot webhook (``/mutate-jobs``) against a real kube-apiserver: a Job made by hand
from a CronJob (``kubectl create job --from=cronjob/x``) runs the CronJob's last slot,
read from its real ``status.lastScheduleTime``.

Real: kube-apiserver (and its etcd), ``kubectl create job --from`` (its Job, with the
ownerReference kubectl writes, taken with ``--dry-run=client``), the operator's API
client (``KubeApi``), the webhook server over TLS on a loopback port. No
controller-manager runs here, so the CronJob's status is written through its status
subresource, as the CronJob controller writes it. The API server calling the webhook,
and Jobs the CronJob controller makes, are tests/cluster/test_queue_shapes.py's.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest

from joblease.operator.injection import SidecarSettings
from joblease.operator.kube import KubeApi, login
from joblease.operator.webhook import (
    JOBS_PATH,
    WebhookConfig,
    WebhookServer,
    kube_cronjob_lookup,
)
from tests.support.controlplane import ControlPlane
from tests.support.webhook_tls import post_review, write_cert

pytestmark = pytest.mark.kube


@pytest.fixture
def kubeconfig_env(control_plane: ControlPlane) -> Iterator[None]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KUBECONFIG", str(control_plane.kubeconfig))
        yield


def _cronjob(namespace: str) -> dict[str, Any]:
    return {"apiVersion": "batch/v1", "kind": "CronJob",
            "metadata": {"name": "nightly", "namespace": namespace},
            "spec": {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": {
                "metadata": {"annotations": {"joblease.io/queue": "nightly"}},
                "spec": {"restartPolicy": "Never",
                         "containers": [{"name": "worker", "image": "busybox"}]}}}}}}


def _manual_job(cp: ControlPlane, namespace: str) -> dict[str, Any]:
    r = cp.kubectl("create", "job", "by-hand", "--from=cronjob/nightly", "-n", namespace,
                   "--dry-run=client", "-o", "json", check=True)
    job: dict[str, Any] = json.loads(r.stdout)
    return job


def _review(namespace: str, job: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "namespace": namespace, "operation": "CREATE",
                        "object": job}}


async def test_a_job_made_by_hand_from_a_cronjob_runs_its_last_slot(
        control_plane: ControlPlane, namespace: str, kubeconfig_env: None,
        tmp_path: Path) -> None:
    cp = control_plane
    cp.kubectl("apply", "-f", "-", check=True, input=json.dumps(_cronjob(namespace)))
    job = _manual_job(cp, namespace)
    # what kubectl writes: the CronJob as owner, no scheduled time
    assert [o["kind"] for o in job["metadata"]["ownerReferences"]] == ["CronJob"]
    assert "batch.kubernetes.io/cronjob-scheduled-timestamp" not in (
        job["metadata"].get("annotations") or {})
    write_cert(tmp_path, "webhook")
    kube = KubeApi(login)
    config = WebhookConfig(port=0, host="127.0.0.1", cert_file=str(tmp_path / "tls.crt"),
                           key_file=str(tmp_path / "tls.key"), settings=SidecarSettings())
    srv = WebhookServer(config, cronjob_lookup=kube_cronjob_lookup(kube.get_cronjob))
    await srv.start()
    try:
        assert srv.port is not None
        # never scheduled: the slot is unknown, so the Job is refused saying how to choose
        status, answer = await post_review(srv.port, tmp_path, JOBS_PATH,
                                           _review(namespace, job))
        assert status == 200
        response = answer["response"]
        assert response["allowed"] is False and "patch" not in response
        assert ("Job by-hand was created from CronJob nightly by hand" in
                response["status"]["message"])
        assert "no status.lastScheduleTime" in response["status"]["message"]

        cp.kubectl("patch", "cronjob", "nightly", "-n", namespace, "--subresource=status",
                   "--type=merge", "-p",
                   json.dumps({"status": {"lastScheduleTime": "2026-12-01T23:05:00Z"}}),
                   check=True)
        status, answer = await post_review(srv.port, tmp_path, JOBS_PATH,
                                           _review(namespace, job))
        assert status == 200
        response = answer["response"]
        assert response["allowed"] is True and response["patchType"] == "JSONPatch"
        (warning,) = response["warnings"]
        assert "runs the CronJob's last slot 2026-12-01T23:05:00Z" in warning

        # the patch, applied by the API server itself (a server-side dry run of the
        # patched Job is accepted and carries the slot in its template)
        patched = jsonpatch.apply_patch(job, json.loads(base64.b64decode(response["patch"])))
        r = cp.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                       "-n", namespace, input=json.dumps(patched), check=True)
        notes = json.loads(r.stdout)["spec"]["template"]["metadata"]["annotations"]
        assert notes["joblease.io/item"] == "2026-12-01T23:05:00Z"
        assert notes["joblease.io/item-create"] == "true"

        # a CronJob that is gone: refused too (nothing to take the slot from)
        cp.kubectl("delete", "cronjob", "nightly", "-n", namespace, check=True)
        status, answer = await post_review(srv.port, tmp_path, JOBS_PATH,
                                           _review(namespace, job))
        assert status == 200 and answer["response"]["allowed"] is False
    finally:
        await srv.stop()
        await kube.close()
