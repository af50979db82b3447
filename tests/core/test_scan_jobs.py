"""Scanning jobs skips queues and semaphores: ``JobLeaseClient.scan_jobs`` (and so ``list`` and
operator's watch snapshot) reads every job key of a namespace, or of all, at one
revision, and never reads a queue's items, however many (docs/queues.md: a queue
owns ``<ns>/_queues/<queue>/``). Against a real etcd; the store is wrapped only to
count what etcd returned and to compact between two pages."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease import client as client_module
from joblease.keys import QueueRef, SemaphoreRef
from joblease.queue import Queues
from joblease.records import QueueSpec
from joblease.semaphore import Semaphores
from joblease.store import KeyValue, Store


class CountingStore:
    """The real store; counts the keys each ``get`` returned, and can run a hook
    after a ``get`` (to change etcd between two pages of a scan)."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.returned = 0
        self.after_get: Callable[[], Awaitable[None]] | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def get(self, key: bytes, **kw: Any) -> tuple[int, list[KeyValue]]:
        revision, kvs = await self.inner.get(key, **kw)
        self.returned += len(kvs)
        if self.after_get is not None:
            hook, self.after_get = self.after_get, None
            await hook()
        return revision, kvs


ITEMS = 1500  # per queue: several pages of the default page size
JOBS = [JobRef("a", "0-first"), JobRef("a", "zeta"), JobRef("b", "9"), JobRef("b", "alpha"),
        JobRef("c", "only")]


@pytest.fixture
async def populated(client: JobLeaseClient) -> JobLeaseClient:
    for job in JOBS:
        await client.register(job, JobSpec(30, 3))
    queues = Queues(client)
    for ns in ("a", "b"):  # between the jobs named with a digit and those with a letter
        q = QueueRef(ns, "files")
        await queues.create(q, QueueSpec(30))
        await queues.enqueue(q, [(f"i{n}", None) for n in range(ITEMS)])
    # a semaphore (docs/semaphores.md: <ns>/_semaphores/<name>/) is no job either
    await Semaphores(client).create(SemaphoreRef("a", "db"), 2)
    return client


@pytest.mark.parametrize("page", [2, client_module.SCAN_PAGE])
@pytest.mark.parametrize("namespace", [None, "a", "b", "c"])
async def test_a_scan_returns_every_job_key_and_no_queue_key(
        populated: JobLeaseClient, monkeypatch: pytest.MonkeyPatch, page: int,
        namespace: str | None) -> None:
    monkeypatch.setattr(client_module, "SCAN_PAGE", page)
    store = CountingStore(populated.store)
    scanning = JobLeaseClient(populated.config, store=store)
    _, everything = await populated.store.get(
        populated.keys.namespace_prefix(namespace), prefix=True, keys_only=True)
    expected = [kv.key for kv in everything
                if b"/_queues/" not in kv.key and b"/_semaphores/" not in kv.key]
    if namespace != "c":
        assert len(everything) >= len(expected) + 2 * ITEMS  # the queues' items are there
    revision, kvs = await scanning.scan_jobs(namespace, keys_only=True)
    assert [kv.key for kv in kvs] == expected
    # Of each skipped subtree (a's queues and semaphore, b's queues) at most one page
    # is read: then the scan jumps past it.
    assert store.returned <= len(expected) + 3 * page
    assert revision >= max(kv.mod_revision for kv in everything)
    listed = await scanning.list(namespace)
    assert [s.job for s in listed] == [j for j in JOBS if namespace in (None, j.namespace)]
    assert all(s.registered for s in listed)


async def test_a_compaction_between_two_pages_scans_again(
        populated: JobLeaseClient, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(client_module, "SCAN_PAGE", 2)
    store = CountingStore(populated.store)
    scanning = JobLeaseClient(populated.config, store=store)
    late = JobRef("c", "late")

    async def register_and_compact() -> None:
        revision = await populated.register(late, JobSpec(30, 3))
        await populated.store.compact(revision)  # type: ignore[attr-defined]
    store.after_get = register_and_compact
    _, kvs = await scanning.scan_jobs(None, keys_only=True)
    jobs = {populated.keys.parse(kv.key)[0] for kv in kvs}  # type: ignore[index]
    assert jobs == {*JOBS, late}  # the second scan, at a revision after the compaction
