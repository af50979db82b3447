"""Ambiguous outcomes are resolved by reading back, never by a blind retry.

A lossy TCP proxy sits between the client and etcd. The client is configured
with two endpoints, the proxy first and etcd directly second, so after the
proxy swallows a response the client fails over and reads back from etcd.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, Phase
from tests.support.proxy import LossyProxy


@pytest.fixture
async def proxied(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, LossyProxy]]:
    host, port = etcd_config.endpoints[0].split(":")
    proxy = await LossyProxy(host, int(port)).start()
    config = etcd_config.with_(endpoints=(proxy.endpoint, etcd_config.endpoints[0]),
                               request_timeout=1.0)
    async with JobLeaseClient(config) as c:
        yield c, proxy
    await proxy.close()


async def warm_up(c: JobLeaseClient, client: JobLeaseClient, job: JobRef) -> None:
    """Make ``c`` cache the job's spec and open its etcd session through the
    proxy (a claim refused because someone else holds the job), so that the
    next claim is a single transaction through the proxy."""
    from joblease import HeldError

    other = await client.claim(job, "warm-up")
    with pytest.raises(HeldError):
        await c.claim(job, "worker-a")
    await other.release()


async def test_claim_whose_response_is_lost_is_found_committed_by_read_back(
    proxied: tuple[JobLeaseClient, LossyProxy], client: JobLeaseClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="joblease")
    c, proxy = proxied
    job = JobRef("default", "lost-response")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=3))
    await warm_up(c, client, job)
    proxy.mode = "drop_responses"
    lease = await c.claim(job, "worker-a")  # commits; the answer is lost; read-back finds it
    state = await client.get(job)
    assert state.holder is not None
    assert state.holder.claim_id == lease.claim_id
    assert state.holder.token == lease.token
    assert state.generation == lease.generation == 2, "the claim was sent twice"
    assert "resolved by read-back: committed" in caplog.text
    assert lease.valid
    record = await lease.complete({"ok": True})
    assert record.token == lease.token
    assert (await client.get(job)).phase is Phase.COMPLETED


async def test_claim_whose_request_is_lost_is_retried_once_safely(
    proxied: tuple[JobLeaseClient, LossyProxy], client: JobLeaseClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="joblease")
    c, proxy = proxied
    job = JobRef("default", "lost-request")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=3))
    await warm_up(c, client, job)
    proxy.mode = "drop_requests"
    lease = await c.claim(job, "worker-a")  # not committed; lease revoked; retried directly
    state = await client.get(job)
    assert state.holder is not None and state.holder.claim_id == lease.claim_id
    assert state.generation == 2, "a claim committed that nobody holds"
    assert "revoking lease" in caplog.text
    assert lease.valid


async def test_completion_whose_response_is_lost_is_confirmed_by_read_back(
    proxied: tuple[JobLeaseClient, LossyProxy], client: JobLeaseClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("INFO", logger="joblease")
    c, proxy = proxied
    job = JobRef("default", "lost-completion")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=3))
    lease = await c.claim(job, "worker-a")
    proxy.mode = "drop_responses"
    record = await lease.complete({"n": 1})
    assert "unknown outcome; reading back" in caplog.text
    assert record.owner == "worker-a" and record.token == lease.token
    state = await client.get(job)
    assert state.result is not None and state.result.claim_id == lease.claim_id
