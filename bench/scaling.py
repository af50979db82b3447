"""Scaling: throughput as jobs grow and as worker processes grow (issue 11).

(a) **Registered jobs.** A fresh single-member etcd per step; N jobs registered
    (100 -> 1,000 -> 10,000, and 100,000 with ``--full``) through one
    JobLeaseClient with 64 registrations in flight (bench.claims.register_jobs):
    registration time and jobs/s are reported. Then a fixed pool of worker
    processes (``--pool-procs`` processes x ``--pool-conc`` coroutines each) runs
    claim+complete cycles on ``min(N, --cycles)`` of those jobs, spread evenly
    over the registered set: cycles/s and p50/p99 cycle latency.
(b) **Worker processes.** One etcd, 1, 4, 16, 64 worker processes, each its own
    JobLeaseClient (own gRPC channel and session lease) in its own interpreter
    (multiprocessing, spawn), each running one claim+complete at a time like a
    real worker. ``--cycles`` jobs are split evenly between the processes.

In both, every worker process connects and reads the specs of its jobs (the
cache a long-lived worker has), then waits at a start barrier, so interpreter
start-up and imports are not timed. Workers never contend for the same job
(each has its own slice); throughput = all cycles / (last finish - start).

    python bench/scaling.py [--full] [--cycles 2000] [--procs 1,4,16,64]
                            [--json bench/results/scaling.json]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct, register_jobs  # noqa: E402
from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from bench.report import save  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient, JobRef  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


# --------------------------------------------------------------------------- worker process
async def _worker(endpoints: list[str], root: str, names: list[str], concurrency: int,
                  ready: Any, start: Any, results: Any) -> None:
    async with JobLeaseClient(EtcdConfig(endpoints=tuple(endpoints), root=root)) as c:
        jobs = [JobRef("bench", n) for n in names]
        for j in jobs:
            await c._spec(j, c.keys.job(j))
        ready.put(os.getpid())
        await asyncio.to_thread(start.wait)
        queue = list(reversed(jobs))
        lat: list[float] = []
        errors = 0

        async def loop() -> None:
            nonlocal errors
            while queue:
                job = queue.pop()
                t = time.perf_counter()
                try:
                    lease = await c.claim(job, f"w-{os.getpid()}")
                    await lease.complete({"ok": True})
                except Exception:
                    errors += 1
                    continue
                lat.append(time.perf_counter() - t)

        await asyncio.gather(*(loop() for _ in range(concurrency)))
        results.put({"latencies": lat, "errors": errors, "end": time.time()})


def worker_main(endpoints: list[str], root: str, names: list[str], concurrency: int,
                ready: Any, start: Any, results: Any) -> None:
    asyncio.run(_worker(endpoints, root, names, concurrency, ready, start, results))


def run_workers(endpoints: tuple[str, ...], root: str, names: list[str], procs: int,
                concurrency: int) -> dict[str, Any]:
    """Split ``names`` over ``procs`` spawned worker processes; time from the barrier."""
    ctx = mp.get_context("spawn")
    ready, results, start = ctx.Queue(), ctx.Queue(), ctx.Event()
    slices = [names[i::procs] for i in range(procs)]
    workers = [ctx.Process(target=worker_main, daemon=True,
                           args=(list(endpoints), root, s, concurrency, ready, start, results))
               for s in slices]
    spawn_t = time.perf_counter()
    for w in workers:
        w.start()
    for _ in workers:
        ready.get(timeout=600)
    spawn_s = time.perf_counter() - spawn_t
    load = loadavg()
    t0 = time.time()
    start.set()
    outs = [results.get(timeout=900) for _ in workers]
    for w in workers:
        w.join(30)
    lat = [x for o in outs for x in o["latencies"]]
    elapsed = max(o["end"] for o in outs) - t0
    return {"procs": procs, "conc_per_proc": concurrency, "cycles": len(lat),
            "errors": sum(o["errors"] for o in outs), "seconds": round(elapsed, 3),
            "cycles_per_s": round(len(lat) / elapsed, 1) if elapsed > 0 else 0.0,
            "p50_ms": round(pct(lat, 0.5) * 1000, 2), "p99_ms": round(pct(lat, 0.99) * 1000, 2),
            "spawn_and_warm_s": round(spawn_s, 1), "loadavg_at_start": load,
            "loadavg_at_end": loadavg()}


# --------------------------------------------------------------------------- the steps
async def register(endpoints: tuple[str, ...], root: str, n: int) -> tuple[list[str], float]:
    async with JobLeaseClient(EtcdConfig(endpoints=endpoints, root=root)) as c:
        t = time.perf_counter()
        jobs = await register_jobs(c, n, "job")
        return [j.name for j in jobs], time.perf_counter() - t


def jobs_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for n in args.jobs:
        with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
            root = f"/bench/scale-{uuid.uuid4().hex[:6]}"
            load = loadavg()
            names, reg_s = asyncio.run(register(cluster.endpoints, root, n))
            cycles = min(n, args.cycles)
            step = n / cycles
            sample = [names[int(i * step)] for i in range(cycles)]
            r = run_workers(cluster.endpoints, root, sample, args.pool_procs, args.pool_conc)
            row = {"registered": n, "register_s": round(reg_s, 2),
                   "registrations_per_s": round(n / reg_s, 1), "loadavg_register": load, **r}
            rows.append(row)
            print(f"jobs={n:>6}: registered in {row['register_s']} s "
                  f"({row['registrations_per_s']}/s), {r['cycles']} cycles at "
                  f"{r['cycles_per_s']}/s, p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, "
                  f"load {r['loadavg_at_end']}", flush=True)
    return rows


def procs_scaling(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        for procs in args.procs:
            root = f"/bench/procs-{uuid.uuid4().hex[:6]}"
            cycles = max(args.cycles, procs * 10)
            names, _ = asyncio.run(register(cluster.endpoints, root, cycles))
            r = run_workers(cluster.endpoints, root, names, procs, 1)
            rows.append(r)
            print(f"procs={procs:>3}: {r['cycles']} cycles at {r['cycles_per_s']}/s, "
                  f"p50 {r['p50_ms']} ms, p99 {r['p99_ms']} ms, errors {r['errors']}, "
                  f"load {r['loadavg_at_end']}", flush=True)
    return rows


def print_table(report: dict[str, Any]) -> None:
    print(f"\n(a) registered jobs, pool {report['args']['pool_procs']} procs x "
          f"{report['args']['pool_conc']} in flight")
    print(f"{'jobs':>7} {'reg s':>7} {'reg/s':>8} {'cycles':>6} {'cycles/s':>9} "
          f"{'p50 ms':>7} {'p99 ms':>7}  loadavg")
    for r in report["jobs"]:
        print(f"{r['registered']:>7} {r['register_s']:>7} {r['registrations_per_s']:>8} "
              f"{r['cycles']:>6} {r['cycles_per_s']:>9} {r['p50_ms']:>7} {r['p99_ms']:>7}  "
              f"{r['loadavg_at_end']}")
    print("\n(b) worker processes, one claim+complete in flight each")
    print(f"{'procs':>5} {'cycles':>6} {'cycles/s':>9} {'p50 ms':>7} {'p99 ms':>7} "
          f"{'errors':>6}  loadavg")
    for r in report["procs"]:
        print(f"{r['procs']:>5} {r['cycles']:>6} {r['cycles_per_s']:>9} {r['p50_ms']:>7} "
              f"{r['p99_ms']:>7} {r['errors']:>6}  {r['loadavg_at_end']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--full", action="store_true", help="add the 100,000-job step")
    parser.add_argument("--jobs", type=lambda s: [int(x) for x in s.split(",")],
                        default=[100, 1000, 10000])
    parser.add_argument("--procs", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 4, 16, 64])
    parser.add_argument("--cycles", type=int, default=2000,
                        help="claim+complete cycles per measurement")
    parser.add_argument("--pool-procs", type=int, default=4)
    parser.add_argument("--pool-conc", type=int, default=4)
    parser.add_argument("--skip", choices=["jobs", "procs"], help="skip one part")
    parser.add_argument("--json", default=str(HERE / "results" / "scaling.json"))
    args = parser.parse_args()
    if args.full and 100000 not in args.jobs:
        args.jobs.append(100000)
    report: dict[str, Any] = {"benchmark": "scaling",
                              "args": {k: v for k, v in vars(args).items() if k != "json"}}
    report["jobs"] = [] if args.skip == "jobs" else jobs_scaling(args)
    report["procs"] = [] if args.skip == "procs" else procs_scaling(args)
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "uname": " ".join(os.uname())}
    print_table(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
