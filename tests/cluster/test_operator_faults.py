"""The operator pod is deleted under a steady claim/complete load.

Real pods on the session cluster: a release of the chart of this test's own (the
defaults plus the test cluster's values: one etcd member), and a "tools" pod of
the project image running the load driver (tests/support/claim_driver.py: the
real client against the release's etcd over TLS, as a sidecar would). Each job
is claimed, released, claimed again and completed, so every JobLease passes
through Pending → Claimed → Pending → Claimed → Completed. The operator pod is
deleted once a few jobs are done (three times with ``--soak``, which also runs
more jobs); its ReplicaSet starts a replacement while the old pod is still
terminating, and the load goes on meanwhile.

The guarantees: the replacement resumes (every status catches up to etcd's
final state), and no status the API server ever served moves backwards (the
rule in tests/support/status_history.py, over a gapless API watch that runs the
whole time). Waits are conditions with generous deadlines (the machine is loaded).
"""

from __future__ import annotations

import functools
import json
import time

import pytest

from tests.support.cluster import Cluster
from tests.support.load import (
    ClaimLoad,
    apply_jobleases,
    start_tools_pod,
    wait_registered,
)
from tests.support.release import Release
from tests.support.status_history import StatusWatch, regressions
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

OPERATOR_LABELS = "app.kubernetes.io/name=joblease-operator,app.kubernetes.io/instance=jl"


def ready_operator(rel: Release, not_uid: str) -> dict[str, str] | None:
    """The operator pod other than ``not_uid`` once it is Ready (else None)."""
    pods = json.loads(rel.kubectl("get", "pods", "-o", "json", "-l", OPERATOR_LABELS))
    for pod in pods["items"]:
        if pod["metadata"]["uid"] == not_uid or pod["metadata"].get("deletionTimestamp"):
            continue
        ready = [c for c in pod["status"].get("conditions", [])
                 if c["type"] == "Ready" and c["status"] == "True"]
        if ready:
            return {"name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
    return None


def mirrored(status: dict[str, object], final: dict[str, object]) -> bool:
    return (status.get("phase") == final["phase"]
            and status.get("generation") == final["generation"]
            and status.get("fencingToken") == final["token"]
            and (status.get("holderIdentity") or "") == final["holder"])


def test_operator_pod_deleted_under_load_resumes_and_no_status_moves_backwards(
        release: Release, cluster: Cluster, soak: bool) -> None:
    rel = release
    rel.install()
    # --soak: more jobs, and the operator deleted three times during the load
    names = [f"job-{i:02d}" for i in range(40 if soak else 8)]
    rounds = 3 if soak else 1
    apply_jobleases(rel, names)
    tools = start_tools_pod(rel)  # meanwhile the operator registers them
    wait_registered(rel, names)
    watch = StatusWatch(cluster.kubeconfig, rel.namespace)
    load = ClaimLoad(rel, tools, names, pause=0.3, releases=1)
    try:
        outages = []
        for round_ in range(rounds):
            load.wait_completed(2 + 8 * round_)
            old = rel.operator_pod()["metadata"]
            deleted_at = time.time()
            rel.kubectl("delete", "pod", old["name"], "--wait=false")
            new = wait_until(functools.partial(ready_operator, rel, old["uid"]), timeout=300,
                             what="the replacement operator Ready", interval=0.5)
            outages.append((deleted_at, time.time()))
        finals = load.wait_done()
        # the load went on while no operator was serving (so the replacement has
        # changes of etcd to catch up on that no operator saw)
        for deleted_at, ready_at in outages:
            during = [r for r in load.snapshot()
                      if r.get("ok") and deleted_at < r["t"] < ready_at]
            assert during, (deleted_at, ready_at, load.snapshot())
        assert all(f["phase"] == "Completed" for f in finals), finals
        by_job = {f["job"]: f for f in finals}
        for done in load.acknowledged("complete"):  # etcd kept each acknowledged one
            final = by_job[done["job"]]
            assert (final["result_token"], final["result_generation"]) == (
                done["token"], done["generation"]), (done, final)

        def caught_up() -> bool:
            items = json.loads(rel.kubectl("get", "jobleases", "-o", "json"))["items"]
            statuses = {i["metadata"]["name"]: i.get("status") or {} for i in items}
            return all(mirrored(statuses.get(f["job"], {}), f) for f in finals)
        wait_until(caught_up, timeout=300, what="every status caught up to etcd", interval=1)
        wait_until(lambda: all(mirrored(watch.last(f["job"]), f) for f in finals), timeout=60,
                   what="the watch saw the final statuses", interval=0.5)
        assert ready_operator(rel, old["uid"]) == new  # no further restart
    finally:
        load.stop()
        watch.stop()
    assert not watch.gaps, watch.gaps
    served = watch.snapshot()
    # the watch saw every job from its registered status to its completion, and the
    # load's claims in between; how many statuses in between is not fixed: under load
    # the operator folds a job's quick changes into one write (a run on a loaded
    # machine served 30 statuses for the 8 jobs' 40 phases, where 33 had been wanted)
    phases = {name: [s.get("phase") for s in served.get(name, []) if s] for name in names}
    for name, seen in phases.items():
        assert seen[:1] == ["Pending"] and seen[-1:] == ["Completed"], (name, seen)
    assert any("Claimed" in seen for seen in phases.values()), phases
    assert regressions(served) == [], regressions(served)
