"""Faults on worker pods, from the node: the nemesis of the pod-level chaos test
(tests/cluster/test_pod_chaos.py).

Every fault is real and lands on what the kubelet runs: the kernel's cgroup freezer
on a pod's containers (a long GC pause, a descheduled VM), SIGKILL of a container's
processes (OOM, a crash), ``kubectl delete pod`` (a drain, a scale-down), the pod's
own network namespace refusing its etcd traffic (a partition between the pod and
etcd: an iptables rule in the pod's namespace, which goes away with the pod),
the operator's pod deleted (its Deployment starts a new one), and the bundled etcd
member's processes SIGKILLed (the kubelet restarts the container in the same pod, on
the same data: the test cluster's release keeps etcd on an emptyDir, which a deleted
pod would take with it). Node access only: the fixture's own cluster, never a
``JOBLEASE_TEST_KUBECONFIG`` one.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support import freezer
from tests.support.cluster import Cluster, kill_containers
from tests.support.cluster.access import container_pids
from tests.support.cluster.settings import ClusterError
from tests.support.pods import container_id
from tests.support.queue_pods import pods_of
from tests.support.worker_pods import operator_pod

SIDECAR, WORKER = "joblease", "worker"
ETCD_PORT = 2379

#: fault -> weight (how often it is drawn): the pod faults most, the shared ones rarely
FAULTS = {"freeze-short": 3, "freeze-long": 3, "kill-worker": 2, "kill-sidecar": 2,
          "delete-pod": 2, "partition": 3, "restart-operator": 1, "kill-etcd": 1}
#: faults on what every pod shares, and the trials that must land between two of them:
#: the kubelet restarts a container that keeps dying later each time (10 s, 20 s, 40 s,
#: ... up to 5 min, reset after 10 min of running), so back-to-back kills of the one
#: etcd member would stop the run for minutes instead of testing a crash
SHARED, SHARED_SPACING = ("restart-operator", "kill-etcd"), 4
#: seconds between two kills of the etcd member: the kubelet resets a container's
#: back-off only after 10 minutes of running, so kills spaced by trials alone pile it up
#: (the 7th kill of a soak left etcd down for 5 minutes); a deleted operator pod is a
#: new pod, with no back-off to pile up
ETCD_KILL_INTERVAL = 11 * 60
#: the trial that replaces a pod waiting in restart back-off (``Nemesis.one``): a
#: ``kubectl delete pod`` as ``delete-pod`` is, its target chosen, not drawn
REPLACE = "replace-backed-off"


@dataclass
class Trial:
    fault: str
    target: str
    seconds: float = 0.0  # how long the fault lasted (freeze, partition)
    note: str = ""


@dataclass
class Nemesis:
    """Draws faults (seeded) and injects them on the pods of ``selector`` in ``namespace``.
    ``ttl`` sets the durations: a short freeze stays under a third of it (the sidecar's
    keep-alive period: its lease survives), a long one and a partition outlast it (the
    lease expires and another pod may claim the item)."""

    cluster: Cluster
    namespace: str
    selector: str
    ttl: float
    etcd_pod: tuple[str, str]  # (namespace, name) of the bundled etcd's member
    seed: int = 0
    trials: list[Trial] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.etcd_killed_at: float | None = None  # time.monotonic() of the last kill-etcd

    def running_pods(self) -> list[dict[str, Any]]:
        """Pods whose worker and sidecar both run (the ones a pod fault can land on)."""
        return [p for p in self._pods() if _running(p)]

    def _pods(self) -> list[dict[str, Any]]:
        return [p for p in pods_of(self.cluster, self.namespace, self.selector)
                if not p["metadata"].get("deletionTimestamp")]

    def draw(self) -> str:
        """The next fault: every type once first (in a seeded order, so even a short run
        injects each), then by weight; a shared fault only ``SHARED_SPACING`` landed
        trials after the last one, and ``kill-etcd`` only ``ETCD_KILL_INTERVAL``
        seconds after the last."""
        landed = [t.fault for t in self.trials if not t.note]
        untried = [f for f in FAULTS if f not in landed]
        since_shared = next((n for n, f in enumerate(reversed(landed)) if f in SHARED),
                            len(landed))
        etcd_rested = (self.etcd_killed_at is None
                       or time.monotonic() - self.etcd_killed_at >= ETCD_KILL_INTERVAL)
        allowed = [f for f in (untried or FAULTS)
                   if (f not in SHARED or since_shared >= SHARED_SPACING or not landed)
                   and (f != "kill-etcd" or etcd_rested)]
        if not allowed:  # only shared faults left untried, too soon for one
            allowed = [f for f in FAULTS if f not in SHARED]
        return self.rng.choices(allowed, weights=[FAULTS[f] for f in allowed])[0]

    def one(self) -> Trial | None:
        """Inject one fault (:meth:`draw`); None when no pod was there to take it."""
        fault = self.draw()
        if fault == "restart-operator":
            ns, name = operator_pod(self.cluster)
            self._delete(ns, name)
            return self._record(Trial(fault, name))
        if fault == "kill-etcd":
            ns, name = self.etcd_pod
            member = json.loads(self.cluster.kubectl("get", "pod", name, "-n", ns, "-o",
                                                     "json", check=True).stdout)
            try:
                kill_containers(self.cluster, [container_id(member, "etcd")])
            except (AssertionError, ClusterError) as exc:  # restarting from the last kill
                return self._record(Trial(fault, name, note=f"did not land: {exc}"[:200]))
            self.etcd_killed_at = time.monotonic()
            return self._record(Trial(fault, name))
        every = self._pods()
        pods = [p for p in every if _running(p)]
        backed_off = [p for p in every if _backed_off(p)]
        if backed_off and len(backed_off) >= len(pods):
            # At least as many pods wait in the kubelet's restart back-off as run:
            # replace one (a real delete, counted as its own type), or a long run
            # ends up faulting one pod while the others wait minutes to restart.
            name = self.rng.choice(backed_off)["metadata"]["name"]
            self._delete(self.namespace, name)
            return self._record(Trial(REPLACE, name))
        if not pods:
            return None
        pod = self.rng.choice(pods)
        name = pod["metadata"]["name"]
        try:
            if fault in ("freeze-short", "freeze-long"):
                seconds = (self.ttl / 4 if fault == "freeze-short" else self.ttl * 1.6)
                with self._frozen(pod):
                    hold(seconds)
                return self._record(Trial(fault, name, seconds))
            if fault in ("kill-worker", "kill-sidecar"):
                ids = [container_id(pod, WORKER if fault == "kill-worker" else SIDECAR)]
                kill_containers(self.cluster, ids)
                return self._record(Trial(fault, name))
            if fault == "delete-pod":
                self._delete(self.namespace, name)
                return self._record(Trial(fault, name))
            seconds = self.ttl * 1.6
            with self._partitioned(pod):
                hold(seconds)
            return self._record(Trial(fault, name, seconds))
        except (AssertionError, ClusterError, FileNotFoundError, ProcessLookupError,
                IndexError) as exc:
            # the pod went away under the fault (a container restarting, the pod
            # replaced): the fault did not land; draw again
            return self._record(Trial(fault, name, note=f"did not land: {exc}"[:200]))

    def _record(self, trial: Trial) -> Trial:
        self.trials.append(trial)
        return trial

    def _delete(self, namespace: str, name: str) -> None:
        self.cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false",
                             timeout=60)

    @contextlib.contextmanager
    def _frozen(self, pod: dict[str, Any]) -> Iterator[None]:
        uid = pod["metadata"]["uid"]
        cgroups = [freezer.container_cgroup(uid, container_id(pod, c)) for c in (SIDECAR,
                                                                                WORKER)]
        with freezer.frozen(cgroups[0]), freezer.frozen(cgroups[1]):
            yield

    @contextlib.contextmanager
    def _partitioned(self, pod: dict[str, Any]) -> Iterator[None]:
        """The pod's etcd traffic dropped in its own network namespace (the sidecar's
        connections to etcd, the Service's port: kube-proxy's DNAT happens outside)."""
        pid = container_pids(self.cluster, container_id(pod, SIDECAR))[0]
        netns = Path(f"/proc/{pid}/ns/net")
        rule = ["OUTPUT", "-p", "tcp", "--dport", str(ETCD_PORT), "-j", "DROP"]

        def iptables(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(["nsenter", f"--net={netns}", "iptables", "-w", *args],
                                  capture_output=True, text=True, timeout=30)
        added = iptables("-I", *rule)
        assert added.returncode == 0, added.stderr
        try:
            yield
        finally:
            # the pod may be gone by now (its namespace with it, and the rule)
            if netns.exists():
                iptables("-D", *rule)

    def counts(self) -> dict[str, int]:
        """Faults that landed, by type."""
        out: dict[str, int] = {}
        for t in self.trials:
            if not t.note:
                out[t.fault] = out.get(t.fault, 0) + 1
        return out


def _running(pod: dict[str, Any]) -> bool:
    """The pod's worker and sidecar both run."""
    return _runs(pod, SIDECAR) and _runs(pod, WORKER)


def _runs(pod: dict[str, Any], container: str) -> bool:
    status = pod.get("status", {})
    return any(s["name"] == container and "running" in (s.get("state") or {})
               for s in status.get("initContainerStatuses", [])
               + status.get("containerStatuses", []))


def _backed_off(pod: dict[str, Any]) -> bool:
    """A container of ``pod`` waits in the kubelet's restart back-off."""
    status = pod.get("status", {})
    return any(((s.get("state") or {}).get("waiting") or {}).get("reason") == "CrashLoopBackOff"
               for s in status.get("initContainerStatuses", [])
               + status.get("containerStatuses", []))


def hold(seconds: float) -> None:
    """Keep a fault on for ``seconds``: the fault's duration, not a wait for a condition."""
    time.sleep(seconds)
