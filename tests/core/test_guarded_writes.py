"""Registration and unregistration fenced by a guard (``guard=`` on
``JobLeaseClient.register``/``unregister``): extra compares, here "this key
still has the create revision it had", the way the elected operator fences its
writes by its term. Against the session's real etcd; the unknown outcomes are
put at the exact step with :class:`FaultyStore`.

Each refused write is checked in etcd itself (the keys read back unchanged),
not only by the error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, FencedError, JobLeaseClient, JobRef, JobSpec, OutcomeUnknownError
from joblease.etcd_store import EtcdStore
from joblease.store import Compare, Delete, TxnOp, TxnResult
from tests.support.faulty_store import FaultyStore, is_guarded_register, is_unregister


@pytest.fixture
async def store(etcd_config: EtcdConfig) -> AsyncIterator[EtcdStore]:
    """The test's own connection, to move the guard key and read the job's keys."""
    s = EtcdStore(etcd_config)
    yield s
    await s.close()


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    faulty_store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=faulty_store, read_back_timeout=2) as c:
        yield c, faulty_store
        faulty_store.on_txn = None


def leader_key(config: EtcdConfig) -> bytes:
    return f"/{config.root.strip('/')}\0test/leader".encode()


async def elect(store: EtcdStore, key: bytes, who: bytes) -> tuple[Compare, ...]:
    """Put ``key`` (a new term) and return the guard "it still has this term"."""
    term = await store.put(key, who)
    _, kvs = await store.get(key)
    assert kvs and kvs[0].create_revision == term
    return (Compare(key, "create", "==", term),)


async def spec_kv(store: EtcdStore, client: JobLeaseClient, job: JobRef) -> tuple[int, bytes]:
    _, kvs = await store.get(client.keys.job(job).spec)
    assert kvs, f"{job} is not registered"
    return kvs[0].mod_revision, kvs[0].value


async def test_guarded_register_and_unregister_commit_while_the_guard_holds(
        client: JobLeaseClient, store: EtcdStore, etcd_config: EtcdConfig) -> None:
    guard = await elect(store, leader_key(etcd_config), b"a")
    job = JobRef("default", "guarded-ok")
    first = await client.register(job, JobSpec(10, 3), guard=guard)
    assert (await client.get(job)).spec == JobSpec(10, 3)
    again = await client.register(job, JobSpec(10, 3), guard=guard)  # idempotent: a read
    assert (await spec_kv(store, client, job))[0] == first <= again
    await client.register(job, JobSpec(20, 3), guard=guard)
    assert (await client.get(job)).spec == JobSpec(20, 3)
    await client.unregister(job, guard=guard)
    assert not (await client.get(job)).registered


@pytest.mark.parametrize("how", ["deleted", "replaced"])
async def test_an_old_terms_register_and_unregister_write_nothing_and_raise_fenced(
        client: JobLeaseClient, store: EtcdStore, etcd_config: EtcdConfig, how: str) -> None:
    key = leader_key(etcd_config)
    old = await elect(store, key, b"a")
    job = JobRef("default", f"fenced-{how}")
    await client.register(job, JobSpec(10, 3), guard=old)
    before = await spec_kv(store, client, job)
    if how == "deleted":
        await store.txn([], [Delete(key)])
    else:  # another candidate elected: the key deleted and created again, a new term
        await store.txn([], [Delete(key)])
        new = await elect(store, key, b"b")
        assert new[0].value != old[0].value

    with pytest.raises(FencedError) as refused:
        await client.register(job, JobSpec(99, 1), guard=old)
    assert refused.value.written is False and refused.value.exit_code == 15
    assert refused.value.http_status == 409 and refused.value.reason == "fenced"
    assert await spec_kv(store, client, job) == before, "a fenced register wrote the spec"

    other = JobRef("default", f"fenced-new-{how}")
    with pytest.raises(FencedError):
        await client.register(other, JobSpec(10, 3), guard=old)
    assert not (await client.get(other)).registered, "a fenced register created a job"

    with pytest.raises(FencedError) as refused:
        await client.unregister(job, guard=old)
    assert refused.value.written is False
    assert await spec_kv(store, client, job) == before, "a fenced unregister deleted the job"
    if how == "replaced":
        await client.unregister(job, guard=new)  # the new term's own writes go through
        assert not (await client.get(job)).registered


async def test_guarded_register_whose_answer_was_lost_after_the_term_ended_says_maybe_written(
        faulty: tuple[JobLeaseClient, FaultyStore], store: EtcdStore,
        etcd_config: EtcdConfig) -> None:
    """The register commits while the term holds, its answer is lost, and the term ends
    before the client settles it: the error must not claim that nothing was written."""
    c, fs = faulty
    key = leader_key(etcd_config)
    guard = await elect(store, key, b"a")
    job = JobRef("default", "fenced-unknown-register")
    sent: list[TxnResult] = []

    async def commit_then_lose_the_answer_and_the_term(
            compares: Sequence[Compare], success: Sequence[TxnOp],
            failure: Sequence[TxnOp]) -> TxnResult:
        r = await fs.inner.txn(compares, success, failure)
        if is_guarded_register(success) and not sent:
            sent.append(r)
            await store.txn([], [Delete(key)])
            raise OutcomeUnknownError("test: the register's answer was lost")
        return r

    fs.on_txn = commit_then_lose_the_answer_and_the_term
    with pytest.raises(FencedError) as refused:
        await c.register(job, JobSpec(10, 3), guard=guard)
    assert sent and sent[0].succeeded
    assert refused.value.written is None
    assert "holds this call's value" in str(refused.value)
    assert (await c.get(job)).spec == JobSpec(10, 3)  # the first copy did commit


@pytest.mark.parametrize("first_copy", ["lost", "committed"])
async def test_guarded_unregister_with_an_unknown_outcome_reads_back_the_guard(
        faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient, store: EtcdStore,
        etcd_config: EtcdConfig, first_copy: str) -> None:
    """The unregister's first copy is lost (never reached etcd) or committed (its answer
    lost), and the term ends meanwhile: the read-back finds the guard failed and says
    truthfully whether the delete landed; nothing is deleted after the term ended."""
    c, fs = faulty
    key = leader_key(etcd_config)
    guard = await elect(store, key, b"a")
    job = JobRef("default", f"fenced-unknown-unregister-{first_copy}")
    await client.register(job, JobSpec(10, 3))
    before = await spec_kv(store, client, job)
    sent: list[bool] = []

    async def lose_the_answer_and_the_term(
            compares: Sequence[Compare], success: Sequence[TxnOp],
            failure: Sequence[TxnOp]) -> TxnResult:
        if is_unregister(success) and not sent:
            sent.append(True)
            if first_copy == "committed":
                assert (await fs.inner.txn(compares, success, failure)).succeeded
            await store.txn([], [Delete(key)])
            raise OutcomeUnknownError("test: the unregister's answer was lost")
        return await fs.inner.txn(compares, success, failure)

    fs.on_txn = lose_the_answer_and_the_term
    with pytest.raises(FencedError) as refused:
        await c.unregister(job, guard=guard)
    assert sent
    if first_copy == "lost":
        assert refused.value.written is False
        assert await spec_kv(store, client, job) == before, "deleted after the term ended"
    else:
        assert refused.value.written is None
        assert not (await client.get(job)).registered


async def test_guarded_semaphore_create_and_delete_are_refused_under_a_stale_term(
        client: JobLeaseClient, store: EtcdStore, etcd_config: EtcdConfig) -> None:
    """``Semaphores.create``/``delete`` with ``guard=`` (the operator's JobSemaphore
    handlers): written while the guard holds, refused with nothing written after
    another term took over."""
    from joblease.keys import SemaphoreRef
    from joblease.semaphore import Semaphores
    sems = Semaphores(client)
    ref = SemaphoreRef("default", "guarded-sem")
    spec = sems.keys(ref).spec
    key = leader_key(etcd_config)
    old = await elect(store, key, b"a")
    first = await sems.create(ref, 2, guard=old)
    await sems.create(ref, 2, guard=old)  # idempotent: a read, no new write
    assert (await store.get(spec))[1][0].mod_revision == first
    await sems.create(ref, 3, guard=old)
    assert (await sems.status(ref)).limit == 3
    await store.txn([], [Delete(key)])  # the term ends; another begins
    new = await elect(store, key, b"b")
    before = (await store.get(spec))[1][0]
    with pytest.raises(FencedError) as refused:
        await sems.create(ref, 5, guard=old)
    assert refused.value.written is False
    with pytest.raises(FencedError):
        await sems.delete(ref, guard=old)
    after = (await store.get(spec))[1][0]
    assert (after.value, after.mod_revision) == (before.value, before.mod_revision)
    await sems.delete(ref, guard=new)
    assert (await store.get(sems.client.keys.semaphore(ref).prefix, prefix=True))[1] == []
