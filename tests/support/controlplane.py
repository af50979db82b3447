"""A real Kubernetes control plane (etcd + kube-apiserver) for tests, without Docker.

Why: the CRD's validation, RBAC and the operator must be tested against the
real API server, not a mock. This starts them envtest-style: its own etcd on
free loopback ports with a private data dir, and a kube-apiserver with a
generated PKI (serving cert, client CA, admin client cert in system:masters,
service-account signing key) and RBAC authorization.

No kubelet and no controller-manager run: pods never start, nothing is
garbage-collected, namespace deletion does not finish, and the ServiceAccount
admission plugin is disabled (no token controller). TokenRequest
(``kubectl create token``) works without them.

If ``JOBLEASE_TEST_KUBECONFIG`` is set, that cluster is used instead and
nothing is started or stopped.

For humans: ``python -m tests.support.controlplane`` starts one, prints the
kubeconfig path and waits for Ctrl-C.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.binaries import (
    etcd_binary,
    helm_binary,
    kube_apiserver_binary,
    kubectl_binary,
)

log = logging.getLogger(__name__)

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc"


class ControlPlaneError(RuntimeError):
    """The control plane did not start (the message carries the log tails)."""


def free_port() -> int:
    """A currently free loopback TCP port (bind to port 0, then release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: get SIGKILL if the test process dies, so nothing leaks."""
    if sys.platform.startswith("linux"):
        import ctypes

        pr_set_pdeathsig = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


# --------------------------------------------------------------------- PKI
def _pem_key(key: Any) -> bytes:
    return bytes(key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    ))


def _cert(
    subject: x509.Name,
    key: Any,
    issuer: x509.Certificate | None,
    issuer_key: Any,
    *,
    ca: bool = False,
    server_names: tuple[str, ...] = (),
    client: bool = False,
) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer.subject if issuer else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ca:
        builder = builder.add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), True
        )
    else:
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        if server_names:
            usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
            sans: list[x509.GeneralName] = []
            for name in server_names:
                try:
                    sans.append(x509.IPAddress(ipaddress.ip_address(name)))
                except ValueError:
                    sans.append(x509.DNSName(name))
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), False)
        builder = builder.add_extension(x509.ExtendedKeyUsage(usages), False)
    return builder.sign(issuer_key, hashes.SHA256())


SERVING_NAMES = ("127.0.0.1", "localhost", "10.0.0.1", "kubernetes",
                 "kubernetes.default", "kubernetes.default.svc")


def write_pki(
    pki: Path,
    *,
    server_names: tuple[str, ...] = SERVING_NAMES,
    clients: tuple[tuple[str, str, tuple[str, ...]], ...] = (),
) -> None:
    """CA, API server serving cert, admin client cert, service-account RSA key.

    ``server_names`` are the serving cert's SANs; each ``(stem, common_name,
    organizations)`` in ``clients`` adds a client cert ``<stem>.crt``/``<stem>.key``
    signed by the same CA (Kubernetes reads CN as user, O as groups).
    """
    pki.mkdir(parents=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "joblease-test-ca")]),
        ca_key, None, ca_key, ca=True,
    )
    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving = _cert(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]),
        serving_key, ca, ca_key,
        server_names=server_names,
    )
    client_certs: dict[str, tuple[x509.Certificate, Any]] = {}
    for stem, common_name, organizations in (("admin", "admin", ("system:masters",)),
                                             *clients):
        key = ec.generate_private_key(ec.SECP256R1())
        client_certs[stem] = (_cert(
            x509.Name([
                *(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org) for org in organizations),
                x509.NameAttribute(NameOID.COMMON_NAME, common_name),
            ]),
            key, ca, ca_key, client=True,
        ), key)
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = serialization.Encoding.PEM
    files = {
        "ca.crt": ca.public_bytes(pem),
        "apiserver.crt": serving.public_bytes(pem),
        "apiserver.key": _pem_key(serving_key),
        "sa.key": _pem_key(sa_key),
        "sa.pub": sa_key.public_key().public_bytes(
            pem, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    }
    for stem, (cert, key) in client_certs.items():
        files[f"{stem}.crt"] = cert.public_bytes(pem)
        files[f"{stem}.key"] = _pem_key(key)
    for name, data in files.items():
        (pki / name).write_bytes(data)
        (pki / name).chmod(0o600)


# ----------------------------------------------------------------- helpers
def _wait_until(what: str, check: Any, deadline_s: float, proc: subprocess.Popen[bytes]) -> None:
    """Poll ``check()`` until true; fail early if ``proc`` exits or the deadline passes."""
    deadline = time.monotonic() + deadline_s
    delay = 0.05
    while True:
        if proc.poll() is not None:
            raise ControlPlaneError(f"{what}: process exited with code {proc.returncode}")
        if check():
            return
        if time.monotonic() > deadline:
            raise ControlPlaneError(f"{what}: not ready after {deadline_s:.0f}s")
        time.sleep(delay)  # poll interval between checks; the deadline bounds the wait
        delay = min(delay * 1.5, 0.5)


def _http_ok(url: str, context: ssl.SSLContext | None = None) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _tail(path: Path, lines: int) -> str:
    if not path.exists():
        return f"({path.name}: no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"----- last {len(text)} lines of {path} -----\n" + "\n".join(text)


class ControlPlane:
    """etcd + kube-apiserver on loopback, or an existing cluster (JOBLEASE_TEST_KUBECONFIG).

    Attributes after :meth:`start`: ``kubeconfig`` (path), ``server`` (URL),
    ``startup_seconds`` (process start to ``/readyz`` 200, None if external),
    ``tmp`` (private dir with logs, PKI, etcd data).
    """

    def __init__(self, ready_timeout: float = 120.0) -> None:
        self.ready_timeout = ready_timeout
        self.tmp = Path(tempfile.mkdtemp(prefix="joblease-cp-"))
        self.kubeconfig: Path = self.tmp / "admin.kubeconfig"
        self.server = ""
        self.etcd_url = ""
        self.startup_seconds: float | None = None
        self.external = bool(os.environ.get("JOBLEASE_TEST_KUBECONFIG"))
        self._procs: list[tuple[str, subprocess.Popen[bytes]]] = []
        self._logs: list[Path] = []

    # ------------------------------------------------------------ lifecycle
    def start(self) -> ControlPlane:
        if self.external:
            self.kubeconfig = Path(os.environ["JOBLEASE_TEST_KUBECONFIG"]).resolve()
            self.server = self._cluster_entry()["server"]
            log.info("using existing cluster %s from %s", self.server, self.kubeconfig)
            return self
        try:
            self._start_local()
        except Exception as exc:
            tails = self.log_tails()
            self.stop()
            raise ControlPlaneError(f"control plane did not start: {exc}\n{tails}") from exc
        return self

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        log_path = self.tmp / f"{name}.log"
        self._logs.append(log_path)
        with log_path.open("wb") as log_file:
            proc = subprocess.Popen(
                argv, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True, preexec_fn=_die_with_parent,
            )
        self._procs.append((name, proc))
        return proc

    def _start_local(self) -> None:
        began = time.monotonic()
        etcd_bin, apiserver_bin = etcd_binary(), kube_apiserver_binary()  # fail fast
        pki = self.tmp / "pki"
        write_pki(pki)
        client_port, peer_port, secure_port = free_port(), free_port(), free_port()
        client_url = f"http://127.0.0.1:{client_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        etcd = self._spawn("etcd", [
            etcd_bin, "--name", "default", "--data-dir", str(self.tmp / "etcd-data"),
            "--listen-client-urls", client_url, "--advertise-client-urls", client_url,
            "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
            "--initial-cluster", f"default={peer_url}", "--unsafe-no-fsync",
        ])
        _wait_until("etcd /health", lambda: _http_ok(f"{client_url}/health"),
                    self.ready_timeout, etcd)
        self.etcd_url = client_url
        self.server = f"https://127.0.0.1:{secure_port}"
        apiserver = self._spawn("kube-apiserver", [
            apiserver_bin,
            "--etcd-servers", client_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
            "--secure-port", str(secure_port),
            "--cert-dir", str(self.tmp / "cert-dir"),
            "--tls-cert-file", str(pki / "apiserver.crt"),
            "--tls-private-key-file", str(pki / "apiserver.key"),
            "--client-ca-file", str(pki / "ca.crt"),
            "--authorization-mode", "RBAC",
            "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
            "--service-account-key-file", str(pki / "sa.pub"),
            "--service-account-signing-key-file", str(pki / "sa.key"),
            "--service-cluster-ip-range", SERVICE_CLUSTER_IP_RANGE,
            "--disable-admission-plugins", "ServiceAccount",
            "--allow-privileged=true",
        ])
        context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        context.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
        _wait_until("kube-apiserver /readyz",
                    lambda: _http_ok(f"{self.server}/readyz", context),
                    self.ready_timeout, apiserver)
        self.startup_seconds = round(time.monotonic() - began, 2)
        self._write_kubeconfig(self.kubeconfig, {
            "client-certificate": str(pki / "admin.crt"),
            "client-key": str(pki / "admin.key"),
        }, {"server": self.server, "certificate-authority": str(pki / "ca.crt")})
        log.warning("control plane ready in %.2fs at %s (kubeconfig %s)",
                    self.startup_seconds, self.server, self.kubeconfig)

    def stop(self, deadline_s: float = 15.0) -> None:
        """SIGTERM (apiserver first, then etcd), SIGKILL after the deadline; remove tmp."""
        for name, proc in reversed(self._procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(deadline_s)
                except subprocess.TimeoutExpired:
                    log.warning("%s ignored SIGTERM for %.0fs; killing", name, deadline_s)
                    proc.kill()
                    proc.wait()
        self._procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> ControlPlane:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log_tails(self, lines: int = 40) -> str:
        """The last lines of the etcd and kube-apiserver logs, for failure reports."""
        return "\n".join(_tail(path, lines) for path in self._logs)

    # ------------------------------------------------------------- clients
    def kubectl(
        self, *args: str, check: bool = False, input: str | None = None,
        kubeconfig: Path | str | None = None, timeout: float = 60,
    ) -> subprocess.CompletedProcess[str]:
        """Run kubectl against this cluster (admin unless ``kubeconfig`` is given)."""
        argv = [kubectl_binary(), "--kubeconfig", str(kubeconfig or self.kubeconfig), *args]
        return subprocess.run(argv, input=input, capture_output=True, text=True,
                              check=check, timeout=timeout)

    def helm(self, *args: str, check: bool = False,
             timeout: float = 120) -> subprocess.CompletedProcess[str]:
        """Run helm against this cluster with private helm config/cache dirs."""
        env = dict(os.environ, KUBECONFIG=str(self.kubeconfig))
        for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
            env[var] = str(self.tmp / "helm" / var.lower())
        return subprocess.run([helm_binary(), *args], capture_output=True, text=True,
                              check=check, timeout=timeout, env=env)

    def service_account_kubeconfig(self, namespace: str, name: str,
                                   duration: str = "1h") -> Path:
        """Create ServiceAccount ``name`` (if absent), get a TokenRequest token for it
        and write a kubeconfig that authenticates as that identity."""
        created = self.kubectl("create", "serviceaccount", name, "-n", namespace)
        if created.returncode != 0 and "already exists" not in created.stderr.lower():
            raise ControlPlaneError(f"create serviceaccount: {created.stderr}")
        token = self.kubectl("create", "token", name, "-n", namespace,
                             f"--duration={duration}", check=True).stdout.strip()
        path = self.tmp / f"sa-{namespace}-{name}.kubeconfig"
        self._write_kubeconfig(path, {"token": token}, self._cluster_entry())
        return path

    # ----------------------------------------------------------- internals
    def _cluster_entry(self) -> dict[str, Any]:
        """The current cluster of the admin kubeconfig, with the CA inlined."""
        view = self.kubectl("config", "view", "--raw", "--minify", "--flatten",
                            "-o", "json", check=True)
        return dict(json.loads(view.stdout)["clusters"][0]["cluster"])

    def _write_kubeconfig(self, path: Path, user: dict[str, str],
                          cluster: dict[str, Any]) -> None:
        """kubectl reads JSON kubeconfigs too, so no YAML library is needed."""
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "joblease-test", "cluster": cluster}],
            "users": [{"name": "user", "user": user}],
            "contexts": [{"name": "joblease-test",
                          "context": {"cluster": "joblease-test", "user": "user"}}],
            "current-context": "joblease-test",
        }
        path.write_text(json.dumps(config, indent=2))
        path.chmod(0o600)


def main() -> int:
    """Start a control plane for a human, print how to use it, stop on Ctrl-C."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cp = ControlPlane()
    with contextlib.ExitStack() as stack:
        stack.enter_context(cp)
        print(f"server:     {cp.server}")
        print(f"kubeconfig: {cp.kubeconfig}")
        print(f"ready in:   {cp.startup_seconds}s")
        print(f"logs:       {cp.tmp}/*.log")
        print(f"try:        kubectl --kubeconfig {cp.kubeconfig} get ns")
        print("Ctrl-C to stop.", flush=True)
        stopped = threading.Event()
        for signum in (signal.SIGINT, signal.SIGTERM):  # even if inherited as ignored
            signal.signal(signum, lambda *_: stopped.set())
        while not stopped.wait(1):
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
