"""guarded_put: the holder's own etcd writes commit only while its claim is current."""

from __future__ import annotations

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, StaleTokenError
from joblease.fencing import guarded_put
from joblease.store import Put


async def test_guarded_put_writes_only_while_the_claim_is_current(
        client: JobLeaseClient, etcd_config: EtcdConfig) -> None:
    job = JobRef("default", "exporter")
    await client.register(job, JobSpec(lease_duration_seconds=2))
    out, other = f"{etcd_config.root}/out/a".encode(), f"{etcd_config.root}/out/b".encode()

    lease_a = await client.claim(job, "worker-a")
    revision = await guarded_put(client.store, lease_a, [Put(out, b"from-a")])
    assert revision > lease_a.token

    # etcd expires A's lease (revoking it is exactly what expiry does), and B claims.
    await client.store.revoke(lease_a.lease_id)
    async with JobLeaseClient(etcd_config) as worker_b:
        lease_b = await worker_b.claim(job, "worker-b")

        with pytest.raises(StaleTokenError) as stale:
            await guarded_put(client.store, lease_a, [Put(out, b"late-a"), Put(other, b"x")])
        assert (stale.value.current_token, stale.value.current_owner) == (
            lease_b.token, "worker-b")
        assert (stale.value.http_status, stale.value.exit_code) == (409, 7)
        _, kvs = await client.store.get(out)
        assert kvs[0].value == b"from-a"
        assert (await client.store.get(other))[1] == []

        await guarded_put(worker_b.store, lease_b, [Put(out, b"from-b")])
        assert (await client.store.get(out))[1][0].value == b"from-b"

        await lease_b.release()
        with pytest.raises(StaleTokenError) as gone:
            await guarded_put(worker_b.store, lease_b, [Put(out, b"after-release")])
        assert gone.value.current_token is None
    assert (await client.store.get(out))[1][0].value == b"from-b"
