"""The seed example with pods: a frozen holder can neither complete nor write.

Everything is a pod on the session cluster, with the chart's operator and bundled
etcd (the shared ``joblease_release``): the example ledger from
examples/ledger.yaml (unchanged) and two worker pods, A and B, built from the pod
template of examples/worker-pod.yaml, competing for one JobLease:

1. A claims (generation g, token T_A) and writes entry 1 to the ledger with T_A;
   B's sidecar is refused meanwhile (A holds the job);
2. A's sidecar container is frozen from the node (cgroup v1 freezer,
   tests/support/freezer.py): it stops renewing, etcd expires A's lease after the
   TTL, B claims generation g+1 with T_B > T_A, writes its entries, completes;
3. A's sidecar is thawed; A's worker, let go only now (a file the test creates
   with ``kubectl exec``), sends its delayed write with T_A (the ledger refuses
   it: 409 stale) and its completion (the sidecar refuses it: 409 stale);
4. the JobLease status and etcd show B's completion, and the ledger holds no
   entry of A after B's first.

Changed from the example, and why:
- the worker runs ``SEED_WORKER`` below (the example's worker makes no external
  effects): wait for the lease, write to the ledger with the token, optionally
  wait for a file, write again, complete;
- ``JOBLEASE_SIDECAR_ON_LOSS=none``: with the example's ``signal``, A's sidecar
  would SIGTERM A's worker on waking, and its late requests would never be sent.
  The signal is a courtesy (it is not in time for a request already on its way,
  which is exactly the case the fences are for); this test shows the fences;
- ``JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX=1``: B claims within about a second of
  A's expiry instead of up to 5 s (only shortens the test);
- the JobLease's TTL is 5 s (the example's 30 s only lengthens the test); bare
  Pods instead of a Job (the test decides which pod runs first).
The freeze ends (in a ``finally``) as soon as B's claim is seen, so the
sidecar's liveness probe (10 s period, 3 failures) never restarts it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support import freezer
from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster
from tests.support.pods import (
    container_id,
    etcd_state,
    example_worker_pod,
    exec_in,
    pod_logs,
    wait_joblease,
    wait_phase,
)
from tests.support.release import Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

LEDGER_MANIFEST = REPO_ROOT / "examples" / "ledger.yaml"
JOB = "seed-report"
RESOURCE = "seed-report"
GO_FILE = "/run/joblease/go"

#: The workers: the example's lease wait, then effects on the ledger with the token.
SEED_WORKER = r"""#!/bin/sh
set -eu
URL=http://127.0.0.1:8470
JOB="$JOB_NAMESPACE/$JOB_NAME"
while :; do  # 1. wait until the sidecar holds the lease
  out="$(curl -sS --max-time 5 -w '\n%{http_code}' "$URL/v1/lease" || printf '\n000')"
  [ "$(printf '%s\n' "$out" | tail -n 1)" = 200 ] && break
  sleep 0.2
done
lease="$(printf '%s\n' "$out" | sed '$d')"
TOKEN="$(printf '%s' "$lease" | sed -n 's/.*"token":\([0-9]*\).*/\1/p')"
GEN="$(printf '%s' "$lease" | sed -n 's/.*"generation":\([0-9]*\).*/\1/p')"
echo "holding token $TOKEN generation $GEN"
write() {  # 2. an effect on the ledger, fenced by the token
  out="$(curl -sS --max-time 30 -X POST -H 'Content-Type: application/json' \
    -H "Joblease-Job: $JOB" -H "Joblease-Token: $TOKEN" \
    -H "Joblease-Idempotency-Key: $JOB#g$GEN.t$TOKEN:$1" \
    --data "{\"pod\":\"$POD_NAME\",\"step\":$1}" -w '\n%{http_code}' \
    "http://ledger/resources/$RESOURCE" || printf '\n000')"
  echo "write $1 -> $(printf '%s\n' "$out" | tail -n 1) $(printf '%s\n' "$out" | sed '$d')"
}
write 1
if [ -n "${HOLD_FILE:-}" ]; then  # (the test lets A go on only after B completed)
  echo "waiting for $HOLD_FILE"
  while [ ! -e "$HOLD_FILE" ]; do sleep 0.1; done
fi
write 2
out="$(curl -sS --max-time 30 -X POST -H 'Content-Type: application/json' \
  --data "{\"token\":$TOKEN,\"result\":{\"by\":\"$POD_NAME\"}}" -w '\n%{http_code}' \
  "$URL/v1/complete" || printf '\n000')"
status="$(printf '%s\n' "$out" | tail -n 1)"
echo "complete -> $status $(printf '%s\n' "$out" | sed '$d')"
case "$status" in 200) exit 0 ;; 409) exit 7 ;; *) exit 1 ;; esac
"""


def _apply_file(cluster: Cluster, path: Path, namespace: str) -> None:
    r = cluster.kubectl("apply", "-n", namespace, "-f", str(path))
    assert r.returncode == 0, r.stderr


def _worker(namespace: str, name: str, *, hold: bool) -> str:
    pod = example_worker_pod(
        namespace, name, JOB, script="seed-worker",
        sidecar_env={"JOBLEASE_SIDECAR_ON_LOSS": "none",
                     "JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX": "1"},
        worker_env={"JOB_NAME": JOB, "RESOURCE": RESOURCE, **({"HOLD_FILE": GO_FILE}
                                                              if hold else {})})
    (worker,) = pod["spec"]["containers"]
    worker["env"] += [
        {"name": "JOB_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}]
    return json.dumps(pod)


def _owner(cluster: Cluster, namespace: str, pod: str) -> str:
    """The owner identity the sidecar claims with: ``POD_NAME/POD_UID``."""
    found = cluster.pod(pod, namespace)
    assert found is not None, pod
    return f"{pod}/{found['metadata']['uid']}"


def _ledger(cluster: Cluster, namespace: str) -> dict[str, Any]:
    """``GET /resources/<RESOURCE>`` of the ledger, from inside its own pod."""
    r = cluster.kubectl("exec", "deploy/ledger", "-n", namespace, "--", "python", "-c",
                        "import urllib.request; print(urllib.request.urlopen("
                        f"'http://127.0.0.1:8080/resources/{RESOURCE}').read().decode())",
                        timeout=90)
    assert r.returncode == 0, r.stderr
    found: dict[str, Any] = json.loads(r.stdout)
    return found


def _log_line(log: str, prefix: str) -> str:
    lines = [line for line in log.splitlines() if line.startswith(prefix)]
    assert len(lines) == 1, f"one {prefix!r} line expected:\n{log}"
    return lines[0]


def test_frozen_holder_is_fenced_off_after_the_next_pod_claims(
        cluster: Cluster, worker_namespace: str, joblease_release: Release) -> None:
    ns = worker_namespace
    _apply_file(cluster, LEDGER_MANIFEST, ns)
    cluster.apply(json.dumps({
        "apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "seed-worker", "namespace": ns},
             "data": {"worker.sh": SEED_WORKER}},
            {"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
             "metadata": {"name": JOB, "namespace": ns},
             "spec": {"leaseDurationSeconds": 5, "maxAttempts": 3}}]}))
    rollout = cluster.kubectl("rollout", "status", "deployment/ledger", "-n", ns,
                              "--timeout=300s", timeout=330)
    assert rollout.returncode == 0, rollout.stderr
    wait_phase(cluster, ns, JOB, "Pending")

    # 1. A claims and writes; B's sidecar competes and is refused
    cluster.apply(_worker(ns, "worker-a", hold=True))
    owner_a = _owner(cluster, ns, "worker-a")
    held_a = wait_joblease(cluster, ns, JOB, lambda s: s.get("holderIdentity") == owner_a,
                           "held by worker-a")
    gen_a, token_a = held_a["generation"], held_a["fencingToken"]
    wait_until(lambda: "write 1 -> " in pod_logs(cluster, ns, "worker-a", "worker"),
               timeout=240, interval=0.5, what="worker-a's first write")
    log_a = pod_logs(cluster, ns, "worker-a", "worker")
    assert f"holding token {token_a} generation {gen_a}" in log_a, log_a
    assert _log_line(log_a, "write 1 -> ").startswith("write 1 -> 201 "), log_a
    cluster.apply(_worker(ns, "worker-b", hold=False))
    owner_b = _owner(cluster, ns, "worker-b")
    wait_until(lambda: "job held by another owner" in pod_logs(cluster, ns, "worker-b",
                                                               "joblease"),
               timeout=240, interval=0.5, what="worker-b's sidecar refused while A holds")
    assert wait_phase(cluster, ns, JOB, "Claimed")["holderIdentity"] == owner_a

    # 2. freeze A's sidecar container from the node, past A's TTL, until B holds
    pod_a = cluster.pod("worker-a", ns)
    assert pod_a is not None
    cgroup = freezer.container_cgroup(pod_a["metadata"]["uid"],
                                      container_id(pod_a, "joblease"))
    froze = time.monotonic()
    with freezer.frozen(cgroup):
        # really frozen: A's own sidecar no longer answers A's worker
        probe = exec_in(cluster, ns, "worker-a", "worker", "curl", "-sS", "--max-time", "3",
                        "http://127.0.0.1:8470/healthz")
        assert probe.returncode != 0, probe.stdout
        # B can claim only once etcd has expired A's lease: A is frozen past its TTL.
        # B's worker completes at once, so its claim may be mirrored already Completed
        # (the operator writes the newest state; Claimed by B need never be served).
        held_b = wait_joblease(cluster, ns, JOB, lambda s: owner_b in (
            s.get("holderIdentity"), s.get("completedBy")), "claimed by worker-b")
        assert freezer.is_frozen(cgroup)
    print(f"\nworker-a's sidecar frozen for {time.monotonic() - froze:.1f}s (TTL 5s)")
    assert held_b["generation"] == gen_a + 1
    token_b = held_b["fencingToken"]
    assert token_b > token_a

    # B completes
    assert cluster.wait_pod_done("worker-b", ns, timeout=240) == "Succeeded", \
        pod_logs(cluster, ns, "worker-b", "worker")
    log_b = pod_logs(cluster, ns, "worker-b", "worker")
    for step in (1, 2):
        assert _log_line(log_b, f"write {step} -> ").startswith(f"write {step} -> 201 "), log_b
    assert _log_line(log_b, "complete -> ").startswith("complete -> 200 "), log_b
    done = wait_phase(cluster, ns, JOB, "Completed")

    # 3. A, thawed, knows its lease is gone; its late write and completion are refused
    lease_a = exec_in(cluster, ns, "worker-a", "worker", "curl", "-sS", "--max-time", "10",
                      "-w", "\n%{http_code}", "http://127.0.0.1:8470/v1/lease")
    body, _, code = lease_a.stdout.rpartition("\n")
    assert code == "409" and json.loads(body)["error"] == "lost", lease_a
    assert "token" not in json.loads(body), body  # the old token is never handed out again
    go = exec_in(cluster, ns, "worker-a", "worker", "touch", GO_FILE)
    assert go.returncode == 0, go.stderr
    assert cluster.wait_pod_done("worker-a", ns, timeout=240) == "Failed"
    log_a = pod_logs(cluster, ns, "worker-a", "worker")
    late = _log_line(log_a, "write 2 -> ")
    assert late.startswith("write 2 -> 409 ") and '"error":"stale"' in late, log_a
    assert f'"highestToken":{token_b}' in late, late
    refused = _log_line(log_a, "complete -> ")
    assert refused.startswith("complete -> 409 ") and '"error":"stale"' in refused, log_a
    final_a = (cluster.pod("worker-a", ns) or {})["status"]
    (worker_a,) = final_a["containerStatuses"]
    assert worker_a["state"]["terminated"]["exitCode"] == 7  # the example's "stale"
    # the same sidecar process all along: the kubelet did not restart it (a restarted
    # sidecar would claim anew, and this would no longer be a paused holder waking up)
    (sidecar_a,) = final_a["initContainerStatuses"]
    assert sidecar_a["restartCount"] == 0, sidecar_a

    # 4. the status, etcd and the ledger show the winner, and nothing of A after B
    final = wait_phase(cluster, ns, JOB, "Completed")
    assert final["generation"] == gen_a + 1 and final["fencingToken"] == token_b, final
    assert final["etcdRevision"] >= done["etcdRevision"]  # never backwards
    (completed,) = [c for c in final["conditions"] if c["type"] == "Completed"]
    assert completed["status"] == "True" and f"completed by {owner_b}" in completed["message"]
    state = etcd_state(joblease_release, ns, JOB)
    assert state is not None and state["holder"] is None, state
    assert state["result"]["owner"] == owner_b and state["result"]["token"] == token_b, state
    assert state["result"]["result"] == {"by": "worker-b"}

    ledger = _ledger(cluster, ns)
    entries = ledger["entries"]
    assert ledger["highestToken"] == token_b, ledger
    assert [(e["token"], e["data"]) for e in entries] == [
        (token_a, {"pod": "worker-a", "step": 1}),
        (token_b, {"pod": "worker-b", "step": 1}),
        (token_b, {"pod": "worker-b", "step": 2})], ledger
    first_b = min(e["seq"] for e in entries if e["token"] == token_b)
    assert not [e for e in entries if e["token"] == token_a and e["seq"] > first_b], ledger
