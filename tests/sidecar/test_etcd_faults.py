"""etcd faults under a sidecar process: a lost answer is read back, a completion
answered 503 is retried to the committed record, an unreachable etcd ends the lease
by the local deadline.

The sidecar's only etcd endpoint is a TCP proxy (tests/support/sidecar_proxy.py)
that loses answers or requests on purpose, then cuts the connections so the
sidecar's client reconnects; etcd, the sidecar and the worker it would signal
are real. Only the network is faulted (the retired Python sidecar's in-process
tests faulted its client at exact steps; these judge the same guarantees from
outside, invariant `read-back`).
"""

from __future__ import annotations

import asyncio
import shutil
import signal
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from joblease import JobLeaseClient
from tests.support.sidecar_process import WORKER_PY, Env, Proc
from tests.support.sidecar_proxy import SeverableProxy
from tests.support.waiting import claim_when_free, poll


@pytest.fixture
async def proxy(env: Env) -> AsyncIterator[SeverableProxy]:
    p = await SeverableProxy.to(env.etcd_config.endpoints[0])
    yield p
    await p.close()


def _worker(env: Env) -> tuple[Proc, dict[str, str]]:
    """A stand-in worker process the sidecar would SIGTERM on a loss."""
    sleep = shutil.which("sleep")
    assert sleep is not None
    worker = env.spawn("worker", [sleep, "300"])
    pid_file = env.tmp / "worker.pid"
    pid_file.write_text(f"{worker.pid}\n")
    return worker, {"JOBLEASE_SIDECAR_ON_LOSS": "signal",
                    "JOBLEASE_WORKER_PID_FILE": str(pid_file)}


async def test_a_completion_whose_answer_is_lost_is_read_back_not_taken_for_loss(
        env: Env, client: JobLeaseClient, proxy: SeverableProxy) -> None:
    """The completion commits in etcd but its answer never reaches the sidecar. The
    worker must get 200 with the committed record (at once, or on its documented
    retry after a 503), never ``409``, and the lease ending under the sidecar
    (holder gone: the completion deleted it) is not a loss: no SIGTERM."""
    await env.register(client, ttl=10)  # the local deadline stays far away
    worker, extra = _worker(env)
    sidecar = env.sidecar("a", JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint, **extra)
    lease = await (await sidecar.started()).held()
    body = {"token": lease["token"], "result": {"n": 1}}

    proxy.mode = "drop_responses"
    first = asyncio.create_task(sidecar.request("POST", "/v1/complete", json=body, timeout=120))

    async def committed() -> Any:
        return (await client.get(env.job)).result
    stored = await poll(committed, 30, "the completion to commit in etcd")
    assert stored.token == lease["token"]
    await proxy.sever()  # etcd is reachable again, on new connections

    answers = []
    r = await first
    answers.append(r.status_code)
    deadline = time.monotonic() + 90
    while r.status_code == 503 and time.monotonic() < deadline:
        r = await sidecar.request("POST", "/v1/complete", json=body, timeout=120)
        answers.append(r.status_code)
    assert r.status_code == 200, (answers, r.text)
    assert set(answers) <= {200, 503}, answers
    record = r.json()
    assert record["token"] == lease["token"] and record["result"] == {"n": 1}
    assert (record["claimId"], record["revision"]) == (stored.claim_id, stored.revision)

    view = await sidecar.lease()
    assert view["status"] == 409 and view["error"] == "completed", view
    assert not sidecar.token_file.exists()
    metrics = await sidecar.metrics()
    assert metrics["joblease_sidecar_losses_total"] == 0
    assert metrics["joblease_sidecar_completions_total"] == 1
    assert worker.returncode() is None, "the sidecar took its own completion for a loss"
    assert not sidecar.logged("lease lost")
    final = await client.get(env.job)
    assert final.result == stored and final.holder is None


async def test_retry_of_a_completion_answered_503_returns_the_committed_result(
        env: Env, client: JobLeaseClient, proxy: SeverableProxy) -> None:
    """The completion commits, then etcd stays unreachable: its answer is lost and the
    read-back fails, so the worker gets 503 and (as documented) retries. Once etcd is
    back the retry answers 200 with the committed record, never ``409 stale`` naming
    the worker's own token; and the lease's end meanwhile is not a loss."""
    await env.register(client, ttl=10)
    worker, extra = _worker(env)
    sidecar = env.sidecar("a", JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint, **extra)
    lease = await (await sidecar.started()).held()
    body = {"token": lease["token"], "result": {"n": 1}}

    proxy.mode = "drop_responses"  # etcd hears everything, the sidecar hears nothing
    first = await sidecar.request("POST", "/v1/complete", json=body, timeout=120)
    assert first.status_code == 503, first.text
    assert first.json()["error"] and first.json()["message"]
    stored = (await client.get(env.job)).result
    assert stored is not None and stored.token == lease["token"]  # it did commit
    assert not sidecar.token_file.exists()  # no token handed out while undecided

    await proxy.sever()  # etcd is back (the sidecar's client reconnects: 503s meanwhile)
    answers = []
    deadline = time.monotonic() + 90
    while True:
        retry = await sidecar.request("POST", "/v1/complete", json=body, timeout=120)
        answers.append(retry.status_code)
        if retry.status_code != 503 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)  # the worker's retry pace, not a synchronisation
    assert retry.status_code == 200, (answers, retry.text)
    record = retry.json()
    assert record["token"] == lease["token"] and record["result"] == {"n": 1}
    assert (record["claimId"], record["revision"]) == (stored.claim_id, stored.revision)
    assert (await sidecar.lease())["error"] == "completed"
    assert worker.returncode() is None, "the sidecar took its own completion for a loss"
    assert not sidecar.logged("lease lost")


async def test_example_worker_retries_a_completion_whose_outcome_is_unknown(
        env: Env, client: JobLeaseClient, proxy: SeverableProxy) -> None:
    """examples/workers/worker.py follows the documented contract: a completion that
    gets a 503 (or no answer) is retried with the same request, and ends with 200."""
    await env.register(client, ttl=10)
    sidecar = env.sidecar("a", JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint)
    await (await sidecar.started()).held()
    proxy.mode = "drop_responses"
    worker = env.spawn_with("worker", [sys.executable, str(WORKER_PY)], {
        "JOBLEASE_SIDECAR_URL": sidecar.url, "JOBLEASE_TOKEN_FILE": str(sidecar.token_file),
        "JOBLEASE_WAIT_SECONDS": "30"})
    await poll(lambda: "complete_retry" in worker.output(), 120, "the worker to retry")
    assert (await client.get(env.job)).result is not None  # committed meanwhile
    await proxy.sever()  # etcd is back
    assert await worker.wait_exit(120) == 0, worker.output()
    assert '"status": 200' in worker.output().splitlines()[-1]
    state = await client.get(env.job)
    assert state.result is not None and state.result.result["items"] == 3


async def test_etcd_unreachable_ends_the_lease_before_anyone_else_can_claim(
        env: Env, client: JobLeaseClient, proxy: SeverableProxy) -> None:
    """Nothing the sidecar sends reaches etcd any more. Its HTTP API keeps answering
    at once; by its local deadline (TTL - margin after the last keep-alive was
    sent) it stops handing out the token, removes the token files and signals
    the worker: strictly before etcd expires the holder and another claimer
    gets the job. When etcd is back, the old token's completion is refused and
    nothing is written: loss is final."""
    ttl = 3
    await env.register(client, ttl=ttl)
    worker, extra = _worker(env)
    sidecar = env.sidecar("a", JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint, **extra)
    lease = await (await sidecar.started()).held()

    # when the last GET /v1/lease that got a 200 was *sent*: the sidecar answered
    # after that, so a send time after the competitor's claim proves a violation
    # however slow the machine (a receive time would not)
    last_vouched = 0.0
    slowest = 0.0
    watching = asyncio.Event()  # the watcher saw a 200 before the cut

    async def watch() -> None:
        nonlocal last_vouched, slowest
        async with httpx.AsyncClient(base_url=sidecar.url, timeout=5) as http:
            while True:
                t = time.monotonic()
                r = await http.get("/v1/lease")
                slowest = max(slowest, time.monotonic() - t)
                if r.status_code == 200 and r.json().get("token") == lease["token"]:
                    last_vouched = t
                    watching.set()
                await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch())
    try:
        await asyncio.wait_for(watching.wait(), 30)
        proxy.mode = "drop_requests"
        cut = time.monotonic()
        other = await claim_when_free(client, env.job, "other-pod", timeout=60)
        claimed = time.monotonic()
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)

    assert other.token > lease["token"]
    assert last_vouched < claimed, "the sidecar vouched for a token etcd had expired"
    assert last_vouched - cut <= ttl, f"still vouching {last_vouched - cut:.2f}s after the cut"
    # answered from local state, never waiting on etcd (the client waits 5 s per request)
    assert slowest < 3, f"GET /v1/lease took {slowest:.2f}s while etcd was unreachable"
    view = await sidecar.lease()
    assert view["status"] == 409 and view["error"] == "lost", view
    assert "token" not in view
    assert not sidecar.token_file.exists() and not (sidecar.workdir / "token.json").exists()
    assert await sidecar.status("/readyz") == 503
    await poll(lambda: worker.returncode() is not None, 15, "the worker to be signalled")
    assert worker.returncode() == -signal.SIGTERM

    await proxy.sever()  # etcd is back
    r = await sidecar.request("POST", "/v1/complete",
                              json={"token": lease["token"], "result": {"late": True}})
    assert r.status_code == 409, r.text
    assert r.json()["error"] in ("lost", "stale"), r.json()
    state = await client.get(env.job)
    assert state.result is None
    # the sidecar claimed nothing again (on a loaded machine the test's own claim may
    # have expired meanwhile: then nobody holds the job)
    assert state.holder is None or state.holder.token == other.token, state.holder
    assert state.generation == other.generation
    assert (await sidecar.lease())["error"] == "lost"  # etcd being back changes nothing
    assert (await sidecar.metrics())["joblease_sidecar_losses_total"] == 1
    if other.valid:
        await other.release()


async def test_a_release_on_sigterm_whose_answer_is_lost_is_read_back(
        env: Env, client: JobLeaseClient, proxy: SeverableProxy) -> None:
    """SIGTERM releases the job; the release commits but its answer is lost. The sidecar
    reads back, finds the holder gone by its own release, and exits 0 with the token
    files removed: not a loss (the worker is not signalled) and not an error."""
    await env.register(client, ttl=10)
    worker, extra = _worker(env)
    sidecar = env.sidecar("a", JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint, **extra)
    lease = await (await sidecar.started()).held()

    proxy.mode = "drop_responses"
    sidecar.signal(signal.SIGTERM)

    async def released() -> bool:
        return (await client.get(env.job)).holder is None
    await poll(released, 30, "the release to commit in etcd")
    await proxy.sever()
    assert await sidecar.wait_exit(60) == 0, sidecar.output()
    assert not sidecar.token_file.exists() and not (sidecar.workdir / "token.json").exists()
    assert worker.returncode() is None, "the sidecar took its own release for a loss"
    assert not sidecar.logged("lease lost")
    again = await client.claim(env.job, "next-pod")  # free at once, not after the TTL
    assert again.token > lease["token"] and again.generation == lease["generation"] + 1
    await again.release()
