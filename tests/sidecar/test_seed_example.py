"""The seed example through two sidecars, and a holder killed outright.

A holds (TTL 2 s) and is paused with SIGSTOP past its TTL; B claims with a
larger token and generation + 1; A resumes (SIGCONT) and must report the loss
at once (409, not ready, token file gone) and refuse its worker's completion
as stale, while B's worker completes. The job keeps a tenure history, which
the sidecars write as the library does: A's tenure expired with its refused
completion counted, B's completed.
"""

from __future__ import annotations

import json
import signal
import time

from joblease import JobLeaseClient
from joblease.records import TenureEnd
from tests.support.etcd_keys import snapshot, writes
from tests.support.sidecar_process import Env
from tests.support.waiting import poll


async def test_paused_sidecar_loses_and_refuses_stale_completion(
        registered: Env, client: JobLeaseClient) -> None:
    env = registered
    await env.register(client, history_limit=10)  # before any sidecar reads the spec
    a = await env.sidecar("a").started()
    lease_a = await a.held()
    hold = env.tmp / "a-may-complete"
    worker_a = env.worker(a, "worker-a", JOBLEASE_EXAMPLE_HOLD_FILE=str(hold))
    # A's worker has read A's token and is "working"
    await poll(lambda: '"event": "work"' in worker_a.output(), 30, "worker A to start work")

    b = await env.sidecar("b").started()
    a.signal(signal.SIGSTOP)
    paused_at = time.monotonic()
    lease_b = await b.held(timeout=15)
    assert time.monotonic() - paused_at > 1.5  # only after A's TTL ran out in etcd
    assert lease_b["token"] > lease_a["token"]
    assert lease_b["generation"] == lease_a["generation"] + 1
    state = await client.get(env.job)
    assert state.holder is not None and state.holder.owner == lease_b["owner"]

    a.signal(signal.SIGCONT)
    # from the first request after resuming, A answers "lost"
    after = await a.lease()
    assert after["status"] == 409 and after["error"] == "lost", after
    assert "token" not in after
    assert (await a.request("GET", "/readyz")).status_code == 503
    assert not a.token_file.exists()
    assert not (a.workdir / "token.json").exists()

    job_prefix = client.keys.job(env.job).prefix
    keys_before = await snapshot(client.store, job_prefix)
    hold.touch()  # A's worker now tries to complete under A's old token
    assert await worker_a.wait_exit(30) == 7, worker_a.output()
    done = next(json.loads(line) for line in worker_a.output().splitlines()
                if '"complete"' in line)
    assert done["status"] == 409
    assert done["body"]["error"] == "stale"
    assert done["body"]["token"] == lease_a["token"]
    assert done["body"]["currentToken"] == lease_b["token"]
    after_refusal = await client.get(env.job)
    assert after_refusal.result is None
    assert not writes(keys_before, await snapshot(client.store, job_prefix))  # nothing written

    worker_b = env.worker(b, "worker-b")
    assert await worker_b.wait_exit(30) == 0, worker_b.output()
    final = await client.get(env.job)
    assert final.result is not None
    assert final.result.token == lease_b["token"]
    assert final.result.owner == lease_b["owner"]
    assert final.result.generation == lease_b["generation"]
    history = await client.history(env.job)
    assert [(t.generation, t.token, t.owner, t.end, t.refused_completions)
            for t in history.tenures] == [
        (lease_a["generation"], lease_a["token"], lease_a["owner"], TenureEnd.EXPIRED, 1),
        (lease_b["generation"], lease_b["token"], lease_b["owner"], TenureEnd.COMPLETED, 0)]

    metrics = await a.metrics()
    assert metrics["joblease_sidecar_losses_total"] == 1
    assert metrics["joblease_sidecar_stale_rejections_total"] == 1
    assert metrics['joblease_sidecar_state{state="lost"}'] == 1


async def test_killed_holder_is_replaced_within_ttl(registered: Env, client: JobLeaseClient
                                                    ) -> None:
    env = registered
    a = await env.sidecar("a").started()
    lease_a = await a.held()
    b = await env.sidecar("b").started()
    await poll(lambda: any(r.get("msg") == "job held by another owner; backing off"
                           for r in b.log_records()), 15, "B to try and back off")
    a.signal(signal.SIGKILL)
    killed_at = time.monotonic()
    lease_b = await b.held(timeout=10)
    took = time.monotonic() - killed_at
    assert took <= 2 + 1, f"B claimed {took:.2f}s after the kill"
    assert lease_b["token"] > lease_a["token"]
    assert lease_b["generation"] == lease_a["generation"] + 1
