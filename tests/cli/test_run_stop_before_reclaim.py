"""``joblease run`` stops its command before anyone else can claim the job
(invariant ``stopped-before-reclaim``, docs/protocol.md).

The default ``--grace`` is half the lease's safety margin, so SIGTERM at the
local deadline, SIGKILL after the grace and the wrapper noticing both fit in
the margin before etcd can expire the lease. The real trial runs the wrapper
in-process (``run_job``) with a real command that ignores SIGTERM (so only the
SIGKILL after the grace stops it) against a real etcd; the fault-injecting
store freezes the wrapper's keep-alives (the one thing faked: a network that
stops carrying them), and with ``revokes`` also refuses its revokes (etcd
unreachable: the lease can only expire). A second worker waits on real etcd
and claims the moment it can. The command must be dead before that claim.
"""

from __future__ import annotations

import asyncio
import io
import sys
import time
from pathlib import Path

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.errors import LeaseLostError, StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.run import RunOptions, default_grace, run_job
from joblease.session import default_margin
from joblease.store import KeepAlive
from tests.support.faulty_store import FaultyStore
from tests.support.waiting import poll

STUBBORN = r"""
import os, pathlib, signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: None)  # only SIGKILL stops it
pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))
while True:
    time.sleep(0.05)
"""


def test_the_default_grace_fits_inside_the_margin() -> None:
    """Whatever the TTL, SIGTERM-to-SIGKILL by default takes half the margin,
    leaving the other half for noticing the deadline and delivering signals."""
    assert RunOptions(JobRef("default", "j"), "o", ["true"]).grace is None
    for ttl in (2, 3, 5, 10, 30, 600, 86400):
        margin = default_margin(ttl)
        assert 0 < default_grace(margin) <= margin / 2


@pytest.mark.parametrize("revokes", ["reach etcd", "fail"])
async def test_a_command_whose_wrapper_cannot_renew_is_dead_before_the_next_claim(
    etcd_config: EtcdConfig, client: JobLeaseClient, tmp_path: Path, revokes: str,
) -> None:
    job = JobRef("default", "stop-before-reclaim")
    ttl = 4
    await client.register(job, JobSpec(lease_duration_seconds=ttl, max_attempts=5))
    store = FaultyStore(EtcdStore(etcd_config))

    async def frozen(stream: KeepAlive, timeout: float) -> int:
        await asyncio.sleep(timeout)
        raise StoreUnavailableError("test: keep-alives frozen")

    store.renew_hook = frozen
    store.fail_revokes = revokes == "fail"
    pid_file = tmp_path / "pid"
    said: list[tuple[float, str]] = []
    opts = RunOptions(job, "worker-a", [sys.executable, "-c", STUBBORN, str(pid_file)])
    # as the CLI makes it: a lost session does not give the job back by itself
    async with JobLeaseClient(etcd_config, store=store, revoke_on_loss=False) as a:
        running = asyncio.create_task(run_job(
            a, opts, stdout=io.BytesIO(), say=lambda m: said.append((time.time(), m))))
        await poll(lambda: pid_file.exists() or running.done(), 30, "the command to start")
        successor = asyncio.create_task(client.claim_waiting(job, "worker-b", 60))
        code = await asyncio.wait_for(running, 60)
        b = await asyncio.wait_for(successor, 60)
    messages = [m for _, m in said]
    assert code == LeaseLostError.exit_code, messages
    assert any("sending SIGKILL" in m for m in messages), messages
    stopped = next(t for t, m in said if m.startswith("the command has exited"))
    state = await client.get(job)
    assert state.holder is not None and state.holder.token == b.token
    # claimedAt is taken before B's claim is sent, so before it commits
    assert stopped < state.holder.claimed_at, (
        f"the command was stopped {stopped - state.holder.claimed_at:.3f}s after the next "
        f"claim: {messages}")
