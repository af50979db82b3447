"""A holder pod that goes away: the next pod claims, and how soon depends on how it went.

Real pods of the example's pod template (tests/support/worker_pods.py) on the
session cluster, against the shared release's operator and bundled etcd. Two
pods start together; the test waits until one holds the job and the other is
waiting (its sidecar was refused "held by another owner").
The worker of each "works" until a hold file exists, so the loss lands
mid-work. Timing comes from etcd: the new holder record's ``claimedAt`` (the
claimer's wall clock; every pod runs on this machine's kernel clock) minus
the moment the test caused the loss.

- ``kubectl delete pod``: the kubelet stops the worker, then SIGTERMs the
  native sidecar, which releases; the waiting sidecar watches the holder key and
  claims at the release, long before the 60 s TTL.
- SIGKILL of every process of the holder's two containers from the node
  (found by cgroup; the sidecar's first, so it never sees its worker die):
  nothing releases, etcd expires the lease after the TTL (3 s here), and the
  waiter, woken by the deletion of the holder key, claims within TTL + 1 s with
  the sidecar's default settings (before the waiter watched the key, a retry
  could land up to a backoff, 5 s, after the expiry: docs/benchmarks.md).
  Marker ``node``: skipped against a ``JOBLEASE_TEST_KUBECONFIG`` cluster.
"""

from __future__ import annotations

import pytest

from tests.support.cluster import Cluster
from tests.support.worker_pods import (
    Takeover,
    finish_work,
    joblease,
    owner_of,
    takeover,
    wait_status,
)

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]


def _register(cluster: Cluster, namespace: str, name: str, ttl: int) -> None:
    cluster.apply(joblease(namespace, name, ttl=ttl, max_attempts=0))
    wait_status(cluster, namespace, name, "registration",
                lambda s: s.get("phase") == "Pending" and int(s.get("etcdRevision") or 0) > 0)


def _assert_next_generation(cluster: Cluster, namespace: str, name: str, t: Takeover) -> None:
    before, after = t.before["holder"], t.after["holder"]
    assert after["generation"] == before["generation"] + 1, (before, after)
    assert after["token"] > before["token"], (before, after)
    assert after["owner"] == owner_of(t.waiter) != before["owner"]
    # the operator's status follows etcd: the waiter, the next generation, its token
    wait_status(cluster, namespace, name, "the waiter's claim in the status",
                lambda s: s.get("holderIdentity") == after["owner"]
                and s.get("generation") == after["generation"]
                and s.get("fencingToken") == after["token"])


def test_deleted_holder_pod_releases_and_the_next_pod_claims_within_seconds(
        cluster: Cluster, worker_namespace: str) -> None:
    ns, name, ttl = worker_namespace, "deleted-holder", 60
    _register(cluster, ns, name, ttl)
    t = takeover(cluster, ns, name, "delete", "del")
    _assert_next_generation(cluster, ns, name, t)
    # released on SIGTERM, not expired: far less than the TTL (the waiter wakes at
    # the release; the rest is the kubelet stopping the worker first)
    print(f"\nnext claim {t.seconds:.2f}s after the delete (TTL {ttl}s)")
    assert t.seconds < 15, f"next claim {t.seconds:.1f}s after the delete (TTL {ttl}s)"
    # the new holder finishes: the job completes under its token
    finish_work(cluster, ns, t.waiter["metadata"]["name"])
    status = wait_status(cluster, ns, name, "Completed",
                         lambda s: s.get("phase") == "Completed")
    assert status["fencingToken"] == t.after["holder"]["token"], status


@pytest.mark.node  # kills container processes by cgroup, from the node
def test_killed_holder_pod_loses_the_job_to_the_next_pod_within_the_ttl(
        cluster: Cluster, worker_namespace: str) -> None:
    ns, name, ttl = worker_namespace, "killed-holder", 3
    _register(cluster, ns, name, ttl)
    t = takeover(cluster, ns, name, "kill", "kill")  # the sidecar's default settings
    _assert_next_generation(cluster, ns, name, t)
    # nothing released: etcd expired the lease (at most TTL after the last keep-alive,
    # which was before the kill; at least 2/3 TTL after it, keep-alives go every TTL/3)
    print(f"\nnext claim {t.seconds:.2f}s after the kill (TTL {ttl}s)")
    assert t.seconds <= ttl + 1, f"next claim {t.seconds:.2f}s after the kill (TTL {ttl}s)"
    assert t.seconds >= ttl / 3, f"next claim {t.seconds:.2f}s after the kill: not expiry"
