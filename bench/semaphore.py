"""Semaphores: the cost of a slot on the claim path, grant latency, fairness.

All in one run, against one etcd the benchmark starts (docs/semaphores.md):

- **cycles/s**: claim + complete of jobs whose spec names one semaphore
  (limit = the concurrency, so nobody waits: the pure cost of taking and
  freeing a slot) against the same jobs without one, at each concurrency, in
  ``--rounds`` rounds whose order alternates (a side's figure is its total
  cycles over its total time); target >= 0.8x at 64;
- **grant latency**: a holder releases, the claim first in line (waiting on
  its watch in ``claim_waiting``) holds the slot: release acknowledged ->
  lease in hand, p50/p99 over ``--grants`` hand-overs (target p99 <= 50 ms on
  loopback);
- **fairness**: 64 waiters get in line one after another on a semaphore of
  limit 1; each holder releases at once: the order they are served in (must be
  the order they came, 0 inversions) and the spread of their waits.

    python bench/semaphore.py [--cycles 2000] [--concurrency 1,8,64] [--rounds 4] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import pct, run_pool
from bench.report import save
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.keys import SemaphoreRef
from joblease.records import SemaphoreUse
from joblease.semaphore import Semaphores


async def _register(client: JobLeaseClient, n: int, uses: tuple[SemaphoreUse, ...],
                    ttl: int = 30) -> list[JobRef]:
    jobs = [JobRef("bench", f"job-{i}") for i in range(n)]
    gate = asyncio.Semaphore(64)

    async def one(job: JobRef) -> None:
        async with gate:
            await client.register(job, JobSpec(ttl, 3, semaphores=uses))
            await client._spec(job, client.keys.job(job))  # warm, as a long-lived worker is

    await asyncio.gather(*(one(j) for j in jobs))
    return jobs


async def cycles(config: EtcdConfig, n: int, concurrency: int, with_semaphore: bool
                 ) -> dict[str, Any]:
    async with JobLeaseClient(config.with_(root=f"/bench/sem-{uuid.uuid4().hex[:6]}")) as c:
        # every job's spec stays cached, as a long-lived worker's few jobs' do
        # (more jobs than the cache holds would add a spec read to every claim)
        c._spec_cache_size = max(c._spec_cache_size, n)
        uses: tuple[SemaphoreUse, ...] = ()
        if with_semaphore:
            await Semaphores(c).create(SemaphoreRef("bench", "db"), concurrency)
            uses = (SemaphoreUse("db"),)
        jobs = await _register(c, n, uses)

        async def cycle(job: JobRef) -> tuple[float, float]:
            t0 = time.perf_counter()
            lease = await c.claim(job, "bench")
            t1 = time.perf_counter()
            await lease.complete()
            return t1 - t0, time.perf_counter() - t1

        return await run_pool(jobs, concurrency, cycle)


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Total cycles over total time across rounds; each percentile the worst round's."""
    cycles_done, seconds = sum(r["cycles"] for r in runs), sum(r["seconds"] for r in runs)
    out: dict[str, Any] = {"cycles": cycles_done, "seconds": round(seconds, 3),
                           "cycles_per_s": round(cycles_done / seconds, 1),
                           "rounds_per_s": [r["cycles_per_s"] for r in runs]}
    for key in runs[0]:
        if key.endswith("_ms"):
            out[key] = max(r[key] for r in runs)
    return out


async def grant_latency(config: EtcdConfig, grants: int) -> dict[str, Any]:
    """Hand-overs on a limit-1 semaphore: the holder releases, the waiter first
    in line gets the slot."""
    async with JobLeaseClient(config.with_(root=f"/bench/sem-{uuid.uuid4().hex[:6]}")) as c:
        await Semaphores(c).create(SemaphoreRef("bench", "db"), 1)
        jobs = await _register(c, grants + 1, (SemaphoreUse("db"),))
        lease = await c.claim(jobs[0], "bench")
        latencies = []
        for job in jobs[1:]:
            waiter = asyncio.create_task(c.claim_waiting(job, "bench", wait=30))
            await asyncio.sleep(0.01)  # in line (or about to be) before the release
            await lease.release()
            released = time.perf_counter()
            lease = await waiter
            latencies.append(time.perf_counter() - released)
        await lease.release()
    return {"grants": len(latencies), "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
            "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
            "max_ms": round(max(latencies) * 1000, 2)}


async def fairness(config: EtcdConfig, waiters: int) -> dict[str, Any]:
    async with JobLeaseClient(config.with_(root=f"/bench/sem-{uuid.uuid4().hex[:6]}")) as c:
        sems = Semaphores(c)
        ref = SemaphoreRef("bench", "db")
        await sems.create(ref, 1)
        jobs = await _register(c, waiters + 1, (SemaphoreUse("db"),))
        first = await c.claim(jobs[0], "bench")
        served: list[tuple[int, float]] = []
        came: list[float] = []

        async def wait(n: int, job: JobRef) -> None:
            lease = await c.claim_waiting(job, "bench", wait=120)
            served.append((n, time.perf_counter() - came[n]))
            await lease.release()

        tasks = []
        for n, job in enumerate(jobs[1:]):
            came.append(time.perf_counter())
            tasks.append(asyncio.create_task(wait(n, job)))
            deadline = time.monotonic() + 30
            # in line before the next one comes (a read of etcd: nothing to wait on)
            while (await sems.status(ref)).waiters < n + 1:
                assert time.monotonic() < deadline, "a waiter did not get in line"
                await asyncio.sleep(0.005)
        await first.release()
        await asyncio.gather(*tasks)
    order = [n for n, _ in served]
    inversions = sum(1 for a, b in itertools.pairwise(order) if b < a)
    waits = [w for _, w in served]
    return {"waiters": waiters, "inversions": inversions,
            "wait_min_ms": round(min(waits) * 1000, 1),
            "wait_max_ms": round(max(waits) * 1000, 1),
            "wait_stdev_ms": round(statistics.pstdev(waits) * 1000, 1)}


async def main_async(args: argparse.Namespace, endpoints: tuple[str, ...]) -> dict[str, Any]:
    config = EtcdConfig(endpoints=endpoints)
    rows = []
    for conc in args.concurrency:
        n = max(args.cycles if conc > 1 else args.cycles // 6, 50)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for r in range(args.rounds):  # the order alternates: neither side always first
            for with_semaphore in ((False, True) if r % 2 == 0 else (True, False)):
                runs[with_semaphore].append(await cycles(config, n, conc, with_semaphore))
        without, with_ = _combine(runs[False]), _combine(runs[True])
        rows.append({"concurrency": conc, "without": without, "with": with_,
                     "ratio": round(with_["cycles_per_s"] / without["cycles_per_s"], 3)})
    return {"benchmark": "semaphore", "rows": rows,
            "grant_latency": await grant_latency(config, args.grants),
            "fairness": await fairness(config, args.waiters)}


def print_report(report: dict[str, Any]) -> None:
    print(f"{'conc':>4}  {'without cyc/s':>13} {'with cyc/s':>11} {'ratio':>6} "
          f"{'claim p99 w/o':>13} {'claim p99 with':>14}")
    for row in report["rows"]:
        print(f"{row['concurrency']:>4}  {row['without']['cycles_per_s']:>13} "
              f"{row['with']['cycles_per_s']:>11} {row['ratio']:>6} "
              f"{row['without']['claim_p99_ms']:>11}ms {row['with']['claim_p99_ms']:>12}ms")
    g, f = report["grant_latency"], report["fairness"]
    print(f"grant latency release->next holder over {g['grants']} hand-overs: "
          f"p50 {g['p50_ms']} ms, p99 {g['p99_ms']} ms, max {g['max_ms']} ms")
    print(f"fairness, {f['waiters']} waiters on limit 1: {f['inversions']} inversions; waits "
          f"{f['wait_min_ms']}..{f['wait_max_ms']} ms (stdev {f['wait_stdev_ms']} ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of the cycles part per concurrency, order alternating")
    parser.add_argument("--grants", type=int, default=200)
    parser.add_argument("--waiters", type=int, default=64)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    from tests.support.binaries import etcd_binary
    with EtcdCluster(1, binary=etcd_binary()) as cluster:
        report = asyncio.run(main_async(args, cluster.endpoints))
    print_report(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
