"""Claims/s and completes/s through joblease, side by side with raw etcd transactions.

Both sides run in the same process, against the same etcd, through the same
gRPC client (joblease.etcd_store.EtcdStore), in the same run:

- **joblease**: ``client.claim(job, owner)`` then ``lease.complete(result)``;
- **raw**: the same etcd work issued as bare transactions with no library
  logic: the claim transaction (4 compares, 2 puts, 2 gets: the generation
  and the last checkpoint, bound to a lease granted once) and the completion
  transaction (2 compares, 1 put, 1 delete).

The ratio joblease/raw is the cost of the library on the hot path; a claim is
one round trip on both sides (the spec is read once per job and cached, so
with fresh jobs joblease pays one extra read per job: shown separately).

- **history**: the joblease side again, on jobs whose spec keeps a tenure
  history (``historyLimit`` 10: the claim also puts the tenure; the completion
  is unchanged; docs/protocol.md, "Tenure history"); the ratio
  history/joblease is what the history costs. The three sides run in
  ``--rounds`` rounds (their order changing each round, through all six) and
  each side's cycles/s is its cycles over its seconds summed over the rounds,
  so a busy machine's swings hit every side alike. Then, at the retention limit: one job claimed,
  checkpointed and released ``limit + 5`` times, and the etcd keys and bytes
  (key + value) its history and its own prefix hold then.

    python bench/claims.py [--cycles 3000] [--concurrency 1,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import itertools
import json
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpu_cost
from bench.cpu_cost import Snapshot
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.store import Compare, Delete, Get, Put


def pct(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def register_jobs(client: JobLeaseClient, n: int, prefix: str,
                        history_limit: int = 0) -> list[JobRef]:
    jobs = [JobRef("bench", f"{prefix}-{i}") for i in range(n)]
    sem = asyncio.Semaphore(64)

    async def one(job: JobRef) -> None:
        async with sem:
            await client.register(job, JobSpec(lease_duration_seconds=30, max_attempts=3,
                                               history_limit=history_limit))

    await asyncio.gather(*(one(j) for j in jobs))
    return jobs


def settle() -> None:
    """Collect garbage before a timed pool, on every side alike: the set-up (3,000
    registrations, the library's spec-cache warm-up) leaves enough young objects
    that a full collection, tens of milliseconds with gRPC and protobuf loaded,
    otherwise lands in whichever side's timed pool comes next (once in 500
    cycles at c=1: 30-100 us a cycle). Not inside :func:`run_pool`, so wrappers
    timing it (bench/claims_alternating.py, bench/profile_claims.py) leave it out."""
    gc.collect()


async def run_pool(jobs: list[Any], concurrency: int, cycle: Any,
                   etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    """``jobs`` by ``concurrency`` workers; ``cpu``: what the timed part cost
    (bench/cpu_cost.py; etcd's CPU if its ``etcd_pids`` are given)."""
    queue: asyncio.Queue[Any] = asyncio.Queue()
    for j in jobs:
        queue.put_nowait(j)
    claim_lat: list[float] = []
    complete_lat: list[float] = []

    async def worker() -> None:
        while not queue.empty():
            job = queue.get_nowait()
            c, d = await cycle(job)
            claim_lat.append(c)
            complete_lat.append(d)

    collections = [g["collections"] for g in gc.get_stats()]
    snap = Snapshot.take(etcd_pids)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    cpu = snap.until(Snapshot.take(etcd_pids))
    n = len(claim_lat)
    return {
        "cpu": cpu,
        # garbage collections (generations 0, 1, 2) during the timed cycles
        "gc_collections": [g["collections"] - c for g, c in zip(gc.get_stats(), collections,
                                                                 strict=True)],
        "cycles": n,
        "seconds": round(elapsed, 3),
        "cycles_per_s": round(n / elapsed, 1),
        "claims_per_s": round(n / sum(claim_lat) * concurrency, 1) if claim_lat else 0,
        "completes_per_s": round(n / sum(complete_lat) * concurrency, 1) if complete_lat else 0,
        "claim_p50_ms": round(pct(claim_lat, 0.5) * 1000, 2),
        "claim_p99_ms": round(pct(claim_lat, 0.99) * 1000, 2),
        "complete_p50_ms": round(pct(complete_lat, 0.5) * 1000, 2),
        "complete_p99_ms": round(pct(complete_lat, 0.99) * 1000, 2),
        "mean_cycle_ms": round(statistics.fmean(
            [a + b for a, b in zip(claim_lat, complete_lat, strict=True)]) * 1000, 2),
    }


async def bench_joblease(config: EtcdConfig, cycles: int, concurrency: int,
                         history_limit: int = 0, root: str | None = None, *,
                         prefix: str = "job", etcd_pids: Sequence[int] = (),
                         rpc_endpoint: str | None = None) -> dict[str, Any]:
    """``root``: the key root (default a fresh one; a tenant's role is bound to it);
    ``prefix``: of the jobs' names (a fresh one per run on one root);
    ``rpc_endpoint``: an etcd whose gRPC calls per cycle (by method, from its
    metrics, read just before and after the timed part) go in ``rpcs_per_cycle``."""
    async with JobLeaseClient(config.with_(root=root or f"/bench/jl-{uuid.uuid4().hex[:6]}")
                              ) as c:
        # Every job's spec stays cached, as a long-lived worker's jobs' do: with more
        # jobs than the cache holds (1024), the warm-up below would be evicted and
        # every claim would pay a spec read the raw side never sends.
        c._spec_cache_size = max(c._spec_cache_size, cycles)
        jobs = await register_jobs(c, cycles, prefix, history_limit)
        # Warm the per-job spec cache the way a long-lived worker has it, and
        # count that read separately (it is paid once per job, not per claim).
        t = time.perf_counter()
        sem = asyncio.Semaphore(64)

        async def warm(j: JobRef) -> None:
            async with sem:
                await c._spec(j, c.keys.job(j))

        await asyncio.gather(*(warm(j) for j in jobs))
        spec_reads_s = time.perf_counter() - t

        async def cycle(job: JobRef) -> tuple[float, float]:
            t0 = time.perf_counter()
            lease = await c.claim(job, "bench-worker")
            t1 = time.perf_counter()
            await lease.complete({"ok": True})
            return t1 - t0, time.perf_counter() - t1

        settle()
        before = cpu_cost.etcd_rpc_counts(rpc_endpoint) if rpc_endpoint else {}
        result = await run_pool(jobs, concurrency, cycle, etcd_pids)
        if rpc_endpoint:
            after = cpu_cost.etcd_rpc_counts(rpc_endpoint)
            result["rpcs_per_cycle"] = {
                m: round((n - before.get(m, 0)) / max(result["cycles"], 1), 3)
                for m, n in after.items() if n != before.get(m, 0)}
        result["spec_cache_fill_s"] = round(spec_reads_s, 3)
        return result


async def bench_raw(config: EtcdConfig, cycles: int, concurrency: int, *,
                    root: str | None = None, prefix: str = "job",
                    etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    """``root``, ``prefix``, ``etcd_pids``: as :func:`bench_joblease`'s."""
    root = root or f"/bench/raw-{uuid.uuid4().hex[:6]}"
    async with JobLeaseClient(config.with_(root=root)) as c:
        jobs = await register_jobs(c, cycles, prefix)
        store = c.store
        _, kvs = await store.get(c.keys.namespace_prefix("bench"), prefix=True)
        spec_rev = {kv.key: kv.mod_revision for kv in kvs}
        # Never kept alive (the raw side has no keep-alive task): a TTL far longer
        # than any pool, so a slow one (a loaded machine: 2,000 cycles at c=1 took
        # over 30 s) does not outlive its holders' lease and fail its completions.
        lease_id, _ = await store.grant(RAW_LEASE_TTL)
        holder_value = json.dumps({"owner": "bench-worker", "claimId": "x" * 32, "ttl": 30,
                                   "claimedAt": time.time()}).encode()
        result_value = json.dumps({"owner": "bench-worker", "claimId": "x" * 32, "token": 0,
                                   "generation": 1, "result": {"ok": True},
                                   "completedAt": time.time()}).encode()

        async def cycle(job: JobRef) -> tuple[float, float]:
            k = c.keys.job(job)
            t0 = time.perf_counter()
            r = await store.txn(
                [Compare(k.spec, "mod", "==", spec_rev[k.spec]),
                 Compare(k.holder, "create", "==", 0),
                 Compare(k.result, "version", "==", 0), Compare(k.claims, "version", "<", 3)],
                [Put(k.holder, holder_value, lease=lease_id), Put(k.claims, b"{}"),
                 Get(k.claims), Get(k.checkpoint)],
                [Get(k.spec), Get(k.holder), Get(k.result), Get(k.claims)])
            assert r.succeeded
            t1 = time.perf_counter()
            r2 = await store.txn(
                [Compare(k.holder, "create", "==", r.revision),
                 Compare(k.holder, "value", "==", holder_value)],
                [Put(k.result, result_value), Delete(k.holder)],
                [Get(k.holder), Get(k.result)])
            assert r2.succeeded
            return t1 - t0, time.perf_counter() - t1

        settle()
        out = await run_pool(jobs, concurrency, cycle, etcd_pids)
        await store.revoke(lease_id)
        return out


#: the sides of one round in each of the six orders, a round after another: over six
#: rounds each side runs first, second and third twice (and next to each other side)
_ORDERS = list(itertools.permutations(("raw", "off", "history")))


async def paired(config: EtcdConfig, cycles: int, concurrency: int, rounds: int, *,
                 first_history: bool, etcd_pids: Sequence[int] = ()
                 ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The raw side and the joblease side without and with a history, in ``rounds``
    rounds of ``cycles / rounds`` cycles each, their order changing each round (see
    ``_ORDERS``; ``first_history`` starts at its other end); per side, cycles/s over
    the sums, latencies the median of the rounds'; and the CPU per cycle of the
    joblease sides (bench/cpu_cost.py: medians of paired rounds)."""
    per_round = max(cycles // rounds, 20)
    runs: dict[str, list[dict[str, Any]]] = {"raw": [], "off": [], "history": []}
    costs: list[cpu_cost.RoundCost] = []
    orders = _ORDERS[::-1] if first_history else _ORDERS
    for r in range(rounds):
        for side in orders[r % len(orders)]:
            if side == "raw":
                runs["raw"].append(await bench_raw(config, per_round, concurrency,
                                                   etcd_pids=etcd_pids))
                continue
            limit = HISTORY_LIMIT if side == "history" else 0
            result, cost = await cpu_cost.measured(
                side, functools.partial(bench_joblease, config, per_round, concurrency, limit,
                                        etcd_pids=etcd_pids))
            runs[side].append(result)
            costs.append(cost)

    def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
        total, seconds = sum(x["cycles"] for x in results), sum(x["seconds"] for x in results)
        out: dict[str, Any] = {"cycles": total, "seconds": round(seconds, 3),
                               "cycles_per_s": round(total / seconds, 1), "rounds": len(results),
                               "round_cycles_per_s": [x["cycles_per_s"] for x in results]}
        for key in ("claim_p50_ms", "claim_p99_ms", "complete_p50_ms", "complete_p99_ms"):
            out[key] = round(statistics.median(x[key] for x in results), 2)
        return out

    return (merged(runs["raw"]), merged(runs["off"]), merged(runs["history"]),
            cpu_cost.summarize(costs, "off", "history"))


async def history_at_limit(config: EtcdConfig, limit: int) -> dict[str, Any]:
    """etcd keys and bytes of one job whose history is full: ``limit + 5`` claims,
    each with a checkpoint and a release (so every tenure has its 3 keys)."""
    async with JobLeaseClient(config.with_(root=f"/bench/hist-{uuid.uuid4().hex[:6]}")) as c:
        job = JobRef("bench", "history-at-limit")
        await c.register(job, JobSpec(30, 0, history_limit=limit))
        for _ in range(limit + 5):
            lease = await c.claim(job, "bench-worker-7d9f-x2k4q")
            await lease.checkpoint({"offset": 123456})
            await lease.release()
        keys = c.keys.job(job)
        _, history = await c.store.get(keys.history.prefix, prefix=True)
        _, own = await c.store.get(keys.prefix, prefix=True)
        return {"limit": limit, "claims": limit + 5,
                "history_keys": len(history),
                "history_bytes": sum(len(kv.key) + len(kv.value) for kv in history),
                "job_keys": len(own), "job_bytes": sum(len(kv.key) + len(kv.value) for kv in own),
                "tenures": len((await c.history(job)).tenures)}


async def main_async(args: argparse.Namespace, endpoints: tuple[str, ...],
                     etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    config = EtcdConfig(endpoints=endpoints)
    rows = []
    for n, conc in enumerate(args.concurrency):
        cycles = max(args.cycles if conc > 1 else args.cycles // 6, 50)
        # the three sides in the same rounds, their order changing, so that none
        # always runs first, or on a fuller etcd, or in a quieter minute
        raw, jl, hist, cpu = await paired(config, cycles, conc, args.rounds,
                                          first_history=n % 2 == 1, etcd_pids=etcd_pids)
        rows.append({"concurrency": conc, "joblease": jl, "raw": raw, "history": hist,
                     "history_cpu": cpu,
                     "ratio_cycles": round(jl["cycles_per_s"] / raw["cycles_per_s"], 3),
                     "ratio_history": round(hist["cycles_per_s"] / jl["cycles_per_s"], 3)})
    return {"benchmark": "claims", "etcd_endpoints": list(endpoints), "rows": rows,
            "history_at_limit": await history_at_limit(config, HISTORY_LIMIT)}


#: The JobLease default (validation.DEFAULT_HISTORY_LIMIT), measured on the history side.
HISTORY_LIMIT = 10
#: The raw side's one etcd lease, granted per pool and revoked after it (seconds).
RAW_LEASE_TTL = 3600


def print_table(report: dict[str, Any]) -> None:
    print(f"{'conc':>4}  {'side':<9} {'cycles/s':>9} {'claim p50':>9} {'claim p99':>9} "
          f"{'compl p50':>9} {'compl p99':>9}")
    for row in report["rows"]:
        for side in ("raw", "joblease", "history"):
            r = row[side]
            print(f"{row['concurrency']:>4}  {side:<9} {r['cycles_per_s']:>9} "
                  f"{r['claim_p50_ms']:>7}ms {r['claim_p99_ms']:>7}ms "
                  f"{r['complete_p50_ms']:>7}ms {r['complete_p99_ms']:>7}ms")
        print(f"{row['concurrency']:>4}  ratio joblease/raw cycles/s = {row['ratio_cycles']}")
        print(f"{row['concurrency']:>4}  ratio history/joblease cycles/s = "
              f"{row['ratio_history']}")
        print(cpu_cost.format_row(f"c={row['concurrency']}", row["history_cpu"], "off",
                                  "history"))
    at = report["history_at_limit"]
    print(f"history at its limit ({at['limit']} tenures after {at['claims']} claims): "
          f"{at['history_keys']} keys, {at['history_bytes']} bytes "
          f"(the job's own prefix: {at['job_keys']} keys, {at['job_bytes']} bytes)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--rounds", type=int, default=6,
                        help="alternating rounds of the joblease and history sides")
    parser.add_argument("--endpoints", help="use this etcd instead of starting one")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    if args.endpoints:
        report = asyncio.run(main_async(args, tuple(args.endpoints.split(","))))
    else:
        with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
            report = asyncio.run(main_async(args, cluster.endpoints,
                                            cpu_cost.pids_of(cluster)))
            report["etcd_binary"] = cluster.binary
    print_table(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
