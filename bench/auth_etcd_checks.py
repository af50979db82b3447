"""What etcd's auth costs etcd per key it checks: etcd CPU per write transaction
with auth and a tenant role against auth off, as the transaction names more keys.

etcd (3.6) checks a tenant's permission once per compare and once per request
of the success *and* failure branches of every transaction, each check reading
the user from its auth store; a claim names about 12 keys, a completion 6. This
sends write transactions of one put plus ``N`` compares (``version < 2**40`` on
keys of the tenant's prefix: always true, no key need exist) for each
``--keys`` N (and, with ``--claims``, the claim's and the completion's own
transactions: bench/claims.py's raw side, no library code), to two etcds of
the same binary and flags (one without auth, one with auth on and the tenant,
bench/auth_claims.py's set-up), in alternating
paired rounds, and reports etcd's CPU per transaction (bench/cpu_cost.py) on
each side and the difference (per transaction; per cycle for the claims); its
growth with N is the cost of one check.

    python bench/auth_etcd_checks.py [--txns 2000] [--rounds 6] [--keys 0,16,64] [--claims 1500]
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpu_cost
from bench.auth_claims import tenant_config
from bench.claims import bench_raw
from bench.cpu_cost import Snapshot
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.store import Compare, Put


async def one_round(store: EtcdStore, prefix: bytes, txns: int, keys: int,
                    concurrency: int, pids: list[int]) -> dict[str, Any]:
    compares = [Compare(prefix + f"c{i}".encode(), "version", "<", 1 << 40) for i in range(keys)]
    left = [txns]

    async def worker(w: int) -> None:
        while left[0] > 0:
            left[0] -= 1
            r = await store.txn(compares, [Put(prefix + f"p{w}".encode(), b"x" * 64)])
            assert r.succeeded

    snap = Snapshot.take(pids)
    await asyncio.gather(*(worker(w) for w in range(concurrency)))
    return {"cycles": txns, "cpu": snap.until(Snapshot.take(pids))}


async def main_async(args: argparse.Namespace, open_etcd: EtcdCluster,
                     auth_etcd: EtcdCluster) -> dict[str, Any]:
    root = f"/bench/checks-{uuid.uuid4().hex[:6]}"
    prefix = f"{root}/bench/".encode()  # the tenant's range
    tenant = await tenant_config(auth_etcd.endpoints, root)
    configs = {"open": EtcdConfig(endpoints=open_etcd.endpoints), "auth": tenant}
    pids = {"open": cpu_cost.pids_of(open_etcd), "auth": cpu_cost.pids_of(auth_etcd)}
    rows = []
    async with EtcdStore(configs["open"]) as plain, EtcdStore(configs["auth"]) as authed:
        stores = {"open": plain, "auth": authed}
        for side in stores:  # connect, authenticate, warm
            await one_round(stores[side], prefix, 200, 4, args.concurrency, pids[side])
        for keys in args.keys:
            costs: list[cpu_cost.RoundCost] = []
            for r in range(args.rounds):
                for side in (("open", "auth") if r % 2 == 0 else ("auth", "open")):
                    _, cost = await cpu_cost.measured(side, functools.partial(
                        one_round, stores[side], prefix, args.txns, keys, args.concurrency,
                        pids[side]))
                    costs.append(cost)
            summary = cpu_cost.summarize(costs, "open", "auth")
            extra = [1000 * (b.per_cycle_ms()["etcd_cpu_ms"] or 0)
                     - 1000 * (a.per_cycle_ms()["etcd_cpu_ms"] or 0)
                     for a, b in cpu_cost.pairs(costs, "open", "auth")]
            rows.append({"keys": keys, "checks_per_txn": keys + 1, "txns_per_cycle": 1,
                         "open_etcd_cpu_us": round(1000 * summary["open"]["etcd_cpu_ms"], 1),
                         "auth_etcd_cpu_us": round(1000 * summary["auth"]["etcd_cpu_ms"], 1),
                         "auth_extra_etcd_cpu_us": round(statistics.median(extra), 1),
                         "paired_extra_us": [round(x, 1) for x in extra], "cpu": summary})
    if args.claims:
        # the claim's and the completion's own transactions (bench/claims.py's raw
        # side: 18 keys checked per cycle, no library code), on fresh jobs per round
        costs = []
        for r in range(args.rounds):
            for side in (("open", "auth") if r % 2 == 0 else ("auth", "open")):
                _, cost = await cpu_cost.measured(side, functools.partial(
                    bench_raw, configs[side], args.claims, args.concurrency, root=root,
                    prefix=f"r{r}-{side}", etcd_pids=pids[side]))
                costs.append(cost)
        summary = cpu_cost.summarize(costs, "open", "auth")
        extra = [1000 * ((b.per_cycle_ms()["etcd_cpu_ms"] or 0)
                         - (a.per_cycle_ms()["etcd_cpu_ms"] or 0))
                 for a, b in cpu_cost.pairs(costs, "open", "auth")]
        rows.append({"keys": "claim+complete", "checks_per_txn": 18, "txns_per_cycle": 2,
                     "open_etcd_cpu_us": round(1000 * summary["open"]["etcd_cpu_ms"], 1),
                     "auth_etcd_cpu_us": round(1000 * summary["auth"]["etcd_cpu_ms"], 1),
                     "auth_extra_etcd_cpu_us": round(statistics.median(extra), 1),
                     "paired_extra_us": [round(x, 1) for x in extra], "cpu": summary})
    return {"benchmark": "auth_etcd_checks", "txns": args.txns, "rounds": args.rounds,
            "concurrency": args.concurrency, "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--txns", type=int, default=2000, help="per round and side")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--keys", type=lambda s: [int(x) for x in s.split(",")],
                        default=[0, 16, 64])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--claims", type=int, default=1500,
                        help="raw claim+complete cycles per round and side (0: none)")
    parser.add_argument("--bcrypt-cost", type=int, default=4)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    binary = etcd_binary_or_none()
    extra = ("--unsafe-no-fsync", f"--bcrypt-cost={args.bcrypt_cost}")
    before, started = os.getloadavg(), time.time()
    with EtcdCluster(1, binary=binary, extra_args=extra) as open_etcd, \
            EtcdCluster(1, binary=binary, extra_args=extra) as auth_etcd:
        report = asyncio.run(main_async(args, open_etcd, auth_etcd))
    report["loadavg_before"] = [round(x, 2) for x in before]
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print(f"write txns (1 put + N compares) at concurrency {args.concurrency}, etcd CPU per txn; "
          "median of paired rounds")
    print(f"{'N':>14} {'checks':>6} {'auth off us':>11} {'auth on us':>10} {'extra us':>9}")
    for row in report["rows"]:
        print(f"{row['keys']:>14} {row['checks_per_txn']:>6} {row['open_etcd_cpu_us']:>11} "
              f"{row['auth_etcd_cpu_us']:>10} {row['auth_extra_etcd_cpu_us']:>9}   "
              f"(pairs {row['paired_extra_us']})")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}; "
          f"{time.time() - started:.1f} s")
    save(report, args.json)


if __name__ == "__main__":
    main()
