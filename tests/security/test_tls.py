"""etcd over TLS and mutual TLS: the core client works with the right files and
is refused, quickly and with StoreUnavailableError, with the wrong ones."""

from __future__ import annotations

import time
import uuid

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.errors import StoreUnavailableError
from tests.support.secure_etcd import Pki

#: A refused connection must be reported within this many seconds.
BOUND = 15.0


def _config(cluster: EtcdCluster, **tls: str) -> EtcdConfig:
    return EtcdConfig(endpoints=cluster.endpoints, root=f"/joblease-tls/{uuid.uuid4().hex[:8]}",
                      request_timeout=2.0, **tls)


async def _round_trip(config: EtcdConfig) -> None:
    job = JobRef("default", "tls-" + uuid.uuid4().hex[:6])
    async with JobLeaseClient(config) as c:
        await c.register(job, JobSpec(lease_duration_seconds=5, max_attempts=2))
        lease = await c.claim(job, "worker-a")
        record = await lease.complete({"ok": True})
        assert record.token == lease.token
        state = await c.get(job)
        assert state.result is not None and state.result.result == {"ok": True}


async def _refused(config: EtcdConfig) -> str:
    started = time.monotonic()
    async with JobLeaseClient(config) as c:
        with pytest.raises(StoreUnavailableError) as info:
            await c.get(JobRef("default", "x"))
    assert time.monotonic() - started < BOUND
    return str(info.value)


async def test_core_client_over_tls(tls_etcd: EtcdCluster, pki: Pki) -> None:
    await _round_trip(_config(tls_etcd, ca_file=str(pki.ca)))


async def test_server_name_override(tls_etcd: EtcdCluster, pki: Pki) -> None:
    await _round_trip(_config(tls_etcd, ca_file=str(pki.ca), server_name="localhost"))


async def test_core_client_over_mutual_tls(mtls_etcd: EtcdCluster, pki: Pki) -> None:
    await _round_trip(_config(mtls_etcd, ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                              key_file=str(pki.client_key)))


async def test_plaintext_to_tls_port_is_refused(tls_etcd: EtcdCluster) -> None:
    await _refused(_config(tls_etcd))


async def test_client_trusting_the_wrong_ca_is_refused(tls_etcd: EtcdCluster, pki: Pki
                                                       ) -> None:
    await _refused(_config(tls_etcd, ca_file=str(pki.wrong_ca)))


async def test_wrong_server_name_is_refused(tls_etcd: EtcdCluster, pki: Pki) -> None:
    await _refused(_config(tls_etcd, ca_file=str(pki.ca), server_name="etcd.example.com"))


async def test_mtls_refuses_a_client_without_certificate(mtls_etcd: EtcdCluster, pki: Pki
                                                         ) -> None:
    await _refused(_config(mtls_etcd, ca_file=str(pki.ca)))


async def test_mtls_refuses_a_certificate_from_another_ca(mtls_etcd: EtcdCluster, pki: Pki
                                                          ) -> None:
    await _refused(_config(mtls_etcd, ca_file=str(pki.ca), cert_file=str(pki.wrong_client_cert),
                           key_file=str(pki.wrong_client_key)))


def test_cli_over_mutual_tls(mtls_etcd: EtcdCluster, pki: Pki) -> None:
    """The CLI reads the same TLS settings from its flags / JOBLEASE_ETCD_* variables."""
    from click.testing import CliRunner

    from joblease.cli import main

    root = f"/joblease-tls/{uuid.uuid4().hex[:8]}"
    env = {"JOBLEASE_ETCD_ENDPOINTS": ",".join(mtls_etcd.endpoints),
           "JOBLEASE_ETCD_CA_FILE": str(pki.ca), "JOBLEASE_ETCD_CERT_FILE": str(pki.client_cert),
           "JOBLEASE_ETCD_KEY_FILE": str(pki.client_key), "JOBLEASE_ROOT": root}
    runner = CliRunner()
    r = runner.invoke(main, ["register", "cli-job", "--ttl", "5"], env=env)
    assert r.exit_code == 0, r.output
    r = runner.invoke(main, ["get", "cli-job", "-o", "json"], env=env)
    assert r.exit_code == 0 and "cli-job" in r.output, r.output
    no_cert = {k: v for k, v in env.items() if "CERT" not in k and "KEY" not in k}
    r = runner.invoke(main, ["get", "cli-job", "--timeout", "2"], env=no_cert)
    assert r.exit_code == 10, r.output
