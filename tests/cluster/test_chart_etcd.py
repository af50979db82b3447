"""The chart with its bundled etcd, installed by the real helm into the real cluster.

Each test installs its own release into its own namespace and uninstalls it
afterwards. Values: the chart's defaults, plus ``etcd.persistence.enabled=false``
only (``TEST_CLUSTER_VALUES``: the test cluster's local volumes are a small pool,
kept for the persistence tests); the members' data then lives in an emptyDir. The
images are the chart's default references, imported into the node's containerd
(``hack/build-images``), so ``imagePullPolicy: IfNotPresent`` pulls nothing.
Waits are on conditions with generous deadlines (the machine is loaded).
"""

from __future__ import annotations

import base64
import json

import pytest

from tests.support.cluster import Cluster, image_ref
from tests.support.release import CHART, TEST_CLUSTER_VALUES, Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]


def secret_data(rel: Release, name: str) -> dict[str, str]:
    data: dict[str, str] = rel.get("secret", name)["data"]
    return data


def run_curl_pod(cluster: Cluster, namespace: str, name: str, secret: str, script: str) -> str:
    """Run ``script`` in a pod of the curl image with Secret ``secret`` at /tls."""
    pod = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "curl", "image": image_ref("docker.io/curlimages/curl"),
                "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "tls", "mountPath": "/tls", "readOnly": True}]}],
            "volumes": [{"name": "tls", "secret": {"secretName": secret,
                                                   "defaultMode": 0o444}}],
        },
    }
    cluster.apply(json.dumps(pod))
    phase = cluster.wait_pod_done(name, namespace, timeout=300)
    logs = cluster.kubectl("logs", name, "-n", namespace)
    assert phase == "Succeeded", f"{phase}: {logs.stdout}{logs.stderr}"
    return logs.stdout


def test_install_with_defaults_runs_etcd_and_the_operator_over_tls(release: Release) -> None:
    rel = release
    # the chart's default image references are the ones imported into the node
    values = rel.helm("show", "values", str(CHART))
    assert image_ref("gcr.io/etcd-development/etcd") == "gcr.io/etcd-development/etcd:v3.6.16"
    assert "tag: v3.6.16" in values
    rel.helm("install", rel.name, str(CHART), *TEST_CLUSTER_VALUES)
    rel.wait_ready()

    pod = rel.operator_pod()
    spec = pod["spec"]
    assert spec["serviceAccountName"] == rel.fullname
    (container,) = [c for c in pod["status"]["containerStatuses"] if c["name"] == "operator"]
    assert container["ready"] is True
    assert container["image"].endswith(image_ref("ghcr.io/joblease/joblease:"))
    # the process itself: UID 65532 (not root), and the root filesystem refuses writes
    out = rel.cluster.kubectl("exec", pod["metadata"]["name"], "-n", rel.namespace, "-c",
                              "operator", "--", "sh", "-c",
                              "id -u; touch /probe 2>&1 && echo wrote || echo refused",
                              timeout=120)
    assert out.returncode == 0, out.stderr
    uid, touched = out.stdout.split("\n", 1)
    assert uid.strip() == "65532" and "refused" in touched, out.stdout

    # the etcd members run restricted, and the operator is wired to them over TLS
    sts = rel.get("statefulset", rel.etcd)
    etcd_spec = sts["spec"]["template"]["spec"]
    (etcd,) = etcd_spec["containers"]
    assert etcd["securityContext"]["readOnlyRootFilesystem"] is True
    assert etcd_spec["securityContext"]["runAsUser"] == 65532
    env = {e["name"]: e.get("value") for e in
           rel.get("deployment", rel.fullname)["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["JOBLEASE_ETCD_ENDPOINTS"].startswith(f"https://{rel.etcd}-0.")
    assert env["JOBLEASE_ETCD_CERT_FILE"] and env["JOBLEASE_ETCD_CA_FILE"]

    # the operator registers a JobLease in the bundled etcd
    rel.apply_joblease("over-tls")
    status = rel.wait_registered("over-tls")
    assert status["etcdRevision"] > 0

    # the client port refuses plain HTTP and TLS without a client certificate
    url = f"{rel.etcd}:2379/health"
    out_text = run_curl_pod(rel.cluster, rel.namespace, "curl-etcd", f"{rel.etcd}-client", (
        f"curl -fsS --max-time 10 http://{url}; echo plain=$?; "
        f"curl -fsS --max-time 10 --cacert /tls/ca.crt https://{url}; echo nocert=$?; "
        f"curl -fsS --max-time 10 --retry 10 --retry-all-errors --cacert /tls/ca.crt "
        f"--cert /tls/tls.crt --key /tls/tls.key https://{url}; echo; echo withcert=$?"))
    lines = out_text.splitlines()
    assert "plain=0" not in lines and any(x.startswith("plain=") for x in lines), out_text
    assert "nocert=0" not in lines and any(x.startswith("nocert=") for x in lines), out_text
    assert "withcert=0" in lines and '"health":"true"' in out_text, out_text


def test_upgrade_keeps_the_certificates_and_the_registrations(release: Release) -> None:
    rel = release
    rel.helm("install", rel.name, str(CHART), *TEST_CLUSTER_VALUES)
    rel.wait_ready()
    rel.apply_joblease("kept")
    before = rel.wait_registered("kept")
    server = secret_data(rel, f"{rel.etcd}-server-tls")
    client = secret_data(rel, f"{rel.etcd}-client")
    webhook = secret_data(rel, f"{rel.fullname}-webhook-tls")
    old_pod = rel.operator_pod()["metadata"]["uid"]
    etcd_pod = rel.get("pod", f"{rel.etcd}-0")["metadata"]["uid"]

    rel.helm("upgrade", rel.name, str(CHART), *TEST_CLUSTER_VALUES,
             "--set", "operator.logLevel=DEBUG")
    rel.wait_ready()
    wait_until(lambda: rel.operator_pod()["metadata"]["uid"] != old_pod, timeout=300,
               what="the operator pod replaced by the upgrade", interval=1)
    new_pod = rel.operator_pod()
    assert "--log-level=DEBUG" in new_pod["spec"]["containers"][0]["args"]

    assert secret_data(rel, f"{rel.etcd}-server-tls") == server
    assert secret_data(rel, f"{rel.etcd}-client") == client
    # the injection webhook's serving certificate too, and its CA stays the caBundle
    assert secret_data(rel, f"{rel.fullname}-webhook-tls") == webhook
    configs = json.loads(rel.kubectl("get", "mutatingwebhookconfigurations", "-o", "json"))
    # every hook of the release: the pods' (injection) and the Jobs' (CronJob slots)
    hooks = [w for c in configs["items"] for w in c["webhooks"]
             if w["clientConfig"].get("service", {}).get("namespace") == rel.namespace]
    assert sorted(h["name"] for h in hooks) == ["inject.joblease.io", "slots.joblease.io"]
    assert all(h["clientConfig"]["caBundle"] == webhook["ca.crt"] for h in hooks)
    # the member kept running (its emptyDir, i.e. the job state, is the same)
    assert rel.get("pod", f"{rel.etcd}-0")["metadata"]["uid"] == etcd_pod
    # the new operator talks to etcd with the kept certificates ...
    rel.apply_joblease("after-upgrade")
    rel.wait_registered("after-upgrade")
    # ... and the registration from before is the same one (no re-registration)
    after = rel.get("joblease", "kept")["status"]
    assert after["phase"] == "Pending"
    assert after["etcdRevision"] == before["etcdRevision"], (before, after)
    assert after.get("generation") == before.get("generation")
    ca = base64.b64decode(server["ca.crt"])
    assert ca.startswith(b"-----BEGIN CERTIFICATE-----") and server["ca.crt"] == client["ca.crt"]


def test_three_members_and_a_worker_namespace_with_its_tenant_secret(
        release: Release, cluster: Cluster) -> None:
    """3 members form one cluster; a labelled namespace gets its tenant Secret (the
    workers' certificate, not the operator's) and reaches etcd through the client
    Service with it."""
    rel = release
    workers = f"{rel.namespace[:50]}-workers"
    cluster.kubectl("create", "namespace", workers, check=True)
    try:
        rel.helm("install", rel.name, str(CHART), *TEST_CLUSTER_VALUES,
                 "--set", "etcd.replicas=3")
        rel.wait_ready()
        assert rel.get("statefulset", rel.etcd)["status"]["readyReplicas"] == 3
        rel.apply_joblease("three")
        rel.wait_registered("three")

        rel.opt_in(workers)
        tenant = json.loads(cluster.kubectl("get", "secret", "joblease-etcd-credentials",
                                            "-n", workers, "-o", "json", check=True).stdout)
        worker_tls = secret_data(rel, f"{rel.etcd}-worker-tls")
        assert {k: tenant["data"][k] for k in worker_tls} == worker_tls
        assert tenant["data"]["tls.crt"] != secret_data(rel, f"{rel.etcd}-client")["tls.crt"]
        # etcd auth is on: the workers' certificate alone names no user; the tenant's own
        # user works on its namespace's job through the client Service (a pod of the
        # project image, with the library)
        script = (
            "import asyncio, os\n"
            "from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec\n"
            "d = '/tls'\n"
            "read = lambda k: open(f'{d}/{k}').read().strip()\n"
            "c = EtcdConfig.from_env(os.environ).with_(username=read('username'),\n"
            "                                          password=read('password'))\n"
            "async def main():\n"
            "    async with JobLeaseClient(c) as w:\n"
            f"        job = JobRef({workers!r}, 'three')\n"
            "        await w.register(job, JobSpec(lease_duration_seconds=10))\n"
            "        lease = await w.claim(job, 'w')\n"
            "        await lease.complete({'members': 3})\n"
            "        print('COMPLETED', lease.token)\n"
            "asyncio.run(main())\n")
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "tenant", "namespace": workers},
            "spec": {"restartPolicy": "Never",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                     "containers": [{
                         "name": "w", "image": image_ref("ghcr.io/joblease/joblease:"),
                         "imagePullPolicy": "Never", "command": ["python", "-c", script],
                         "env": [{"name": "JOBLEASE_ETCD_ENDPOINTS",
                                  "value": f"https://{rel.etcd}.{rel.namespace}.svc:2379"},
                                 {"name": "JOBLEASE_ETCD_CA_FILE", "value": "/tls/ca.crt"},
                                 {"name": "JOBLEASE_ETCD_CERT_FILE", "value": "/tls/tls.crt"},
                                 {"name": "JOBLEASE_ETCD_KEY_FILE", "value": "/tls/tls.key"}],
                         "volumeMounts": [{"name": "tls", "mountPath": "/tls",
                                           "readOnly": True}]}],
                     "volumes": [{"name": "tls", "secret": {
                         "secretName": "joblease-etcd-credentials"}}]}}
        cluster.apply(json.dumps(pod))
        phase = cluster.wait_pod_done("tenant", workers, timeout=300)
        logs = cluster.kubectl("logs", "tenant", "-n", workers)
        assert phase == "Succeeded" and "COMPLETED" in logs.stdout, logs.stdout + logs.stderr
    finally:
        cluster.kubectl("delete", "namespace", workers, "--wait=false")
