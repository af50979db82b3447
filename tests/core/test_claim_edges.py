"""Claims, unregisters and sessions at the edges: unknown outcomes, late copies,
slow keep-alive answers, long-lived clients.

Each test puts a fault at one exact step with :class:`FaultyStore` (a real
etcd behind a wrapper that can lose an answer, hold a request back and let
it land later, fail reads or revokes, or hold a keep-alive answer) and
checks the guarantee named in its title: a truthful answer, and nothing left
behind that nobody owns.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from joblease import (
    AttemptsExhaustedError,
    EtcdConfig,
    HeldError,
    JobLeaseClient,
    JobRef,
    JobSpec,
    OutcomeUnknownError,
    Phase,
    StoreUnavailableError,
)
from joblease.errors import ClaimOutcomeUnknownError, ClaimRevokedError
from joblease.etcd_store import EtcdStore
from joblease.store import Compare, TxnOp, TxnResult
from tests.support.faulty_store import (
    FaultyStore,
    delay_the_first_claim_until_the_revoke,
    is_claim,
    is_unregister,
)
from tests.support.waiting import poll


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        yield c, store
        store.fail_reads = store.fail_revokes = False
        store.on_txn = None
        store.on_revoke = None
        store.reply_gate = None


# -- unregister -----------------------------------------------------------------------------


async def test_unregister_resent_after_an_unknown_outcome_never_erases_a_newer_registration(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 1: the first copy commits, its answer is lost, and before the client
    settles it the job is registered, claimed and completed again. The new job
    and its result must survive (a blind re-send of the prefix delete erased them)."""
    c, store = faulty
    job = JobRef("default", "reincarnated")
    await client.register(job, JobSpec(10, 3))
    newer: dict[str, Any] = {}

    async def first_copy_commits_then_job_is_reborn(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if not is_unregister(success) or newer:
            return await store.inner.txn(compares, success, failure)
        r = await store.inner.txn(compares, success, failure)
        assert r.succeeded
        await client.register(job, JobSpec(10, 3))
        lease = await client.claim(job, "worker-b")
        newer["record"] = await lease.complete({"n": 2})
        raise OutcomeUnknownError("test: the unregister's answer was lost")

    store.on_txn = first_copy_commits_then_job_is_reborn
    await c.unregister(job)
    state = await client.get(job)
    assert state.registered, "the re-sent unregister deleted a newer registration"
    assert state.result is not None and state.result == newer["record"]
    assert state.phase is Phase.COMPLETED


async def test_unregister_whose_request_was_lost_is_sent_again_and_deletes_the_job(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    c, store = faulty
    job = JobRef("default", "lost-unregister")
    await client.register(job, JobSpec(10, 3))
    lease = await client.claim(job, "worker-a")
    lost: list[bool] = []

    async def lose_the_first_request(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if is_unregister(success) and not lost:
            lost.append(True)
            raise OutcomeUnknownError("test: the request never reached etcd")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = lose_the_first_request
    await c.unregister(job)
    assert lost
    state = await client.get(job)
    assert not state.registered and state.holder is None and state.generation == 0
    await poll(lambda: not lease.valid, 10, "the holder to learn it lost the job", interval=0.01)


# -- ambiguous claims -----------------------------------------------------------------------


async def test_ambiguous_claim_whose_read_back_fails_says_outcome_unknown_and_leaves_no_holder(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 3: the claim commits, its answer is lost and etcd cannot be read.
    The client must not say "nothing was written", and the committed holder
    must not stay bound to a session that is renewed forever."""
    c, store = faulty
    job = JobRef("default", "ghost")
    await client.register(job, JobSpec(30, 3))

    async def commit_then_lose_answer_and_reads(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if is_claim(success):
            store.fail_reads = True
            raise OutcomeUnknownError("test: the claim's answer was lost")
        return r

    store.on_txn = commit_then_lose_answer_and_reads
    with pytest.raises(OutcomeUnknownError) as info:
        await c.claim(job, "worker-a")
    exc = info.value
    assert isinstance(exc, ClaimOutcomeUnknownError), f"not an outcome-unknown answer: {exc!r}"
    assert exc.reason == "unknown" and exc.exit_code == 11 and exc.http_status == 503
    assert exc.lease_revoked
    store.fail_reads = False
    state = await client.get(job)
    assert state.generation == 1, "the claim did commit"
    assert state.holder is None, "a holder nobody knows of is still bound to a live lease"


async def test_ambiguous_claim_whose_revoke_fails_too_stops_renewing_so_etcd_expires_it(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 3, etcd unreachable for the revoke as well: the session's lease is
    no longer renewed, so etcd expires the committed holder within its TTL."""
    c, store = faulty
    job = JobRef("default", "ghost-unrevoked")
    ttl = 3
    await client.register(job, JobSpec(ttl, 3))

    async def commit_then_fail_reads_and_revokes(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if is_claim(success):
            store.fail_reads = store.fail_revokes = True
            raise OutcomeUnknownError("test: the claim's answer was lost")
        return r

    store.on_txn = commit_then_fail_reads_and_revokes
    with pytest.raises(ClaimOutcomeUnknownError) as info:
        await c.claim(job, "worker-a")
    assert not info.value.lease_revoked and info.value.ttl == ttl
    assert "expires within" in str(info.value)
    store.fail_reads = store.fail_revokes = False
    assert (await client.get(job)).holder is not None, "the claim committed"
    await poll(lambda: _free(client, job), ttl + 5,
               "etcd to expire the holder of the unsettled claim", interval=0.01)


async def _free(client: JobLeaseClient, job: JobRef) -> bool:
    return (await client.get(job)).holder is None


async def test_ambiguous_claim_whose_read_back_finds_another_workers_holder_is_refused(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Mutation survivor: read-back must adopt only a holder carrying our claim id;
    another worker's holder means HeldError naming that worker and its token."""
    c, store = faulty
    job = JobRef("default", "someone-else")
    await client.register(job, JobSpec(30, 5))
    other: dict[str, Any] = {}

    async def another_worker_claims_first(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if is_claim(success) and not other:
            other["lease"] = await client.claim(job, "worker-b")
            raise OutcomeUnknownError("test: our request was lost on the way")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = another_worker_claims_first
    with pytest.raises(HeldError) as info:
        await c.claim(job, "worker-a")
    b = other["lease"]
    assert info.value.owner == "worker-b" and info.value.token == b.token
    state = await client.get(job)
    assert state.holder is not None and state.holder.claim_id == b.claim_id
    assert state.generation == 1, "our lost request must not have committed later"
    assert b.valid
    await b.release()


async def test_claim_copy_committing_between_read_back_and_revoke_is_reported_truthfully(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 9: with maxAttempts 1, a delayed copy of our claim commits after
    the read-back saw nothing and before the revoke ends it. The job is now out
    of attempts although nobody ever held it; the claim must say exactly that
    (our own claim, its token), not an anonymous "attempts exhausted"."""
    c, store = faulty
    job = JobRef("default", "late-copy")
    await client.register(job, JobSpec(30, 1))
    delayed = delay_the_first_claim_until_the_revoke(store)
    with pytest.raises(AttemptsExhaustedError) as info:
        await c.claim(job, "worker-a")
    landed: TxnResult = delayed["landed"]
    assert landed.succeeded, "the delayed copy did commit"
    exc = info.value
    assert isinstance(exc, ClaimRevokedError), f"the attempt was used silently: {exc!r}"
    assert exc.token == landed.revision and exc.generation == 1 and exc.max_attempts == 1
    assert "own claim" in str(exc)
    state = await client.get(job)
    assert state.holder is None and state.generation == 1 and state.phase is Phase.FAILED


async def test_claim_copy_committing_before_the_revoke_is_followed_by_a_fresh_claim(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Defect 9 with attempts left: the revoked copy's attempt is counted and
    logged, and the client claims again under a new lease."""
    caplog.set_level("INFO", logger="joblease")
    c, store = faulty
    job = JobRef("default", "late-copy-retry")
    await client.register(job, JobSpec(30, 3))
    delayed = delay_the_first_claim_until_the_revoke(store)
    lease = await c.claim(job, "worker-a")
    assert delayed["landed"].succeeded
    assert lease.generation == 2 and lease.token > delayed["landed"].revision
    assert "that attempt is used" in caplog.text
    state = await client.get(job)
    assert state.holder is not None and state.holder.claim_id == lease.claim_id
    await lease.release()


async def test_claim_that_never_settles_names_the_attempts_its_revoked_copies_used(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Every copy lands just before its revoke: the claim gives up, and its error
    does not claim that nothing was written; it names each used attempt."""
    c, store = faulty
    job = JobRef("default", "never-settles")
    await client.register(job, JobSpec(30, 0))
    pending: list[tuple[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]]] = []
    landed: list[TxnResult] = []
    one_at_a_time = asyncio.Lock()

    async def hold_every_claim_back(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if is_claim(success):
            pending.append((compares, success, failure))
            raise OutcomeUnknownError("test: sent; the copy is still on its way")
        return await store.inner.txn(compares, success, failure)

    async def copy_lands_just_before_the_revoke(lease_id: int) -> None:
        async with one_at_a_time:
            while pending:
                landed.append(await store.inner.txn(*pending.pop()))
            await store.inner.revoke(lease_id)

    store.on_txn = hold_every_claim_back
    store.on_revoke = copy_lands_just_before_the_revoke
    with pytest.raises(StoreUnavailableError) as info:
        await c.claim(job, "worker-a")
    assert len(landed) == 4 and all(r.succeeded for r in landed)
    tokens = ", ".join(str(r.revision) for r in landed)
    assert f"claims with tokens {tokens} committed" in str(info.value)
    assert "each used an attempt" in str(info.value)
    state = await client.get(job)
    assert state.holder is None and state.generation == 4


async def test_claim_cancelled_in_flight_leaves_no_holder_renewed(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Cancelling a claim whose transaction committed but whose answer never came
    must not leave a holder that no handle knows of, renewed by the session."""
    c, store = faulty
    job = JobRef("default", "cancelled")
    await client.register(job, JobSpec(30, 3))
    committed = asyncio.Event()

    async def commit_and_never_answer(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if is_claim(success):
            committed.set()
            await asyncio.Event().wait()
        return r

    store.on_txn = commit_and_never_answer
    task = asyncio.create_task(c.claim(job, "worker-a"))
    await asyncio.wait_for(committed.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await poll(lambda: _free(client, job), 5,
               "the cancelled claim's holder to be revoked (TTL is 30 s)", interval=0.01)


# -- sessions -------------------------------------------------------------------------------


async def test_claim_during_a_slow_keep_alive_answer_does_not_revoke_jobs_held_on_that_ttl(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """Defect 10: a claim made while the session's keep-alive answer is on its
    way (under 0.5 s of local safety left) gets a new session; the old one, and
    every job it holds, lives on to its own deadline and is renewed by that
    answer. (TTL 2, margin 0.8: the renew's timeout ends at the deadline, so the
    answer can be held through the whole last half second.)"""
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, margin=0.8) as c:
        held_job, new_job = JobRef("default", "held-on-ttl-2"), JobRef("default", "new-on-ttl-2")
        await client.register(held_job, JobSpec(2, 0))
        await client.register(new_job, JobSpec(2, 0))
        a = await c.claim(held_job, "worker-a")
        blocker = await client.claim(new_job, "warm-up")  # c caches new_job's spec
        with pytest.raises(HeldError):
            await c.claim(new_job, "worker-a")
        await blocker.release()
        session = a._session
        assert session is not None

        gate = asyncio.Event()
        store.reply_gate = gate
        await poll(lambda: store.reply_held.is_set() and session.alive
                   and session.remaining() < 0.5, 10,
                   "a keep-alive answer held while under 0.5 s of safety is left",
                   interval=0.002)
        claiming = asyncio.create_task(c.claim(new_job, "worker-a"))
        await asyncio.sleep(0)  # the claim has chosen its session
        store.reply_gate = None
        gate.set()
        b = await claiming

        assert a.lost_reason is None, f"the held job was lost: {a.lost_reason}"
        assert b.lease_id != a.lease_id, "the new claim used the nearly expired session"
        await poll(lambda: a.remaining() > 0.5, 5, "the held answer to renew the session",
                   interval=0.01)
        state = await client.get(held_job)
        assert state.holder is not None and state.holder.token == a.token
        assert a.lease_id not in store.revoked
        await a.release()
        await b.release()


async def test_long_lived_client_keeps_a_bounded_spec_cache_and_few_sessions(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Defect 16: a client that claims many jobs of many TTLs keeps at most
    ``_spec_cache_size`` specs and closes (revokes) sessions with no holders
    beyond ``sessions.idle_sessions``; a session with a holder stays. The sizes are
    shrunk so the bound shows with few jobs; open sessions are counted as etcd
    leases granted and not revoked."""
    c, store = faulty
    c._spec_cache_size = 3
    c.sessions.idle_sessions = 2
    keep = JobRef("default", "kept")
    await client.register(keep, JobSpec(20, 0))
    kept = await c.claim(keep, "worker-a")
    for i, ttl in enumerate(range(2, 10)):
        job = JobRef("default", f"churn-{i}")
        await client.register(job, JobSpec(ttl, 0))
        lease = await c.claim(job, "worker-a")
        await lease.complete({"i": i})
        assert len(c._specs) <= 3
    assert kept.valid and kept.lease_id not in store.revoked
    # open: the kept one, the last one used and at most two idle ones
    await poll(lambda: len(set(store.granted) - set(store.revoked)) <= 4, 5,
               "sessions without holders to be closed", interval=0.01)
    assert await _all_revoked(store, store.revoked), "closed sessions are still known to etcd"
    assert (await client.get(keep)).holder is not None
    await kept.release()


async def _all_revoked(store: FaultyStore, leases: list[int]) -> bool:
    return all([await store.inner.time_to_live(lease) <= 0 for lease in leases])
