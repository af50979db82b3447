"""bench/claims.py's joblease side for several checkouts of the library and its
raw side, alternating round by round on one etcd, so a busy machine's swings
hit every side alike (bench/claims.py runs its raw side once, then the
library's rounds).

Each round runs, one process each: the joblease side of every ``--library``
checkout in turn (its ``operator/`` on ``PYTHONPATH``, this file's
bench/claims.py driving it), then the raw side (with the last checkout's
store), then, with ``--clientv3``, the same raw transactions through etcd's Go
client (bench/clientv3, built with ``go build``). Per side: its cycles over its
summed seconds, and the mean CPU per cycle of the process and of its main
thread (the event loop's; not measured for the Go client).

    python bench/claims_alternating.py --library main=/work/main --library branch=. \\
        --concurrency 1,8,64 --rounds 4
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def one_side(side: str, endpoints: str, cycles: int, concurrency: int) -> dict[str, Any]:
    """Run one side in this process (the child's entry point)."""
    import bench.claims as claims
    from joblease import EtcdConfig

    timed = claims.run_pool

    async def run_pool(*pool_args: Any) -> dict[str, Any]:
        cpu, main = time.process_time(), time.thread_time()
        result = await timed(*pool_args)
        result["cpu_us"] = 1e6 * (time.process_time() - cpu) / result["cycles"]
        result["main_us"] = 1e6 * (time.thread_time() - main) / result["cycles"]
        return result

    claims.run_pool = run_pool
    run = claims.bench_joblease if side == "joblease" else claims.bench_raw
    return asyncio.run(run(EtcdConfig(endpoints=tuple(endpoints.split(","))), cycles,
                           concurrency))


def child(side: str, library: Path, endpoints: str, cycles: int, concurrency: int
          ) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": f"{library / 'operator'}{os.pathsep}{ROOT}"}
    out = subprocess.run(
        [sys.executable, __file__, "--child", side, "--endpoints", endpoints,
         "--cycles", str(cycles), "--concurrency", str(concurrency)],
        env=env, check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def clientv3(binary: str, endpoints: str, cycles: int, concurrency: int) -> dict[str, Any]:
    """The raw side's transactions through etcd's Go client (bench/clientv3); its
    CPU is not measured (reported as 0)."""
    out = subprocess.run([binary, "--endpoints", endpoints, "--cycles", str(cycles),
                          "--concurrency", str(concurrency)],
                         check=True, capture_output=True, text=True).stdout
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return {"cycles": result["cycles"], "seconds": result["seconds"], "cpu_us": 0.0,
            "main_us": 0.0}


def alternate(args: argparse.Namespace, endpoints: str) -> None:
    libraries = [(name, Path(path).resolve()) for name, _, path in
                 (spec.partition("=") for spec in args.library)]
    for concurrency in args.concurrency:
        cycles = args.cycles if concurrency > 1 else max(args.cycles // 6, 50)
        print(f"concurrency {concurrency}, {cycles} cycles x {args.rounds} rounds; "
              f"load before {open('/proc/loadavg').read().strip()}", flush=True)
        sums: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for _ in range(args.rounds):
            sides = [(name, "joblease", path) for name, path in libraries]
            sides.append(("raw", "raw", libraries[-1][1]))
            if args.clientv3:
                sides.append(("clientv3", "clientv3", libraries[-1][1]))
            for name, side, path in sides:
                r = (clientv3(args.clientv3, endpoints, cycles, concurrency) if side == "clientv3"
                     else child(side, path, endpoints, cycles, concurrency))
                total = sums[name]
                total["cycles"] += r["cycles"]
                total["seconds"] += r["seconds"]
                total["cpu_us"] += r["cpu_us"]
                total["main_us"] += r["main_us"]
                total["runs"] += 1
        print(f"  load after {open('/proc/loadavg').read().strip()}")
        raw = sums["raw"]["cycles"] / sums["raw"]["seconds"]
        for name, total in sums.items():
            rate = total["cycles"] / total["seconds"]
            print(f"  {name:12s} {rate:8.1f} cycles/s  ratio to raw {rate / raw:5.2f}  "
                  f"CPU/cycle {total['cpu_us'] / total['runs']:7.1f} us (process) "
                  f"{total['main_us'] / total['runs']:7.1f} us (main thread)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--library", action="append", default=[],
                        help="NAME=PATH of a checkout (repeat); the raw side uses the last")
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8, 64])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--endpoints", help="use this etcd instead of starting one")
    parser.add_argument("--clientv3", help="bench/clientv3's binary: the raw transactions "
                        "through etcd's Go client, as one more side")
    parser.add_argument("--child", choices=("joblease", "raw"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = one_side(args.child, args.endpoints, args.cycles, args.concurrency[0])
        print(json.dumps({k: result[k] for k in ("cycles", "seconds", "cpu_us", "main_us")}))
        return
    if not args.library:
        args.library = [f"this={ROOT}"]
    if args.endpoints:
        alternate(args, args.endpoints)
        return
    from joblease.embedded import EtcdCluster

    binary = None
    try:  # the pinned build the tests use, as bench/claims.py does
        from tests.support.binaries import etcd_binary

        binary = etcd_binary()
    except Exception:
        pass
    with EtcdCluster(1, binary=binary) as cluster:
        alternate(args, ",".join(cluster.endpoints))


if __name__ == "__main__":
    main()
