"""Queue creation and deletion fenced by a guard (``guard=`` on ``Queues.create`` /
``Queues.delete``), the way the elected operator fences its JobQueue writes by
its term. Against the session's real etcd; each refused write is checked in
etcd itself (the queue's keys read back unchanged), not only by the error."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig, FencedError, JobLeaseClient
from joblease.errors import QueueNotFoundError
from joblease.etcd_store import EtcdStore
from joblease.keys import QueueRef
from joblease.queue import Queues
from joblease.records import QueueSpec
from joblease.store import Compare, Delete
from tests.support.etcd_keys import snapshot


@pytest.fixture
async def store(etcd_config: EtcdConfig) -> AsyncIterator[EtcdStore]:
    """The test's own connection, to move the guard key and read the queue's keys."""
    s = EtcdStore(etcd_config)
    yield s
    await s.close()


def leader_key(config: EtcdConfig) -> bytes:
    return f"/{config.root.strip('/')}\0test/queue-leader".encode()


async def elect(store: EtcdStore, key: bytes, who: bytes) -> tuple[Compare, ...]:
    """Put ``key`` (a new term) and return the guard "it still has this term"."""
    term = await store.put(key, who)
    return (Compare(key, "create", "==", term),)


async def test_guarded_create_and_delete_commit_while_the_guard_holds(
        client: JobLeaseClient, store: EtcdStore, etcd_config: EtcdConfig) -> None:
    queues = Queues(client)
    guard = await elect(store, leader_key(etcd_config), b"a")
    q = QueueRef("default", "guarded-ok")
    first = await queues.create(q, QueueSpec(10, 3, shards=3), guard=guard)
    assert (await queues.spec(q, refresh=True))[1] == QueueSpec(10, 3, shards=3)
    assert (await queues.counts(q)).pending == 3  # the shards were enqueued
    again = await queues.create(q, QueueSpec(10, 3, shards=3), guard=guard)  # a read
    assert (await queues.spec(q, refresh=True))[0] == first <= again
    await queues.create(q, QueueSpec(10, 3, suspend=True, shards=3), guard=guard)
    assert (await queues.spec(q, refresh=True))[1].suspend is True
    await queues.delete(q, guard=guard)
    assert await snapshot(store, queues.keys(q).prefix) == {}
    with pytest.raises(QueueNotFoundError):
        await queues.delete(q, guard=guard)


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_an_old_terms_create_and_delete_write_nothing_and_raise_fenced(
        client: JobLeaseClient, store: EtcdStore, etcd_config: EtcdConfig, how: str) -> None:
    queues = Queues(client)
    key = leader_key(etcd_config)
    old = await elect(store, key, b"a")
    q = QueueRef("default", f"fenced-{how}")
    await queues.create(q, QueueSpec(10, 3), guard=old)
    await queues.enqueue(q, [("x", 1)])
    before = await snapshot(store, queues.keys(q).prefix)
    if how == "deleted":
        await store.txn([], [Delete(key)])
    else:
        await store.txn([], [Delete(key)])
        await elect(store, key, b"b")
    with pytest.raises(FencedError) as err:
        await queues.create(q, QueueSpec(20, 3, shards=5), guard=old)
    assert err.value.exit_code == 15 and "nothing of it was written" in str(err.value)
    with pytest.raises(FencedError):
        await queues.delete(q, guard=old)
    assert await snapshot(store, queues.keys(q).prefix) == before  # neither wrote anything
    await store.txn([], [Delete(key)])
    current = await elect(store, key, b"c")  # the term now in office may delete it
    await queues.delete(q, guard=current)
    assert await snapshot(store, queues.keys(q).prefix) == {}
