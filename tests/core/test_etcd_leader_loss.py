"""A 3-member etcd cluster: the protocol survives losing the leader.

When the leader dies, etcd elects another and restarts every lease's
countdown at full TTL (so a TTL is a lower bound on ownership, never an upper
one). The holder keeps its job, completes it, and later claims get larger
tokens. The client fails over between endpoints on its own. The job's tenure
history, written by those same transactions, survives the loss too, and the
restarted member serves it as the others do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, Phase
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.records import TenureEnd


async def leader_index(cluster: EtcdCluster) -> int:
    for i, m in enumerate(cluster.members):
        if not m.running:
            continue
        async with EtcdStore(EtcdConfig(endpoints=(m.endpoint,))) as store:
            status = await store.status()
            if status["leader"] == status["member"]:
                return i
    raise AssertionError("no leader")


async def test_holder_keeps_its_job_and_tokens_grow_across_leader_loss(
    etcd_cluster_factory: Callable[[int], EtcdCluster],
) -> None:
    cluster = etcd_cluster_factory(3)
    config = EtcdConfig(endpoints=cluster.endpoints, root="/cluster-test", request_timeout=2.0)
    async with JobLeaseClient(config) as client:
        job = JobRef("default", "ha")
        await client.register(job, JobSpec(5, 0, history_limit=10))
        lease = await client.claim(job, "a")

        leader = await leader_index(cluster)
        cluster.members[leader].kill()

        record = await asyncio.wait_for(lease.complete({"survived": True}), 30)
        assert record.token == lease.token

        other = JobRef("default", "after-failover")
        await client.register(other, JobSpec(5, 0))
        later = await client.claim(other, "b")
        assert later.token > lease.token
        await later.complete(None)

        history = await client.history(job)
        assert [(t.token, t.end) for t in history.tenures] == [
            (lease.token, TenureEnd.COMPLETED)]

        cluster.members[leader].start()
        cluster.wait_healthy(60, [cluster.members[leader]])
        assert (await client.get(job)).phase is Phase.COMPLETED
        # the restarted member has caught up: the same history, read from it alone
        only_it = config.with_(endpoints=(cluster.members[leader].endpoint,))
        async with JobLeaseClient(only_it) as reader:
            assert (await reader.history(job)).tenures == history.tenures
