"""Checkpoints are fenced: only the current holder's are stored, and the next
holder reads the last one from its claim (real etcd)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Sequence

import pytest

from joblease import (
    EtcdConfig,
    InvalidInputError,
    JobLeaseClient,
    JobRef,
    JobSpec,
    OutcomeUnknownError,
    Phase,
    StaleTokenError,
)
from joblease.etcd_store import EtcdStore
from joblease.store import Compare, Put, TxnOp, TxnResult
from joblease.validation import MAX_CHECKPOINT_BYTES, MAX_JSON_DEPTH
from tests.support.etcd_keys import snapshot, writes
from tests.support.faulty_store import FaultyStore

TTL = 2


def _nested(depth: int) -> object:
    """A list nested ``depth`` deep around a scalar."""
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


async def _wait_holder_gone(client: JobLeaseClient, job: JobRef, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (await client.get(job)).holder is not None:
        assert time.monotonic() < deadline, f"etcd did not expire the holder of {job}"
        await asyncio.sleep(0.05)


async def test_next_holder_resumes_from_checkpoint_and_stale_checkpoint_is_refused(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "ckpt-resume")
    await client.register(job, JobSpec(lease_duration_seconds=TTL, max_attempts=5))
    async with JobLeaseClient(client.config) as a_client:
        a = await a_client.claim(job, "worker-a")
        assert a.checkpoint_record is None
        written = await a.checkpoint({"offset": 41})
        assert (written.token, written.generation, written.owner) == (a.token, 1, "worker-a")
        again = await a.checkpoint({"offset": 42})
        assert again.revision > written.revision

        # A "pauses": its keep-alive stops (the session stops renewing without
        # revoking, as a SIGSTOPped process would), until etcd expires it.
        assert a._session is not None  # test-only: stop A's renewals in place
        await a._session.close(revoke=False)
        await _wait_holder_gone(client, job, timeout=TTL + 10)

        b = await client.claim(job, "worker-b")
        inherited = b.checkpoint_record
        assert inherited is not None
        assert inherited.data == {"offset": 42}
        assert (inherited.token, inherited.generation) == (a.token, a.generation)
        assert b.generation == a.generation + 1
        await b.checkpoint({"offset": 43})

        keys = client.keys.job(job)
        before = await snapshot(client.store, keys.prefix)
        with pytest.raises(StaleTokenError) as info:
            await a.checkpoint({"offset": 99})  # A resumes late
        assert info.value.current_token == b.token
        assert writes(before, await snapshot(client.store, keys.prefix)) == []

        state = await client.get(job)
        assert state.checkpoint is not None
        assert state.checkpoint.data == {"offset": 43}
        assert state.checkpoint.token == b.token
        assert state.checkpoint.generation == b.generation
        assert state.to_dict()["checkpoint"]["data"] == {"offset": 43}

        await b.complete({"done": True})
        state = await client.get(job)
        assert state.phase is Phase.COMPLETED
        assert state.checkpoint is not None and state.checkpoint.data == {"offset": 43}
        with pytest.raises(StaleTokenError):
            await b.checkpoint({"offset": 44})  # completed: no holder any more


async def test_bad_checkpoints_are_refused_and_write_nothing(client: JobLeaseClient) -> None:
    job = JobRef("default", "ckpt-bad")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await client.claim(job, "w")
    keys = client.keys.job(job)
    before = await snapshot(client.store, keys.prefix)
    with pytest.raises(InvalidInputError, match="too large"):
        await lease.checkpoint("x" * MAX_CHECKPOINT_BYTES)
    with pytest.raises(InvalidInputError, match="not JSON-serializable"):
        await lease.checkpoint({"when": object()})
    with pytest.raises(InvalidInputError, match="not JSON-serializable"):
        await lease.checkpoint(float("nan"))
    with pytest.raises(StaleTokenError):
        wrong = await client.lease_for(job, "w", lease.token + 1000)
        await wrong.checkpoint({"x": 1})
    with pytest.raises(StaleTokenError):
        other = await client.lease_for(job, "someone-else", lease.token)
        await other.checkpoint({"x": 1})
    assert writes(before, await snapshot(client.store, keys.prefix)) == []
    assert (await client.get(job)).checkpoint is None
    await lease.release()


async def test_a_second_handle_of_the_same_claim_can_checkpoint(client: JobLeaseClient) -> None:
    """``lease_for`` (the CLI's handle) and the claimer's handle both write:
    last writer wins, neither is mistaken for stale."""
    job = JobRef("default", "ckpt-two-handles")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await client.claim(job, "w")
    await lease.checkpoint(1)
    other = await client.lease_for(job, "w", lease.token)
    assert other.checkpoint_record is not None and other.checkpoint_record.data == 1
    await other.checkpoint(2)
    assert (await lease.checkpoint(3)).data == 3
    state = await client.get(job)
    assert state.checkpoint is not None and state.checkpoint.data == 3
    await lease.release()


async def test_corrupt_checkpoint_makes_the_job_corrupt_not_a_crash(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "ckpt-corrupt")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    await client.store.txn([], [Put(client.keys.job(job).checkpoint, b'{"owner": 5}')], [])
    state = await client.get(job)
    assert state.phase is Phase.CORRUPT and state.checkpoint is None
    assert state.corrupt is not None and "checkpoint" in state.corrupt


@pytest.mark.parametrize("data", [
    "\ud800", ["fine", {"k": "\udc00x"}], {"\ud83d": 1},
    _nested(MAX_JSON_DEPTH + 1),
], ids=["lone-high", "lone-low-nested", "lone-in-key", "depth-65"])
async def test_a_checkpoint_outside_the_stored_value_rule_is_refused_and_writes_nothing(
    client: JobLeaseClient, data: object,
) -> None:
    """docs/protocol.md#stored-values: refused before anything is sent, the
    holder keeps the job and a valid checkpoint still lands."""
    job = JobRef("default", "ckpt-rule")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await client.claim(job, "w")
    keys = client.keys.job(job)
    before = await snapshot(client.store, keys.prefix)
    refused = r"lone UTF-16 surrogate|nested deeper than 64"
    with pytest.raises(InvalidInputError, match=refused) as e:
        await lease.checkpoint(data)
    assert e.value.exit_code == 2 and e.value.http_status == 400
    assert writes(before, await snapshot(client.store, keys.prefix)) == []
    assert (await lease.checkpoint("\U0001f680")).data == "\U0001f680"  # a valid pair is fine
    await lease.release()


async def test_a_stored_lone_surrogate_checkpoint_is_corrupt_and_the_next_holder_still_works(
    client: JobLeaseClient,
) -> None:
    """Issue 24, item 7: a checkpoint holding an escaped lone surrogate (stored
    past the writers, e.g. by an older sidecar) made every reader answering
    in UTF-8 fail. Now it reads as a corrupt record with its reason: the job is
    Corrupt, its state is answerable as UTF-8, the next holder claims, sees
    ``{"corrupt": why}`` for the checkpoint, and its own checkpoint replaces it."""
    job = JobRef("default", "ckpt-surrogate")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    bad = (b'{"checkpointedAt":1.0,"claimId":"c0","data":{"note":"\\ud800"},'
           b'"generation":1,"owner":"old","token":3}')
    await client.store.txn([], [Put(client.keys.job(job).checkpoint, bad)], [])
    state = await client.get(job)
    assert state.phase is Phase.CORRUPT and state.checkpoint is None
    assert state.corrupt is not None and "checkpoint" in state.corrupt
    assert "lone UTF-16 surrogate" in state.corrupt
    json.dumps(state.to_dict(), ensure_ascii=False).encode("utf-8")
    lease = await client.claim(job, "next")
    view = lease.checkpoint_dict()
    assert view is not None and "lone UTF-16 surrogate" in view["corrupt"]
    json.dumps(lease.to_dict(), ensure_ascii=False).encode("utf-8")
    await lease.checkpoint({"note": "clean"})
    state = await client.get(job)
    assert state.phase is Phase.CLAIMED and state.checkpoint is not None
    assert state.checkpoint.data == {"note": "clean"}
    await lease.release()


async def test_unregister_deletes_the_checkpoint(client: JobLeaseClient) -> None:
    job = JobRef("default", "ckpt-unregister")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await client.claim(job, "w")
    await lease.checkpoint({"step": 1})
    await client.unregister(job)
    _, kvs = await client.store.get(client.keys.job(job).checkpoint)
    assert kvs == []


# -- unknown outcomes (faults at one exact step; every forwarded request is real) ------------


@pytest.fixture
async def faulty(etcd_config: EtcdConfig) -> AsyncIterator[tuple[JobLeaseClient, FaultyStore]]:
    store = FaultyStore(EtcdStore(etcd_config))
    async with JobLeaseClient(etcd_config, store=store) as c:
        yield c, store
        store.on_txn = None


def _is_checkpoint(success: Sequence[TxnOp]) -> bool:
    return any(isinstance(op, Put) and op.key.endswith(b"/checkpoint") for op in success)


async def test_checkpoint_whose_reply_was_lost_is_confirmed_by_reading_back(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    c, store = faulty
    job = JobRef("default", "ckpt-lost-reply")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await c.claim(job, "w")
    sent: list[int] = []

    async def commit_then_lose(compares: Sequence[Compare], success: Sequence[TxnOp],
                               failure: Sequence[TxnOp]) -> TxnResult:
        r = await store.inner.txn(compares, success, failure)
        if _is_checkpoint(success):
            sent.append(r.revision)
            store.on_txn = None
            raise OutcomeUnknownError("injected: checkpoint reply lost after commit")
        return r

    store.on_txn = commit_then_lose
    record = await lease.checkpoint({"step": 1})
    assert sent and record.revision == sent[0] and record.data == {"step": 1}
    _, kvs = await client.store.get(client.keys.job(job).checkpoint)
    assert kvs[0].version == 1, "the checkpoint was written more than once"
    await lease.release()


async def test_late_copy_of_an_older_checkpoint_cannot_overwrite_a_newer_one(
    faulty: tuple[JobLeaseClient, FaultyStore], client: JobLeaseClient,
) -> None:
    """The first copy is held back (outcome unknown), the resend commits, a newer
    checkpoint commits, then the held copy arrives: its compare on the
    checkpoint's mod revision fails, and the newer checkpoint stands."""
    c, store = faulty
    job = JobRef("default", "ckpt-late-copy")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await c.claim(job, "w")
    held: list[tuple[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]]] = []

    async def hold_first(compares: Sequence[Compare], success: Sequence[TxnOp],
                         failure: Sequence[TxnOp]) -> TxnResult:
        if _is_checkpoint(success) and not held:
            held.append((compares, success, failure))
            raise OutcomeUnknownError("injected: checkpoint in flight, outcome unknown")
        return await store.inner.txn(compares, success, failure)

    store.on_txn = hold_first
    first = await lease.checkpoint({"step": 1})
    store.on_txn = None
    assert first.data == {"step": 1} and held
    await lease.checkpoint({"step": 2})
    late = await store.inner.txn(*held[0])  # the held copy lands now
    assert not late.succeeded
    state = await client.get(job)
    assert state.checkpoint is not None and state.checkpoint.data == {"step": 2}
    await lease.release()
