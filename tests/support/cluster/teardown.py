"""Leaving the machine as it was: what :meth:`Cluster.down` (and :meth:`Cluster.up`,
after a crashed run) does, in an order that matters. The kubelet goes first so it
restarts nothing; then every process in the cluster's cgroups (the pods); the
control plane and containerd in reverse start order; containerd's shims and
anything left in the network namespace or naming the state dir; libcni's cached
results; the mounts under the state dir, deepest first; the cgroups, the network
namespace (with its bridge and iptables rules); the sysctls the kubelet rewrote
(by the last cluster on the machine); the state dir. Processes are stopped by pid,
each checked against its command line or network namespace, never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
from typing import TYPE_CHECKING, Any

from tests.support.cluster import host
from tests.support.cluster.settings import CNI_RESULTS, ClusterError

if TYPE_CHECKING:
    from tests.support.cluster.node import Cluster


def status(cluster: Cluster) -> dict[str, Any]:
    """What is running: pids alive, netns, cgroups, mounts (for hack/cluster status)."""
    state: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(cluster.state_file.read_text())
    pids = state.get("pids", {})
    return {
        "running": cluster.in_use(),
        "state_dir": str(cluster.state_dir) if cluster.state_dir.exists() else None,
        "kubeconfig": str(cluster.kubeconfig) if cluster.kubeconfig.exists() else None,
        "processes": {n: p for n, p in pids.items() if cluster.owns_process(p)},
        "netns": cluster.netns if host.netns_inode(cluster.netns) else None,
        "cgroups": [str(p) for p in host.cgroup_dirs(cluster.cgroup)],
        "mounts": len(host.mountpoints_under(cluster.state_dir)),
    }


def leftovers(cluster: Cluster) -> list[str]:
    """Everything of this cluster still on the machine (empty after :meth:`down`)."""
    found = []
    for pid in host.all_pids():
        if host.alive(pid) and str(cluster.state_dir) in host.cmdline(pid):
            found.append(f"process {pid}: {host.cmdline(pid)[:120]}")
    if host.netns_inode(cluster.netns) is not None:
        found.append(f"network namespace {cluster.netns}")
    found += [f"cgroup {p}" for p in host.cgroup_dirs(cluster.cgroup)]
    found += [f"mount {p}" for p in host.mountpoints_under(cluster.state_dir)]
    if cluster.state_dir.exists():
        found.append(f"state dir {cluster.state_dir}")
    return found


def tear_down(cluster: Cluster, deadline_s: float) -> None:
    """Stop everything and leave the machine as it was (idempotent)."""
    state: dict[str, Any] = {}
    with contextlib.suppress(OSError, ValueError):
        state = json.loads(cluster.state_file.read_text())
    pids: dict[str, int] = state.get("pids", {})
    problems: list[str] = []
    # 1. the kubelet first, so it restarts nothing
    for name in ("kubelet", "import", "import-rest"):
        if name in pids and cluster.owns_process(pids[name]):
            host.kill_and_wait([pids[name]], deadline_s)
    # 2. the pods: every process in the cluster's cgroups
    cgroup_tops = host.cgroup_dirs(cluster.cgroup)
    in_pods: set[int] = set()
    for top in cgroup_tops:
        in_pods |= host.pids_in_cgroup(top)
    in_pods.discard(os.getpid())
    if in_pods:
        host.kill_and_wait(sorted(in_pods), 0, signal.SIGKILL)
    # 3. the control plane and containerd, in reverse start order
    order = ["forward-host", "kube-proxy", "kube-scheduler", "kube-controller-manager",
             "containerd", "forward-netns", "kube-apiserver", "etcd"]
    for name in order:
        pid = pids.get(name)
        if pid and cluster.owns_process(pid):
            left = host.kill_and_wait([pid], deadline_s)
            problems += [f"{name} ({p}) did not exit" for p in left]
    # 4. containerd shims of our containerd, then anything still in our netns
    socket_path = str(cluster.containerd_socket)
    shims = [p for p in host.all_pids() if "containerd-shim" in host.cmdline(p)
             and socket_path in host.cmdline(p)]
    if shims:
        host.kill_and_wait(shims, 5)
    inode = host.netns_inode(cluster.netns)
    if inode is not None:
        rest = sorted(host.pids_in_netns(inode) - {os.getpid()})
        if rest:
            left = host.kill_and_wait(rest, 5)
            problems += [f"process {p} in {cluster.netns} did not exit" for p in left]
    rest = [p for p in host.all_pids()  # anything else naming the state dir (the host forwarder)
            if p != os.getpid() and host.alive(p) and str(cluster.state_dir) in host.cmdline(p)]
    if rest:
        left = host.kill_and_wait(rest, 5)
        problems += [f"process {p} ({host.cmdline(p)[:60]}) did not exit" for p in left]
    # 5. libcni's cached results for our sandboxes
    sandboxes = {d.name for base in ("root", "state")
                 for d in (cluster.state_dir / "containerd" / base
                           / "io.containerd.grpc.v1.cri" / "sandboxes").glob("*")}
    if CNI_RESULTS.exists():
        for cached in CNI_RESULTS.iterdir():
            if cached.name.startswith(f"{cluster.netns}-") or any(
                    f"-{sandbox}-" in cached.name for sandbox in sandboxes):
                with contextlib.suppress(OSError):
                    cached.unlink()
    for path, existed in ((CNI_RESULTS, "cni_results_existed"),
                          (CNI_RESULTS.parent, "var_lib_cni_existed")):
        if state and not state.get(existed, True):
            with contextlib.suppress(OSError):
                path.rmdir()
    # 6. mounts (pod rootfs overlays, shm, volumes, netns bind mounts)
    for attempt in range(3):
        points = host.mountpoints_under(cluster.state_dir)
        if not points:
            break
        for point in points:
            try:
                host.umount(point)
            except ClusterError as exc:
                if attempt == 2:
                    problems.append(str(exc))
    # 7. cgroups, network namespace, sysctls, state dir
    for top in host.cgroup_dirs(cluster.cgroup):
        for pid in host.pids_in_cgroup(top):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        try:
            host.remove_cgroup_tree(top)
        except ClusterError as exc:
            problems.append(str(exc))
    if host.netns_inode(cluster.netns) is not None:
        result = host.run(["ip", "netns", "delete", cluster.netns], check=False)
        if result.returncode != 0:
            problems.append(f"ip netns delete {cluster.netns}: {result.stderr.strip()}")
    # the last cluster on the machine to go restores the sysctls (another
    # one's kubelet still runs with its values otherwise)
    others = [d.name for d in cluster.state_dir.parent.glob("*")
              if d.is_dir() and d != cluster.state_dir
              and type(cluster)(d.name, state_dir=d, local=True).in_use()]
    if not others:
        saved = cluster.state_dir.parent / "sysctls.json"
        originals: dict[str, str] = state.get("sysctls", {})
        with contextlib.suppress(OSError, ValueError):
            originals = json.loads(saved.read_text())
        for key, value in originals.items():
            try:
                if host.read_sysctl(key) != value:
                    host.write_sysctl(key, value)
            except OSError as exc:
                problems.append(f"restore sysctl {key}={value}: {exc}")
        if not problems:
            with contextlib.suppress(FileNotFoundError):
                saved.unlink()
    if cluster.state_dir.exists() and not host.mountpoints_under(cluster.state_dir):
        shutil.rmtree(cluster.state_dir, ignore_errors=True)
    with contextlib.suppress(OSError):  # the state root too, once the last one is gone
        cluster.state_dir.parent.rmdir()
    if problems:
        raise ClusterError("teardown incomplete: " + "; ".join(problems))
