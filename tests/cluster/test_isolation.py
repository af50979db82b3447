"""Isolation by default (issue 28), on the real cluster with the chart's defaults.

The shared ``joblease_release`` is installed with the chart's defaults: the bundled
etcd with auth on (the operator turned it on as root), tenants following the
injection label. Real pods, the real operator, the real etcd; nothing faked.

- A worker pod in namespace A, with everything a worker pod gets mounted (the tenant
  Secret: the namespace's etcd user and password and the workers' client
  certificate), is refused by etcd -- permission denied -- reading, claiming,
  completing, releasing, checkpointing a job of namespace B, writing the operator's
  leader key and listing other prefixes; its own namespace's job works, and B's job
  is unchanged. The certificate alone (no password) reaches nothing.
- Labelling a new namespace is the only step: its first injected pod holds its lease
  (timed); removing the label makes its credentials refused within a bound, while
  another namespace's credentials keep working.
- The etcd process restarts (its data kept): the operator and a running sidecar
  authenticate again (simple tokens die with the process) and carry on.
- A rotation of a namespace's credentials under a steady claim/complete load (a
  Deployment of queue workers draining): no claim or completion fails, the kubelet's
  copy of the Secret reaches the sidecars within the chart's grace, and the old user is
  refused afterwards.
"""

from __future__ import annotations

import base64
import json
import time
from typing import Any

import pytest
import yaml

from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster, image_ref, kill_containers
from tests.support.pods import container_id, etcd_state, pod_logs, wait_phase
from tests.support.queue_pods import pods_of, queue_cli, queue_items, queue_ready
from tests.support.release import INJECT_LABEL, TENANT_SECRET, Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

#: A worker pod's attempts, as a Python program in the project image (it has the
#: library): every outcome is printed as one JSON object.
PROBE = r'''
import asyncio, json, os
from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.errors import JobLeaseError
from joblease.keys import KeySpace
from joblease.operator.election import election_key
from joblease.store import Delete, Put

D = "/etc/joblease/etcd"
def read(name):
    with open(f"{D}/{name}") as f:
        return f.read().strip()

base = EtcdConfig.from_env(os.environ)
tenant = base.with_(username=read("username"), password=read("password"))
A, B, TOKEN = os.environ["NS_A"], os.environ["NS_B"], int(os.environ["TOKEN_B"])
out = {}

async def attempt(name, make):
    try:
        await make()
        out[name] = "ok"
    except JobLeaseError as exc:
        out[name] = f"{type(exc).__name__}: {exc}"[:300]

async def main():
    theirs, ours = JobRef(B, "theirs"), JobRef(A, "ours")
    async with JobLeaseClient(tenant) as c:
        k = c.keys.job(theirs)
        await attempt("read", lambda: c.get(theirs))
        await attempt("claim", lambda: c.claim(theirs, "intruder"))
        await attempt("complete-handle", lambda: c.lease_for(theirs, "b-worker", TOKEN))
        await attempt("complete", lambda: c.store.put(k.result, b'{"forged": true}'))
        await attempt("release", lambda: c.store.txn([], [Delete(k.holder)]))
        await attempt("checkpoint", lambda: c.store.put(k.checkpoint, b"{}"))
        await attempt("unregister", lambda: c.unregister(theirs))
        await attempt("operator-key", lambda: c.store.put(
            election_key(base.root, "all-namespaces"), b"intruder"))
        await attempt("list-all", lambda: c.list())
        await attempt("list-b", lambda: c.list(B))
        await attempt("list-root", lambda: c.store.get(b"/", prefix=True, keys_only=True))
        lease = await c.claim(ours, "a-worker")
        await lease.checkpoint({"step": 1})
        await lease.complete({"ok": True})
        out["own"] = "ok"
    async with JobLeaseClient(base) as bare:  # the certificate, no password
        await attempt("certificate-only", lambda: bare.get(ours))
    print("PROBE " + json.dumps(out))

asyncio.run(main())
'''


def opt_in_second(cluster: Cluster, release: Release, namespace: str) -> str:
    other = f"{namespace[:50]}-b"
    cluster.kubectl("create", "namespace", other, check=True)
    release.opt_in(other)
    return other


def apply_joblease(cluster: Cluster, namespace: str, name: str, ttl: int) -> None:
    cluster.apply(json.dumps({
        "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"leaseDurationSeconds": ttl, "maxAttempts": 3}}))


def injected_worker_pod(namespace: str, name: str, job: str, script: str) -> dict[str, Any]:
    """A pod the webhook injects a sidecar into for ``job`` (by annotation): one worker
    container, ``w``, running ``script`` with sh in the curl image, as a non-root user."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace,
                         "annotations": {"joblease.io/job": job}},
            "spec": {"restartPolicy": "Never",
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                     "containers": [{"name": "w",
                                     "image": image_ref("docker.io/curlimages/curl"),
                                     "imagePullPolicy": "Never",
                                     "command": ["sh", "-c", script]}]}}


def operator_exec(release: Release, *argv: str) -> str:
    pod = release.operator_pod()["metadata"]["name"]
    r = release.cluster.kubectl("exec", "-n", release.namespace, pod, "-c", "operator", "--",
                                *argv, timeout=60)
    assert r.returncode == 0, f"{argv}: {r.returncode} {r.stdout} {r.stderr}"
    return r.stdout


def tenant_credentials(cluster: Cluster, namespace: str) -> tuple[str, str]:
    secret = json.loads(cluster.kubectl("get", "secret", TENANT_SECRET, "-n", namespace,
                                        "-o", "json", check=True).stdout)
    data = {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}
    return data["username"], data["password"]


AUTHENTICATE = r'''
import asyncio, os, sys
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.tenancy import EtcdAuthAdmin

async def main():
    async with EtcdStore(EtcdConfig.from_env(os.environ)) as store:
        print("ACCEPTED" if await EtcdAuthAdmin(store).authenticate(sys.argv[1], sys.argv[2])
              else "REFUSED")

asyncio.run(main())
'''


def etcd_accepts(release: Release, username: str, password: str) -> bool:
    """Whether etcd authenticates ``username`` (asked from the operator's container,
    which has the library and reaches etcd)."""
    out = operator_exec(release, "python", "-c", AUTHENTICATE, username, password)
    assert out.strip() in ("ACCEPTED", "REFUSED"), out
    return out.strip() == "ACCEPTED"


def test_a_worker_pod_reaches_only_its_own_namespace(
        cluster: Cluster, joblease_release: Release, worker_namespace: str) -> None:
    rel, a = joblease_release, worker_namespace
    b = opt_in_second(cluster, rel, a)
    try:
        apply_joblease(cluster, b, "theirs", ttl=300)
        apply_joblease(cluster, a, "ours", ttl=30)
        wait_phase(cluster, b, "theirs", "Pending")
        wait_phase(cluster, a, "ours", "Pending")
        claimed = json.loads(operator_exec(rel, "joblease", "claim", "theirs", "-n", b,
                                           "--owner", "b-worker", "-o", "json"))
        before = etcd_state(rel, b, "theirs")
        pod = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "intruder", "namespace": a},
            "spec": {
                "restartPolicy": "Never",
                "securityContext": {"runAsNonRoot": True, "runAsUser": 65532},
                "containers": [{
                    "name": "probe", "image": image_ref("ghcr.io/joblease/joblease:"),
                    "imagePullPolicy": "Never", "command": ["python", "-c", PROBE],
                    "env": [
                        {"name": "NS_A", "value": a}, {"name": "NS_B", "value": b},
                        {"name": "TOKEN_B", "value": str(claimed["token"])},
                        {"name": "JOBLEASE_ETCD_ENDPOINTS",
                         "value": f"https://{rel.etcd}.{rel.namespace}.svc:2379"},
                        {"name": "JOBLEASE_ETCD_CA_FILE", "value": "/etc/joblease/etcd/ca.crt"},
                        {"name": "JOBLEASE_ETCD_CERT_FILE",
                         "value": "/etc/joblease/etcd/tls.crt"},
                        {"name": "JOBLEASE_ETCD_KEY_FILE",
                         "value": "/etc/joblease/etcd/tls.key"}],
                    "volumeMounts": [{"name": "etcd", "mountPath": "/etc/joblease/etcd",
                                      "readOnly": True}]}],
                "volumes": [{"name": "etcd", "secret": {"secretName": TENANT_SECRET}}]}}
        cluster.apply(json.dumps(pod))
        phase = cluster.wait_pod_done("intruder", a, timeout=300)
        logs = cluster.kubectl("logs", "intruder", "-n", a).stdout
        assert phase == "Succeeded", logs
        (line,) = [x for x in logs.splitlines() if x.startswith("PROBE ")]
        out = json.loads(line.removeprefix("PROBE "))
        assert out.pop("own") == "ok"
        certificate_only = out.pop("certificate-only")
        assert certificate_only.startswith("PermissionDeniedError"), certificate_only
        for name, outcome in out.items():
            assert outcome.startswith("PermissionDeniedError") and (
                "permission denied" in outcome), (name, outcome)
        assert set(out) == {"read", "claim", "complete-handle", "complete", "release",
                            "checkpoint", "unregister", "operator-key", "list-all", "list-b",
                            "list-root"}
        after = etcd_state(rel, b, "theirs")
        assert before is not None and after is not None
        before.pop("revision"), after.pop("revision")  # the read's, not the job's
        assert after == before  # held by b-worker, no result, no checkpoint
        assert after["holder"]["owner"] == "b-worker" and after["result"] is None
        ours = etcd_state(rel, a, "ours")
        assert ours is not None and ours["result"]["result"] == {"ok": True}
    finally:
        cluster.kubectl("delete", "namespace", b, "--wait=false")


def test_opting_a_namespace_in_and_out_follows_its_label(
        cluster: Cluster, joblease_release: Release, namespace: str) -> None:
    rel, ns = joblease_release, namespace
    apply_joblease(cluster, ns, "first", ttl=10)
    wait_phase(cluster, ns, "first", "Pending")
    pod = injected_worker_pod(ns, "first-worker", "first", "sleep 600")
    labelled = time.monotonic()
    cluster.kubectl("label", "namespace", ns, INJECT_LABEL, check=True)
    created = cluster.kubectl("create", "-f", "-", input=json.dumps(pod))
    assert created.returncode == 0, created.stderr
    if "Warning:" in created.stderr:  # the Secret was not there yet at admission
        assert f"Secret {ns}/{TENANT_SECRET} does not exist" in created.stderr
        assert "once the namespace is labelled for injection" in created.stderr
    status = wait_phase(cluster, ns, "first", "Claimed", timeout=300)
    to_lease = time.monotonic() - labelled
    assert status["holderIdentity"]
    print(f"\nlabel -> first pod holds its lease: {to_lease:.1f} s "
          f"(admission warning: {'Warning:' in created.stderr})")

    user, password = tenant_credentials(cluster, ns)
    other_user, other_password = tenant_credentials(cluster, "default")
    assert etcd_accepts(rel, user, password)
    unlabelled = time.monotonic()
    cluster.kubectl("label", "namespace", ns, INJECT_LABEL.split("=")[0] + "-", check=True)
    wait_until(lambda: not etcd_accepts(rel, user, password), timeout=90,
               what="the opted-out namespace's credentials refused", interval=1)
    refused_after = time.monotonic() - unlabelled
    wait_until(lambda: cluster.kubectl("get", "secret", TENANT_SECRET, "-n",
                                       ns).returncode != 0,
               timeout=30, what="the opted-out namespace's Secret deleted", interval=0.5)
    print(f"unlabel -> credentials refused: {refused_after:.1f} s")
    assert etcd_accepts(rel, other_user, other_password)  # other namespaces unaffected
    cluster.kubectl("delete", "pod", "first-worker", "-n", ns, "--wait=false")


def test_an_etcd_restart_with_auth_on_is_survived_by_operator_and_sidecars(
        cluster: Cluster, joblease_release: Release, worker_namespace: str) -> None:
    """Simple auth tokens die with the etcd process: the operator and a holding sidecar
    authenticate again (watch and keep-alive streams included) and carry on."""
    rel, ns = joblease_release, worker_namespace
    apply_joblease(cluster, ns, "survivor", ttl=15)
    wait_phase(cluster, ns, "survivor", "Pending")
    pod = injected_worker_pod(ns, "survivor", "survivor", (
        "until [ -f /run/joblease/go ]; do sleep 1; done; "
        "curl -fsS -X POST -d \"{\\\"token\\\": $(cat $JOBLEASE_TOKEN_FILE), "
        "\\\"result\\\": {\\\"after\\\": \\\"restart\\\"}}\" "
        "$JOBLEASE_SIDECAR_URL/v1/complete"))
    cluster.apply(json.dumps(pod))
    held = wait_phase(cluster, ns, "survivor", "Claimed", timeout=300)
    member = json.loads(cluster.kubectl("get", "pod", f"{rel.etcd}-0", "-n", rel.namespace,
                                        "-o", "json", check=True).stdout)
    restarts = member["status"]["containerStatuses"][0]["restartCount"]
    kill_containers(cluster, [container_id(member, "etcd")])

    def restarted() -> bool:
        p = json.loads(cluster.kubectl("get", "pod", f"{rel.etcd}-0", "-n", rel.namespace,
                                       "-o", "json", check=True).stdout)
        s = p["status"]["containerStatuses"][0]
        return bool(s["restartCount"] > restarts and s.get("ready"))
    wait_until(restarted, timeout=180, what="the etcd member restarted and ready", interval=1)
    # the sidecar renews across the restart (a lease outlives it: TTL restarts), then
    # completes with the token it held; the operator's mirror reports it
    r = cluster.kubectl("exec", "survivor", "-n", ns, "-c", "w", "--", "touch",
                        "/run/joblease/go")
    assert r.returncode == 0, r.stderr
    done = wait_phase(cluster, ns, "survivor", "Completed", timeout=120)
    assert done["fencingToken"] == held["fencingToken"]
    assert done["result"] == {"after": "restart"}


def test_a_rotation_under_a_draining_deployment_fails_no_claim(
        cluster: Cluster, joblease_release: Release, queue_namespace: str) -> None:
    """Credential rotation under a steady claim/complete load, with the chart's defaults
    (grace ``rotationGraceSeconds`` 150 s, the operator's resync every 60 s): the example
    Deployment of queue workers (examples/queue-deployment.yaml, 2 replicas; each Go
    sidecar claims and completes one item after another) drains while the operator
    rotates the namespace's credentials (``joblease.io/rotate=true`` on its Secret).
    The sidecars go on with the old user's token until etcd deletes that user, then
    authenticate again from their mounted files, which the kubelet has refreshed by
    then. The queue is topped up a little at a time, so the drain outlasts the rotation.

    Asserted: the Secret names the other user; etcd refuses the old password at the
    end of the grace and accepts the new one; items were completed after the old user
    was gone; no item was claimed twice (a failed claim, completion or keep-alive ends
    the sidecar's lease and its item goes to another claim); no container restarted;
    no sidecar logged an authentication failure or a refusal."""
    ns, queue = queue_namespace, "files"
    docs = [d for d in yaml.safe_load_all(
        (REPO_ROOT / "examples" / "queue-deployment.yaml").read_text()) if d]
    for doc in docs:
        if doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = 2  # two sidecars re-authenticate; fewer pods to start
    for doc in docs:
        doc["metadata"]["namespace"] = ns
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": docs}))
    queue_ready(cluster, ns, queue)
    enqueued = 0

    def top_up() -> dict[str, Any]:
        """The queue's counts, with 20 more items whenever fewer than 20 wait: at each
        poll (every 2-3 s), so the load is steady but bounded (the two workers drain
        some 45 items/s here when they can, too much beside the rest of the suite)."""
        nonlocal enqueued
        counts: dict[str, Any] = queue_cli(cluster, ns, "queue", "get", queue)
        if counts["pending"] < 20:
            lines = "".join(json.dumps({"id": f"r{n:05d}", "payload": {"n": n}}) + "\n"
                            for n in range(enqueued, enqueued + 20))
            added = queue_cli(cluster, ns, "queue", "enqueue", queue, "--file", "-",
                              stdin=lines)
            assert added["added"] == 20, added
            enqueued += 20
        return counts

    def completed_at_least(n: int) -> bool:
        return int(top_up()["completed"]) >= n

    wait_until(lambda: completed_at_least(30), timeout=300, interval=2,
               what="30 items completed before the rotation")
    old_user, old_password = tenant_credentials(cluster, ns)
    cluster.kubectl("annotate", "secret", TENANT_SECRET, "-n", ns, "joblease.io/rotate=true",
                    check=True)
    began = time.monotonic()

    def rotated() -> bool:
        top_up()
        return tenant_credentials(cluster, ns)[0] != old_user
    wait_until(rotated, timeout=180, interval=2, what="the Secret naming the other user")
    new_user, new_password = tenant_credentials(cluster, ns)

    def old_refused() -> bool:
        top_up()
        return not etcd_accepts(joblease_release, old_user, old_password)
    wait_until(old_refused, timeout=150 + 180, interval=3, what="etcd refusing the old user")
    refused_after = time.monotonic() - began
    at_refusal = int(top_up()["completed"])
    print(f"\nrotation: the old user refused {refused_after:.0f}s after the annotation, "
          f"{at_refusal} items completed by then")
    wait_until(lambda: completed_at_least(at_refusal + 30), timeout=240, interval=2,
               what="30 items completed after the old user was deleted")
    assert etcd_accepts(joblease_release, new_user, new_password)

    selector = "app.kubernetes.io/name=files"
    pods = pods_of(cluster, ns, selector)
    assert len(pods) == 2
    for pod in pods:
        statuses = [*pod["status"].get("initContainerStatuses", ()),
                    *pod["status"].get("containerStatuses", ())]
        assert all(c["restartCount"] == 0 for c in statuses), (
            pod["metadata"]["name"], [(c["name"], c["restartCount"]) for c in statuses])
        log = pod_logs(cluster, ns, pod["metadata"]["name"], "joblease")
        for bad in ("authentication failed", "permission denied", "lease lost"):
            assert bad not in log, (pod["metadata"]["name"], bad, log[-3000:])
    # stop the drain: each sidecar gives its item back on SIGTERM
    cluster.kubectl("scale", "deployment/files", "-n", ns, "--replicas=0", check=True)
    wait_until(lambda: queue_cli(cluster, ns, "queue", "get", queue)["held"] == 0,
               timeout=120, interval=2, what="no item held after the scale-down")
    counts = queue_cli(cluster, ns, "queue", "get", queue)
    assert counts["failed"] == 0 and counts["total"] == enqueued, counts
    items = queue_items(cluster, ns, queue, limit=100_000)
    assert len(items) == enqueued, (len(items), enqueued)
    twice = [i for i, st in items.items() if st["generation"] > 1]
    assert not twice, twice
    done = [st for st in items.values() if st["phase"] == "Completed"]
    assert len(done) == counts["completed"] >= at_refusal + 30, counts
    print(f"rotation: {len(done)} items completed ({at_refusal} before the old user was "
          f"refused), none claimed twice")
