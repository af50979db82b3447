"""A completion ends the lease: the sidecar must not take its own completion for a loss.

Real etcd, the real sidecar runner serving real HTTP, a real worker process
to signal; faults are injected around the store (see ``tests/support/faulty_store.py``
and ``tests/support/sidecar.py``).

Python only: the faults sit at exact steps inside the Python client (a reply
lost after this one transaction committed, held until a keep-alive re-check
ran), and the assertions read ``SidecarRunner.phase``, neither of which a
process of another implementation has. The guarantees that matter for every
implementation (a completion whose answer is lost is read back and answered
with the committed record, never taken for a loss; etcd unreachable past the
local deadline) are checked through a TCP proxy, per implementation, in
``tests/sidecar/test_etcd_faults.py``.
"""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path

import pytest

from joblease import JobLeaseClient, JobSpec
from joblease.sidecar.state import Phase
from tests.support.sidecar import FileEvents, sidecar_in_process
from tests.support.sidecar_process import WORKER_PY, Env, Proc
from tests.waiting import poll

pytestmark = pytest.mark.python_sidecar_only(
    reason="faults injected inside the Python client; reads SidecarRunner state")


def _worker(env: Env) -> tuple[Proc, dict[str, object]]:
    sleep = shutil.which("sleep")
    assert sleep is not None
    worker = env.spawn("worker", [sleep, "300"])
    pid_file = env.tmp / "worker.pid"
    pid_file.write_text(f"{worker.pid}\n")
    return worker, {"on_loss": "signal", "worker_pid_file": pid_file}


def _no_loss(caplog: pytest.LogCaptureFixture) -> None:
    losses = [r.getMessage() for r in caplog.records if r.getMessage() == "lease lost"]
    assert losses == [], "the sidecar declared its own completion a loss"
    assert not any("SIGTERM" in r.getMessage() for r in caplog.records)


async def test_completion_slower_than_a_keepalive_period_is_not_taken_for_loss(
        env: Env, client: JobLeaseClient, caplog: pytest.LogCaptureFixture) -> None:
    """The completion commits (deleting the holder) but its reply is slower than a
    keep-alive period: the keep-alive's holder re-check sees the holder gone. That
    is our completion, not a loss: no SIGTERM, and the completion answers 200."""
    caplog.set_level("INFO", logger="joblease")
    await client.register(env.job, JobSpec(lease_duration_seconds=3))
    worker, extra = _worker(env)
    async with sidecar_in_process(env.etcd_config, env.job, env.tmp / "a", **extra) as sc:
        lease = await sc.held()
        sc.store.hold_completion_reply = asyncio.Event()
        complete = asyncio.create_task(
            sc.request("POST", "/v1/complete", json={"token": lease["token"], "result": 1}))
        await asyncio.wait_for(sc.store.recheck_after_commit.wait(), 20)
        # The lease has ended: no token is handed out while the result decides.
        view = await sc.lease()
        assert view["status"] == 409 and "token" not in view
        assert not sc.token_file.exists()
        sc.store.hold_completion_reply.set()
        r = await asyncio.wait_for(complete, 30)
        assert r.status_code == 200, r.text
        assert r.json()["token"] == lease["token"]
        assert sc.runner.phase is Phase.COMPLETED
        assert (await sc.lease())["error"] == "completed"
        metrics = (await sc.request("GET", "/metrics")).text
        assert "joblease_sidecar_losses_total 0.0" in metrics
        _no_loss(caplog)
        assert worker.returncode() is None
    state = await client.get(env.job)
    assert state.result is not None and state.result.token == lease["token"]


async def test_retry_of_a_completion_answered_503_returns_the_committed_result(
        env: Env, client: JobLeaseClient, caplog: pytest.LogCaptureFixture) -> None:
    """The completion commits, then etcd becomes unreachable: its reply is lost and
    the read-back fails, so the worker gets 503 and (as documented) retries. The
    retry must answer 200 with the committed record, not ``409 stale`` naming the
    worker's own token; and the lease's end meanwhile is not a loss."""
    caplog.set_level("INFO", logger="joblease")
    await client.register(env.job, JobSpec(lease_duration_seconds=2))
    worker, extra = _worker(env)
    async with sidecar_in_process(env.etcd_config, env.job, env.tmp / "a", **extra) as sc:
        lease = await sc.held()
        sc.store.lose_completion_reply = True
        r = await sc.request("POST", "/v1/complete", json={"token": lease["token"],
                                                           "result": {"n": 1}})
        assert r.status_code == 503, r.text
        assert sc.store.completion_committed.is_set()
        assert not sc.token_file.exists()
        sc.store.lose_completion_reply = False
        sc.store.unreachable = False  # etcd is back
        retry = await sc.request("POST", "/v1/complete", json={"token": lease["token"],
                                                               "result": {"n": 1}})
        assert retry.status_code == 200, retry.text
        record = retry.json()
        assert record["token"] == lease["token"] and record["result"] == {"n": 1}
        stored = (await client.get(env.job)).result
        assert stored is not None
        assert (record["claimId"], record["revision"]) == (stored.claim_id, stored.revision)
        await poll(lambda: sc.runner.phase is Phase.COMPLETED, 10, "the sidecar to settle")
        _no_loss(caplog)
        assert worker.returncode() is None


async def test_token_files_are_never_published_after_the_deadline(
        env: Env, client: JobLeaseClient, tmp_path: Path) -> None:
    """A claim whose reply arrives after the lease's safety deadline (no keep-alive got
    through meanwhile): the sidecar must not write the token files even for an instant."""
    workdir = tmp_path / "late"
    workdir.mkdir()
    events = FileEvents(workdir)
    try:
        async with sidecar_in_process(env.etcd_config, env.job, workdir) as sc:
            sc.store.claim_reply_after_deadline = True
            await client.register(env.job, JobSpec(lease_duration_seconds=2))
            await poll(lambda: sc.runner.phase is not Phase.CLAIMING, 30, "the claim to end")
            assert sc.runner.phase is Phase.LOST
            view = await sc.lease()
            assert view["status"] == 409 and view["error"] == "lost"
            appeared = events.read()
            assert "token" not in appeared and "token.json" not in appeared, appeared
    finally:
        events.close()


async def test_release_slower_than_a_keepalive_period_is_not_taken_for_loss(
        env: Env, client: JobLeaseClient, caplog: pytest.LogCaptureFixture) -> None:
    """The same race for a release: the re-check sees the holder our release deleted.
    The worker asked to give the job up: it is not signalled, and the release is 200."""
    caplog.set_level("INFO", logger="joblease")
    await client.register(env.job, JobSpec(lease_duration_seconds=3))
    worker, extra = _worker(env)
    async with sidecar_in_process(env.etcd_config, env.job, env.tmp / "a", **extra) as sc:
        lease = await sc.held()
        sc.store.hold_release_reply = asyncio.Event()
        release = asyncio.create_task(
            sc.request("POST", "/v1/release", json={"token": lease["token"]}))
        await asyncio.wait_for(sc.store.recheck_after_commit.wait(), 20)
        view = await sc.lease()
        assert view["status"] == 409 and "token" not in view
        sc.store.hold_release_reply.set()
        r = await asyncio.wait_for(release, 30)
        assert r.status_code == 200, r.text
        assert r.json() == {"state": "released", "token": lease["token"]}
        assert sc.runner.phase is Phase.RELEASED
        _no_loss(caplog)
        assert worker.returncode() is None
    assert (await client.get(env.job)).holder is None


async def test_a_claim_whose_lease_vanished_before_its_answer_is_claimed_again(
        env: Env, client: JobLeaseClient) -> None:
    """An ambiguous claim that committed but whose etcd lease was already gone: nobody
    holds the job, so the sidecar claims again rather than exiting as if it had lost
    a lease it held."""
    async with sidecar_in_process(env.etcd_config, env.job, env.tmp / "a") as sc:
        sc.store.claim_lease_gone_before_reply = True
        await client.register(env.job, JobSpec(lease_duration_seconds=3))
        lease = await sc.held()
        assert lease["generation"] == 2  # the first attempt committed and is counted
        assert not sc.task.done()
    state = await client.get(env.job)
    assert state.generation == 2


async def test_example_worker_retries_a_completion_whose_outcome_is_unknown(
        env: Env, client: JobLeaseClient) -> None:
    """examples/workers/worker.py follows the documented contract: a completion that
    gets no answer or a 503 is retried with the same request, and ends with 200."""
    await client.register(env.job, JobSpec(lease_duration_seconds=2))
    async with sidecar_in_process(env.etcd_config, env.job, env.tmp / "a") as sc:
        await sc.held()
        sc.store.lose_completion_reply = True
        worker = env.spawn_with("worker", [sys.executable, str(WORKER_PY)], {
            "JOBLEASE_SIDECAR_URL": sc.url, "JOBLEASE_TOKEN_FILE": str(sc.token_file),
            "JOBLEASE_WAIT_SECONDS": "30"})
        await poll(lambda: "complete_retry" in worker.output(), 90, "the worker to retry")
        assert sc.store.completion_committed.is_set()
        sc.store.lose_completion_reply = False
        sc.store.unreachable = False  # etcd is back
        assert await worker.wait_exit(90) == 0, worker.output()
        assert '"status": 200' in worker.output().splitlines()[-1]
    state = await client.get(env.job)
    assert state.result is not None and state.result.result["items"] == 3
