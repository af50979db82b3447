"""Changing the bundled etcd's member count on a running release is refused, jobs held.

Real pods on the session cluster: a release of this test's own with 1 (or 3)
members, a "tools" pod of the project image running the load driver
(tests/support/claim_driver.py) with every member as an endpoint, and the real helm.
Without the refusal, ``helm upgrade --set etcd.replicas=3`` made members 1 and 2
bootstrap a second, empty etcd cluster beside member 0 (``--initial-cluster-state=new``)
and 3 to 1 left member 0 alone without quorum.

The guarantees, in both directions: the upgrade fails with the message naming
``etcd.replicas`` and both counts; nothing changed: the same StatefulSet spec and
pods (not one restarted), the same members in one etcd cluster (the same cluster id
from every member), the release still at revision 1; a job claimed before the
upgrade is still held with its token after it (its completion with that token is
accepted), and the load's tokens keep increasing per job across it.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest

from tests.support.binaries import helm_binary
from tests.support.cluster import Cluster
from tests.support.load import (
    ClaimLoad,
    apply_jobleases,
    etcd_members,
    start_tools_pod,
    tokens_by_job,
    wait_registered,
)
from tests.support.release import CHART, TEST_CLUSTER_VALUES, Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1500)]


def one_cluster(rel: Release, tools: str, members: int) -> dict[str, Any] | None:
    """The members' report once all ``members`` answer with one cluster id and one
    leader, else None."""
    report = etcd_members(rel, tools)
    statuses = list(report["status"].values())
    if len(statuses) != members or any("error" in s for s in statuses):
        return None
    if len({s["cluster"] for s in statuses}) != 1 or len({s["leader"] for s in statuses}) != 1:
        return None
    return report


def pod_uids(rel: Release) -> dict[str, str]:
    pods = json.loads(rel.kubectl("get", "pods", "-o", "json"))["items"]
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods
            if not p["metadata"].get("deletionTimestamp")}


@pytest.mark.parametrize(("installed", "asked"), [(1, 3), (3, 1)],
                         ids=["one-to-three", "three-to-one"])
def test_changing_the_member_count_is_refused_while_jobs_are_held(
        release: Release, cluster: Cluster, installed: int, asked: int) -> None:
    rel = release
    rel.install("--set", f"etcd.replicas={installed}")
    held, churn = ["held"], [f"job-{i}" for i in range(4)]
    apply_jobleases(rel, held + churn)
    tools = start_tools_pod(rel)
    wait_registered(rel, held + churn)
    before = wait_until(lambda: one_cluster(rel, tools, installed), timeout=120,
                        what=f"{installed} member(s) in one cluster", interval=1)

    # "held": claimed and kept alive until the checks below are done, then completed
    # with its token; meanwhile the churn claims and releases its jobs (a new token
    # each claim), again and again until then
    holder = ClaimLoad(rel, tools, held, owner="holder", pause=0.5, releases=0, limit=400,
                       until=True)
    load = ClaimLoad(rel, tools, churn, pause=0.5, releases=3, limit=400, until=True)
    loads = [holder, load]
    try:
        wait_until(lambda: holder.acknowledged("claim") and len(load.acknowledged("claim")) >= 2,
                   timeout=120, what="the held claim and two churn claims", interval=0.2)
        (claimed,) = holder.acknowledged("claim")
        sts = rel.get("statefulset", rel.etcd)
        uids = pod_uids(rel)
        tokens_before = max(r["token"] for r in load.acknowledged("claim"))

        refused = subprocess.run(
            [helm_binary(), "upgrade", rel.name, str(CHART), "-n", rel.namespace,
             *TEST_CLUSTER_VALUES, "--set", f"etcd.replicas={asked}"],
            capture_output=True, text=True, timeout=300, env=rel.env)
        refused_at = time.time()
        assert refused.returncode != 0, refused.stdout
        assert (f"etcd.replicas: the bundled etcd {rel.etcd} in namespace {rel.namespace} "
                f"has {installed} member(s) and this upgrade asks for {asked}"
                ) in refused.stderr, refused.stderr

        # nothing changed: the same objects, pods, members and one cluster
        after_sts = rel.get("statefulset", rel.etcd)
        assert after_sts["metadata"]["resourceVersion"] == sts["metadata"]["resourceVersion"]
        assert after_sts["spec"]["replicas"] == installed
        history = json.loads(rel.helm("history", rel.name, "-o", "json"))
        assert [(h["revision"], h["status"]) for h in history] == [(1, "deployed")]
        after = wait_until(lambda: one_cluster(rel, tools, installed), timeout=120,
                           what=f"{installed} member(s) in one cluster", interval=1)
        assert sorted(after["members"], key=lambda m: m["id"]) == sorted(
            before["members"], key=lambda m: m["id"])
        assert {s["cluster"] for s in after["status"].values()} == {
            s["cluster"] for s in before["status"].values()}
        assert pod_uids(rel) == uids

        # the churn claimed on after the refusal; then the load ends
        wait_until(lambda: any(r["t"] > refused_at for r in load.acknowledged("claim")),
                   timeout=120, what="a churn claim after the refused upgrade", interval=0.2)
        for each in loads:
            each.finish()

        # the held job was held throughout: its completion with the token it got
        # before the upgrade commits after it; the churn got larger tokens since
        (done,) = holder.wait_done()
        (completed,) = holder.acknowledged("complete")
        assert completed["token"] == claimed["token"] and completed["t"] > refused_at, (
            claimed, completed, refused_at)
        assert done["result_token"] == claimed["token"], done
        finals = load.wait_done()
    finally:
        for each in loads:
            each.stop()
    assert all(f["phase"] == "Completed" for f in finals), finals
    records = load.snapshot()
    later = [r["token"] for r in records if r.get("op") == "claim" and r.get("ok")
             and r["t"] > refused_at]
    assert later and min(later) > tokens_before, (tokens_before, later)
    for job, tokens in tokens_by_job(records).items():
        assert tokens == sorted(set(tokens)) and len(tokens) >= 4, (job, tokens)
