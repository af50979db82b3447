"""A deposed leader's registration and unregistration do not land: the operator's
kopf handlers, built for an elected replica (``build_registry(..., leadership)``),
fence every etcd write by the replica's term. Against the session's real etcd
with the real election; the kopf handlers are called directly (no API server:
what is tested is what they write to etcd and how they fail).

The deposed leader is one that has not noticed yet (paused, or its watch of the
leader key behind): its watch of the key is replaced by one that never reports
(FaultyStore.watch_hooks), its etcd lease is still renewed, and an admin
deletes its key so that another candidate is elected. Only that watch is faked.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, cast

import kopf
import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.etcd_store import EtcdStore
from joblease.operator.election import Election, Leadership
from joblease.operator.handlers import build_registry
from joblease.operator.mirror import Mirror
from joblease.store import Delete, WatchBatch
from tests.support.faulty_store import FaultyStore

TTL = 5
SPEC_OLD = {"leaseDurationSeconds": 10, "maxAttempts": 3}
SPEC_NEW = {"leaseDurationSeconds": 20, "maxAttempts": 3}


class _Mirror:
    """The handlers only tell the mirror to refresh a job they registered."""

    def refresh(self, job: JobRef) -> None:
        pass


def handlers(client: JobLeaseClient, leadership: Leadership) -> dict[str, Callable[..., Any]]:
    """The registry's handler functions by reason (create, update, delete, ...)."""
    registry = build_registry(client, cast(Mirror, _Mirror()), lambda: cast(Any, None), None,
                              leadership)
    return {str(h.reason): h.fn for h in registry._changing.get_all_handlers()
            if h.reason is not None}


async def never_reports(key: bytes, start_revision: int) -> AsyncIterator[WatchBatch]:
    await asyncio.Event().wait()
    yield WatchBatch(0, [])  # pragma: no cover


@pytest.fixture
async def replicas(etcd_config: EtcdConfig) -> AsyncIterator[
        tuple[JobLeaseClient, FaultyStore, JobLeaseClient, EtcdStore]]:
    """A's client (its store can fake its watch), B's client, and an admin store."""
    a_store = FaultyStore(EtcdStore(etcd_config))
    admin = EtcdStore(etcd_config)
    async with JobLeaseClient(etcd_config, store=a_store) as a, \
            JobLeaseClient(etcd_config) as b:
        yield a, a_store, b, admin
    await admin.close()


async def test_a_deposed_leaders_register_and_unregister_do_not_land_and_it_steps_down(
        replicas: tuple[JobLeaseClient, FaultyStore, JobLeaseClient, EtcdStore],
        etcd_config: EtcdConfig) -> None:
    a_client, a_store, b_client, admin = replicas
    log = logging.getLogger("test")
    job = JobRef("default", "fenced-handlers")
    a_store.watch_hooks = [never_reports]  # A's leadership watch: A will not notice
    a_election = Election(a_store, etcd_config.root, "all-namespaces", "replica-a", ttl=TTL)
    b_election = Election(b_client.store, etcd_config.root, "all-namespaces", "replica-b",
                          ttl=TTL)
    a_lead = await asyncio.wait_for(a_election.campaign(), 10)
    b_lead: Leadership | None = None
    try:
        a = handlers(a_client, a_lead)
        await a["create"](namespace=job.namespace, name=job.name, spec=SPEC_OLD, logger=log)
        # the leader's write lands
        assert (await a_client.get(job)).spec == JobSpec(10, 3, history_limit=10)

        # A's term ends (its key deleted, as an expired lease would), B is elected.
        await admin.txn([], [Delete(a_election.key)])
        b_lead = await asyncio.wait_for(b_election.campaign(), 10)
        assert b_lead.term > a_lead.term
        assert a_lead.alive, "A noticed on its own; the test needs a leader that has not"
        b = handlers(b_client, b_lead)
        await b["update"](namespace=job.namespace, name=job.name, spec=SPEC_NEW, logger=log)
        _, kvs = await admin.get(b_client.keys.job(job).spec)
        new_spec = kvs[0]

        # A, still believing it leads, re-applies the older spec, then deletes the job.
        with pytest.raises(kopf.TemporaryError, match="not the leader"):
            await a["update"](namespace=job.namespace, name=job.name, spec=SPEC_OLD,
                              logger=log)
        with pytest.raises(kopf.TemporaryError, match="not the leader"):
            await a["delete"](namespace=job.namespace, name=job.name, logger=log)
        other = JobRef("default", "fenced-handlers-new")
        with pytest.raises(kopf.TemporaryError, match="not the leader"):
            await a["create"](namespace=other.namespace, name=other.name, spec=SPEC_OLD,
                              logger=log)
        _, kvs = await admin.get(b_client.keys.job(job).spec)
        assert kvs == [new_spec], "the deposed leader's write landed over the new leader's"
        assert not (await b_client.get(other)).registered

        # The refusal itself ended A's leadership: run_operator exits 3 on it.
        reason = await asyncio.wait_for(a_lead.wait_lost(), 5)
        assert "fenced by the term" in reason
        assert not a_lead.alive
    finally:
        await a_lead.resign()
        if b_lead is not None:
            await b_lead.resign()
