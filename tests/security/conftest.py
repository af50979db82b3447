"""The security tests' own fixture: ``tenants``, two fresh namespaces with their
etcd tenant users under a key root private to the test, on ``auth_etcd``
(tests/support/secure_etcd.py, with ``pki``, ``tls_etcd`` and ``mtls_etcd``).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.tenancy import ensure_namespace_tenant
from tests.support.failure_logs import attach_on_failure
from tests.support.secure_etcd import ROOT_PASSWORD, Pki, Tenants


@pytest.fixture
async def tenants(auth_etcd: EtcdCluster, pki: Pki, request: pytest.FixtureRequest
                  ) -> AsyncIterator[Tenants]:
    suffix = uuid.uuid4().hex[:8]
    root = f"/joblease-sec/{suffix}"
    base = EtcdConfig(endpoints=auth_etcd.endpoints, ca_file=str(pki.ca), root=root)
    admin = EtcdStore(base.with_(username="root", password=ROOT_PASSWORD))
    ns_a, ns_b = f"team-a-{suffix}", f"team-b-{suffix}"
    a = await ensure_namespace_tenant(admin, root, ns_a)
    b = await ensure_namespace_tenant(admin, root, ns_b)
    yield Tenants(root, base, admin, ns_a, ns_b, a, b)
    await admin.close()
    attach_on_failure(request, "etcd log", auth_etcd.log_tails)
