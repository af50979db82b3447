"""The edges of a held lease: unconfirmed releases, late keep-alives, the
local deadline, revoked etcd leases, bad margins and corrupt stored records.

Real etcd throughout; faults are injected between the client and etcd by
``tests/support/faulty_store.py`` (a wrapped store) or ``tests/support/proxy.py``
(a proxy that slows answers).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest

from joblease import (
    EtcdConfig,
    InvalidInputError,
    JobLeaseClient,
    JobRef,
    JobSpec,
    LeaseLostError,
    OutcomeUnknownError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.etcd_store import EtcdStore
from joblease.lease import LeaseState
from joblease.session import Session, default_margin
from joblease.store import Compare, Delete, Get, KeepAlive, Put, TxnOp
from tests.support.faulty_store import FaultyStore
from tests.support.proxy import DelayingProxy
from tests.support.waiting import claim_when_free


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store) as c:
        yield c, store


async def job_keys(client: JobLeaseClient, job: JobRef) -> list[tuple[bytes, int]]:
    _, kvs = await client.store.get(client.keys.job(job).prefix, prefix=True)
    return [(kv.key, kv.mod_revision) for kv in kvs]


# -- release ---------------------------------------------------------------------------------


async def test_release_that_cannot_be_confirmed_raises_and_the_job_stays_held(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Issue 20 §2.4: three release copies with unknown outcomes, each read back
    as "still ours", must not be reported as released."""
    c, store = faulty
    job = JobRef("default", "release-unknown")
    await client.register(job, JobSpec(10, 0))
    lease = await c.claim(job, "worker-a")
    holder_key = c.keys.job(job).holder
    lost_answers = 0

    async def lose_release_answers(compares: Sequence[Compare], success: Sequence[TxnOp],
                                   failure: Sequence[TxnOp]) -> None:
        nonlocal lost_answers
        if list(success) == [Delete(holder_key)]:
            lost_answers += 1
            raise OutcomeUnknownError("injected: the release's answer was lost")

    store.before_txn = lose_release_answers
    with pytest.raises(OutcomeUnknownError, match="could not be confirmed"):
        await lease.release()
    assert lost_answers == 3
    state = await client.get(job)
    assert state.holder is not None and state.holder.claim_id == lease.claim_id
    assert lease.state is LeaseState.HELD and lease.valid, "the handle must still say held"

    store.before_txn = None
    await lease.release()  # asking again is safe and now confirmed
    assert lease.state is LeaseState.RELEASED
    assert (await client.get(job)).holder is None


async def test_completion_whose_read_back_fails_too_says_outcome_unknown(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """"etcd unavailable" promises nothing was written; after a completion was
    sent, only "outcome unknown" is true, and it is said once the client's
    ``read_back_timeout`` (here 0.5 s, not the 30 s default) has passed."""
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, read_back_timeout=0.5) as c:
        await _complete_with_etcd_gone(c, store, client)


async def _complete_with_etcd_gone(c: JobLeaseClient, store: FaultyStore,
                                   client: JobLeaseClient) -> None:
    job = JobRef("default", "complete-unknown")
    await client.register(job, JobSpec(10, 0))
    lease = await c.claim(job, "worker-a")

    async def etcd_gone(compares: Sequence[Compare], success: Sequence[TxnOp],
                        failure: Sequence[TxnOp]) -> None:
        if any(not isinstance(op, Get) for op in success):
            raise OutcomeUnknownError("injected: the completion's answer was lost")
        raise StoreUnavailableError("injected: etcd unreachable")

    store.before_txn = etcd_gone
    began = time.monotonic()
    with pytest.raises(OutcomeUnknownError):
        await lease.complete({"n": 1})
    assert time.monotonic() - began < 10, "the client's read_back_timeout must bound it"
    store.before_txn = None
    assert (await lease.complete({"n": 1})).claim_id == lease.claim_id


# -- the local safety deadline ---------------------------------------------------------------


async def test_a_lost_lease_never_becomes_valid_again_and_its_job_is_given_back(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """Issue 20 §2.7: a keep-alive sent just before the deadline and answered
    just after it must not revive the lease, and the etcd lease it renewed must
    not keep the job held for nobody."""
    c, store = faulty
    job = JobRef("default", "late-keep-alive")
    await client.register(job, JobSpec(5, 0))
    lease = await c.claim(job, "worker-a")
    interval = lease.ttl / 3
    deadline: list[float] = []
    calls = 0

    async def late_answer(stream: KeepAlive, timeout: float) -> int:
        nonlocal calls
        calls += 1
        if calls == 1:
            # Fail late, so that the next keep-alive goes out 60 ms before the deadline.
            deadline.append(time.monotonic() + lease.remaining())
            await asyncio.sleep(max(0.0, deadline[0] - 0.06 - interval - time.monotonic()))
            raise StoreUnavailableError("injected: keep-alive failed")
        if calls == 2:
            try:
                async with asyncio.timeout(timeout):  # the session's own timeout holds
                    ttl = await stream.renew(timeout)  # etcd renews the lease in time...
                    # ...but the answer arrives 20 ms after the local deadline
                    await asyncio.sleep(max(0.0, deadline[0] + 0.02 - time.monotonic()))
                    return ttl
            except TimeoutError:
                raise StoreUnavailableError("keep-alive timed out") from None
        return await stream.renew(timeout)

    store.renew_hook = late_answer
    seen: list[bool] = []

    async def watch_validity() -> None:
        while True:
            seen.append(lease.valid)
            await asyncio.sleep(0.002)

    watcher = asyncio.create_task(watch_validity())
    try:
        async with asyncio.timeout(15):
            while not deadline or time.monotonic() < deadline[0] + 0.2:
                await asyncio.sleep(0.01)
    finally:
        watcher.cancel()
    # (On a badly overloaded machine the session may wake up only after the
    # deadline and send nothing: then it is simply lost, and what follows holds.)
    assert not lease.valid and lease.state is LeaseState.LOST
    assert False in seen
    assert True not in seen[seen.index(False):], "the lease became valid again"
    # etcd had renewed the lease for 5 s at the last keep-alive; the lost
    # session revokes it, so the job is free long before that.
    async with asyncio.timeout(3):
        while (await client.get(job)).holder is not None:
            await asyncio.sleep(0.02)
    other = await claim_when_free(client, job, "worker-b", timeout=1)
    assert other.token > lease.token


async def test_safety_deadline_counts_from_the_keep_alive_send_not_its_answer(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """Every answer from etcd arrives 0.5 s late (a slow way back); the local
    deadline must never be later than send time + TTL - margin."""
    host, port = etcd_config.endpoints[0].split(":")
    proxy = await DelayingProxy(host, int(port), delay=0.5).start()
    store = FaultyStore(EtcdStore(etcd_config.with_(endpoints=(proxy.endpoint,))))
    job = JobRef("default", "slow-answers")
    await client.register(job, JobSpec(6, 0))
    margin = default_margin(6)
    try:
        async with JobLeaseClient(etcd_config, store=store) as c:
            lease = await c.claim(job, "worker-a")
            checked = 0
            async with asyncio.timeout(30):
                while checked < 2:
                    renewed = [r for r in store.sent_renewals if r[2] > 0]
                    if len(renewed) > checked:
                        checked = len(renewed)
                        sends = [s + ttl for s, ttl in store.grants]
                        sends += [s + ttl for s, _, ttl in renewed]
                        local_deadline = time.monotonic() + lease.remaining()
                        assert lease.valid
                        assert local_deadline <= max(sends) - margin + 0.005, (
                            "the deadline counts from the answer, not the send")
                    await asyncio.sleep(0.01)
            assert all(answered - sent >= 0.45 for sent, answered, _ in store.sent_renewals)
    finally:
        await proxy.close()


async def test_lease_is_invalid_once_its_deadline_passes_even_if_the_keep_alive_never_ran(
    client: JobLeaseClient,
) -> None:
    """The event loop is blocked past the TTL: no keep-alive task runs, yet the
    handle must already say it may not act (the sidecar's ``current()`` relies on it)."""
    job = JobRef("default", "blocked-loop")
    await client.register(job, JobSpec(2, 0))
    lease = await client.claim(job, "worker-a")
    assert lease.valid
    time.sleep(lease.remaining() + 0.1)  # blocks the loop on purpose: nothing else runs
    assert not lease.valid
    assert lease.remaining() == 0
    with pytest.raises(LeaseLostError):
        lease.ensure_valid()
    await asyncio.sleep(0.2)  # let the keep-alive task run now: it must not revive it
    assert not lease.valid


async def test_keep_alive_answered_with_no_ttl_ends_the_session_at_once(
    etcd_config: EtcdConfig, client: JobLeaseClient,
) -> None:
    """Another client revokes our etcd lease; etcd answers the next keep-alive
    with TTL 0, which ends the session then, not at the local deadline."""
    store = FaultyStore(EtcdStore(etcd_config))
    session = await Session(store, 6).start()
    try:
        deadline = time.monotonic() + session.remaining()
        await client.store.revoke(session.lease_id)
        reason = await asyncio.wait_for(session.wait_lost(), timeout=session.remaining() + 2)
        lost_at = time.monotonic()
        assert store.sent_renewals and store.sent_renewals[-1][2] <= 0
        assert lost_at < deadline - 1, "the session lived on until its local deadline"
        assert "expired" in reason and not session.alive
    finally:
        await session.close()
        await store.close()


# -- bad margins -----------------------------------------------------------------------------


@pytest.mark.parametrize("margin", [-0.5, 10, 12.5, float("nan"), float("inf"), True, "1"])
async def test_invalid_margin_is_refused_before_anything_is_written(
    etcd_config: EtcdConfig, client: JobLeaseClient, margin: Any,
) -> None:
    job = JobRef("default", "bad-margin")
    await client.register(job, JobSpec(10, 0))
    before = await job_keys(client, job)
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store, margin=margin) as c:
        with pytest.raises(InvalidInputError, match="margin"):
            await c.claim(job, "worker-a")
    assert store.grants == [], "an etcd lease was granted"
    assert await job_keys(client, job) == before
    with pytest.raises(InvalidInputError, match="margin"):
        Session(client.store, 10, margin=margin)


# -- corrupt stored records on the lease paths -----------------------------------------------


async def test_a_corrupt_holder_value_ends_that_lease_but_not_the_keep_alive(
    client: JobLeaseClient,
) -> None:
    """A tenant overwrites its holder key with a wrong-shaped value: that lease
    is lost with a reason, completion is refused as stale, and the session keeps
    renewing the other jobs it holds."""
    bad, good = JobRef("default", "corrupt-holder"), JobRef("default", "neighbour")
    for job in (bad, good):
        await client.register(job, JobSpec(6, 0))
    lease = await client.claim(bad, "worker-a")
    neighbour = await client.claim(good, "worker-a")
    await client.store.put(client.keys.job(bad).holder, b'{"owner": 5}',  # type: ignore[attr-defined]
                           lease=lease.lease_id)
    assert await asyncio.wait_for(lease.wait_done(), 10) is LeaseState.LOST
    assert lease.lost_reason is not None and "cannot be decoded" in lease.lost_reason
    with pytest.raises(StaleTokenError, match="cannot be decoded"):
        await lease.complete("late")
    for _ in range(2):  # two more keep-alives (and holder checks) succeed
        renewed = neighbour.last_renewal
        async with asyncio.timeout(10):
            while neighbour.last_renewal == renewed:
                await asyncio.sleep(0.02)
    assert neighbour.valid


async def test_completion_over_a_corrupt_result_is_refused_as_stale(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "corrupt-result")
    await client.register(job, JobSpec(10, 0))
    lease = await client.claim(job, "worker-a")
    keys = client.keys.job(job)
    await client.store.txn([], [Put(keys.result, b"{not json"), Delete(keys.holder)])
    with pytest.raises(StaleTokenError, match="cannot be decoded") as info:
        await lease.complete({"n": 1})
    assert info.value.current_token is None
    with pytest.raises(StaleTokenError, match="cannot be decoded"):
        await lease.release()
