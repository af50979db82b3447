"""A real single-node Kubernetes for tests: kubelet, containerd, CNI, kube-proxy, CoreDNS.

Why: the product is used as pods (a native sidecar, read-only root
filesystems, projected service-account tokens, Service DNS), and only a real
kubelet running real containers shows how that behaves. Nothing is faked:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
kube-proxy v1.36 are the pinned builds (``hack/build-test-binaries``),
containerd 2.x is built from its Go module, runc, the CNI plugins, iptables
and socat come from Debian, and CoreDNS runs as a Deployment from an image
imported into containerd (``ctr images import``, no registry).

Network design (the machine's rule: traffic only to loopback or to network
namespaces the test created). Every cluster process runs inside a network
namespace this module creates, ``jl-<name>``, entered with ``setns(2)`` in the
child before ``exec`` (not ``ip netns exec``: that also gives the process a
private mount namespace and a fresh ``/sys``, hiding the cgroup mounts and
keeping the kubelet's volume mounts out of the host's view). The namespace
holds ``lo`` with 127.0.0.1 and the API server's advertise address
10.250.0.1 (a /32 on ``lo``: this kernel has no ``dummy`` driver; pods reach
the API server through the ``kubernetes`` Service, 10.0.0.1 → 10.250.0.1:6443,
never 127.0.0.1); and the CNI bridge
``cni0`` (pods 10.244.0.0/24). There is no default route and no masquerade:
nothing leaves it. Because the namespace is private, components use their
fixed default ports there.

Reaching the cluster from the test process: the host side may only use host
loopback. A forwarder pair bridges the two over a unix socket in the state
dir (path sockets are not network-namespace scoped): in the namespace
``socat UNIX-LISTEN:<dir>/apiserver.sock,fork TCP:127.0.0.1:6443``, on the
host ``socat TCP-LISTEN:<free port>,bind=127.0.0.1,fork UNIX-CONNECT:...``.
The admin kubeconfig points at ``https://127.0.0.1:<host port>`` (127.0.0.1 is
a SAN of the serving cert), so kubectl, helm and Python clients in the test
process work unchanged. TLS stays end to end (socat forwards bytes).
``kubectl logs/exec`` work too: the API server dials the kubelet by the node's
Hostname address, ``localhost``, inside the namespace.

Test-machine-only settings (see docs/control-plane.md): the kubelet runs with
``failCgroupV1: false`` (this machine has only cgroup v1 for memory) and
``cgroupDriver: cgroupfs``; containerd's CRI with ``restrict_oom_score_adj``
(runc cannot lower oom_score_adj here). Both are wrong for a production node.

Storage: a default StorageClass ``local`` (``kubernetes.io/no-provisioner``,
``WaitForFirstConsumer``) with a pool of pre-created local PersistentVolumes,
directories under ``<state dir>/volumes`` owned by UID/GID 65532 (the chart's
etcd and the project image run as that user), so StatefulSet claims bind as on
a real cluster (see :func:`storage_manifest`); they go with the state dir.

State lives in a well-known directory (``/var/tmp/jl-cluster/<name>``,
or ``JOBLEASE_CLUSTER_DIR``) with a state file ``cluster.json`` recording pids,
the sysctls the kubelet rewrites (recorded before it starts) and what existed
before. :meth:`Cluster.down` - and :meth:`Cluster.up` first, after a crashed
run - stops processes by pid (checked against their command line), kills what
is left in the cluster's cgroups, network namespace or containerd shims,
unmounts everything under the state dir, removes the cgroups
(``/sys/fs/cgroup/*/jl-<name>``, which is the kubelet's ``cgroupRoot``), the
network namespace (with its bridge and iptables rules), restores the sysctls
and removes the state dir.

If ``JOBLEASE_TEST_KUBECONFIG`` is set, that cluster is used and nothing is
started or stopped (images must already be loadable there: see the docs).

For humans: ``hack/cluster up|down|status`` (``python -m tests.support.cluster``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import errno
import importlib
import json
import logging
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.support.binaries import (
    cache_dir,
    cni_bin_dir,
    containerd_binary,
    containerd_shim_binary,
    ctr_binary,
    etcd_binary,
    kube_apiserver_binary,
    kube_controller_manager_binary,
    kube_proxy_binary,
    kube_scheduler_binary,
    kubectl_binary,
    kubelet_binary,
    runc_binary,
    system_binary,
)
from tests.support.controlplane import SERVICE_ACCOUNT_ISSUER, free_port, write_pki

log = logging.getLogger(__name__)

# short: shim sockets are <state dir>/s/<64 hex> and a unix socket path has
# at most 107 bytes
STATE_ROOT = Path("/var/tmp/jl-cluster")
ADVERTISE_ADDRESS = "10.250.0.1"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
DNS_SERVICE_IP = "10.0.0.10"
POD_CIDR = "10.244.0.0/24"
#: The kubelet's pod capacity (see _start_kubelet): below the /24's 253 addresses.
MAX_PODS = 200
NODE_NAME = "localhost"
APISERVER_PORT = 6443
# The host sysctls the kubelet rewrites (kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CLONE_NEWNET = 0x40000000
# libcni's result cache (containerd's CRI has no setting for it): files named
# <network>-<sandbox id>-<interface>, removed by CNI DEL, which killed pods skip
CNI_RESULTS = Path("/var/lib/cni/results")
# Storage: the default StorageClass and its pool of pre-created local volumes
# (see storage_manifest). 16: a few releases with 3 members each; a volume is not
# reused once its claim is deleted (Released, reclaim policy Retain).
STORAGE_CLASS = "local"
LOCAL_VOLUMES = 16
LOCAL_VOLUME_SIZE = "10Gi"
#: owner of the volume directories: the UID/GID the chart's etcd (and the
#: project image) run as, so the non-root container can write its data dir
VOLUME_OWNER = 65532


class ClusterError(RuntimeError):
    """The cluster did not start or did not stop cleanly (message carries log tails)."""


# ------------------------------------------------------------ small helpers
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def _child_setup(netns: str | None, die_with_parent: bool) -> Callable[[], None]:
    """preexec_fn: enter the cluster's network namespace; optionally get SIGKILL
    when the parent (the test process) dies, so nothing outlives a crashed run."""
    def setup() -> None:
        libc = _libc()
        if die_with_parent:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if netns:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    os._exit(126)
            finally:
                os.close(fd)
    return setup


def _run(argv: list[str], *, netns: str | None = None, check: bool = True,
         timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                            preexec_fn=_child_setup(netns, False) if netns else None)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def _tail(path: Path, lines: int) -> str:
    if not path.exists():
        return f"({path.name}: no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"----- last {len(text)} lines of {path} -----\n" + "\n".join(text)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def _pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if gone): with the
    pid, it names one process (pids are reused, start times are not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _kill_and_wait(pids: list[int], deadline_s: float, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to each pid, wait until all are gone, SIGKILL the rest at the
    deadline. Returns the pids that were still alive after SIGKILL + 5 s."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    for grace, final in ((deadline_s, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            _reap(pids)
            time.sleep(0.1)  # poll interval; the deadline bounds the wait
        left = [p for p in pids if _alive(p)]
        if not left or final is None:
            return left
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, final)
        pids = left
    return pids


def _reap(pids: list[int]) -> None:
    """Collect those of ``pids`` that are exited children of this process (when we
    started them), so they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def _mountpoints_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` in this mount namespace, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(prefix):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def _umount(point: str) -> None:
    libc = _libc()
    if libc.umount2(point.encode(), 0) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return
        if libc.umount2(point.encode(), 2) != 0:  # MNT_DETACH
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):
                raise ClusterError(f"umount {point}: {os.strerror(err)}")


def _cgroup_dirs(group: str) -> list[Path]:
    """``/sys/fs/cgroup/<hierarchy>/<group>`` in every mounted hierarchy."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            path = Path(fields[4]) / group
            if path.is_dir():
                found.append(path)
    return found


def _cgroup_hierarchies() -> list[Path]:
    result = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            result.append(Path(fields[4]))
    return result


def _remove_cgroup_tree(top: Path, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while top.exists():
        below = sorted((p for p in top.rglob("*") if p.is_dir()),
                       key=lambda p: len(p.parts), reverse=True)
        dirs = [*below, top]
        busy = []
        for directory in dirs:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                busy.append(f"{directory}: {exc.strerror}")
        if not busy:
            return
        if time.monotonic() > deadline:
            raise ClusterError("cgroups not removable: " + "; ".join(busy[:5]))
        time.sleep(0.2)  # tasks still exiting; the deadline bounds the wait


def _pids_in_cgroup(top: Path) -> set[int]:
    pids: set[int] = set()
    if not top.exists():
        return pids
    for procs in top.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids.update(int(x) for x in procs.read_text().split())
    with contextlib.suppress(OSError):
        pids.update(int(x) for x in (top / "cgroup.procs").read_text().split())
    return pids


def _netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def _pids_in_netns(inode: int) -> set[int]:
    found = set()
    for pid in _pids():
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/ns/net").st_ino == inode:
                found.add(pid)
    return found


def _read_sysctl(key: str) -> str:
    return Path("/proc/sys", key).read_text().strip()


def _write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", key).write_text(value + "\n")


def _images_index() -> list[dict[str, str]]:
    """The image archives: ``tests.support.images.ensure_images()`` builds them when
    that module exists; the index it writes is read either way."""
    with contextlib.suppress(ImportError):
        images = importlib.import_module("tests.support.images")
        images.ensure_images()
    index = cache_dir() / "images" / "index.json"
    if not index.exists():
        raise ClusterError(f"no image index at {index}: build the images first "
                           "(tests/support/images.py ensure_images())")
    entries: list[dict[str, str]] = json.loads(index.read_text())
    return entries


def image_ref(prefix: str) -> str:
    """The reference in the image index that starts with ``prefix``
    (e.g. ``registry.k8s.io/pause``)."""
    for entry in _images_index():
        if entry["ref"].startswith(prefix):
            return entry["ref"]
    raise ClusterError(f"no image {prefix}* in the image index")


# ------------------------------------------------------------------ cluster
class Cluster:
    """One single-node cluster in network namespace ``jl-<name>``.

    Attributes after :meth:`up`: ``kubeconfig`` (admin, via the host forwarder),
    ``startup_seconds`` (up → node Ready, DNS answering), ``state_dir``.
    """

    def __init__(self, name: str = "default", state_dir: Path | None = None,
                 die_with_parent: bool = True, ready_timeout: float = 300.0,
                 local: bool = False) -> None:
        """``local=True`` starts a cluster here even if JOBLEASE_TEST_KUBECONFIG is set
        (the teardown test needs one of its own)."""
        if not name.replace("-", "").isalnum() or len(name) > 10:
            raise ValueError(f"cluster name {name!r}: use up to 10 letters, digits or '-'")
        self.name = name
        self.netns = f"jl-{name}"
        self.cgroup = f"jl-{name}"
        root = Path(os.environ.get("JOBLEASE_CLUSTER_DIR") or STATE_ROOT)
        self.state_dir = (state_dir or root / name).resolve()
        self.die_with_parent = die_with_parent
        self.ready_timeout = ready_timeout
        self.external = bool(os.environ.get("JOBLEASE_TEST_KUBECONFIG")) and not local
        self.kubeconfig = self.state_dir / "admin.kubeconfig"
        self.server = ""
        self.startup_seconds: float | None = None
        self.timings: dict[str, float] = {}
        self._state: dict[str, Any] = {}
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        if self.external:
            self.kubeconfig = Path(os.environ["JOBLEASE_TEST_KUBECONFIG"]).resolve()

    # ------------------------------------------------------------- paths
    @property
    def state_file(self) -> Path:
        return self.state_dir / "cluster.json"

    @property
    def containerd_socket(self) -> Path:
        return self.state_dir / "containerd" / "containerd.sock"

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    def _save_state(self) -> None:
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._state, indent=2))
        tmp.replace(self.state_file)

    # ---------------------------------------------------------- lifecycle
    def up(self) -> Cluster:
        """Start everything and wait until the node is Ready and DNS works."""
        if self.external:
            log.warning("using existing cluster from %s", self.kubeconfig)
            return self
        began = time.monotonic()
        self.recover()
        try:
            self._up(began)
        except BaseException as exc:
            tails = self.log_tails()
            with contextlib.suppress(Exception):
                self.down()
            if isinstance(exc, Exception):
                raise ClusterError(f"cluster did not start: {exc}\n{tails}") from exc
            raise
        return self

    def in_use(self) -> bool:
        """True while a process recorded in the state file still runs (checked
        against its command line, so a reused pid does not count). A crashed run
        leaves none: the test process's children die with it (PR_SET_PDEATHSIG)."""
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_file.read_text())
            owner = state.get("owner", [0, ""])
            if owner[0] and _start_time(owner[0]) == owner[1]:
                return True  # the process running `up` (before it started anything)
            pids = state.get("pids", {})
            return any(self._ours(pid) for name, pid in pids.items()
                       if not name.startswith("import"))
        return False

    def recover(self) -> None:
        """Clean up what a crashed earlier run with the same name left behind;
        refuse (ClusterError) if that cluster is still running."""
        if self.external:
            return
        if self.in_use():
            raise ClusterError(f"cluster {self.name} is running (state dir {self.state_dir}); "
                               f"`hack/cluster down --name {self.name}` stops it")
        leftovers = (self.state_dir.exists() or _netns_inode(self.netns) is not None
                     or bool(_cgroup_dirs(self.cgroup)))
        if leftovers:
            log.warning("cluster %s: cleaning up a previous run", self.name)
            self.down()

    @classmethod
    def recover_stale(cls) -> list[str]:
        """Tear down every cluster under the state root whose processes are all
        gone (crashed test runs with other names); return their names."""
        root = Path(os.environ.get("JOBLEASE_CLUSTER_DIR") or STATE_ROOT)
        cleaned = []
        for state_dir in sorted(root.glob("*")) if root.is_dir() else []:
            if not state_dir.is_dir():
                continue
            stale = cls(state_dir.name, state_dir=state_dir, local=True)
            young = time.time() - state_dir.stat().st_mtime < 120  # being created now
            if not young and not stale.in_use():
                stale.recover()
                cleaned.append(state_dir.name)
        return cleaned

    def _original_sysctls(self) -> dict[str, str]:
        """The host sysctls as they were before any cluster's kubelet ran. The first
        cluster records them in ``<state root>/sysctls.json``; later and concurrent
        ones (and the one after a crash) read that file; the last ``down`` restores
        them and removes it."""
        saved = self.state_dir.parent / "sysctls.json"
        current = {key: _read_sysctl(key) for key in KUBELET_SYSCTLS}
        try:
            fd = os.open(saved, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            with contextlib.suppress(OSError, ValueError):
                recorded: dict[str, str] = json.loads(saved.read_text())
                if set(recorded) == set(KUBELET_SYSCTLS):
                    return recorded
            saved.write_text(json.dumps(current))
            return current
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(current))
        return current

    def _mark(self, what: str, began: float) -> None:
        self.timings[what] = round(time.monotonic() - began, 2)

    def _up(self, began: float) -> None:
        binaries = {  # resolve all first: fail fast with a clear message
            "etcd": etcd_binary(), "kube-apiserver": kube_apiserver_binary(),
            "kube-controller-manager": kube_controller_manager_binary(),
            "kube-scheduler": kube_scheduler_binary(), "kube-proxy": kube_proxy_binary(),
            "kubelet": kubelet_binary(), "containerd": containerd_binary(),
            "shim": containerd_shim_binary(), "ctr": ctr_binary(), "runc": runc_binary(),
            "socat": system_binary("socat", "socat", "/usr/bin/socat"),
            "iptables": system_binary("iptables", "iptables", "/usr/sbin/iptables"),
            "cni": cni_bin_dir(),
        }
        images = _images_index()
        pause = next(e["ref"] for e in images if e["ref"].startswith("registry.k8s.io/pause"))
        coredns = next(e["ref"] for e in images if "coredns" in e["ref"])
        self.state_dir.mkdir(parents=True)
        self.logs.mkdir()
        self._state = {
            "owner": [os.getpid(), _start_time(os.getpid())],
            "name": self.name, "netns": self.netns, "cgroup": self.cgroup,
            "pids": {}, "sysctls": self._original_sysctls(),
            "cni_results_existed": CNI_RESULTS.exists(),
            "var_lib_cni_existed": CNI_RESULTS.parent.exists(),
        }
        self._save_state()
        self._make_netns()
        self._make_cgroups()
        pki = self.state_dir / "pki"
        write_pki(pki, server_names=(
            "127.0.0.1", "localhost", KUBERNETES_SERVICE_IP, ADVERTISE_ADDRESS, "kubernetes",
            "kubernetes.default", "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ), clients=(
            ("kubelet", f"system:node:{NODE_NAME}", ("system:nodes",)),
            ("controller-manager", "system:kube-controller-manager", ()),
            ("scheduler", "system:kube-scheduler", ()),
            ("kube-proxy", "system:kube-proxy", ()),
            ("apiserver-kubelet-client", "kube-apiserver-kubelet-client",
             ("system:masters",)),
        ))
        for stem in ("kubelet", "controller-manager", "scheduler", "kube-proxy"):
            self._write_kubeconfig(self.state_dir / f"{stem}.kubeconfig",
                                   f"https://127.0.0.1:{APISERVER_PORT}", pki, stem)
        # etcd, kube-apiserver
        etcd_url = "http://127.0.0.1:2379"
        self._spawn("etcd", [
            binaries["etcd"], "--name", "default", "--data-dir", str(self.state_dir / "etcd"),
            "--listen-client-urls", etcd_url, "--advertise-client-urls", etcd_url,
            "--listen-peer-urls", "http://127.0.0.1:2380",
            "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
            "--initial-cluster", "default=http://127.0.0.1:2380", "--unsafe-no-fsync",
            "--listen-metrics-urls", "http://127.0.0.1:2381",
        ])
        # containerd starts meanwhile: image import is the slow part of `up`
        self._start_containerd(binaries, pause)
        # what `up` itself runs (pause, CoreDNS, the curl probe) first; the rest
        # (the project image takes 20-30 s) alongside the kubelet's start-up
        needed = [e for e in images if e["ref"].startswith(
            ("registry.k8s.io/pause", "registry.k8s.io/coredns", "docker.io/curlimages/curl"))]
        import_proc = self._import_images(binaries["ctr"], needed, "import")
        rest_proc = self._import_images(
            binaries["ctr"], [e for e in images if e not in needed], "import-rest")
        self._spawn("kube-apiserver", [
            binaries["kube-apiserver"],
            "--etcd-servers", etcd_url,
            "--bind-address", "0.0.0.0", "--advertise-address", ADVERTISE_ADDRESS,
            "--secure-port", str(APISERVER_PORT),
            "--cert-dir", str(self.state_dir / "apiserver-certs"),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--kubelet-client-certificate", str(pki / "apiserver-kubelet-client.crt"),
            "--kubelet-client-key", str(pki / "apiserver-kubelet-client.key"),
            "--kubelet-preferred-address-types", "Hostname",
            "--authorization-mode", "Node,RBAC",
            "--enable-admission-plugins", "NodeRestriction",
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--allow-privileged=true",
        ])
        self._start_forwarders()
        self._wait("kube-apiserver /readyz", self._apiserver_ready, self._procs["kube-apiserver"])
        self._mark("apiserver ready", began)
        self._spawn("kube-controller-manager", [
            binaries["kube-controller-manager"],
            "--kubeconfig", str(self.state_dir / "controller-manager.kubeconfig"),
            "--authentication-kubeconfig", str(self.state_dir / "controller-manager.kubeconfig"),
            "--authorization-kubeconfig", str(self.state_dir / "controller-manager.kubeconfig"),
            "--bind-address", "127.0.0.1",
            "--leader-elect=false", "--use-service-account-credentials",
            "--controllers", "*",
            "--service-account-private-key-file", str(pki / "sa.key"),
            "--root-ca-file", str(pki / "ca.crt"),
            "--service-cluster-ip-range", SERVICE_CIDR, "--cluster-cidr", POD_CIDR,
            "--node-monitor-period", "2s",
        ])
        self._spawn("kube-scheduler", [
            binaries["kube-scheduler"],
            "--kubeconfig", str(self.state_dir / "scheduler.kubeconfig"),
            "--authentication-kubeconfig", str(self.state_dir / "scheduler.kubeconfig"),
            "--authorization-kubeconfig", str(self.state_dir / "scheduler.kubeconfig"),
            "--bind-address", "127.0.0.1", "--leader-elect=false",
        ])
        self._start_kube_proxy(binaries["kube-proxy"])
        self._make_storage()
        self._wait_import(import_proc, "import")
        self._mark("pause, coredns, curl imported", began)
        self._start_kubelet(binaries["kubelet"], pki)
        self._wait("node Ready and untainted", self._node_ready, self._procs["kubelet"])
        self._mark("node ready", began)
        self._start_coredns(coredns)
        self._wait("CoreDNS available", lambda: self._deployment_available("coredns"),
                   self._procs["kubelet"])
        self._mark("coredns ready", began)
        self._dns_probe()
        self._mark("dns probe passed", began)
        self._wait_import(rest_proc, "import-rest")
        self.startup_seconds = round(time.monotonic() - began, 2)
        self._mark("all images imported", began)
        log.warning("cluster %s ready in %.1fs (%s); kubeconfig %s", self.name,
                    self.startup_seconds, ", ".join(f"{k} {v}s" for k, v in self.timings.items()),
                    self.kubeconfig)

    # ----------------------------------------------------------- pieces
    def _spawn(self, name: str, argv: list[str], *, netns: bool = True,
               env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        with (self.logs / f"{name}.log").open("ab") as log_file:
            proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, env=env, cwd=self.state_dir,
                preexec_fn=_child_setup(self.netns if netns else None, self.die_with_parent),
            )
        self._procs[name] = proc
        self._state["pids"][name] = proc.pid
        self._save_state()
        return proc

    def _wait(self, what: str, check: Callable[[], bool],
              proc: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + self.ready_timeout
        delay = 0.1
        while True:
            for name, p in self._procs.items():
                if p.poll() is not None and name != "import":
                    raise ClusterError(f"{what}: {name} exited with code {p.returncode}")
            if check():
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"{what}: not reached after {self.ready_timeout:.0f}s")
            time.sleep(delay)  # poll interval between checks; the deadline bounds the wait
            delay = min(delay * 1.5, 1.0)

    def _make_netns(self) -> None:
        _run(["ip", "netns", "add", self.netns])
        self._state["netns_created"] = True
        self._save_state()
        ns = ["ip", "-n", self.netns]
        _run([*ns, "link", "set", "lo", "up"])
        # the advertise address on the namespace's lo: this kernel has no dummy
        # driver, and an address on lo is just as local (pods reach it via cni0)
        _run([*ns, "addr", "add", f"{ADVERTISE_ADDRESS}/32", "dev", "lo"])
        # a route for the Service range, as a node's default route would give: without
        # it a process of the namespace itself (the API server calling an admission
        # webhook's Service) fails at the route lookup, before kube-proxy's OUTPUT DNAT
        # rewrites the ClusterIP to a pod IP; from the advertise address, pods answer
        # it through cni0 as they answer the API server
        _run([*ns, "route", "add", SERVICE_CIDR, "dev", "lo", "src", ADVERTISE_ADDRESS])
        # per-namespace sysctls: forwarding between pods on cni0 (Service DNAT),
        # bridged traffic through iptables (kube-proxy's hairpin).
        _run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && "
              "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables"], netns=self.netns)

    def _make_cgroups(self) -> None:
        """The kubelet's cgroupRoot /jl-<name> in every hierarchy (it must exist)."""
        for hierarchy in _cgroup_hierarchies():
            path = hierarchy / self.cgroup
            path.mkdir(exist_ok=True)
            for knob in ("cpuset.cpus", "cpuset.mems"):  # a v1 cpuset child starts empty
                if (hierarchy / knob).exists() and (path / knob).exists():
                    (path / knob).write_text((hierarchy / knob).read_text())

    def _start_forwarders(self) -> None:
        sock = self.state_dir / "apiserver.sock"
        socat = system_binary("socat", "socat", "/usr/bin/socat")
        self._spawn("forward-netns", [
            socat, f"UNIX-LISTEN:{sock},fork,mode=600",
            f"TCP:127.0.0.1:{APISERVER_PORT}"])
        port = free_port()
        self._spawn("forward-host", [
            socat, f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
            f"UNIX-CONNECT:{sock}"], netns=False)
        self._state["host_port"] = port
        self._save_state()
        pki = self.state_dir / "pki"
        self._write_kubeconfig(self.kubeconfig, f"https://127.0.0.1:{port}", pki, "admin")
        self.server = f"https://127.0.0.1:{port}"

    def _apiserver_ready(self) -> bool:
        pki = self.state_dir / "pki"
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        import urllib.error
        import urllib.request
        try:
            with urllib.request.urlopen(f"{self.server}/readyz", timeout=3,
                                        context=context) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):
            return False

    def _start_containerd(self, binaries: dict[str, str], pause: str) -> None:
        base = self.state_dir / "containerd"
        base.mkdir()
        cni_conf = self.state_dir / "cni" / "net.d"
        cni_conf.mkdir(parents=True)
        (cni_conf / "10-jl.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": self.netns,
            "plugins": [
                {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
                 "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                          "routes": [{"dst": "0.0.0.0/0"}],
                          "dataDir": str(self.state_dir / "cni" / "ipam")}},
                {"type": "portmap", "capabilities": {"portMappings": True}},
            ],
        }, indent=2))
        config = f"""version = 4
root = "{base}/root"
state = "{base}/state"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing",
                    "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.image-verifier.v1.bindir"]
[plugins."io.containerd.server.v1.grpc"]
  address = "{self.containerd_socket}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{self.containerd_socket}.ttrpc"
[plugins."io.containerd.server.v1.debug"]
  address = ""
[plugins."io.containerd.server.v1.metrics"]
  address = ""
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{self.state_dir}/s"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{binaries['runc']}"
        Root = "{base}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{binaries['cni']}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""
        (base / "config.toml").write_text(config)
        bin_dir = str(Path(binaries["shim"]).parent)
        env = dict(os.environ, PATH=f"{bin_dir}:{Path(binaries['runc']).parent}:"
                   f"/usr/sbin:/usr/bin:/sbin:/bin")
        proc = self._spawn("containerd", [binaries["containerd"], "--config",
                                          str(base / "config.toml")], env=env)
        self._wait("containerd socket", lambda: self._ctr_ok(binaries["ctr"]), proc)

    def ctr(self, *args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return _run([ctr_binary(), "--address", str(self.containerd_socket), "-n", "k8s.io",
                     *args], check=check, timeout=timeout)

    def _ctr_ok(self, ctr: str) -> bool:
        if not self.containerd_socket.exists():
            return False
        return _run([ctr, "--address", str(self.containerd_socket), "version"],
                    check=False, timeout=10).returncode == 0

    def _import_images(self, ctr: str, images: list[dict[str, str]],
                       name: str) -> subprocess.Popen[bytes]:
        script = " && ".join([
            f"{ctr} --address {self.containerd_socket} -n k8s.io images import "
            f"'{entry['archive']}'" for entry in images] or ["true"])
        with (self.logs / f"{name}.log").open("ab") as log_file:
            proc = subprocess.Popen(["sh", "-c", script], stdout=log_file,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=_child_setup(None, self.die_with_parent))
        self._state["pids"][name] = proc.pid
        self._save_state()
        return proc

    def _wait_import(self, proc: subprocess.Popen[bytes], name: str) -> None:
        deadline = time.monotonic() + self.ready_timeout
        while proc.poll() is None:
            if time.monotonic() > deadline:
                raise ClusterError(f"{name}: image import did not finish")
            time.sleep(0.2)  # the import runs in the background; the deadline bounds it
        if proc.returncode != 0:
            raise ClusterError(f"ctr images import failed: {_tail(self.logs / f'{name}.log', 20)}")

    def _start_kube_proxy(self, binary: str) -> None:
        config = self.state_dir / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": str(self.state_dir / "kube-proxy.kubeconfig")},
            "hostnameOverride": NODE_NAME,
            "clusterCIDR": POD_CIDR,
            "bindAddress": "127.0.0.1",
            "healthzBindAddress": "127.0.0.1:10256",
            "metricsBindAddress": "127.0.0.1:10249",
            # 0 = leave the (host-wide) conntrack table size and timeouts alone
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }, indent=2))
        self._spawn("kube-proxy", [binary, "--config", str(config)])

    def _start_kubelet(self, binary: str, pki: Path) -> None:
        root = self.state_dir / "kubelet"
        root.mkdir()
        config = self.state_dir / "kubelet.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            # test-machine-only: cgroup v1 and no systemd here (docs/control-plane.md)
            "failCgroupV1": False,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": f"/{self.cgroup}",
            "containerRuntimeEndpoint": f"unix://{self.containerd_socket}",
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                               "x509": {"clientCAFile": str(pki / "ca.crt")}},
            "authorization": {"mode": "Webhook"},
            "address": "0.0.0.0",
            "clusterDNS": [DNS_SERVICE_IP],
            "clusterDomain": "cluster.local",
            "resolvConf": "",
            "podLogsDir": str(self.state_dir / "pod-logs"),
            "failSwapOn": False,
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "nodeStatusUpdateFrequency": "2s",
            "serializeImagePulls": False,
            "rotateCertificates": False,
            # The default (110) leaves little room beside bench/e2e.py's burst of 100
            # worker pods: CoreDNS, etcd and the operator run too, and pods of a
            # previous step may still be terminating. The ceiling is the pod CIDR:
            # host-local IPAM has 253 addresses in the /24, so stay well below it.
            "maxPods": MAX_PODS,
        }, indent=2))
        self._spawn("kubelet", [
            binary, "--config", str(config),
            "--kubeconfig", str(self.state_dir / "kubelet.kubeconfig"),
            "--root-dir", str(root), "--cert-dir", str(root / "pki"),
            "--hostname-override", NODE_NAME, "--node-ip", ADVERTISE_ADDRESS,
        ])

    @property
    def volumes_dir(self) -> Path:
        return self.state_dir / "volumes"

    def _make_storage(self) -> None:
        """The default StorageClass and its local PersistentVolumes (directories under
        the state dir, owned by :data:`VOLUME_OWNER`), so StatefulSet claims bind."""
        self.volumes_dir.mkdir()
        for index in range(LOCAL_VOLUMES):
            path = self.volumes_dir / f"pv-{index:02d}"
            path.mkdir()
            os.chown(path, VOLUME_OWNER, VOLUME_OWNER)
            path.chmod(0o750)
        self.apply(storage_manifest(self.volumes_dir, LOCAL_VOLUMES))

    def _node_ready(self) -> bool:
        result = self.kubectl("get", "node", NODE_NAME, "-o", "json", timeout=20)
        if result.returncode != 0:
            return False
        node = json.loads(result.stdout)
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", []))
        taints = [t["key"] for t in node.get("spec", {}).get("taints", [])]
        return ready and "node.kubernetes.io/not-ready" not in taints

    def _deployment_available(self, name: str, namespace: str = "kube-system") -> bool:
        result = self.kubectl("get", "deployment", name, "-n", namespace, "-o", "json",
                              timeout=20)
        if result.returncode != 0:
            return False
        status = json.loads(result.stdout).get("status", {})
        return bool(status.get("availableReplicas", 0) >= 1)

    def _start_coredns(self, image: str) -> None:
        self.apply(coredns_manifest(image))

    def _dns_probe(self) -> None:
        """A pod resolves the ``kubernetes`` Service by name and gets /readyz through it."""
        curl = image_ref("docker.io/curlimages/curl")
        name = "dns-probe"
        self.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"restartPolicy": "Never", "containers": [{
                "name": "probe", "image": curl, "imagePullPolicy": "Never",
                "command": ["curl", "-sS", "--retry", "30", "--retry-delay", "1",
                            "--retry-all-errors", "--max-time", "5", "--cacert",
                            "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
                            "https://kubernetes.default.svc.cluster.local/readyz"],
            }]},
        }))
        phase = self.wait_pod_done(name, "default")
        logs = self.kubectl("logs", name, "-n", "default").stdout
        if phase != "Succeeded" or "ok" not in logs:
            raise ClusterError(f"DNS probe pod ended {phase}: {logs}")
        self.kubectl("delete", "pod", name, "-n", "default", "--wait=false")

    # ------------------------------------------------------------ clients
    def kubectl(self, *args: str, check: bool = False, input: str | None = None,
                timeout: float = 60) -> subprocess.CompletedProcess[str]:
        """kubectl against this cluster as admin."""
        argv = [kubectl_binary(), "--kubeconfig", str(self.kubeconfig), *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def apply(self, manifest: str) -> None:
        result = self.kubectl("apply", "-f", "-", input=manifest)
        if result.returncode != 0:
            raise ClusterError(f"kubectl apply failed: {result.stderr}")

    def pod(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        result = self.kubectl("get", "pod", name, "-n", namespace, "-o", "json", timeout=20)
        if result.returncode != 0:
            return None
        pod: dict[str, Any] = json.loads(result.stdout)
        return pod

    def wait_pod_done(self, name: str, namespace: str = "default",
                      timeout: float | None = None) -> str:
        """Wait until the pod is Succeeded or Failed; return the phase."""
        deadline = time.monotonic() + (timeout or self.ready_timeout)
        phase = "?"
        while time.monotonic() < deadline:
            pod = self.pod(name, namespace)
            phase = (pod or {}).get("status", {}).get("phase", "?")
            if phase in ("Succeeded", "Failed"):
                return str(phase)
            time.sleep(0.5)  # poll interval; the deadline bounds the wait
        raise ClusterError(f"pod {namespace}/{name} still {phase} after the deadline:\n"
                           + self.kubectl("describe", "pod", name, "-n", namespace).stdout)

    def log_tails(self, lines: int = 30) -> str:
        if not self.logs.exists():
            return ""
        return "\n".join(_tail(path, lines) for path in sorted(self.logs.glob("*.log")))

    def _write_kubeconfig(self, path: Path, server: str, pki: Path, stem: str) -> None:
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "joblease", "cluster": {
                "server": server, "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": stem, "user": {
                "client-certificate": str(pki / f"{stem}.crt"),
                "client-key": str(pki / f"{stem}.key")}}],
            "contexts": [{"name": "joblease", "context": {"cluster": "joblease", "user": stem}}],
            "current-context": "joblease",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)

    # ----------------------------------------------------------- teardown
    def status(self) -> dict[str, Any]:
        """What is running: pids alive, netns, cgroups, mounts (for hack/cluster status)."""
        state: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_file.read_text())
        pids = state.get("pids", {})
        return {
            "running": self.in_use(),
            "state_dir": str(self.state_dir) if self.state_dir.exists() else None,
            "kubeconfig": str(self.kubeconfig) if self.kubeconfig.exists() else None,
            "processes": {n: p for n, p in pids.items() if self._ours(p)},
            "netns": self.netns if _netns_inode(self.netns) else None,
            "cgroups": [str(p) for p in _cgroup_dirs(self.cgroup)],
            "mounts": len(_mountpoints_under(self.state_dir)),
        }

    def _ours(self, pid: int) -> bool:
        """A pid from the state file still names our process (not a reused pid)."""
        return _alive(pid) and (str(self.state_dir) in _cmdline(pid)
                                or self._in_our_netns(pid))

    def _in_our_netns(self, pid: int) -> bool:
        inode = _netns_inode(self.netns)
        try:
            return inode is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == inode
        except OSError:
            return False

    def leftovers(self) -> list[str]:
        """Everything of this cluster still on the machine (empty after :meth:`down`)."""
        found = []
        for pid in _pids():
            if _alive(pid) and str(self.state_dir) in _cmdline(pid):
                found.append(f"process {pid}: {_cmdline(pid)[:120]}")
        if _netns_inode(self.netns) is not None:
            found.append(f"network namespace {self.netns}")
        found += [f"cgroup {p}" for p in _cgroup_dirs(self.cgroup)]
        found += [f"mount {p}" for p in _mountpoints_under(self.state_dir)]
        if self.state_dir.exists():
            found.append(f"state dir {self.state_dir}")
        return found

    def down(self, deadline_s: float = 20.0) -> None:
        """Stop everything and leave the machine as it was (idempotent)."""
        if self.external:
            return
        state: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            state = json.loads(self.state_file.read_text())
        pids: dict[str, int] = state.get("pids", {})
        problems: list[str] = []
        # 1. the kubelet first, so it restarts nothing
        for name in ("kubelet", "import", "import-rest"):
            if name in pids and self._ours(pids[name]):
                _kill_and_wait([pids[name]], deadline_s)
        # 2. the pods: every process in the cluster's cgroups
        cgroup_tops = _cgroup_dirs(self.cgroup)
        in_pods: set[int] = set()
        for top in cgroup_tops:
            in_pods |= _pids_in_cgroup(top)
        in_pods.discard(os.getpid())
        if in_pods:
            _kill_and_wait(sorted(in_pods), 0, signal.SIGKILL)
        # 3. the control plane and containerd, in reverse start order
        order = ["forward-host", "kube-proxy", "kube-scheduler", "kube-controller-manager",
                 "containerd", "forward-netns", "kube-apiserver", "etcd"]
        for name in order:
            pid = pids.get(name)
            if pid and self._ours(pid):
                left = _kill_and_wait([pid], deadline_s)
                problems += [f"{name} ({p}) did not exit" for p in left]
        # 4. containerd shims of our containerd, then anything still in our netns
        socket_path = str(self.containerd_socket)
        shims = [p for p in _pids() if "containerd-shim" in _cmdline(p)
                 and socket_path in _cmdline(p)]
        if shims:
            _kill_and_wait(shims, 5)
        inode = _netns_inode(self.netns)
        if inode is not None:
            rest = sorted(_pids_in_netns(inode) - {os.getpid()})
            if rest:
                left = _kill_and_wait(rest, 5)
                problems += [f"process {p} in {self.netns} did not exit" for p in left]
        rest = [p for p in _pids()  # anything else naming the state dir (the host forwarder)
                if p != os.getpid() and _alive(p) and str(self.state_dir) in _cmdline(p)]
        if rest:
            left = _kill_and_wait(rest, 5)
            problems += [f"process {p} ({_cmdline(p)[:60]}) did not exit" for p in left]
        # 5. libcni's cached results for our sandboxes
        sandboxes = {d.name for base in ("root", "state")
                     for d in (self.state_dir / "containerd" / base
                               / "io.containerd.grpc.v1.cri" / "sandboxes").glob("*")}
        if CNI_RESULTS.exists():
            for cached in CNI_RESULTS.iterdir():
                if cached.name.startswith(f"{self.netns}-") or any(
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
            points = _mountpoints_under(self.state_dir)
            if not points:
                break
            for point in points:
                try:
                    _umount(point)
                except ClusterError as exc:
                    if attempt == 2:
                        problems.append(str(exc))
        # 7. cgroups, network namespace, sysctls, state dir
        for top in _cgroup_dirs(self.cgroup):
            for pid in _pids_in_cgroup(top):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            try:
                _remove_cgroup_tree(top)
            except ClusterError as exc:
                problems.append(str(exc))
        if _netns_inode(self.netns) is not None:
            result = _run(["ip", "netns", "delete", self.netns], check=False)
            if result.returncode != 0:
                problems.append(f"ip netns delete {self.netns}: {result.stderr.strip()}")
        # the last cluster on the machine to go restores the sysctls (another
        # one's kubelet still runs with its values otherwise)
        others = [d.name for d in self.state_dir.parent.glob("*")
                  if d.is_dir() and d != self.state_dir
                  and Cluster(d.name, state_dir=d, local=True).in_use()]
        if not others:
            saved = self.state_dir.parent / "sysctls.json"
            originals: dict[str, str] = state.get("sysctls", {})
            with contextlib.suppress(OSError, ValueError):
                originals = json.loads(saved.read_text())
            for key, value in originals.items():
                try:
                    if _read_sysctl(key) != value:
                        _write_sysctl(key, value)
                except OSError as exc:
                    problems.append(f"restore sysctl {key}={value}: {exc}")
            if not problems:
                with contextlib.suppress(FileNotFoundError):
                    saved.unlink()
        if self.state_dir.exists() and not _mountpoints_under(self.state_dir):
            shutil.rmtree(self.state_dir, ignore_errors=True)
        with contextlib.suppress(OSError):  # the state root too, once the last one is gone
            self.state_dir.parent.rmdir()
        self._procs.clear()
        if problems:
            raise ClusterError("teardown incomplete: " + "; ".join(problems))

    def crash(self) -> None:
        """For recovery tests: end this instance as a killed test process would
        (SIGKILL to every process it started, as PR_SET_PDEATHSIG does) and clean
        nothing: pods, shims, mounts, cgroups and the network namespace stay."""
        for proc in self._procs.values():
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        for proc in self._procs.values():
            proc.wait()
        self._procs.clear()
        self._state["owner"] = [0, ""]  # as if the process that ran `up` had died
        self._save_state()

    def __enter__(self) -> Cluster:
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()


# ------------------------------------------------- node access (pod-level faults)
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
    for top in _cgroup_dirs(cluster.cgroup):
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
    return [p for top in _cgroup_dirs(cluster.cgroup) for p in top.rglob(f"pod{pod_uid}")
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
    ticks = int(_start_time(pid))
    uptime = float(Path("/proc/uptime").read_text().split()[0])
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def storage_manifest(volumes_dir: Path, count: int) -> str:
    """A default StorageClass without a provisioner, and ``count`` local volumes.

    Why this and not a provisioner: ``kubernetes.io/no-provisioner`` with
    ``WaitForFirstConsumer`` is how Kubernetes serves pre-created local disks (the
    scheduler's volume binder picks a free PersistentVolume of the class on the
    pod's node when the pod is scheduled, the kubelet bind-mounts the directory).
    Every part is the real one; only the pool is finite: a volume whose claim is
    deleted becomes ``Released`` and is not handed out again (``Retain``; nothing
    here scrubs data), so the pool bounds how many claims a session may create.
    ``local`` volumes need node affinity, which is the one node. The capacity is
    nominal (a directory has no size limit); it only has to cover the claims.
    """
    class_ = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
              "metadata": {"name": STORAGE_CLASS, "annotations": {
                  "storageclass.kubernetes.io/is-default-class": "true"}},
              "provisioner": "kubernetes.io/no-provisioner",
              "volumeBindingMode": "WaitForFirstConsumer",
              "reclaimPolicy": "Retain"}
    volumes: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{STORAGE_CLASS}-pv-{index:02d}",
                     "labels": {"joblease.io/test-volume": "true"}},
        "spec": {
            "capacity": {"storage": LOCAL_VOLUME_SIZE},
            "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
            "local": {"path": str(volumes_dir / f"pv-{index:02d}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}]}},
        }} for index in range(count)]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [class_, *volumes]})


def coredns_manifest(image: str) -> str:
    """CoreDNS as upstream deploys it, minus upstream forwarding (pods have no route out)."""
    corefile = """.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loop
    reload
    loadbalance
}
"""
    labels = {"k8s-app": "kube-dns"}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns",
                       "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "serviceAccountName": "coredns",
                      "priorityClassName": "system-cluster-critical",
                      "dnsPolicy": "Default",
                      "containers": [{
                          "name": "coredns", "image": image, "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 53, "name": "dns-tcp",
                                     "protocol": "TCP"},
                                    {"containerPort": 9153, "name": "metrics",
                                     "protocol": "TCP"}],
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                            "readOnly": True}],
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                             "periodSeconds": 2},
                          "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                            "initialDelaySeconds": 60},
                          "securityContext": {
                              "allowPrivilegeEscalation": False,
                              "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                              "readOnlyRootFilesystem": True,
                              "runAsNonRoot": True, "runAsUser": 65532},
                      }],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                  }}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"selector": labels, "clusterIP": DNS_SERVICE_IP, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
             {"name": "metrics", "port": 9153, "protocol": "TCP"}]}},
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def main(argv: list[str] | None = None) -> int:
    """``hack/cluster up|down|status [--name NAME]``."""
    parser = argparse.ArgumentParser(prog="hack/cluster", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--name", default="default", help="cluster name (netns jl-NAME)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cluster = Cluster(args.name, die_with_parent=False)
    if cluster.external:
        print("JOBLEASE_TEST_KUBECONFIG is set: that cluster is used, nothing to do",
              file=sys.stderr)
        return 2
    if args.command == "up":
        try:
            cluster.up()
        except ClusterError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"ready in {cluster.startup_seconds}s: "
              + ", ".join(f"{k} {v}s" for k, v in cluster.timings.items()), file=sys.stderr)
        print(f"logs: {cluster.logs}", file=sys.stderr)
        print(cluster.kubeconfig)
        return 0
    if args.command == "down":
        try:
            cluster.down()
        except ClusterError as exc:
            print(exc, file=sys.stderr)
            return 1
        left = cluster.leftovers()
        for item in left:
            print(f"left behind: {item}", file=sys.stderr)
        return 1 if left else 0
    print(json.dumps(cluster.status(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
