"""Two operator replicas on the real single-node cluster: deleting the active pod
under a steady claim/complete load hands over to another replica.

Real pods of the chart (``replicaCount: 2``, its own etcd with TLS), a load pod
of the project image that claims and completes every JobLease the test creates
(through the etcd client Secret the operator uses), JobLeases created by the
test every half second before, during and after the switch, and a
``kubectl get --watch`` recording every status the API server served. Asserted:

- both replicas are Ready while only one leads (readiness is "serving");
- after ``kubectl delete pod <leader>`` another replica leads within the
  election TTL + 2 s (from the delete call to the leader line in its log; same
  clock: one machine): the standby, or the Deployment's replacement when that
  one's first campaign comes before the standby's (the ReplicaSet creates it as
  soon as the old pod is terminating, and the old leader resigns only after
  stopping its leader-only parts: 3 of 9 runs here on 2026-12-07); then the
  standby's log must show it saw the key vacated and campaigned, losing to the
  replacement's term;
- every JobLease created around the switch was registered (the load could
  claim and complete it, which needs the registration) and its last served
  status is that completion; no served status moved backwards;
- of the two live replicas afterwards, exactly one leads.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import threading
import time
from typing import Any

import pytest

from tests.support.cluster import Cluster, image_ref
from tests.support.load import operator_etcd_access
from tests.support.release import Release
from tests.support.status_history import StatusWatch, regressions
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

TTL = 10  # the chart's default operator.leaderElection.leaseDurationSeconds
JOBS = 30
LEADER_LINE = re.compile(
    r"^(\S+ \S+) INFO joblease\.operator\.election: election \S+: (\S+) is the leader "
    r"\(term (\d+)\)", re.M)
STANDBY_LINE = re.compile(
    r"^\S+ \S+ INFO joblease\.operator\.election: election \S+: standing by "
    r"\(leader (\S+), term (\d+)\)", re.M)

LOAD = """
import asyncio, sys
from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.errors import JobLeaseError, NotRegisteredError

async def main(ns, n):
    done = set()
    async with JobLeaseClient(EtcdConfig.from_env()) as client:
        print("load up", flush=True)
        while len(done) < n:
            for name in [f"j{i:03d}" for i in range(n)]:
                if name in done:
                    continue
                try:
                    lease = await client.claim(JobRef(ns, name), "load")
                    await lease.complete({"by": "load"})
                except NotRegisteredError:
                    continue  # not registered by the operator (yet)
                except JobLeaseError as exc:
                    print("retry", name, exc, flush=True)
                    continue
                done.add(name)
                print("completed", name, lease.token, flush=True)
            await asyncio.sleep(0.2)

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def operator_pods(release: Release) -> list[dict[str, Any]]:
    pods = json.loads(release.kubectl(
        "get", "pods", "-o", "json", "-l",
        f"app.kubernetes.io/name=joblease-operator,app.kubernetes.io/instance={release.name}"))
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def ready(pod: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True"
               for c in pod.get("status", {}).get("conditions", []))


def logs(release: Release, pod: str) -> str:
    r = release.cluster.kubectl("logs", pod, "-n", release.namespace, timeout=30)
    return r.stdout if r.returncode == 0 else ""


def leader_line(release: Release, pod: str) -> tuple[float, str, int] | None:
    """(wall time, identity, term) of the pod's "is the leader" log line, if any."""
    found = LEADER_LINE.search(logs(release, pod))
    if found is None:
        return None
    at = dt.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S,%f")
    return at.replace(tzinfo=dt.UTC).timestamp(), found.group(2), int(found.group(3))


def new_leader(release: Release, candidates: list[str]) -> tuple[str, float, int] | None:
    """(pod, wall time, term) of the first of ``candidates`` with a leader line."""
    for pod in candidates:
        if (line := leader_line(release, pod)) is not None:
            return pod, line[0], line[2]
    return None


def load_pod(release: Release) -> str:
    """The load pod: the operator's etcd access (env, certificate, credentials), the
    project image."""
    deployment = release.get("deployment", release.fullname)
    spec = deployment["spec"]["template"]["spec"]
    (operator,) = spec["containers"]
    env, mounts, volumes = operator_etcd_access(release)
    release.cluster.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "load", "namespace": release.namespace},
        "spec": {"restartPolicy": "Never", "securityContext": spec["securityContext"],
                 "volumes": volumes, "containers": [{
                     "name": "load", "image": image_ref("ghcr.io/joblease/joblease:"),
                     "imagePullPolicy": "Never",
                     "command": ["python", "-c", LOAD, release.namespace, str(JOBS)],
                     "env": env, "volumeMounts": mounts,
                     "securityContext": operator["securityContext"]}]}}))

    def up() -> bool:
        logs = release.cluster.kubectl("logs", "load", "-n", release.namespace).stdout
        if "load up" in logs:
            return True
        phase = release.cluster.kubectl("get", "pod", "load", "-n", release.namespace, "-o",
                                        "jsonpath={.status.phase}").stdout
        assert phase != "Failed", f"the load pod failed:\n{logs[-3000:]}"
        return False

    wait_until(up, timeout=300, interval=1, what="the load pod connected to etcd")
    return "load"


def completed(release: Release) -> dict[str, int]:
    out = release.cluster.kubectl("logs", "load", "-n", release.namespace, timeout=30).stdout
    return {m.group(1): int(m.group(2))
            for m in re.finditer(r"^completed (\S+) (\d+)$", out, re.M)}


def state(release: Release, old: str, standby: str, created: list[str]) -> str:
    """What a failure report needs: both operator pods' logs (this and the previous
    container), the load pod's, what was created and completed."""
    parts = [f"created {len(created)}, completed {sorted(completed(release))}"]
    for pod in (old, standby, "load"):
        for previous in ((), ("--previous",)):
            r = release.cluster.kubectl("logs", pod, "-n", release.namespace, *previous,
                                        timeout=30)
            parts.append(f"--- logs {pod} {' '.join(previous)} (rc {r.returncode}):\n"
                         f"{r.stdout[-6000:]}{r.stderr[-500:]}")
    return "\n".join(parts) + "\n" + release.diagnostics()


def test_deleting_the_active_operator_pod_hands_over_to_another_replica(
        cluster: Cluster, release: Release) -> None:
    release.install("--set", "replicaCount=2")
    pods = operator_pods(release)
    assert len(pods) == 2 and all(ready(p) for p in pods), "both replicas Ready"
    names = [p["metadata"]["name"] for p in pods]
    leaders = wait_until(
        lambda: {n: line for n in names if (line := leader_line(release, n))} or None,
        timeout=120, interval=1, what="an operator pod leading")
    assert len(leaders) == 1, leaders
    ((old, (_, _, old_term)),) = leaders.items()
    (standby,) = [n for n in names if n != old]

    load_pod(release)
    watch = StatusWatch(cluster.kubeconfig, release.namespace)
    created: list[str] = []
    deleted_at: list[float] = []
    stop = threading.Event()

    failed: list[BaseException] = []

    def create() -> None:
        try:
            for i in range(JOBS):
                release.apply_joblease(f"j{i:03d}")
                created.append(f"j{i:03d}")
                if i == JOBS // 3:  # a third before the switch, the rest during and after
                    wait_until(lambda: len(completed(release)) >= 3, timeout=180,
                               interval=1, what="the first completions")
                    deleted_at.append(time.time())
                    release.kubectl("delete", "pod", old, "--wait=false")
                if stop.wait(0.5):
                    return
        except BaseException as exc:  # reported by the main thread, with the logs
            failed.append(exc)

    def creator_ok() -> None:
        if failed:
            raise AssertionError(f"creating the JobLeases failed: {failed[0]!r}\n"
                                 f"{state(release, old, standby, created)}") from failed[0]

    creator = threading.Thread(target=create, daemon=True)
    creator.start()
    try:
        # The creator deletes the leader once the load completed its first jobs (its
        # own wait is 180 s); another replica then has to lead within the TTL.
        def leader_deleted() -> bool:
            creator_ok()
            return bool(deleted_at)
        try:
            wait_until(leader_deleted, timeout=240, interval=0.5,
                       what=f"the delete of the leader {old}")
        except AssertionError as exc:
            if failed:
                raise
            raise AssertionError(f"{exc}\n{state(release, old, standby, created)}") from exc

        def successor() -> tuple[str, float, int] | None:
            replacements = [p["metadata"]["name"] for p in operator_pods(release)
                            if p["metadata"]["name"] not in names]
            return new_leader(release, [standby, *replacements])
        try:
            winner, led_at, term = wait_until(successor, timeout=60, interval=0.5,
                                              what=f"a successor of {old} leading")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{state(release, old, standby, created)}") from exc
        takeover = led_at - deleted_at[0]
        assert term > old_term, (term, old_term)
        assert takeover > 0, f"{winner} led {-takeover:.2f}s before the delete"
        assert takeover <= TTL + 2, f"{winner} led {takeover:.2f}s after the delete"
        if winner != standby:
            # The replacement won the race for the vacated key: the standby must have
            # seen the vacancy too (its watch) and campaigned, losing to that term.
            wait_until(lambda: (winner, str(term)) in STANDBY_LINE.findall(
                logs(release, standby)), timeout=30, interval=0.5,
                what=f"the standby {standby} standing by for {winner} (term {term})")
        creator.join(300)
        creator_ok()
        assert not creator.is_alive() and len(created) == JOBS

        # Every JobLease, created before, during or after the switch, was registered and
        # completed, and the statuses caught up with no step backwards.
        def all_completed() -> dict[str, int] | None:
            now = completed(release)
            return now if len(now) == JOBS else None
        done = wait_until(all_completed, timeout=300, interval=2,
                          what=f"all {JOBS} JobLeases completed")

        def settled() -> bool:
            return all(watch.last(n).get("phase") == "Completed"
                       and watch.last(n).get("fencingToken") == t for n, t in done.items())
        wait_until(settled, timeout=180, interval=1, what="every status Completed")
        assert not watch.gaps, watch.gaps
        assert regressions(watch.snapshot()) == [], regressions(watch.snapshot())

        # The Deployment replaced the deleted pod; of the two, only the winner leads.
        def replaced() -> list[dict[str, Any]] | None:
            now = operator_pods(release)
            return now if len(now) == 2 and all(ready(p) for p in now) else None
        now = [p["metadata"]["name"] for p in wait_until(
            replaced, timeout=300, interval=2, what="the replacement Ready")]
        assert winner in now and old not in now, (winner, now)
        assert [n for n in now if leader_line(release, n)] == [winner]
        print(f"takeover by {'the standby' if winner == standby else 'the replacement'} "
              f"{takeover:.2f}s after the delete (TTL {TTL}s); "
              f"{watch.events} statuses served")
    finally:
        stop.set()
        watch.stop()
