"""The tenure history (docs/protocol.md, "Tenure history") on a real etcd.

Each claim's transaction writes its tenure; completion, release and checkpoint
transactions write theirs; retention keeps the last ``historyLimit``; an
unknown claim outcome leaves exactly one tenure per committed claim, told
truthfully once settled. Faults are injected with :class:`FaultyStore` (a
real etcd behind it; only the lost answer is fake).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, StaleTokenError
from joblease.errors import InvalidInputError, OutcomeUnknownError
from joblease.etcd_store import EtcdStore
from joblease.history import recent_tenures
from joblease.records import TenureEnd
from joblease.store import Compare, Put, TxnOp, TxnResult
from tests.support.faulty_store import FaultyStore, delay_the_first_claim_until_the_revoke, is_claim


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        yield c, store
        store.on_txn = None
        store.on_revoke = None


async def _history_keys(client: JobLeaseClient, job: JobRef) -> list[tuple[bytes, int]]:
    """Every key of the job's history with its size (key + value bytes)."""
    prefix = client.keys.job(job).history.prefix
    _, kvs = await client.store.get(prefix, prefix=True)
    return [(kv.key[len(prefix):], len(kv.key) + len(kv.value)) for kv in kvs]


async def test_completion_release_and_checkpoints_end_and_count_their_tenures(
    client: JobLeaseClient, etcd_config: EtcdConfig,
) -> None:
    job = JobRef("default", "history-ends")
    await client.register(job, JobSpec(10, 0, history_limit=5))
    first = await client.claim(job, "worker-a")
    for n in range(3):
        await first.checkpoint({"n": n})
    await first.release()
    second = await client.claim(job, "worker-b")
    # completed from another process's handle (the CLI's `complete` beside a sidecar)
    async with JobLeaseClient(etcd_config) as other:
        adopted = await other.lease_for(job, "worker-b", second.token)
        await adopted.complete({"ok": True})
    history = await client.history(job)
    assert [(t.generation, t.token, t.owner, t.claim_id, t.end, t.checkpoints)
            for t in history.tenures] == [
        (1, first.token, "worker-a", first.claim_id, TenureEnd.RELEASED, 3),
        (2, second.token, "worker-b", second.claim_id, TenureEnd.COMPLETED, 0)]
    assert history.history_limit == 5 and history.registered
    assert all(t.ended_at is not None and t.claimed_at > 0 for t in history.tenures)


async def test_a_live_holder_reads_open_and_a_job_without_history_has_none(
    client: JobLeaseClient,
) -> None:
    job, plain = JobRef("default", "history-open"), JobRef("default", "history-off")
    await client.register(job, JobSpec(10, 0, history_limit=2))
    await client.register(plain, JobSpec(10, 0))
    lease = await client.claim(job, "w")
    other = await client.claim(plain, "w")
    [tenure] = (await client.history(job)).tenures
    assert tenure.end is TenureEnd.OPEN and tenure.token == lease.token
    assert (await client.history(plain)).tenures == ()
    assert await _history_keys(client, plain) == []
    missing = await client.history(JobRef("default", "never-registered"))
    assert not missing.registered and missing.tenures == ()
    await lease.release()
    await other.release()


async def test_only_the_last_n_tenures_are_kept_and_the_keys_are_bounded(
    client: JobLeaseClient,
) -> None:
    limit = 4
    job = JobRef("default", "history-retention")
    await client.register(job, JobSpec(10, 0, history_limit=limit))
    counts: list[int] = []
    sizes: list[int] = []
    for _ in range(limit + 10):
        lease = await client.claim(job, "w")
        await lease.checkpoint({"p": 1})
        await lease.release()
        keys = await _history_keys(client, job)
        counts.append(len(keys))
        sizes.append(sum(size for _, size in keys))
    history = await client.history(job)
    assert [t.generation for t in history.tenures] == list(range(11, limit + 11))
    keys = await _history_keys(client, job)
    assert len(keys) == 3 * limit  # tenure, end, checkpoints
    # once the limit is reached the history stops growing (the bytes vary only
    # with the digits of the informational wall-clock times)
    assert counts[limit - 1:] == [3 * limit] * 11
    assert max(sizes[limit:]) - sizes[limit - 1] < 3 * limit * 4
    # a lowered limit is applied by the next claim, backlog and all
    await client.register(job, JobSpec(10, 0, history_limit=1))
    lease = await client.claim(job, "w")
    assert [t.generation for t in (await client.history(job)).tenures] == [limit + 11]
    assert len(await _history_keys(client, job)) == 1
    await lease.release()


async def test_a_claim_with_a_stale_generation_still_records_its_own_tenure(
    client: JobLeaseClient, etcd_config: EtcdConfig,
) -> None:
    """A client that last saw generation 1 claims after three other claims: the
    compare refuses its guess, the failure branch corrects it, the claim commits
    as generation 5 with tenure 5 (no tenure is overwritten or skipped)."""
    job = JobRef("default", "history-guess")
    await client.register(job, JobSpec(10, 0, history_limit=10))
    async with JobLeaseClient(etcd_config) as late:
        held = await late.claim(job, "late")  # caches the spec and generation 1
        await held.release()
        for _ in range(3):
            await (await client.claim(job, "w")).release()
        lease = await late.claim(job, "late")
        assert lease.generation == 5
        tenures = (await client.history(job)).tenures
        assert [t.generation for t in tenures] == [1, 2, 3, 4, 5]
        assert tenures[-1].token == lease.token and tenures[-1].end is TenureEnd.OPEN
        await lease.release()


async def test_unregister_deletes_the_history_and_a_new_registration_starts_afresh(
    client: JobLeaseClient, etcd_config: EtcdConfig,
) -> None:
    """History goes with its registration; a stale completer of the old one
    cannot record its refusal into the new registration's tenure of the same
    generation (the record is guarded by the tenure's create revision)."""
    job = JobRef("default", "history-reregistered")
    await client.register(job, JobSpec(10, 0, history_limit=3))
    async with JobLeaseClient(etcd_config) as old_client:
        old = await old_client.claim(job, "old")
        await client.unregister(job)
        assert await _history_keys(client, job) == []
        await client.register(job, JobSpec(10, 0, history_limit=3))
        new = await client.claim(job, "new")
        assert new.generation == old.generation == 1
        with pytest.raises(StaleTokenError):
            await old.complete("late")
    [tenure] = (await client.history(job)).tenures
    assert (tenure.token, tenure.owner, tenure.refused_completions) == (new.token, "new", 0)
    await new.release()


async def test_an_ambiguous_claim_leaves_one_tenure_per_committed_claim(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """The claim commits and its answer is lost: read back, it is ours; the
    history has exactly one open tenure, with that token."""
    c, store = faulty
    job = JobRef("default", "history-ambiguous")
    await client.register(job, JobSpec(10, 0, history_limit=5))
    lost: list[TxnResult] = []

    async def commit_then_lose_answer(compares: Sequence[Compare], success: Sequence[TxnOp],
                                      failure: Sequence[TxnOp]) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if is_claim(success) and not lost:
            lost.append(r)
            raise OutcomeUnknownError("test: the claim's answer was lost")
        return r

    store.on_txn = commit_then_lose_answer
    lease = await c.claim(job, "w")
    store.on_txn = None
    assert lost and lease.token == lost[0].revision
    [tenure] = (await client.history(job)).tenures
    assert (tenure.generation, tenure.token, tenure.end) == (1, lease.token, TenureEnd.OPEN)
    await lease.complete(None)
    [tenure] = (await client.history(job)).tenures
    assert tenure.end is TenureEnd.COMPLETED


async def test_a_claim_revoked_while_settling_reads_revoked_and_the_retry_is_the_open_one(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """A delayed copy of the claim commits just before the revoke that settles
    its unknown outcome: its tenure says ``revoked`` (not expired), the fresh
    claim's tenure is the only open one, and no token has two tenures."""
    c, store = faulty
    job = JobRef("default", "history-revoked")
    await client.register(job, JobSpec(30, 3, history_limit=5))
    delayed = delay_the_first_claim_until_the_revoke(store)
    lease = await c.claim(job, "w")
    landed: TxnResult = delayed["landed"]
    assert landed.succeeded and lease.generation == 2
    tenures = (await client.history(job)).tenures
    assert [(t.generation, t.token, t.end) for t in tenures] == [
        (1, landed.revision, TenureEnd.REVOKED), (2, lease.token, TenureEnd.OPEN)]
    assert len({t.token for t in tenures}) == len(tenures)
    # the revoked tenure's end was written once, by a create-only transaction
    _, [end] = await client.store.get(client.keys.job(job).history.end(1))
    assert end.version == 1
    await lease.release()


async def test_a_corrupt_tenure_is_named_and_the_others_still_read(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "history-corrupt")
    await client.register(job, JobSpec(10, 0, history_limit=5))
    await (await client.claim(job, "w")).release()
    lease = await client.claim(job, "w")
    await client.store.txn([], [Put(client.keys.job(job).history.tenure(1), b"[1]")])
    history = await client.history(job)
    assert [t.generation for t in history.tenures] == [2]
    assert [g for g, _ in history.corrupt] == [1] and "tenure" in history.corrupt[0][1]
    await lease.release()


async def test_a_history_limit_out_of_range_is_refused_and_changes_nothing(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "history-bad-limit")
    for bad in (-1, 1001, True):
        with pytest.raises(InvalidInputError, match="historyLimit"):
            await client.register(job, JobSpec(10, 0, history_limit=bad))  # type: ignore[arg-type]
    assert not (await client.get(job)).registered


async def test_the_recent_tenures_are_the_historys_last_ones_read_at_the_states_revision(
    client: JobLeaseClient,
) -> None:
    """``recent_tenures`` (the operator's short form) is the tail of what
    ``history`` says, read at the state's revision: a later change (a refusal, a
    newer claim) does not show in a read at an older state, and the read touches
    only the newest generations' keys."""
    job = JobRef("default", "history-recent")
    await client.register(job, JobSpec(10, 0, history_limit=10))
    keys = client.keys.job(job)
    for _ in range(4):
        lease = await client.claim(job, "w")
        await lease.checkpoint({"p": 1})
        await lease.release()
    held = await client.claim(job, "last")
    at_claim = await client.get(job)
    tenures, corrupt = await recent_tenures(client.store, keys, at_claim, 3)
    assert corrupt == ()
    assert tenures == (await client.history(job)).tenures[-3:]
    assert [(t.generation, t.end) for t in tenures] == [
        (3, TenureEnd.RELEASED), (4, TenureEnd.RELEASED), (5, TenureEnd.OPEN)]
    await held.release()
    with pytest.raises(StaleTokenError):
        await client.complete_for(job, "last", held.token)
    again, _ = await recent_tenures(client.store, keys, at_claim, 3)
    assert again == tenures  # as of the claim's revision: open, nothing refused yet
    now, _ = await recent_tenures(client.store, keys, await client.get(job), 3)
    assert (now[-1].end, now[-1].refused_completions) == (TenureEnd.RELEASED, 1)
    assert await recent_tenures(client.store, keys, await client.get(job), 0) == ((), ())


async def test_a_watch_with_history_reports_a_change_of_the_history_alone(
    client: JobLeaseClient,
) -> None:
    """A refused completion writes only to the history, outside the job's
    prefix: ``watch(history=True)`` reports the job at that revision, with
    ``history_revision`` set; a plain watch reports nothing for it."""
    job = JobRef("default", "history-watched")
    await client.register(job, JobSpec(10, 0, history_limit=3))
    first = await client.claim(job, "a")
    await first.release()
    lease = await client.claim(job, "b")
    await lease.complete(None)
    with_history, plain = client.watch("default", history=True), client.watch("default")
    try:
        for states in (with_history, plain):  # the snapshots: up to the completion
            while (await anext(states)).job != job:
                pass
        with pytest.raises(StaleTokenError):
            await client.complete_for(job, "a", first.token)  # counted against a's tenure
        assert (await client.history(job)).tenures[0].refused_completions == 1
        state = await asyncio.wait_for(anext(with_history), 10)
        assert state.job == job and state.history_revision == state.revision > 0
        assert state.result is not None and state.result.token == lease.token
        marker = JobRef("default", "history-watched-marker")
        await client.register(marker, JobSpec(10, 0))
        following = await asyncio.wait_for(anext(plain), 10)
        assert following.job == marker  # the history change came before, unreported
    finally:
        await with_history.aclose()
        await plain.aclose()
