"""Node access for pod-level faults: a container's cgroup and processes, signals
to them, a process's start time. Only for the fixture's own cluster."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from tests.support.cluster import host
from tests.support.cluster.node import Cluster
from tests.support.cluster.settings import ClusterError


def container_cgroup(cluster: Cluster, container_id: str, hierarchy: str = "memory") -> Path:
    """The cgroup v1 directory of a container of ``cluster``'s node in ``hierarchy``.

    The kubelet (cgroupfs driver, ``cgroupRoot: /jl-<name>``) puts each pod under
    ``kubepods[/<qos>]/pod<uid>`` and containerd names the container's cgroup
    after its id. Node access: only for the fixture's own cluster, never for a
    ``JOBLEASE_TEST_KUBECONFIG`` one (ClusterError).
    """
    if cluster.external:
        raise ClusterError("node access (cgroups) needs the test's own cluster, "
                           "not JOBLEASE_TEST_KUBECONFIG's")
    for top in host.cgroup_dirs(cluster.cgroup):
        if top.parent.name == hierarchy:
            found = [p for p in top.rglob(container_id) if p.is_dir()]
            if found:
                return found[0]
    raise ClusterError(f"no {hierarchy} cgroup for container {container_id[:12]}")


def pod_cgroups(cluster: Cluster, pod_uid: str) -> list[Path]:
    """The pod's cgroup directories left on the node, in every hierarchy
    (``kubepods[/<qos>]/pod<uid>``, cgroupfs driver): none once the kubelet has
    cleaned up after it."""
    if cluster.external:
        raise ClusterError("node access (cgroups) needs the test's own cluster, "
                           "not JOBLEASE_TEST_KUBECONFIG's")
    return [p for top in host.cgroup_dirs(cluster.cgroup) for p in top.rglob(f"pod{pod_uid}")
            if p.is_dir()]


def container_pids(cluster: Cluster, container_id: str) -> list[int]:
    """Every process of the container (from its ``pids`` cgroup)."""
    procs = container_cgroup(cluster, container_id, "pids") / "cgroup.procs"
    return sorted(int(x) for x in procs.read_text().split())


def kill_containers(cluster: Cluster, container_ids: list[str],
                    sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to every process of the containers, in the order given, as the
    kernel's OOM killer or a crash would: no shutdown handler runs for SIGKILL.
    The pids are collected first, so all signals go out within microseconds
    (the kubelet, which reacts once a second, sees the containers die together).
    Returns the pids signalled."""
    pids = [pid for cid in container_ids for pid in container_pids(cluster, cid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    return pids


def process_start_wall_time(pid: int) -> float:
    """When ``pid`` started, on the wall clock (10 ms resolution: /proc's clock ticks)."""
    ticks = int(host.start_time(pid))
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")
