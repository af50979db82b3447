"""Self-fencing of ``joblease run``: is the command dead before the next claim commits?

Invariant ``stopped-before-reclaim`` (docs/protocol.md), measured. Each trial:

1. a wrapper (``joblease.run.Runner``, in this process, with the client the
   CLI makes: ``revoke_on_loss=False``) claims a fresh job and starts a real
   command that **ignores SIGTERM** (the worst case: only the SIGKILL after
   the default ``--grace``, half the margin, stops it);
2. the wrapper is partitioned from etcd from the start: its keep-alives never
   reach etcd and its revokes fail (``tests/support/faulty_store.py``; etcd
   and everything else are real), so only etcd's expiry frees the job;
3. a successor waits on the job (``claim_waiting``: a watch of the holder key)
   against the same etcd and claims the instant it can.

Per trial it records the time from the wrapper's local deadline to its
SIGTERM (monotonic clock), and whether the command had exited (reaped by the
wrapper) before the successor's claim: the successor's ``claimedAt`` is taken
before its claim transaction is sent, so "exited < claimedAt" is conservative.

    python bench/self_fencing.py [--trials 200] [--ttl 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import platform
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import pct
from bench.etcd_binary import etcd_binary_or_none
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.errors import StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.run import Runner, RunOptions
from joblease.store import KeepAlive
from tests.support.faulty_store import FaultyStore

STUBBORN = r"""
import signal, sys, time
signal.signal(signal.SIGTERM, lambda s, f: None)
open(sys.argv[1], "w").close()
while True:
    time.sleep(0.05)
"""


async def _frozen(stream: KeepAlive, timeout: float) -> int:
    await asyncio.sleep(timeout)
    raise StoreUnavailableError("bench: partitioned from etcd")


async def trial(config: EtcdConfig, successor: JobLeaseClient, ttl: int, tmp: Path
                ) -> dict[str, Any]:
    job = JobRef("bench", f"fence-{uuid.uuid4().hex[:10]}")
    await successor.register(job, JobSpec(lease_duration_seconds=ttl, max_attempts=3))
    store = FaultyStore(EtcdStore(config))
    store.renew_hook = _frozen
    store.fail_revokes = True
    started = tmp / f"{job.name}.started"
    said: dict[str, tuple[float, float]] = {}  # message prefix -> (monotonic, wall)

    def say(message: str) -> None:
        for key in ("sent SIGTERM", "the command has exited", "lease on"):
            if message.startswith(key):
                said.setdefault(key, (time.monotonic(), time.time()))

    async with JobLeaseClient(config, store=store, revoke_on_loss=False) as holder:
        runner = Runner(holder, RunOptions(job, "holder", [sys.executable, "-c", STUBBORN,
                                                           str(started)]),
                        stdout=io.BytesIO(), say=say)
        running = asyncio.create_task(runner.run())
        while not started.exists():
            if running.done():
                raise RuntimeError(f"the wrapper ended early: {running.result()}")
            await asyncio.sleep(0.01)
        lease = runner.lease
        assert lease is not None
        # renewals never get through: the deadline stays where the grant put it
        deadline = time.monotonic() + lease.remaining()
        margin, grace = lease.margin, runner.grace
        waiting = asyncio.create_task(successor.claim_waiting(job, "successor", 60))
        code = await asyncio.wait_for(running, 60)
        next_lease = await asyncio.wait_for(waiting, 60)
    state = await successor.get(job)
    assert state.holder is not None and state.holder.token == next_lease.token
    await next_lease.release()
    started.unlink()
    term_mono, _ = said["sent SIGTERM"]
    _, exited_wall = said["the command has exited"]
    return {"exit": code, "margin": margin, "grace": grace,
            "deadline_to_sigterm": term_mono - deadline,
            "exited_before_claim": exited_wall < state.holder.claimed_at,
            "slack": state.holder.claimed_at - exited_wall}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    binary = etcd_binary_or_none()
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"self-fencing-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with EtcdCluster(1, binary=binary) as cluster:
        config = EtcdConfig(endpoints=cluster.endpoints, root="/bench-self-fencing")
        async with JobLeaseClient(config) as successor:
            for i in range(args.trials):
                results.append(await trial(config, successor, args.ttl, tmp))
                if (i + 1) % 20 == 0:
                    print(f"{i + 1}/{args.trials} trials", file=sys.stderr, flush=True)
        etcd = cluster.binary
    tmp.rmdir()
    lat = [r["deadline_to_sigterm"] * 1000 for r in results]
    slack = [r["slack"] * 1000 for r in results]
    before = sum(r["exited_before_claim"] for r in results)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", "bench/self_fencing.py", *sys.argv[1:]]),
        "python": platform.python_version(), "etcd_binary": etcd, "cpus": os.cpu_count(),
        "load_before": load_before, "load_after": os.getloadavg(),
        "trials": len(results), "ttl": args.ttl,
        "margin": results[0]["margin"], "grace": results[0]["grace"],
        "exit_codes": sorted({r["exit"] for r in results}),
        "stopped_before_next_claim": before,
        "stopped_before_next_claim_fraction": before / len(results),
        "deadline_to_sigterm_ms": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                                   "max": max(lat), "mean": statistics.fmean(lat)},
        "exit_to_next_claim_ms": {"min": min(slack), "p1": pct(slack, 0.01),
                                  "p50": pct(slack, 0.5)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
