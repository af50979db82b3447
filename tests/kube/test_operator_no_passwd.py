"""The operator starts as a UID that has no passwd entry, as it runs in the image.

The image runs as 65532:65532 and its base (python:slim, or the Debian
stand-in hack/build-images uses) lists no such user. kopf's default identity
calls ``getpass.getuser()``, which then raised ``KeyError: 'getpwuid(): uid
not found: 65532'`` and the operator crash-looped in its pod. Here the real
``joblease operator`` runs on the host under ``setpriv`` as 65532 with no
``LOGNAME``/``USER`` in its environment (and only CAP_DAC_READ_SEARCH, so that
it can read a checkout in a root-only directory), against the real kube-apiserver and
etcd, until its ``/readyz`` answers 200 (kopf has started its watches, which is
past the point where it crashed).
"""

from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from joblease import EtcdConfig
from tests.support.controlplane import ControlPlane
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for

pytestmark = pytest.mark.kube
UID = GID = 65532
ACCOUNT_ENV = ("LOGNAME", "USER", "LNAME", "USERNAME", "POD_ID")


def _inline_kubeconfig(cp: ControlPlane, dest: Path) -> None:
    """The admin kubeconfig with its certificates inlined (``--flatten``), so that it
    is one file the unprivileged process can read."""
    view = cp.kubectl("config", "view", "--raw", "--minify", "--flatten", "-o", "json",
                      check=True)
    dest.write_text(view.stdout)
    dest.chmod(0o600)


class NoPasswdOperator(OperatorProcess):
    """``joblease operator`` as UID/GID 65532 (no passwd entry), no account env."""

    def __init__(self, cp: ControlPlane, etcd: EtcdConfig, namespace: str, log: Path,
                 home: Path) -> None:
        super().__init__(cp, etcd, namespace, log)
        self.home = home
        _inline_kubeconfig(cp, home / "kubeconfig")
        os.chown(home / "kubeconfig", UID, GID)

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in super().environment().items() if k not in ACCOUNT_ENV}
        env.update(KUBECONFIG=str(self.home / "kubeconfig"), HOME=str(self.home))
        return env

    def start(self) -> NoPasswdOperator:
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop to a UID without an entry"
        self.starts += 1
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                # CAP_DAC_READ_SEARCH only: read (never write) the checkout and its venv
                # wherever they are (a `mktemp -d` clone is root-only), as the image's
                # files are readable to its user; the UID still has no passwd entry.
                [setpriv, f"--reuid={UID}", f"--regid={GID}", "--clear-groups",
                 "--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search", "--",
                 sys.executable, "-m", "joblease.operator", "--namespace", self.namespace,
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
                 "--watch-timeout", "60"],
                env=self.environment(), cwd=self.home, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)
        return self


@pytest.fixture
def home() -> Iterator[Path]:
    """A directory the unprivileged process owns (pytest's tmp_path is root-only)."""
    path = Path(tempfile.mkdtemp(prefix="joblease-nopasswd-"))
    os.chown(path, UID, GID)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
async def no_passwd_operator(crds_installed: ControlPlane, namespace: str,
                             etcd_config: EtcdConfig, tmp_path: Path, home: Path,
                             request: pytest.FixtureRequest
                             ) -> AsyncIterator[NoPasswdOperator]:
    op = NoPasswdOperator(crds_installed, etcd_config, namespace, tmp_path / "operator.log",
                          home)
    async with running_operator(op, request, start=False) as running:
        yield running


async def test_operator_starts_as_a_uid_without_a_passwd_entry(
        no_passwd_operator: NoPasswdOperator, crds_installed: ControlPlane,
        namespace: str) -> None:
    assert os.geteuid() == 0, "this test drops from root to UID 65532 with setpriv"
    with pytest.raises(KeyError):
        pwd.getpwuid(UID)  # the condition the image runs in
    op = no_passwd_operator.start()
    proc = op.proc
    assert proc is not None

    async def ready() -> bool:
        if proc.poll() is not None:  # fail at once, with the reason, not at the deadline
            raise RuntimeError(f"operator exited with {proc.returncode}:\n{op.log_tail(30)}")
        return await asyncio.to_thread(op.probe, "/readyz") == 200
    await wait_for("operator /readyz as UID 65532", ready, timeout=90, interval=0.2)
    status = Path(f"/proc/{proc.pid}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    assert uids == [str(UID)] * 4, status
    log = op.log.read_text(errors="replace")
    assert "getpwuid" not in log and "Traceback" not in log, log[-3000:]

    # and it works: a JobLease is registered (the finalizer is kopf's doing)
    kube = Kube(crds_installed, namespace)
    await kube.apply("nopasswd", {"leaseDurationSeconds": 5, "maxAttempts": 1})
    await kube.status_where("nopasswd", "Pending", lambda s: s.get("phase") == "Pending")
    obj = await kube.get("nopasswd")
    assert obj is not None and "joblease.io/finalizer" in obj["metadata"]["finalizers"]
