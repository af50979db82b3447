"""The bundled etcd with 3 members on persistent volumes loses a member during claims.

Real pods on the session cluster: a release of this test's own with
``etcd.replicas=3`` and ``etcd.persistence.enabled=true`` (the claims bind to the
cluster's local volumes, tests/support/cluster/), and a "tools" pod of the
project image running the load driver (tests/support/claim_driver.py) with every
member as an endpoint, as the operator has them. The leader's pod is deleted
(the harder case: an election follows) once a few jobs are done, with the node
cordoned until the other two members have served two more completions, so the
member is really away meanwhile (that progress comes from a load started while it
is away); then the StatefulSet recreates it on the same
claim (``--soak``: three times, the leader of the moment each time, more jobs).

The guarantees: every completion etcd acknowledged is in etcd afterwards with its
token; per job the acknowledged claims' tokens strictly increase; the load made
progress while the member was gone (two of three are a quorum); the member comes
back as the same member (same ID, no re-add) on the same volume, restarting from
its data (its log says it restarted the local member instead of starting a new
one), and catches up with the others. Waits are conditions with generous deadlines.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support.cluster import STORAGE_CLASS, Cluster
from tests.support.load import (
    ClaimLoad,
    apply_jobleases,
    etcd_members,
    start_tools_pod,
    tokens_by_job,
    wait_registered,
)
from tests.support.release import PERSISTENT_VALUES, Release
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]


def leader_pod(rel: Release, tools: str) -> tuple[str, dict[str, Any]]:
    """The leader's pod name and the members' report (all three answering)."""
    report = etcd_members(rel, tools)
    statuses = list(report["status"].values())
    assert report["members"] and all("error" not in s for s in statuses), report
    (leader,) = {s["leader"] for s in statuses}
    (name,) = [m["name"] for m in report["members"] if m["id"] == leader]
    return name, report


def healthy_leader(rel: Release, tools: str) -> tuple[str, dict[str, Any]] | None:
    """:func:`leader_pod` once all three answer and agree on a leader, else None."""
    try:
        return leader_pod(rel, tools)
    except (AssertionError, ValueError):
        return None


def claims(rel: Release) -> dict[str, dict[str, Any]]:
    items = json.loads(rel.kubectl("get", "pvc", "-o", "json"))["items"]
    return {i["metadata"]["name"]: i for i in items}


def test_a_deleted_member_loses_no_acknowledged_completion_and_rejoins_with_its_data(
        release: Release, cluster: Cluster, soak: bool) -> None:
    rel = release
    rel.install("--set", "etcd.replicas=3", *PERSISTENT_VALUES)
    pvcs = claims(rel)
    assert sorted(pvcs) == [f"data-{rel.etcd}-{i}" for i in range(3)], sorted(pvcs)
    for pvc in pvcs.values():  # the members' data is on the node's local volumes
        assert pvc["status"]["phase"] == "Bound", pvc["status"]
        assert cluster.external or pvc["spec"]["storageClassName"] == STORAGE_CLASS

    # --soak: more jobs, and the leader's pod deleted three times (the leader of the
    # moment each time, once the member deleted before is back)
    names = [f"job-{i:02d}" for i in range(100 if soak else 8)]
    rounds = 3 if soak else 1
    apply_jobleases(rel, names)
    tools = start_tools_pod(rel)  # meanwhile the operator registers them
    wait_registered(rel, names)
    # all three answering the tools pod (a member's name may take a moment to resolve)
    victim, before = wait_until(lambda: healthy_leader(rel, tools), timeout=120,
                                what="three members and one leader", interval=1)
    # One load before the first outage and one started during each outage (while the
    # member is away): a load that was already running could run out of jobs before
    # the member has gone (a fast machine, a slow pod deletion), and then show no
    # progress during the outage for want of work, not for want of a quorum.
    groups = [names[i::rounds + 1] for i in range(rounds + 1)]
    limit = 900 if soak else 240
    loads = [ClaimLoad(rel, tools, groups[0], pause=0.3, releases=1, limit=limit)]
    outages = []
    try:
        for round_ in range(rounds):
            loads[-1].wait_completed(2)
            if round_:
                victim, _ = wait_until(lambda: healthy_leader(rel, tools), timeout=120,
                                       what="three members and one leader", interval=1)
            victim_pod = rel.get("pod", victim)
            node = victim_pod["spec"]["nodeName"]
            # the node cordoned: the StatefulSet's new pod stays Pending, so the member
            # stays away until the other two have shown progress (not just a race
            # between the driver and a fast restart)
            cluster.kubectl("cordon", node, check=True)
            try:
                rel.kubectl("delete", "pod", victim, "--wait=false")

                def gone(victim: str = victim, uid: str = victim_pod["metadata"]["uid"]
                         ) -> bool:
                    pod = rel.cluster.pod(victim, rel.namespace)
                    return pod is None or pod["metadata"]["uid"] != uid
                wait_until(gone, timeout=120, what=f"{victim} gone", interval=0.5)
                # progress while the member is away: the other two are a quorum
                during = ClaimLoad(rel, tools, groups[round_ + 1], pause=0.3, releases=1,
                                   limit=limit)
                loads.append(during)
                during.wait_completed(2, timeout=180)
                assert (rel.cluster.pod(victim, rel.namespace) or {}).get(
                    "status", {}).get("phase") in (None, "Pending")
                outages.append(victim)
            finally:
                cluster.kubectl("uncordon", node, check=True)

            def back(victim: str = victim) -> bool:
                pod = rel.cluster.pod(victim, rel.namespace) or {"status": {}}
                return any(c["type"] == "Ready" and c["status"] == "True"
                           for c in pod["status"].get("conditions", []))
            wait_until(back, timeout=300, what=f"{victim} recreated and Ready", interval=0.5)
        finals = [f for load in loads for f in load.wait_done()]
    finally:
        for load in loads:
            load.stop()
    records = [r for load in loads for r in load.snapshot()]

    # no acknowledged completion lost: etcd holds each, with its token and generation
    by_job = {f["job"]: f for f in finals}
    acked = [r for r in records if r.get("op") == "complete" and r.get("ok")]
    assert acked and all(f["phase"] == "Completed" for f in finals), finals
    for done in acked:
        final = by_job[done["job"]]
        assert (final["result_token"], final["result_generation"]) == (
            done["token"], done["generation"]), (done, final)
    # tokens strictly increase per job, across the election
    for job, tokens in tokens_by_job(records).items():
        assert tokens == sorted(set(tokens)) and len(tokens) >= 2, (job, tokens)

    # each member is the same one, on the same claim, restarted from its data
    for victim in set(outages):
        new_pod = rel.get("pod", victim)
        claim = next(v["persistentVolumeClaim"]["claimName"]
                     for v in new_pod["spec"]["volumes"] if v["name"] == "data")
        assert claims(rel)[claim]["metadata"]["uid"] == pvcs[claim]["metadata"]["uid"]
        assert claims(rel)[claim]["spec"]["volumeName"] == pvcs[claim]["spec"]["volumeName"]
        log = rel.kubectl("logs", victim)
        assert ('"msg":"restarting local member"' in log
                and '"msg":"starting local member"' not in log), log[-3000:]

    def caught_up() -> dict[str, Any] | None:
        report = etcd_members(rel, tools)
        statuses = list(report["status"].values())
        if any("error" in s for s in statuses):
            return None
        revisions = {s["revision"] for s in statuses}
        return report if len(revisions) == 1 else None
    after = wait_until(caught_up, timeout=120, what="the members at one revision", interval=1)
    assert sorted(after["members"], key=lambda m: m["id"]) == sorted(
        before["members"], key=lambda m: m["id"]), (before, after)
    assert len(after["members"]) == 3
