"""The seed's worked example, with real worker processes and a real etcd.

Worker A claims generation g and is paused (SIGSTOP) past its TTL; etcd
expires A's lease; B claims generation g+1 with a strictly larger token; A is
resumed (SIGCONT): A's handle reports the loss, A's late completion is
rejected as stale naming B's token, B completes, and the result record is B's.
The job's tenure history then says exactly that: A's tenure (g, A's token)
ended expired with A's refused late completion counted against it, B's
(g+1, B's token) ended completed.
"""

from __future__ import annotations

import time

from joblease import JobLeaseClient, JobRef, JobSpec, Phase
from joblease.records import TenureEnd
from tests.support.waiting import claim_when_free, wait_until
from tests.support.worker_proc import WorkerProc

TTL = 2


async def test_stale_completion_is_rejected_after_reclaim(client: JobLeaseClient) -> None:
    job = JobRef("default", "seed-example")
    await client.register(job, JobSpec(lease_duration_seconds=TTL, max_attempts=5,
                                       history_limit=10))
    a = WorkerProc(client.config, job, "worker-a")
    b: WorkerProc | None = None
    try:
        claimed_a = a.next_event("claimed")
        a.pause()
        paused_at = time.monotonic()

        b = WorkerProc(client.config, job, "worker-b")
        claimed_b = b.next_event("claimed", timeout=TTL + 10)
        # etcd, not A, decided the expiry: B got in only after A's TTL ran out.
        assert time.monotonic() - paused_at >= TTL - 0.5
        assert claimed_b["generation"] == claimed_a["generation"] + 1
        assert claimed_b["token"] > claimed_a["token"]

        a.resume()
        a.send("status")
        status = a.next_event("status")
        assert status["valid"] is False
        assert status["state"] == "lost"

        a.send('complete {"by": "a"}')
        late = a.next_event("completed")
        assert late["ok"] is False
        assert late["error"] == "stale"
        assert late["token"] == claimed_a["token"]
        assert late["currentToken"] == claimed_b["token"]
        assert late["currentOwner"] == "worker-b"

        b.send('complete {"by": "b"}')
        done = b.next_event("completed")
        assert done["ok"] is True and done["token"] == claimed_b["token"]

        state = await client.get(job)
        assert state.phase is Phase.COMPLETED
        assert state.result is not None
        assert state.result.owner == "worker-b"
        assert state.result.generation == claimed_b["generation"]
        assert state.result.token == claimed_b["token"]
        assert state.result.result == {"by": "b"}

        history = await client.history(job)
        assert [(t.generation, t.token, t.owner, t.end) for t in history.tenures] == [
            (claimed_a["generation"], claimed_a["token"], "worker-a", TenureEnd.EXPIRED),
            (claimed_b["generation"], claimed_b["token"], "worker-b", TenureEnd.COMPLETED)]
        tenure_a, tenure_b = history.tenures
        assert tenure_a.refused_completions == 1 and tenure_b.refused_completions == 0
        assert tenure_a.ended_at is None and tenure_b.ended_at is not None
        assert history.revision >= state.result.revision and not history.corrupt
    finally:
        a.stop()
        if b is not None:
            b.stop()


async def test_killed_holder_loses_the_job_within_ttl_plus_one_second(
    client: JobLeaseClient,
) -> None:
    """Expiry: a holder that stops renewing (SIGKILL) loses the job within
    TTL + 1 s of its last renewal, and another worker can claim it."""
    job = JobRef("default", "expiry")
    await client.register(job, JobSpec(lease_duration_seconds=TTL, max_attempts=0))
    a = WorkerProc(client.config, job, "worker-a")
    try:
        a.next_event("claimed")
        a.next_event("renewed")  # at least one keep-alive went out
        a.kill()
        last_renewal = a.last_renewal()
        b = await claim_when_free(client, job, "worker-b", timeout=TTL + 5)
        elapsed = time.monotonic() - last_renewal
        assert elapsed <= TTL + 1.0, f"job was claimable only {elapsed:.2f}s after last renewal"
        assert b.generation == 2
        await b.release()
    finally:
        a.stop()


def test_wait_until_helper_fails_loudly() -> None:
    try:
        wait_until(lambda: False, 0.05, "nothing")
    except AssertionError as e:
        assert "nothing" in str(e)
    else:
        raise AssertionError("wait_until did not fail")
