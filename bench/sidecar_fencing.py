"""Self-fencing of the Go sidecar: is the worker told (and stopped) before the next claim?

Invariant ``stopped-before-reclaim`` (docs/protocol.md) for the sidecar, measured, as
bench/self_fencing.py measures it for ``joblease run``. Each trial:

1. a real Go sidecar (on-loss ``signal``, the injected default) claims a fresh job
   through a TCP proxy to etcd (tests/support/proxy.py ``ChaosProxy``); its worker is a
   real process named in the pid file, which on SIGTERM notes the wall time and exits
   (what examples/workers/*.sh do: the shell ends at once);
2. once the lease is held the proxy swallows every byte both ways (a partition: the
   sidecar's keep-alives never reach etcd), and ``GET /v1/lease``'s
   ``remainingSeconds`` read just after gives the sidecar's local safety deadline
   (no renewal can move it from then on);
3. a successor waits on the job (``claim_waiting``: a watch of the holder key) on the
   same etcd, not through the proxy, and claims the instant etcd expires the lease.

Per trial: the time from the local deadline to the worker's SIGTERM, and whether the
worker had exited before the successor's claim (its ``claimedAt`` is taken before the
claim transaction is sent, so "exited < claimedAt" is conservative).

    python bench/sidecar_fencing.py [--trials 200] [--ttl 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import pct
from bench.etcd_binary import etcd_binary_or_none
from bench.sidecar import _held, sidecar_env
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from tests.support import sidecar_impls
from tests.support.proxy import ChaosProxy

WORKER = r"""
import signal, sys, time
def stop(sig, frame):
    open(sys.argv[1], "w").write(repr(time.time()))
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while True:
    time.sleep(1)
"""


async def trial(argv: list[str], config: EtcdConfig, successor: JobLeaseClient,
                ttl: int, tmp: Path) -> dict[str, Any]:
    job = JobRef("bench", f"sfence-{uuid.uuid4().hex[:10]}")
    await successor.register(job, JobSpec(lease_duration_seconds=ttl, max_attempts=3))
    workdir = tmp / job.name
    workdir.mkdir()
    told = workdir / "sigterm"
    worker = subprocess.Popen([sys.executable, "-c", WORKER, str(told)])  # noqa: ASYNC220
    (workdir / "worker.pid").write_text(f"{worker.pid}\n")
    host, port = config.endpoints[0].rsplit(":", 1)
    proxy = await ChaosProxy((host, int(port))).start()
    env = sidecar_env(EtcdConfig(endpoints=[proxy.endpoint], root=config.root), job, workdir)
    env.update(JOBLEASE_SIDECAR_ON_LOSS="signal",
               JOBLEASE_WORKER_PID_FILE=str(workdir / "worker.pid"))
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL,  # noqa: ASYNC220
                            stderr=subprocess.DEVNULL)
    try:
        http, _ = await _held(proc, workdir)
        try:
            proxy.mode = "blackhole"
            read_at = time.monotonic()
            view = (await http.get("/v1/lease")).json()
            deadline = read_at + float(view["remainingSeconds"])
            next_lease = await successor.claim_waiting(job, "successor", 60)
            claimed = await successor.get(job)
            assert claimed.holder is not None and claimed.holder.token == next_lease.token
            code = await asyncio.to_thread(worker.wait, 30)
            told_wall = float(told.read_text())
            # the worker notes the wall clock; the deadline is on the monotonic one
            told_mono = told_wall - time.time() + time.monotonic()
        finally:
            await http.aclose()
        await next_lease.release()
        return {"worker_exit": code, "deadline_to_sigterm": told_mono - deadline,
                "exited_before_claim": told_wall < claimed.holder.claimed_at,
                "slack": claimed.holder.claimed_at - told_wall}
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        # the sidecar lost its lease and holds nothing: SIGKILL (its graceful stop would
        # spend up to 10 s revoking through the partition)
        proc.kill()
        await asyncio.to_thread(proc.wait, 10)
        await proxy.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    argv = list(sidecar_impls.argv("go"))
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sidecar-fencing-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    results: list[dict[str, Any]] = []
    load_before = os.getloadavg()
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        config = EtcdConfig(endpoints=cluster.endpoints, root="/bench-sidecar-fencing")
        async with JobLeaseClient(config) as successor:
            for i in range(args.trials):
                results.append(await trial(argv, config, successor, args.ttl, tmp))
                if (i + 1) % 20 == 0:
                    print(f"{i + 1}/{args.trials} trials", file=sys.stderr, flush=True)
        etcd = cluster.binary
    shutil.rmtree(tmp)
    lat = [r["deadline_to_sigterm"] * 1000 for r in results]
    slack = [r["slack"] * 1000 for r in results]
    before = sum(r["exited_before_claim"] for r in results)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "command": " ".join(["python", "bench/sidecar_fencing.py", *sys.argv[1:]]),
        "python": platform.python_version(), "etcd_binary": etcd, "sidecar": argv[0],
        "cpus": os.cpu_count(), "load_before": load_before, "load_after": os.getloadavg(),
        "trials": len(results), "ttl": args.ttl,
        "worker_exit_codes": sorted({r["worker_exit"] for r in results}),
        "stopped_before_next_claim": before,
        "stopped_before_next_claim_fraction": before / len(results),
        "deadline_to_sigterm_ms": {"p50": pct(lat, 0.5), "p99": pct(lat, 0.99),
                                   "max": max(lat), "min": min(lat),
                                   "mean": statistics.fmean(lat)},
        "exit_to_next_claim_ms": {"min": min(slack), "p1": pct(slack, 0.01),
                                  "p50": pct(slack, 0.5)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--ttl", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
