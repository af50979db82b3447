"""A sidecar claims, the example worker reads the token (HTTP + file) and
completes through the sidecar; etcd holds the result under the right token."""

from __future__ import annotations

import json

from joblease import JobLeaseClient
from tests.support.sidecar_process import WORKER_SH, Env


async def test_worker_completes_through_sidecar(registered: Env, client: JobLeaseClient
                                                ) -> None:
    env = registered
    sidecar = await env.sidecar("a").started()
    lease = await sidecar.held()
    assert lease["state"] == "held"
    assert lease["job"] == str(env.job)
    assert lease["owner"].startswith("pod-a/")
    assert lease["generation"] == 1
    assert 0 < lease["remainingSeconds"] <= 2

    # the token file and token.json match the API
    assert sidecar.token_file.read_text() == f"{lease['token']}\n"
    info = json.loads((sidecar.workdir / "token.json").read_text())
    assert info["token"] == lease["token"] and info["owner"] == lease["owner"]
    assert info["generation"] == 1 and info["job"] == str(env.job)
    assert (await sidecar.request("GET", "/readyz")).status_code == 200

    worker = env.worker(sidecar, "worker-a")
    assert await worker.wait_exit(30) == 0, worker.output()
    events = [json.loads(line) for line in worker.output().splitlines()]
    seen = next(e for e in events if e["event"] == "lease")
    assert seen["token"] == lease["token"]
    done = next(e for e in events if e["event"] == "complete")
    assert done["status"] == 200 and done["body"]["token"] == lease["token"]

    state = await client.get(env.job)
    assert state.result is not None
    assert state.result.token == lease["token"]
    assert state.result.owner == lease["owner"]
    assert state.result.generation == 1
    assert state.result.result["items"] == 3
    assert state.holder is None

    # after completion: not ready, no token file, the lease answers "completed"
    assert (await sidecar.request("GET", "/readyz")).status_code == 503
    assert not sidecar.token_file.exists()
    after = await sidecar.lease()
    assert after["status"] == 409 and after["error"] == "completed"
    # a retried completion with the same token is answered with the same record
    r = await sidecar.request("POST", "/v1/complete",
                              json={"token": lease["token"], "result": {"items": 3}})
    assert r.status_code == 200 and r.json()["token"] == lease["token"]

    metrics = await sidecar.metrics()
    assert metrics["joblease_sidecar_claims_total"] == 1
    assert metrics["joblease_sidecar_completions_total"] == 1
    assert metrics['joblease_sidecar_state{state="completed"}'] == 1

    # a second sidecar for a completed job exits 0 with a clear log line (with
    # on-final "exit"; the default "serve" is tests/sidecar/test_terminal_cases.py)
    late = env.sidecar("late", JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await late.wait_exit(30) == 0, late.output()
    assert late.logged("job already completed; nothing to do")


async def test_shell_worker_completes(registered: Env, client: JobLeaseClient) -> None:
    """examples/workers/worker.sh: curl + the token file."""
    env = registered
    sidecar = await env.sidecar("a").started()
    lease = await sidecar.held()
    worker = env.spawn_with("worker-sh", ["sh", str(WORKER_SH)], {
        "JOBLEASE_SIDECAR_URL": sidecar.url, "JOBLEASE_TOKEN_FILE": str(sidecar.token_file)})
    assert await worker.wait_exit(30) == 0, worker.output()
    state = await client.get(env.job)
    assert state.result is not None and state.result.token == lease["token"]
    assert state.result.result == {"items": 3}


async def test_release_after_completion_says_completed_not_stale(
        registered: Env, client: JobLeaseClient) -> None:
    """A worker that completes and then releases (e.g. a shutdown hook) is told the job
    is completed, with the same record, not that its token is stale."""
    env = registered
    sidecar = await env.sidecar("a").started()
    lease = await sidecar.held()
    done = await sidecar.request("POST", "/v1/complete", json={"token": lease["token"]})
    assert done.status_code == 200, done.text
    r = await sidecar.request("POST", "/v1/release", json={"token": lease["token"]})
    assert r.status_code == 409, r.text
    assert r.json()["error"] == "completed" and r.json()["result"] == done.json()
    state = await client.get(env.job)
    assert state.result is not None and state.result.token == lease["token"]
