"""The bundled etcd's auth switch (the chart's ``JOBLEASE_ETCD_ENABLE_AUTH``): the
operator turns auth on as ``root`` on its first start, and afterwards finds it on.

A private etcd of its own (auth cannot be turned off again for the session's
shared one), with mutual TLS as the chart runs it; a client certificate whose CN is
no etcd user, like the chart's.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.errors import PermissionDeniedError
from joblease.etcd_store import EtcdStore
from joblease.operator.tenants import turn_auth_on
from joblease.tenancy import EtcdAuthAdmin, ensure_namespace_tenant
from tests.support.secure_etcd import Pki, _tls_cluster


@pytest.fixture
def fresh_mtls_etcd(pki: Pki) -> Iterator[EtcdCluster]:
    cluster = _tls_cluster(pki, mutual=True).start()
    yield cluster
    cluster.stop()


def _configs(cluster: EtcdCluster, pki: Pki) -> tuple[EtcdConfig, EtcdConfig]:
    """The chart's connection: the client certificate alone, and as root."""
    plain = EtcdConfig(endpoints=cluster.endpoints, ca_file=str(pki.ca),
                       cert_file=str(pki.client_cert), key_file=str(pki.client_key),
                       root="/bootstrap")
    return plain, plain.with_(username="root", password="a-generated-root-password")


async def test_the_operator_turns_auth_on_once_and_connects_as_root(
        fresh_mtls_etcd: EtcdCluster, pki: Pki) -> None:
    plain, root = _configs(fresh_mtls_etcd, pki)
    job = JobRef("team-a", "job")
    async with JobLeaseClient(plain) as before:  # auth off: the certificate is enough
        await before.register(job, JobSpec(lease_duration_seconds=5))

    await turn_auth_on(root)
    async with EtcdStore(root) as admin:
        assert await EtcdAuthAdmin(admin).auth_enabled()
        tenant = await ensure_namespace_tenant(admin, "/bootstrap", "team-a")
    # the certificate alone (its CN is no etcd user) reaches nothing now ...
    async with JobLeaseClient(plain) as bare:
        with pytest.raises(PermissionDeniedError):
            await bare.get(job)
    # ... root everything, the tenant its namespace
    async with JobLeaseClient(root) as operator:
        assert (await operator.get(job)).registered
    async with JobLeaseClient(tenant.etcd_config(plain)) as worker:
        lease = await worker.claim(job, "w")
        await lease.complete({})

    # a restart finds auth on and changes nothing (a wrong password is not "fixed")
    await turn_auth_on(root)
    with pytest.raises(PermissionDeniedError):
        await turn_auth_on(plain.with_(username="root", password="not-the-password"))


async def test_replicas_starting_together_all_find_auth_on(
        fresh_mtls_etcd: EtcdCluster, pki: Pki) -> None:
    """Two operator replicas of a fresh install both see auth off and both turn it
    on: the slower one's next step, over a connection without credentials, is then
    refused ("user name not found"). It crashed the replica on its first start (a
    restart of the chart's standby, seen in the HA test, 2026-12-07); it must find
    that another replica was quicker and go on."""
    plain, root = _configs(fresh_mtls_etcd, pki)
    await asyncio.gather(*(turn_auth_on(root) for _ in range(4)))
    async with EtcdStore(root) as admin:
        assert await EtcdAuthAdmin(admin).auth_enabled()
    with pytest.raises(PermissionDeniedError):  # and a wrong password is still refused
        await turn_auth_on(plain.with_(username="root", password="not-the-password"))
