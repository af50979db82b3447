"""Queues and semaphores under a tenant's etcd credentials (docs/security.md,
docs/semaphores.md, docs/queues.md): a namespace's ``_queues/`` and
``_semaphores/`` live under its prefix ``<root>/<ns>/``, so its tenant role
covers them and nothing of another namespace's.

Real etcd with TLS and auth (``tenants``); the semaphores and queues are made by
``root``, as the operator makes them from JobSemaphore and JobQueue resources."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.errors import PermissionDeniedError
from joblease.keys import ItemRef, KeySpace, QueueRef, SemaphoreRef
from joblease.queue import Queues
from joblease.records import QueueSpec, SemaphoreUse
from joblease.semaphore import Semaphores
from tests.support.etcd_keys import snapshot, writes
from tests.support.secure_etcd import Tenants

SEMAPHORE, QUEUE = "billing-db", "files"
NEEDS_SLOT = JobSpec(lease_duration_seconds=10, max_attempts=3,
                     semaphores=(SemaphoreUse(SEMAPHORE, 1),))
QUEUE_SPEC = QueueSpec(lease_duration_seconds=10, max_attempts=2)


async def _namespace_made_by_root(root: JobLeaseClient, namespace: str) -> JobRef:
    """A semaphore of one slot, a queue of three items and a job that needs the slot."""
    await Semaphores(root).create(SemaphoreRef(namespace, SEMAPHORE), 1)
    queues = Queues(root)
    await queues.create(QueueRef(namespace, QUEUE), QUEUE_SPEC)
    await queues.enqueue(QueueRef(namespace, QUEUE), [(f"item-{n}", {"n": n}) for n in range(3)])
    job = JobRef(namespace, "uses-db")
    await root.register(job, NEEDS_SLOT)
    return job


async def test_a_tenant_claims_slots_and_drains_queues_of_its_namespace_only(
        tenants: Tenants) -> None:
    t = tenants
    async with JobLeaseClient(t.root_config) as root:
        job_a = await _namespace_made_by_root(root, t.ns_a)
        job_b = await _namespace_made_by_root(root, t.ns_b)
        prefix_b = KeySpace(t.root).namespace_prefix(t.ns_b)
        before_b = await snapshot(root.store, prefix_b)

        async with JobLeaseClient(t.config(t.a)) as a:
            sems, queues = Semaphores(a), Queues(a)
            sem_a, queue_a = SemaphoreRef(t.ns_a, SEMAPHORE), QueueRef(t.ns_a, QUEUE)
            # A's job that needs A's semaphore: the claim takes the slot, the
            # completion frees it, both in the tenant's own transactions
            lease = await a.claim(job_a, "worker-a")
            assert [g.to_dict() for g in lease.slots] == [
                {"semaphore": str(sem_a), "slots": [0], "token": lease.token}]
            assert (await sems.status(sem_a)).live == 1
            await lease.complete({"ok": True})
            assert (await sems.status(sem_a)).live == 0

            # A's queue, drained item by item
            drained = []
            while (item := await queues.claim_next(queue_a, "worker-a")) is not None:
                assert isinstance(item.job, ItemRef)
                drained.append(item.job.id)
                await item.complete({"done": item.job.id})
            assert sorted(drained) == ["item-0", "item-1", "item-2"]
            counts = await queues.counts(queue_a)
            assert (counts.total, counts.completed) == (3, 3)

            # B's semaphore, queue and slot-needing job: every call refused by etcd
            sem_b, queue_b = SemaphoreRef(t.ns_b, SEMAPHORE), QueueRef(t.ns_b, QUEUE)
            refused: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
                ("claim B's job that needs B's semaphore", lambda: a.claim(job_b, "intruder")),
                ("read B's semaphore", lambda: sems.status(sem_b)),
                ("raise B's semaphore's limit", lambda: sems.create(sem_b, 100)),
                ("delete B's semaphore", lambda: sems.delete(sem_b)),
                ("claim B's next item", lambda: queues.claim_next(queue_b, "intruder")),
                ("claim B's item by id",
                 lambda: queues.claim(ItemRef(queue_b, "item-0"), "intruder")),
                ("enqueue into B's queue", lambda: queues.enqueue(queue_b, [("z", 1)])),
                ("list B's items", lambda: queues.items(queue_b)),
                ("count B's items", lambda: queues.counts(queue_b)),
                ("retry B's item", lambda: queues.retry(ItemRef(queue_b, "item-0"))),
                ("delete B's queue", lambda: queues.delete(queue_b)),
            ]
            for what, call in refused:
                with pytest.raises(PermissionDeniedError, match="permission denied"):
                    await call()
                    pytest.fail(f"{what}: not refused")

        assert not writes(before_b, await snapshot(root.store, prefix_b))
        b_sems, b_queues = Semaphores(root), Queues(root)
        assert (await b_sems.status(SemaphoreRef(t.ns_b, SEMAPHORE))).live == 0
        b_counts = await b_queues.counts(QueueRef(t.ns_b, QUEUE))
        assert (b_counts.total, b_counts.pending) == (3, 3)
        assert (await root.get(job_b)).holder is None
