"""Bad input at the cluster boundary is refused with its reason and changes nothing.

Real API server, operator, bundled etcd and pods (the shared ``joblease_release``):

- JobLeases the CRD's schema refuses are refused by ``kubectl apply`` (the API
  server's validation: OpenAPI bounds and types, CEL, strict field validation of
  unknown fields) with a message naming the field; no object exists afterwards and
  the operator registered nothing in etcd;
- a worker that sends its sidecar a malformed or stale completion gets a 4xx; the
  JobLease status and the job's state in etcd are unchanged, and the lease is
  still held: the worker's real completion afterwards is accepted.
The worker pod is examples/worker-pod.yaml's (its ConfigMap and pod template),
with its own JobLease name and ``JOBLEASE_EXAMPLE_HOLD_FILE`` set, so the worker
holds the lease until the test has sent the bad completions (``kubectl exec``).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import Cluster
from tests.support.pods import (
    etcd_state,
    example_docs,
    example_worker_pod,
    exec_in,
    joblease_status,
    pod_logs,
    wait_joblease,
    wait_phase,
)
from tests.support.release import Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

#: (case, spec, what the API server's message must name)
REFUSED: list[tuple[str, dict[str, Any], list[str]]] = [
    ("negative-ttl", {"leaseDurationSeconds": -5},
     ["spec.leaseDurationSeconds", "should be greater than or equal to 2"]),
    ("ttl-below-etcd-minimum", {"leaseDurationSeconds": 1},
     ["spec.leaseDurationSeconds", "greater than or equal to 2"]),
    ("ttl-too-long", {"leaseDurationSeconds": 86401},
     ["spec.leaseDurationSeconds", "less than or equal to 86400"]),
    ("negative-attempts", {"leaseDurationSeconds": 30, "maxAttempts": -1},
     ["spec.maxAttempts", "greater than or equal to 0"]),
    ("attempts-not-a-number", {"leaseDurationSeconds": 30, "maxAttempts": "three"},
     ["spec.maxAttempts", "must be of type integer"]),
    ("no-ttl", {"maxAttempts": 3}, ["spec.leaseDurationSeconds", "Required value"]),
    ("unknown-field", {"leaseDurationSeconds": 30, "ttlSeconds": 30},
     ['unknown field "spec.ttlSeconds"']),
]


def _joblease(namespace: str, name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
                       "metadata": {"name": name, "namespace": namespace}, "spec": spec})


def test_joblease_the_schema_refuses_is_refused_by_the_api_server_and_not_created(
        cluster: Cluster, worker_namespace: str, joblease_release: Release) -> None:
    ns = worker_namespace
    for case, spec, named in REFUSED:
        r = cluster.kubectl("apply", "-f", "-", input=_joblease(ns, case, spec))
        assert r.returncode != 0, f"{case}: accepted: {r.stdout}"
        for text in named:
            assert text in r.stderr, f"{case}: {text!r} not in the refusal: {r.stderr}"
        assert joblease_status(cluster, ns, case) is None, f"{case}: the object exists"
    # the operator never saw any of them: nothing of this namespace is in etcd
    pod = joblease_release.operator_pod()["metadata"]["name"]
    listed = exec_in(cluster, joblease_release.namespace, pod, "operator",
                     "joblease", "list", "-n", ns, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout) == [], listed.stdout
    # the same name with a valid spec is accepted and registered: the refusals were
    # about the specs
    cluster.apply(_joblease(ns, "negative-ttl", {"leaseDurationSeconds": 30}))
    wait_phase(cluster, ns, "negative-ttl", "Pending")
    registered = etcd_state(joblease_release, ns, "negative-ttl")
    assert registered is not None and registered["leaseDurationSeconds"] == 30, registered


def _complete(cluster: Cluster, namespace: str, pod: str, body: str) -> tuple[int, str]:
    """POST ``body`` to the sidecar's /v1/complete from inside the worker container."""
    r = exec_in(cluster, namespace, pod, "worker", "curl", "-sS", "--max-time", "20",
                "-X", "POST", "-H", "Content-Type: application/json", "--data", body,
                "-w", "\n%{http_code}", "http://127.0.0.1:8470/v1/complete")
    assert r.returncode == 0, r.stderr
    text, _, code = r.stdout.rpartition("\n")
    return int(code), text


def _facts(status: dict[str, Any]) -> dict[str, Any]:
    """What the status says about ownership (not the operator's time estimates)."""
    keys = ("phase", "holderIdentity", "generation", "fencingToken", "attempts", "result",
            "claimTime")
    return {k: status.get(k) for k in keys}


def test_malformed_or_stale_completion_gets_a_4xx_and_changes_nothing(
        cluster: Cluster, worker_namespace: str, joblease_release: Release) -> None:
    ns, job = worker_namespace, "bad-completion"
    config_map = example_docs()["ConfigMap"]
    config_map["metadata"]["namespace"] = ns
    pod = example_worker_pod(ns, "worker", job,
                             worker_env={"JOBLEASE_EXAMPLE_HOLD_FILE": "/run/joblease/go"})
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        config_map, json.loads(_joblease(ns, job, {"leaseDurationSeconds": 10}))]}))
    wait_phase(cluster, ns, job, "Pending")
    cluster.apply(json.dumps(pod))
    held = wait_phase(cluster, ns, job, "Claimed")
    token = held["fencingToken"]
    uid = (cluster.pod("worker", ns) or {})["metadata"]["uid"]
    assert held["holderIdentity"] == f"worker/{uid}", held
    before = etcd_state(joblease_release, ns, job)
    assert before is not None and before["holder"]["token"] == token, before

    def worker_running() -> bool:
        # Claimed is the sidecar's doing; the kubelet starts the worker container only
        # after the sidecar's startup probe passed, a moment later
        statuses = ((cluster.pod("worker", ns) or {}).get("status") or {}).get(
            "containerStatuses") or []
        return any(c["name"] == "worker" and "running" in (c.get("state") or {})
                   for c in statuses)
    wait_until(worker_running, timeout=120, interval=0.5, what="the worker container running")

    cases = [  # (body, status, error word)
        ("{not json", 400, "invalid"),
        ('["token", 1]', 400, "invalid"),
        ('{"result": {"items": 3}}', 400, "invalid"),
        (f'{{"token": "{token}", "result": null}}', 400, "invalid"),
        (f'{{"token": {token}.5, "result": null}}', 400, "invalid"),
        ('{"token": -1, "result": null}', 400, "invalid"),
        (f'{{"token": {token - 1}, "result": {{"items": 3}}}}', 409, "stale"),
        (f'{{"token": {token + 1000}, "result": {{"items": 3}}}}', 409, "stale"),
    ]
    for body, want, error in cases:
        code, text = _complete(cluster, ns, "worker", body)
        assert (code, json.loads(text)["error"]) == (want, error), (body, code, text)

    # nothing changed: the status, the job in etcd (no key of it was written), the lease
    after = etcd_state(joblease_release, ns, job)
    assert after is not None
    assert after["modRevision"] == before["modRevision"], (before, after)
    assert (after["holder"], after["result"], after["generation"]) == (
        before["holder"], None, before["generation"])
    status = joblease_status(cluster, ns, job)
    assert status is not None and _facts(status) == _facts(held), (held, status)
    lease = exec_in(cluster, ns, "worker", "worker", "curl", "-sS", "--max-time", "10",
                    "http://127.0.0.1:8470/v1/lease")
    assert json.loads(lease.stdout)["token"] == token, lease.stdout

    # the worker's own completion, with the right token, is still accepted
    go = exec_in(cluster, ns, "worker", "worker", "touch", "/run/joblease/go")
    assert go.returncode == 0, go.stderr
    assert cluster.wait_pod_done("worker", ns, timeout=240) == "Succeeded", \
        pod_logs(cluster, ns, "worker", "worker")
    done = wait_joblease(cluster, ns, job, lambda s: s.get("phase") == "Completed",
                         "Completed by the worker")
    assert done["fencingToken"] == token and done["generation"] == held["generation"]
