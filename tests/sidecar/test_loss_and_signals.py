"""Loss (readiness, token file, worker signal, exit action) and SIGTERM handling."""

from __future__ import annotations

import shutil
import signal
import uuid

import httpx
import pytest

from joblease import HeldError, JobLeaseClient
from joblease.records import JobSpec
from tests.support.sidecar_process import Env, Sidecar
from tests.support.waiting import poll


@pytest.mark.parametrize("how", ["pid-file", "process-name"])
async def test_loss_flips_readiness_and_signals_the_worker(
        registered: Env, client: JobLeaseClient, how: str) -> None:
    env = registered
    sleep = shutil.which("sleep")
    assert sleep is not None
    if how == "pid-file":
        dummy = env.spawn("dummy-worker", [sleep, "300"])
        pid_file = env.tmp / "worker.pid"
        pid_file.write_text(f"{dummy.pid}\n")
        extra = {"JOBLEASE_WORKER_PID_FILE": str(pid_file)}
    else:
        # a uniquely named copy of sleep: never signal anybody else's process
        name = "jlw-" + uuid.uuid4().hex[:8]
        exe = env.tmp / name
        shutil.copy(sleep, exe)
        dummy = env.spawn("dummy-worker", [str(exe), "300"])
        extra = {"JOBLEASE_WORKER_PROCESS_NAME": name}
    probe_port_file = env.tmp / "probe-port"
    sidecar = env.sidecar("a", JOBLEASE_SIDECAR_ON_LOSS="signal",
                          JOBLEASE_SIDECAR_PROBE_PORT="0",
                          JOBLEASE_SIDECAR_PROBE_PORT_FILE=str(probe_port_file), **extra)
    await sidecar.started()
    await sidecar.held()
    probe = f"http://127.0.0.1:{int(probe_port_file.read_text())}"
    async with httpx.AsyncClient(base_url=probe) as http:
        assert (await http.get("/readyz")).status_code == 200
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/v1/lease")).status_code == 404  # no token off loopback
    assert sidecar.token_file.exists()

    # the job disappears from under the holder: the next holder check notices
    await client.unregister(env.job)
    await poll(lambda: _not_ready(sidecar), 10, "readiness to flip")
    assert not sidecar.token_file.exists()
    lease = await sidecar.lease()
    assert lease["status"] == 409 and lease["error"] == "lost"
    async with httpx.AsyncClient(base_url=probe) as http:
        assert (await http.get("/readyz")).status_code == 503
    await poll(lambda: dummy.returncode() is not None, 10, "the worker to be signalled")
    assert dummy.returncode() == -signal.SIGTERM
    assert sidecar.returncode() is None  # "signal" keeps serving the 409s
    assert (await sidecar.request("GET", "/healthz")).status_code == 200


async def _not_ready(sidecar: Sidecar) -> bool:
    return await sidecar.status("/readyz") == 503


async def test_exit_action_exits_nonzero_on_loss(registered: Env, client: JobLeaseClient
                                                 ) -> None:
    env = registered
    sidecar = await env.sidecar("a", JOBLEASE_SIDECAR_ON_LOSS="exit").started()
    await sidecar.held()
    await client.unregister(env.job)
    assert await sidecar.wait_exit(15) == 8
    assert not sidecar.token_file.exists()


async def test_sigterm_releases_and_exits_zero(registered: Env, client: JobLeaseClient
                                               ) -> None:
    env = registered
    sidecar = await env.sidecar("a").started()
    lease = await sidecar.held()
    sidecar.signal(signal.SIGTERM)
    assert await sidecar.wait_exit(15) == 0, sidecar.output()
    assert not sidecar.token_file.exists()
    # claimable at once, long before the 2 s TTL could have run out
    state = await client.get(env.job)
    assert state.holder is None
    again = await client.claim(env.job, "someone-else")
    assert again.token > lease["token"] and again.generation == lease["generation"] + 1
    await again.release()


async def test_sigterm_without_release_keeps_the_claim(registered: Env, client: JobLeaseClient
                                                       ) -> None:
    env = registered
    sidecar = await env.sidecar("a", JOBLEASE_SIDECAR_RELEASE_ON_TERM="false").started()
    lease = await sidecar.held()
    sidecar.signal(signal.SIGTERM)
    assert await sidecar.wait_exit(15) == 0
    with pytest.raises(HeldError):
        await client.claim(env.job, "someone-else")
    state = await client.get(env.job)
    assert state.holder is not None and state.holder.token == lease["token"]


async def test_sigterm_while_claiming_exits_zero(registered: Env, client: JobLeaseClient
                                                 ) -> None:
    env = registered
    holder = await client.claim(env.job, "holder")
    sidecar = await env.sidecar("a").started()
    assert (await sidecar.lease())["status"] == 503
    assert await sidecar.status("/readyz") == 503
    sidecar.signal(signal.SIGTERM)
    assert await sidecar.wait_exit(15) == 0
    await holder.release()


async def test_refused_claims_exit_with_the_error_code(env: Env, client: JobLeaseClient
                                                      ) -> None:
    # not registered within the wait: NotRegisteredError's exit code (with on-final
    # "exit"; the default "serve" is tests/sidecar/test_terminal_cases.py)
    lonely = env.sidecar("lonely", JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.5",
                         JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await lonely.wait_exit(20) == 3
    assert any(r.get("msg") == "job is not registered" for r in lonely.log_records())

    # registered a moment after the sidecar started: it waits and claims
    late = await env.sidecar("late", JOBLEASE_SIDECAR_REGISTRATION_WAIT="30").started()
    await poll(lambda: any(r.get("msg") == "job not registered yet; waiting"
                           for r in late.log_records()), 15, "the sidecar to wait")
    await client.register(env.job, JobSpec(lease_duration_seconds=2, max_attempts=1))
    await late.held()
    late.signal(signal.SIGTERM)  # releases; the single attempt stays used
    assert await late.wait_exit(15) == 0

    # attempts exhausted: AttemptsExhaustedError's exit code
    spent = env.sidecar("spent", JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await spent.wait_exit(20) == 6
