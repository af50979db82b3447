"""Semaphores: the cost of a slot on the claim path, grant latency, fairness.

All in one run, against one etcd the benchmark starts (docs/semaphores.md):

- **cycles/s**: claim + complete of jobs whose spec names one semaphore
  (limit = the concurrency, so nobody waits: the pure cost of taking and
  freeing a slot) against the same jobs without one, at each concurrency, in
  ``--rounds`` rounds whose order alternates (a side's figure is its total
  cycles over its total time); target >= 0.8x at 64; beside it, each side's
  CPU per cycle, this process's and etcd's (bench/cpu_cost.py), which says
  which of the two a slot costs;
- **grant latency**: a holder releases, the claim first in line (waiting on
  its watch in ``claim_waiting``) holds the slot: release acknowledged ->
  lease in hand, p50/p99 over ``--grants`` hand-overs (target p99 <= 50 ms on
  loopback);
- **fairness**: 64 waiters get in line one after another on a semaphore of
  limit 1; each holder releases at once: the order they are served in (must be
  the order they came, 0 inversions) and the spread of their waits;
- **Go sidecar grant latency**: the same hand-over between Go sidecar
  processes: a waiter sidecar in phase ``waiting`` behind a holder sidecar, the
  holder's ``POST /v1/complete`` answered -> the waiter's ``GET /v1/lease``
  says held (polled every 2 ms), p50/p99 over ``--sidecar-grants``
  hand-overs, for each binary ``--sidecar`` names (default: this checkout's
  build), beside the library's figure above.

    python bench/semaphore.py [--cycles 2000] [--concurrency 1,8,64] [--rounds 4]
                              [--sidecar-grants 60] [--sidecar LABEL=BINARY ...] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpu_cost
from bench.claims import pct, run_pool
from bench.report import save
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.keys import SemaphoreRef
from joblease.records import SemaphoreUse
from joblease.semaphore import Semaphores
from tests.support.sidecar_process import Env, Sidecar


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


async def cycles(config: EtcdConfig, n: int, concurrency: int, with_semaphore: bool,
                 etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
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

        return await run_pool(jobs, concurrency, cycle, etcd_pids)


def _combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Total cycles over total time across rounds; each percentile the worst round's."""
    cycles_done, seconds = sum(r["cycles"] for r in runs), sum(r["seconds"] for r in runs)
    out: dict[str, Any] = {"cycles": cycles_done, "seconds": round(seconds, 3),
                           "cycles_per_s": round(cycles_done / seconds, 1),
                           "rounds_per_s": [r["cycles_per_s"] for r in runs]}
    for key in runs[0]:
        if key.endswith("_ms"):
            out[key] = max(r[key] for r in runs)
    # CPU per cycle over all rounds (bench/cpu_cost.py): this process's, etcd's
    for side, key in (("client", "client_cpu_s"), ("etcd", "etcd_cpu_s")):
        spent = [r["cpu"][key] for r in runs]
        if all(x is not None for x in spent):
            out[f"{side}_cpu_us_per_cycle"] = round(sum(spent) / cycles_done * 1e6, 1)
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


SIDECAR_POLL_S = 0.002  # how often the waiter's GET /v1/lease is asked: the figures' resolution
SETTLE_S = 0.02  # after the waiter says "waiting", as grant_latency's 10 ms: its wait begun


async def _lease_view(http: httpx.AsyncClient, s: Sidecar) -> dict[str, Any]:
    r = await http.get(f"{s.url}/v1/lease")
    return {"status": r.status_code, **r.json()}


async def _until(http: httpx.AsyncClient, s: Sidecar, ready: Any, what: str,
                 timeout: float = 60) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        if s.returncode() is not None:
            raise RuntimeError(f"{s.name} exited while waiting for {what}:\n{s.output()}")
        view = await _lease_view(http, s)
        if ready(view):
            return view
        if time.monotonic() > deadline:
            raise RuntimeError(f"{s.name}: no {what} in {timeout} s (last {view}):\n{s.output()}")
        await asyncio.sleep(SIDECAR_POLL_S)


async def sidecar_grant_latency(config: EtcdConfig, grants: int, binary: str
                                ) -> dict[str, Any]:
    """Hand-overs on a limit-1 semaphore between Go sidecar processes: the holder
    completes its job through its API, the sidecar waiting in line behind it
    holds the slot (its GET /v1/lease answers 200)."""
    config = config.with_(root=f"/bench/sem-{uuid.uuid4().hex[:6]}")
    with tempfile.TemporaryDirectory(prefix="bench-sem-sidecar-") as tmp:
        env = Env(Path(tmp), config, [binary])
        try:
            async with JobLeaseClient(config) as c, httpx.AsyncClient(timeout=10) as http:
                await Semaphores(c).create(SemaphoreRef("default", "db"), 1)
                jobs = [JobRef("default", f"job-{i}") for i in range(grants + 1)]
                for job in jobs:
                    await c.register(job, JobSpec(30, 3, semaphores=(SemaphoreUse("db"),)))

                async def start(i: int) -> Sidecar:
                    return await env.sidecar(f"s{i}", JOBLEASE_JOB_NAME=jobs[i].name).started()
                holder = await start(0)
                token = (await _until(http, holder, lambda v: v["status"] == 200, "lease"))["token"]
                latencies = []
                for i in range(1, grants + 1):
                    waiter = await start(i)
                    await _until(http, waiter, lambda v: v.get("state") == "waiting", "waiting")
                    await asyncio.sleep(SETTLE_S)
                    done = await http.post(f"{holder.url}/v1/complete",
                                           json={"token": token, "result": None})
                    completed = time.perf_counter()
                    assert done.status_code == 200, done.text
                    view = await _until(http, waiter, lambda v: v["status"] == 200, "lease")
                    latencies.append(time.perf_counter() - completed)
                    holder.stop()
                    holder, token = waiter, view["token"]
        finally:
            env.stop()
    return {"binary": binary, "grants": len(latencies),
            "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
            "p90_ms": round(pct(latencies, 0.9) * 1000, 2),
            "p99_ms": round(pct(latencies, 0.99) * 1000, 2),
            "max_ms": round(max(latencies) * 1000, 2),
            "latencies_ms": [round(x * 1000, 2) for x in latencies]}


async def main_async(args: argparse.Namespace, endpoints: tuple[str, ...],
                     etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    config = EtcdConfig(endpoints=endpoints)
    rows = []
    for conc in args.concurrency:
        n = max(args.cycles if conc > 1 else args.cycles // 6, 50)
        runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
        for r in range(args.rounds):  # the order alternates: neither side always first
            for with_semaphore in ((False, True) if r % 2 == 0 else (True, False)):
                runs[with_semaphore].append(await cycles(config, n, conc, with_semaphore,
                                                         etcd_pids))
        without, with_ = _combine(runs[False]), _combine(runs[True])
        rows.append({"concurrency": conc, "without": without, "with": with_,
                     "ratio": round(with_["cycles_per_s"] / without["cycles_per_s"], 3)})
    report: dict[str, Any] = {"benchmark": "semaphore", "rows": rows, "grant_latency": None,
                              "fairness": None, "sidecar_grant_latency": [],
                              "views_unwatched": args.views_unwatched}
    if args.views_unwatched:
        return report  # waiting needs the views' watches: those parts would only hang
    report["grant_latency"] = await grant_latency(config, args.grants)
    report["fairness"] = await fairness(config, args.waiters)
    if args.sidecar_grants:
        for label, binary in args.sidecar:  # in the order given: repeat them to alternate
            report["sidecar_grant_latency"].append({"label": label, **await sidecar_grant_latency(
                config, args.sidecar_grants, binary)})
    return report


def _unwatch_views() -> None:
    """--views-unwatched: replace SemaphoreView's follower by its first read
    alone. Not a mode of the product: a view that does not watch never sees
    another client's slots or a freed slot it did not free, and its waiters
    would never wake; here one client makes every write, so the views stay
    right and the cycles' difference is what the watch costs."""
    from joblease.slot_view import SemaphoreView
    from joblease.store import Get

    async def first_read_only(view: SemaphoreView) -> None:
        try:
            r = await view._store.txn([], [Get(view.keys.prefix, prefix=True)])
            for kv in r.kvs(0):
                view._put(kv)
            view.revision = r.revision
            view._ready.set()
            await asyncio.Event().wait()  # until closed
        finally:
            view.broken = True
            view._ready.set()

    SemaphoreView._follow = first_read_only  # type: ignore[method-assign,assignment]


def print_report(report: dict[str, Any]) -> None:
    print(f"{'conc':>4}  {'without cyc/s':>13} {'with cyc/s':>11} {'ratio':>6} "
          f"{'claim p99 w/o':>13} {'claim p99 with':>14}")
    for row in report["rows"]:
        print(f"{row['concurrency']:>4}  {row['without']['cycles_per_s']:>13} "
              f"{row['with']['cycles_per_s']:>11} {row['ratio']:>6} "
              f"{row['without']['claim_p99_ms']:>11}ms {row['with']['claim_p99_ms']:>12}ms")
        w, o = row["without"], row["with"]
        if "client_cpu_us_per_cycle" in w and "etcd_cpu_us_per_cycle" in w:
            print(f"      CPU per cycle without / with: client {w['client_cpu_us_per_cycle']} / "
                  f"{o['client_cpu_us_per_cycle']} us, etcd {w['etcd_cpu_us_per_cycle']} / "
                  f"{o['etcd_cpu_us_per_cycle']} us")
    if report["views_unwatched"]:
        print("(--views-unwatched: an experiment, not the product; grant latency and "
              "fairness not measured)")
        print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")
        return
    g, f = report["grant_latency"], report["fairness"]
    print(f"grant latency release->next holder over {g['grants']} hand-overs: "
          f"p50 {g['p50_ms']} ms, p99 {g['p99_ms']} ms, max {g['max_ms']} ms")
    print(f"fairness, {f['waiters']} waiters on limit 1: {f['inversions']} inversions; waits "
          f"{f['wait_min_ms']}..{f['wait_max_ms']} ms (stdev {f['wait_stdev_ms']} ms)")
    for s in report["sidecar_grant_latency"]:
        print(f"Go sidecar grant latency ({s['label']}: {s['binary']}) complete->waiter held over "
              f"{s['grants']} hand-overs: p50 {s['p50_ms']} ms, p90 {s['p90_ms']} ms, "
              f"p99 {s['p99_ms']} ms, "
              f"max {s['max_ms']} ms (library above: p50 {g['p50_ms']} ms, p99 {g['p99_ms']} ms)")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8, 64])
    parser.add_argument("--rounds", type=int, default=4,
                        help="rounds of the cycles part per concurrency, order alternating")
    parser.add_argument("--grants", type=int, default=200)
    parser.add_argument("--waiters", type=int, default=64)
    parser.add_argument("--sidecar-grants", type=int, default=60,
                        help="hand-overs between Go sidecars (0: skip that part)")
    parser.add_argument("--sidecar", action="append", default=[], metavar="LABEL=BINARY",
                        help="a Go sidecar binary to measure (repeatable, measured in the order "
                             "given; default: this checkout's build, hack/build-sidecar)")
    parser.add_argument("--json", help="write the report here")
    parser.add_argument("--views-unwatched", action="store_true",
                        help="experiment: the client's semaphore views make their first read "
                             "but never watch (only this client's own writes reach them, which "
                             "in this single-client run is every write), to measure what the "
                             "watch costs; the cycles part only")
    args = parser.parse_args()
    if args.views_unwatched:
        _unwatch_views()
    args.sidecar = [tuple(x.split("=", 1)) for x in args.sidecar]
    if args.sidecar_grants and not args.sidecar:
        from tests.support.binaries import go_sidecar_binary
        args.sidecar = [("this checkout", go_sidecar_binary())]
    from tests.support.binaries import etcd_binary
    loadavg_before = Path("/proc/loadavg").read_text().split()[:3]
    with EtcdCluster(1, binary=etcd_binary()) as cluster:
        report = asyncio.run(main_async(args, cluster.endpoints, cpu_cost.pids_of(cluster)))
    report["loadavg_before"] = loadavg_before
    report["loadavg_after"] = Path("/proc/loadavg").read_text().split()[:3]
    print_report(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
