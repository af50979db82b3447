"""Every terminal case of a sidecar, as a native sidecar sees it (docs/sidecar.md).

A native sidecar that exits is restarted by the kubelet, and a worker whose
startup probe never passes never starts: so with the default
``JOBLEASE_SIDECAR_ON_FINAL=serve`` the sidecar stays up with its final answer,
``/readyz`` lets the worker in once, and the worker reads the answer from
``GET /v1/lease`` and ends the pod with it. Each test checks the documented
state, readiness, HTTP answers, token files and exit behaviour, and runs the
example shell worker (``examples/workers/worker.sh``, sh + curl) and the
Python one against the real sidecar process and the session's real etcd.
"""

from __future__ import annotations

import json
import signal
import subprocess
from typing import Any

import httpx
import pytest

from joblease import JobLeaseClient
from joblease.records import JobSpec
from joblease.store import Put
from tests.support.sidecar_process import WORKER_SH, Env, Proc, Sidecar
from tests.support.waiting import poll


def _with_probe(env: Env, name: str, **extra: str) -> Sidecar:
    """A sidecar with its probe listener on a free port (written to a file)."""
    return env.sidecar(name, JOBLEASE_SIDECAR_PROBE_PORT="0",
                       JOBLEASE_SIDECAR_PROBE_PORT_FILE=str(env.tmp / f"{name}-probe-port"),
                       **extra)


async def _probe(env: Env, sidecar: Sidecar, path: str) -> httpx.Response:
    port = int((env.tmp / f"{sidecar.name}-probe-port").read_text())
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
        return await http.get(path)


async def _final(sidecar: Sidecar, error: str) -> dict[str, Any]:
    """Wait until GET /v1/lease gives the final answer ``error`` (409)."""
    async def check() -> dict[str, Any] | None:
        if sidecar.returncode() is not None:
            raise AssertionError(f"{sidecar.name} exited:\n{sidecar.output()}")
        lease = await sidecar.lease()
        return lease if lease["status"] == 409 and lease.get("error") == error else None
    found: dict[str, Any] = await poll(check, 30, f"{sidecar.name} to answer {error}")
    return found


def _shell_worker(env: Env, sidecar: Sidecar, name: str, **extra: str) -> Proc:
    return env.spawn_with(name, ["sh", str(WORKER_SH)], {
        "JOBLEASE_SIDECAR_URL": sidecar.url, "JOBLEASE_TOKEN_FILE": str(sidecar.token_file),
        "JOBLEASE_WAIT_SECONDS": "30", **extra})


async def _stays_up_then_sigterm_exits_zero(sidecar: Sidecar) -> None:
    assert sidecar.returncode() is None  # still serving its answer
    assert (await sidecar.request("GET", "/healthz")).status_code == 200
    sidecar.signal(signal.SIGTERM)  # what the kubelet does once the worker exited
    assert await sidecar.wait_exit(15) == 0, sidecar.output()


async def test_already_completed_lets_the_worker_in_and_it_exits_zero(
        registered: Env, client: JobLeaseClient) -> None:
    env = registered
    first = await client.claim(env.job, "earlier-pod")
    done = await first.complete({"items": 3})

    sidecar = await _with_probe(env, "late").started()
    lease = await _final(sidecar, "completed")
    assert lease["state"] == "completed"
    assert lease["exitCode"] == 0
    assert "already completed by earlier-pod" in lease["message"]
    assert lease["result"]["token"] == done.token and lease["result"]["owner"] == "earlier-pod"
    assert "token" not in lease  # no token is ever handed out
    # the startup probe passes: the worker container starts and reads the answer
    r = await _probe(env, sidecar, "/readyz")
    assert r.status_code == 200 and r.json() == {"ready": True, "state": "completed"}
    assert not sidecar.token_file.exists() and not (sidecar.workdir / "token.json").exists()
    metrics = await sidecar.metrics()
    assert metrics['joblease_sidecar_state{state="completed"}'] == 1
    assert metrics["joblease_sidecar_completions_total"] == 0  # not completed by us
    # a completion or release under any token is refused and writes nothing
    r = await sidecar.request("POST", "/v1/complete", json={"token": done.token, "result": 1})
    assert r.status_code == 409 and r.json()["error"] == "stale"

    sh = _shell_worker(env, sidecar, "worker-sh")
    assert await sh.wait_exit(30) == 0, sh.output()
    assert "already completed: nothing to do" in sh.output()
    assert "work item" not in sh.output()
    py = env.worker(sidecar, "worker-py")
    assert await py.wait_exit(30) == 0, py.output()
    assert not any(json.loads(line)["event"] == "work" for line in py.output().splitlines())

    state = await client.get(env.job)
    assert state.result == done  # untouched
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_attempts_exhausted_fails_the_worker_with_the_reason(
        env: Env, client: JobLeaseClient) -> None:
    await env.register(client, max_attempts=1)
    spent = await client.claim(env.job, "earlier-pod")
    await spent.release()
    before = await client.get(env.job)

    sidecar = await _with_probe(env, "a").started()
    lease = await _final(sidecar, "failed")
    assert lease["state"] == "failed" and lease["reason"] == "exhausted"
    assert lease["exitCode"] == 6
    assert lease["attempts"] == 1 and lease["maxAttempts"] == 1
    assert "has used 1 of 1 attempts" in lease["message"]
    r = await _probe(env, sidecar, "/readyz")
    body = r.json()  # with why it failed (docs/sidecar.md, "/readyz")
    assert r.status_code == 200 and body == {"ready": True, "state": "failed",
                                             "message": body.get("message")}
    assert "has used 1 of 1 attempts" in body["message"]
    assert not sidecar.token_file.exists()
    assert (await sidecar.metrics())['joblease_sidecar_state{state="failed"}'] == 1
    assert any(rec.get("msg") == "job has no attempts left" for rec in sidecar.log_records())

    sh = _shell_worker(env, sidecar, "worker-sh")
    assert await sh.wait_exit(30) == 6, sh.output()
    assert "the job cannot run: exhausted:" in sh.output()
    assert "has used 1 of 1 attempts" in sh.output()
    assert "work item" not in sh.output()
    py = env.worker(sidecar, "worker-py")
    assert await py.wait_exit(30) == 6, py.output()
    assert "the job cannot run: exhausted: job" in py.output()

    after = await client.get(env.job)
    assert after.attempts == before.attempts == 1 and after.holder is None
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_not_registered_within_the_wait_fails_the_worker(
        env: Env, client: JobLeaseClient) -> None:
    sidecar = await _with_probe(env, "a", JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.5").started()
    assert (await sidecar.lease())["status"] in (503, 409)
    lease = await _final(sidecar, "failed")
    assert lease["reason"] == "not_found" and lease["exitCode"] == 3
    assert f"job {env.job} is not registered (waited 0.5 s)" in lease["message"]
    assert (await _probe(env, sidecar, "/readyz")).status_code == 200
    assert not sidecar.token_file.exists()
    # final: registering now changes nothing for this sidecar (a new pod claims)
    await env.register(client)
    assert (await sidecar.lease())["error"] == "failed"

    sh = _shell_worker(env, sidecar, "worker-sh")
    assert await sh.wait_exit(30) == 3, sh.output()
    assert "the job cannot run: not_found:" in sh.output()
    assert "is not registered" in sh.output()
    state = await client.get(env.job)
    assert state.attempts == 0 and state.holder is None  # nothing claimed
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_a_claim_refused_for_good_fails_the_worker(env: Env, client: JobLeaseClient
                                                         ) -> None:
    """A job whose stored spec cannot be decoded: the claim raises CorruptRecordError,
    which no retry can fix."""
    key = client.keys.job(env.job).spec
    await client.store.txn([], [Put(key, b"{not json")], [])
    sidecar = await _with_probe(env, "a").started()
    lease = await _final(sidecar, "failed")
    assert lease["reason"] == "corrupt" and lease["exitCode"] == 14
    assert lease["message"].startswith(f"cannot claim job {env.job}:")
    assert (await _probe(env, sidecar, "/readyz")).status_code == 200
    sh = _shell_worker(env, sidecar, "worker-sh")
    assert await sh.wait_exit(30) == 14, sh.output()
    assert "the job cannot run: corrupt:" in sh.output()
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_lost_mid_work_stops_the_shell_worker(registered: Env, client: JobLeaseClient
                                                    ) -> None:
    env = registered
    pid_file = env.tmp / "worker.pid"
    sidecar = await _with_probe(env, "a", JOBLEASE_SIDECAR_ON_LOSS="signal",
                                JOBLEASE_WORKER_PID_FILE=str(pid_file)).started()
    held = await sidecar.held()
    assert (await _probe(env, sidecar, "/readyz")).status_code == 200  # the startup probe
    sh = _shell_worker(env, sidecar, "worker-sh", JOBLEASE_WORKER_PID_FILE=str(pid_file),
                       JOBLEASE_EXAMPLE_HOLD_FILE=str(env.tmp / "never"))
    await poll(lambda: "work item 3" in sh.output(), 30, "the worker to be mid-work")
    assert f"token {held['token']}" in sh.output()

    await client.unregister(env.job)  # the job vanishes from under the holder
    assert await sh.wait_exit(30) == -signal.SIGTERM, sh.output()
    assert "complete ->" not in sh.output()  # stopped before any completion
    lease = await _final(sidecar, "lost")
    assert lease["state"] == "lost"
    r = await _probe(env, sidecar, "/readyz")  # the worker was let in already: 503
    assert r.status_code == 503 and r.json()["state"] == "lost"
    assert not sidecar.token_file.exists()
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_lost_before_the_worker_was_let_in_still_lets_it_fail(
        registered: Env, client: JobLeaseClient) -> None:
    """The lease is lost before the startup probe ever saw 200 (on-loss ``signal``,
    no worker to signal yet): the probe must pass now, or the worker would never
    start and the pod would hang. (With on-loss ``none`` it stays 503, as before:
    tests/sidecar/test_seed_example.py.)"""
    env = registered
    sidecar = await _with_probe(env, "a", JOBLEASE_SIDECAR_ON_LOSS="signal").started()
    await sidecar.held()
    await client.unregister(env.job)
    await _final(sidecar, "lost")
    r = await _probe(env, sidecar, "/readyz")
    body = r.json()  # with why it was lost (docs/sidecar.md, "/readyz")
    assert r.status_code == 200 and body == {"ready": True, "state": "lost",
                                             "message": body.get("message")}
    assert body["message"], body
    sh = _shell_worker(env, sidecar, "worker-sh")
    assert await sh.wait_exit(30) == 8, sh.output()
    assert "no lease:" in sh.output() and "work item" not in sh.output()
    # once let in, the gate stays shut
    assert (await _probe(env, sidecar, "/readyz")).status_code == 503
    # no worker to signal is logged, not fatal (it was: a log field clashed with
    # LogRecord's processName and the sidecar died)
    assert any(rec.get("msg") == "no worker process found to signal"
               for rec in sidecar.log_records())
    await _stays_up_then_sigterm_exits_zero(sidecar)


@pytest.mark.parametrize("case", ["completed", "exhausted", "not-registered"])
async def test_on_final_exit_exits_with_the_code(env: Env, client: JobLeaseClient, case: str
                                                 ) -> None:
    """``JOBLEASE_SIDECAR_ON_FINAL=exit``: the old behaviour, for a sidecar run as a
    plain process (exit 0 / 6 / 3)."""
    if case != "not-registered":
        await client.register(env.job, JobSpec(lease_duration_seconds=2, max_attempts=1))
        lease = await client.claim(env.job, "earlier")
        if case == "completed":
            await lease.complete(None)
        else:
            await lease.release()
    sidecar = env.sidecar("a", JOBLEASE_SIDECAR_ON_FINAL="exit",
                          JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.3")
    expected = {"completed": 0, "exhausted": 6, "not-registered": 3}[case]
    assert await sidecar.wait_exit(30) == expected, sidecar.output()


def test_an_unknown_on_final_action_is_refused(env: Env) -> None:
    result = subprocess.run(
        env.sidecar_argv, capture_output=True, text=True, timeout=60,
        env={**env.base_env(), "JOBLEASE_JOB_NAME": "x", "JOBLEASE_SIDECAR_ON_FINAL": "wait"})
    assert result.returncode == 2
    assert "invalid on-final action 'wait': one of serve, exit" in result.stderr


async def test_a_job_whose_semaphore_does_not_exist_fails_the_worker_naming_it(
        env: Env, client: JobLeaseClient) -> None:
    """The sidecar takes semaphore slots (docs/semaphores.md; tests/sidecar/
    test_semaphores.py): a spec naming a semaphore nobody created is waited on
    like a missing registration, then refused with not_found naming the
    semaphore, and nothing is claimed."""
    from joblease.records import SemaphoreUse
    await client.register(env.job, JobSpec(lease_duration_seconds=10, max_attempts=3,
                                           semaphores=(SemaphoreUse("absent-db", 1),)))
    sidecar = await _with_probe(env, "a", JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.5").started()
    lease = await _final(sidecar, "failed")
    assert lease["reason"] == "not_found" and lease["exitCode"] == 3
    assert lease["semaphore"] == f"{env.job.namespace}/absent-db"
    assert lease["message"] == (f"semaphore {env.job.namespace}/absent-db does not exist (waited "
                                "0.5 s): is there a JobSemaphore of that name in this namespace?")
    state = await client.get(env.job)
    assert state.attempts == 0 and state.holder is None  # nothing claimed
    await _stays_up_then_sigterm_exits_zero(sidecar)


async def test_a_job_needing_more_slots_than_the_limit_is_refused_for_good(
        env: Env, client: JobLeaseClient) -> None:
    """A weight above the semaphore's limit could never be granted: refused as
    bad input (invalid, exit 2) rather than waited on forever; nothing written."""
    from joblease.keys import SemaphoreRef
    from joblease.records import SemaphoreUse
    from joblease.semaphore import Semaphores
    await Semaphores(client).create(SemaphoreRef(env.job.namespace, "db"), 1)
    await client.register(env.job, JobSpec(lease_duration_seconds=10, max_attempts=3,
                                           semaphores=(SemaphoreUse("db", 2),)))
    sidecar = await _with_probe(env, "a").started()
    lease = await _final(sidecar, "failed")
    assert lease["reason"] == "invalid" and lease["exitCode"] == 2
    assert "needs 2 slots of semaphore default/db, whose limit is 1" in lease["message"]
    _, slots = await client.store.get(
        client.keys.semaphore(SemaphoreRef(env.job.namespace, "db")).prefix, prefix=True)
    assert [kv.key.rsplit(b"/", 1)[-1] for kv in slots] == [b"spec"]  # no slot, no waiter
    state = await client.get(env.job)
    assert state.attempts == 0 and state.holder is None
    await _stays_up_then_sigterm_exits_zero(sidecar)
