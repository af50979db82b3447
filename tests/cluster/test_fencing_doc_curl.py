"""docs/fencing.md's in-pod curl block ("In a cluster: the example ledger"), as written.

The block is taken from the doc (``fenced_blocks``: ``doc_block`` gives a section's first
block, the ``kubectl apply``) and run with ``bash -c`` in the worker
container of a pod built from examples/worker-pod.yaml (the native joblease sidecar
beside it, holding the job ``team-a/nightly-report``, so ``/run/joblease/token`` is the
live token), in namespace ``team-a`` with the ledger applied from examples/ledger.yaml,
as the doc says. The worker image (the curl stand-in of docs/control-plane.md, Debian
minbase) has bash; the block is POSIX too.

What the test supplies, and why:
- ``GEN`` and ``TOKEN`` in the exec environment: the ``generation`` and ``token`` of the
  sidecar's ``GET /v1/lease`` (the doc says so above the block);
- ``CURL_HOME`` naming a ConfigMap whose ``.curlrc`` adds ``write-out`` of the HTTP
  status after each body: the block prints bodies only, and the doc promises codes;
- the worker script only waits (``exec sleep``): the test runs the block itself.
The stale write (an older token) is sent by the test, not by the block (the block
reads the token file, which holds the live token).
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from tests.support.binaries import REPO_ROOT
from tests.support.cli import fenced_blocks
from tests.support.cluster import Cluster
from tests.support.pods import example_worker_pod, exec_in, wait_joblease
from tests.support.release import Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]

DOC = REPO_ROOT / "docs" / "fencing.md"
NS = "team-a"
JOB = "nightly-report"
POD = "doc-curl-worker"
CURL_HOME = "/curl-home"


@pytest.fixture
def team_a(cluster: Cluster, joblease_release: Release) -> Iterator[str]:
    """The doc's namespace ``team-a``, opted in to the shared release; deleted after."""
    cluster.kubectl("create", "namespace", NS, check=True)
    wait_until(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n",
                                       NS).returncode == 0,
               timeout=120, what=f"serviceaccount default in {NS}", interval=0.5)
    try:
        joblease_release.opt_in(NS)
        yield NS
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false")


def _block() -> str:
    """The doc's block that starts with the POST to the ledger, as written."""
    (block,) = [text for language, text in fenced_blocks(DOC)
                if language == "sh" and text.startswith("curl -X POST ")]
    return block


def _responses(out: str) -> list[tuple[int, dict[str, object]]]:
    """(status, body) of each curl, from the bodies and the ``write-out`` status lines."""
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) % 2 == 0, out
    pairs = zip(lines[::2], lines[1::2], strict=True)
    return [(int(code), json.loads(body)) for body, code in pairs]


def test_the_in_pod_curl_block_writes_with_the_live_token_as_written(
        cluster: Cluster, team_a: str) -> None:
    ns = team_a
    r = cluster.kubectl("apply", "-n", ns, "-f", str(REPO_ROOT / "examples" / "ledger.yaml"))
    assert r.returncode == 0, r.stderr
    pod = example_worker_pod(ns, POD, JOB, script="doc-curl-worker")
    (worker,) = pod["spec"]["containers"]
    worker["volumeMounts"].append({"name": "curl-home", "mountPath": CURL_HOME,
                                   "readOnly": True})
    pod["spec"]["volumes"].append({"name": "curl-home",
                                   "configMap": {"name": "doc-curl-home"}})
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "doc-curl-worker", "namespace": ns},
         "data": {"worker.sh": "exec sleep 3600\n"}},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "doc-curl-home", "namespace": ns},
         "data": {".curlrc": 'write-out = "\\n%{http_code}\\n"\nsilent\nshow-error\n'}},
        {"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
         "metadata": {"name": JOB, "namespace": ns},
         "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3}},
        pod]}))
    rollout = cluster.kubectl("rollout", "status", "deployment/ledger", "-n", ns,
                              "--timeout=300s", timeout=330)
    assert rollout.returncode == 0, rollout.stderr
    wait_joblease(cluster, ns, JOB, lambda s: str(s.get("holderIdentity", "")).startswith(
        POD + "/"), f"held by {POD}")

    def lease() -> dict[str, int] | None:
        got = exec_in(cluster, ns, POD, "worker", "curl", "-sS", "--max-time", "5",
                      "-w", "\n%{http_code}", "http://127.0.0.1:8470/v1/lease")
        body, _, code = got.stdout.rpartition("\n")
        if got.returncode != 0 or code.strip() != "200":
            return None
        found: dict[str, int] = json.loads(body)
        return found

    held = wait_until(lease, timeout=240, interval=0.5, what="the sidecar's GET /v1/lease")
    gen, token = held["generation"], held["token"]
    live = exec_in(cluster, ns, POD, "worker", "cat", "/run/joblease/token")
    assert live.stdout.strip() == str(token), live

    ran = exec_in(cluster, ns, POD, "worker", "env", f"GEN={gen}", f"TOKEN={token}",
                  f"CURL_HOME={CURL_HOME}", "bash", "-e", "-c", _block())
    assert ran.returncode == 0, (ran.stdout, ran.stderr)
    (post_code, post), (get_code, got), (fence_code, fence) = _responses(ran.stdout)
    assert post_code == 201 and post["token"] == token, post
    assert post["resource"] == "report-2024-06", post
    assert get_code == 200 and got["highestToken"] == token, got
    assert got["entries"] and all(e["token"] == token for e in got["entries"]), got
    assert fence_code == 200 and fence["highestToken"] == token, fence

    # a second write with an older token: 409 stale, nothing applied
    stale = exec_in(cluster, ns, POD, "worker", "env", f"CURL_HOME={CURL_HOME}", "curl",
                    "-X", "POST", "http://ledger/resources/report-2024-06",
                    "-H", f"Joblease-Job: {ns}/{JOB}", "-H", f"Joblease-Token: {token - 1}",
                    "-H", f"Joblease-Idempotency-Key: {ns}/{JOB}#g{gen}.t{token - 1}:rows",
                    "-H", "Content-Type: application/json", "--data", '{"rows": 41}')
    ((stale_code, refused),) = _responses(stale.stdout)
    assert stale_code == 409 and refused["error"] == "stale", refused
    assert refused["highestToken"] == token, refused
    after = exec_in(cluster, ns, POD, "worker", "env", f"CURL_HOME={CURL_HOME}", "curl",
                    "http://ledger/resources/report-2024-06")
    ((_, again),) = _responses(after.stdout)
    assert again["entries"] == got["entries"] and again["highestToken"] == token, again
