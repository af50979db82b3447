"""docs/security.md's etcd command for mutual TLS, run as written by bash: a real etcd
(the tests' pinned build, first on PATH as ``etcd``) with the test's certificates
(tests/support/secure_etcd.py) in place of the block's /etc/etcd/tls files and a free
loopback port in place of 0.0.0.0:2379. Nothing else of the block is changed; the
settings it leaves to etcd's defaults (data directory, peer URL, which would be port
2380 on every test) come from etcd's own ``ETCD_*`` environment variables.

It checks what the block promises: the core client with a certificate of the CA
round-trips a job, and one without a certificate is refused (the block once carried a
comment between its continued lines, so etcd started without its last line and
accepted every client)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import find_etcd_binary, free_port
from joblease.errors import StoreUnavailableError
from tests.support.cli import doc_block
from tests.support.etcd import etcd_binary
from tests.support.secure_etcd import Pki
from tests.support.waiting import wait_until

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DOC_FILES = ("/etc/etcd/tls/server.pem", "/etc/etcd/tls/server-key.pem", "/etc/etcd/tls/ca.pem")
DOC_LISTEN = "https://0.0.0.0:2379"


def _config(endpoint: str, **tls: str) -> EtcdConfig:
    return EtcdConfig(endpoints=[endpoint], root=f"/joblease-tls-docs/{uuid.uuid4().hex[:8]}",
                      request_timeout=2.0, **tls)


async def _round_trip(config: EtcdConfig) -> None:
    job = JobRef("default", "tls-docs")
    async with JobLeaseClient(config) as c:
        await c.register(job, JobSpec(lease_duration_seconds=5, max_attempts=2))
        lease = await c.claim(job, "worker-a")
        await lease.complete({"ok": True})


async def _get(config: EtcdConfig) -> None:
    async with JobLeaseClient(config) as c:
        await c.get(JobRef("default", "x"))


def test_the_mutual_tls_etcd_command_refuses_a_client_without_a_certificate(
        tmp_path: Path, pki: Pki) -> None:
    block = doc_block(DOC, "sh", "TLS and mutual TLS to etcd")
    assert DOC_LISTEN in block and all(f in block for f in DOC_FILES), block
    port, peer = free_port(), free_port()
    script = block.replace(DOC_LISTEN, f"https://127.0.0.1:{port}")
    for doc_file, ours in zip(DOC_FILES, (pki.server_cert, pki.server_key, pki.ca), strict=True):
        script = script.replace(doc_file, str(ours))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "etcd").symlink_to(etcd_binary() or find_etcd_binary())
    peer_url = f"http://127.0.0.1:{peer}"
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "ETCD_DATA_DIR": str(tmp_path / "data"), "ETCD_LISTEN_PEER_URLS": peer_url,
           "ETCD_INITIAL_ADVERTISE_PEER_URLS": peer_url,
           "ETCD_INITIAL_CLUSTER": f"default={peer_url}", "ETCD_UNSAFE_NO_FSYNC": "true"}
    log = (tmp_path / "etcd.log").open("w")
    proc = subprocess.Popen(["bash", "-euc", script], env=env, cwd=tmp_path, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"https://127.0.0.1:{port}"
    with_cert = _config(endpoint, ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                        key_file=str(pki.client_key))
    try:
        def serving() -> bool:
            assert proc.poll() is None, (tmp_path / "etcd.log").read_text()[-3000:]
            try:
                asyncio.run(_get(with_cert))
            except StoreUnavailableError:
                return False
            return True
        wait_until(serving, timeout=60, what="the documented etcd serving mutual TLS",
                   interval=0.2)
        asyncio.run(_round_trip(with_cert))
        started = time.monotonic()
        with pytest.raises(StoreUnavailableError):
            asyncio.run(_get(_config(endpoint, ca_file=str(pki.ca))))
        assert time.monotonic() - started < 15
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()
