"""The cluster itself: :class:`Cluster` starts the node's components in order inside
its network namespace, waits for each, records every pid in its state file, and
offers the clients the tests use (``kubectl``, ``apply``, ``pod``). What each
component is started with is in :mod:`.components`; the host resources it
borrows in :mod:`.host`; giving them back in :mod:`.teardown`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.binaries import (
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
from tests.support.cluster import components, host, teardown
from tests.support.cluster.images import image_ref, images_index
from tests.support.cluster.manifests import coredns_manifest, storage_manifest
from tests.support.cluster.settings import (
    ADVERTISE_ADDRESS,
    APISERVER_PORT,
    CNI_RESULTS,
    KUBELET_SYSCTLS,
    KUBERNETES_SERVICE_IP,
    LOCAL_VOLUMES,
    NODE_NAME,
    SERVICE_CIDR,
    STATE_ROOT,
    VOLUME_OWNER,
    ClusterError,
)
from tests.support.controlplane import free_port, write_pki

log = logging.getLogger("tests.support.cluster")


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
            if owner[0] and host.start_time(owner[0]) == owner[1]:
                return True  # the process running `up` (before it started anything)
            pids = state.get("pids", {})
            return any(self.owns_process(pid) for name, pid in pids.items()
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
        leftovers = (self.state_dir.exists() or host.netns_inode(self.netns) is not None
                     or bool(host.cgroup_dirs(self.cgroup)))
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
        current = {key: host.read_sysctl(key) for key in KUBELET_SYSCTLS}
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
        images = images_index()
        pause = next(e["ref"] for e in images if e["ref"].startswith("registry.k8s.io/pause"))
        coredns = next(e["ref"] for e in images if "coredns" in e["ref"])
        self.state_dir.mkdir(parents=True)
        self.logs.mkdir()
        self._state = {
            "owner": [os.getpid(), host.start_time(os.getpid())],
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
        self._spawn("etcd", components.etcd_argv(binaries["etcd"], self.state_dir / "etcd"))
        # containerd starts meanwhile: image import is the slow part of `up`
        self._start_containerd(binaries, pause)
        # what `up` itself runs (pause, CoreDNS, the curl probe) first; the rest
        # (the project image takes 20-30 s) alongside the kubelet's start-up
        needed = [e for e in images if e["ref"].startswith(
            ("registry.k8s.io/pause", "registry.k8s.io/coredns", "docker.io/curlimages/curl"))]
        import_proc = self._import_images(binaries["ctr"], needed, "import")
        rest_proc = self._import_images(
            binaries["ctr"], [e for e in images if e not in needed], "import-rest")
        self._spawn("kube-apiserver", components.apiserver_argv(
            binaries["kube-apiserver"], pki, self.state_dir / "apiserver-certs"))
        self._start_forwarders()
        self._wait("kube-apiserver /readyz", self._apiserver_ready, self._procs["kube-apiserver"])
        self._mark("apiserver ready", began)
        self._spawn("kube-controller-manager", components.controller_manager_argv(
            binaries["kube-controller-manager"],
            self.state_dir / "controller-manager.kubeconfig", pki))
        self._spawn("kube-scheduler", components.scheduler_argv(
            binaries["kube-scheduler"], self.state_dir / "scheduler.kubeconfig"))
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
                preexec_fn=host.child_setup(self.netns if netns else None, self.die_with_parent),
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
        host.run(["ip", "netns", "add", self.netns])
        self._state["netns_created"] = True
        self._save_state()
        ns = ["ip", "-n", self.netns]
        host.run([*ns, "link", "set", "lo", "up"])
        # the advertise address on the namespace's lo: this kernel has no dummy
        # driver, and an address on lo is just as local (pods reach it via cni0)
        host.run([*ns, "addr", "add", f"{ADVERTISE_ADDRESS}/32", "dev", "lo"])
        # a route for the Service range, as a node's default route would give: without
        # it a process of the namespace itself (the API server calling an admission
        # webhook's Service) fails at the route lookup, before kube-proxy's OUTPUT DNAT
        # rewrites the ClusterIP to a pod IP; from the advertise address, pods answer
        # it through cni0 as they answer the API server
        host.run([*ns, "route", "add", SERVICE_CIDR, "dev", "lo", "src", ADVERTISE_ADDRESS])
        # per-namespace sysctls: forwarding between pods on cni0 (Service DNAT),
        # bridged traffic through iptables (kube-proxy's hairpin).
        host.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward && "
              "echo 1 > /proc/sys/net/bridge/bridge-nf-call-iptables"], netns=self.netns)

    def _make_cgroups(self) -> None:
        """The kubelet's cgroupRoot /jl-<name> in every hierarchy (it must exist)."""
        for hierarchy in host.cgroup_hierarchies():
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
        (cni_conf / "10-jl.conflist").write_text(
            components.cni_conflist(self.netns, self.state_dir / "cni" / "ipam"))
        (base / "config.toml").write_text(components.containerd_config(
            base=base, socket=self.containerd_socket, state_dir=self.state_dir, pause=pause,
            runc=binaries["runc"], cni_bin_dir=binaries["cni"], cni_conf=cni_conf))
        bin_dir = str(Path(binaries["shim"]).parent)
        env = dict(os.environ, PATH=f"{bin_dir}:{Path(binaries['runc']).parent}:"
                   f"/usr/sbin:/usr/bin:/sbin:/bin")
        proc = self._spawn("containerd", [binaries["containerd"], "--config",
                                          str(base / "config.toml")], env=env)
        self._wait("containerd socket", lambda: self._ctr_ok(binaries["ctr"]), proc)

    def ctr(self, *args: str, check: bool = True,
            timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return host.run([ctr_binary(), "--address", str(self.containerd_socket), "-n", "k8s.io",
                     *args], check=check, timeout=timeout)

    def _ctr_ok(self, ctr: str) -> bool:
        if not self.containerd_socket.exists():
            return False
        return host.run([ctr, "--address", str(self.containerd_socket), "version"],
                    check=False, timeout=10).returncode == 0

    def _import_images(self, ctr: str, images: list[dict[str, str]],
                       name: str) -> subprocess.Popen[bytes]:
        script = " && ".join([
            f"{ctr} --address {self.containerd_socket} -n k8s.io images import "
            f"'{entry['archive']}'" for entry in images] or ["true"])
        with (self.logs / f"{name}.log").open("ab") as log_file:
            proc = subprocess.Popen(["sh", "-c", script], stdout=log_file,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    preexec_fn=host.child_setup(None, self.die_with_parent))
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
            raise ClusterError("ctr images import failed: "
                               + host.tail(self.logs / f"{name}.log", 20))

    def _start_kube_proxy(self, binary: str) -> None:
        config = self.state_dir / "kube-proxy.yaml"
        config.write_text(components.kube_proxy_config(self.state_dir / "kube-proxy.kubeconfig"))
        self._spawn("kube-proxy", [binary, "--config", str(config)])

    def _start_kubelet(self, binary: str, pki: Path) -> None:
        root = self.state_dir / "kubelet"
        root.mkdir()
        config = self.state_dir / "kubelet.yaml"
        config.write_text(components.kubelet_config(
            cgroup=self.cgroup, containerd_socket=self.containerd_socket, ca=pki / "ca.crt",
            pod_logs=self.state_dir / "pod-logs"))
        self._spawn("kubelet", components.kubelet_argv(
            binary, config, self.state_dir / "kubelet.kubeconfig", root))

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
        return "\n".join(host.tail(path, lines) for path in sorted(self.logs.glob("*.log")))

    def _write_kubeconfig(self, path: Path, server: str, pki: Path, stem: str) -> None:
        path.write_text(components.kubeconfig(server, pki, stem))
        path.chmod(0o600)

    # ----------------------------------------------------------- teardown
    def owns_process(self, pid: int) -> bool:
        """A pid from the state file still names our process (not a reused pid)."""
        return host.alive(pid) and (str(self.state_dir) in host.cmdline(pid)
                                    or self.in_our_netns(pid))

    def in_our_netns(self, pid: int) -> bool:
        inode = host.netns_inode(self.netns)
        try:
            return inode is not None and os.stat(f"/proc/{pid}/ns/net").st_ino == inode
        except OSError:
            return False

    def status(self) -> dict[str, Any]:
        """What is running: pids alive, netns, cgroups, mounts (for hack/cluster status)."""
        return teardown.status(self)

    def leftovers(self) -> list[str]:
        """Everything of this cluster still on the machine (empty after :meth:`down`)."""
        return teardown.leftovers(self)

    def down(self, deadline_s: float = 20.0) -> None:
        """Stop everything and leave the machine as it was (idempotent; see
        :mod:`tests.support.cluster.teardown` for the order and why)."""
        if self.external:
            return
        teardown.tear_down(self, deadline_s)
        self._procs.clear()

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
