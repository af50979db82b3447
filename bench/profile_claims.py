"""Profile one side of ``bench/claims.py`` (joblease or raw) with py-spy, and say
where its CPU goes per claim+complete cycle.

py-spy (``pip install py-spy``; not a dependency of the project) samples the
interpreter's real stack. Under asyncio that stack is the event loop, the task
being stepped and the coroutine chain it is running (``claim`` ->
``_claim_on`` -> ``EtcdStore.txn`` -> gRPC), so the time spent inside
coroutines is charged to them, and a suspended coroutine, which costs nothing,
is not sampled: the right picture for CPU. It attaches only while the timed
pool of ``bench/claims.py`` runs (not the registration or the spec warm-up).
It does not see inside gRPC's Cython and C core (charged to the Python frame
that called it, ``UnaryUnaryCall._invoke`` mostly) and shows gRPC's poller
thread as ``Thread.run``. Each sample is charged to the innermost frame that
matches a category below; process and main-thread CPU per cycle are measured
too (``time.process_time``, ``time.thread_time``).

    python bench/profile_claims.py --side joblease --concurrency 64 --cycles 5000
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import bench.claims as claims
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster

#: (category, pattern of a frame): a sample goes to the first category matching
#: its innermost frame that matches any.
CATEGORIES = [
    ("idle: epoll wait, gRPC poller thread", r"EpollSelector.select|Thread.run|Thread._bootstrap"),
    ("tracing decorator (child_span)", r"child_span|tracing.py"),
    ("claim id (uuid)", r"uuid"),
    ("JSON encode/decode (stdlib json, records)", r"json/|records.py"),
    ("validation", r"validation.py"),
    ("Lease object, session attach/detach", r"Lease.__init__|Session.attach|Session.on_loss|"
                                            r"Lease._finish|Session.detach|remove_on_loss|locks.py"),
    ("session pool (for_claim, ready, using)", r"session_pool.py"),
    ("keys (JobKeys properties)", r"keys.py"),
    ("store op dataclasses (Compare/Put/Get)", r"__create_fn__"),
    ("request build (etcd_wire)", r"etcd_wire"),
    ("response decode (_txn_result/_response/_kv)", r"_txn_result|_response|_kv \("),
    ("claim code itself (client.py)", r"joblease/client.py"),
    ("completion code itself (lease.py)", r"joblease/lease.py"),
    ("bench loop (claims.py, asyncio.Queue)", r"bench/claims.py|queues.py"),
    ("gRPC call (invoke, channel, metadata, _call_raw)", r"grpc/|_call_raw|EtcdStore.txn|Metadata"),
    ("asyncio loop, tasks, futures", r"asyncio/"),
]


def categorise(raw_samples: str) -> collections.Counter[str]:
    """py-spy ``--format raw`` lines (``frame;frame;... count``) by category."""
    rules = [(name, re.compile(rx)) for name, rx in CATEGORIES]
    found: collections.Counter[str] = collections.Counter()
    for line in raw_samples.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not count.isdigit():
            continue
        frames = stack.split(";")
        name = next((n for f in reversed(frames) for n, rx in rules if rx.search(f)),
                    "other: " + frames[-1][:60])
        found[name] += int(count)
    return found


async def profiled(args: argparse.Namespace, config: EtcdConfig, out: Path) -> dict[str, Any]:
    timed = claims.run_pool

    async def run_pool(*pool_args: Any) -> dict[str, Any]:
        spy = await asyncio.create_subprocess_exec(
            args.py_spy, "record", "-r", str(args.rate), "--format", "raw", "-o", str(out),
            "--pid", str(os.getpid()), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1.0)  # py-spy attached
        cpu, main = time.process_time(), time.thread_time()
        try:
            result = await timed(*pool_args)
        finally:
            spy.send_signal(signal.SIGINT)
            await spy.wait()
        n = result["cycles"]
        result["process_cpu_us_per_cycle"] = round(1e6 * (time.process_time() - cpu) / n, 1)
        result["main_thread_cpu_us_per_cycle"] = round(1e6 * (time.thread_time() - main) / n, 1)
        return result

    claims.run_pool = run_pool
    side = claims.bench_joblease if args.side == "joblease" else claims.bench_raw
    return await side(config, args.cycles, args.concurrency)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--side", choices=("joblease", "raw"), default="joblease")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--cycles", type=int, default=5000)
    parser.add_argument("--rate", type=int, default=500, help="py-spy samples per second")
    parser.add_argument("--out", default="bench/results/profile-claims.txt",
                        help="py-spy's raw samples go here")
    parser.add_argument("--py-spy", default=shutil.which("py-spy") or str(
        Path(sys.executable).with_name("py-spy")))
    parser.add_argument("--endpoints", help="use this etcd instead of starting one")
    args = parser.parse_args()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.endpoints:
        result = asyncio.run(profiled(args, EtcdConfig(endpoints=tuple(
            args.endpoints.split(","))), out))
    else:
        binary = None
        try:  # the pinned build the tests use, as bench/claims.py does
            from tests.support.binaries import etcd_binary

            binary = etcd_binary()
        except Exception:
            pass
        with EtcdCluster(1, binary=binary) as cluster:
            result = asyncio.run(profiled(args, EtcdConfig(endpoints=cluster.endpoints), out))
    found = categorise(out.read_text())
    total = sum(found.values())
    print(f"{args.side} c={args.concurrency}: {result['cycles']} cycles, "
          f"{result['cycles_per_s']} cycles/s, CPU per cycle "
          f"{result['process_cpu_us_per_cycle']} us (process), "
          f"{result['main_thread_cpu_us_per_cycle']} us (main thread); "
          f"{total} samples at {args.rate} Hz")
    for name, count in found.most_common():
        print(f"  {name:52s} {100 * count / max(total, 1):5.1f}%")


if __name__ == "__main__":
    main()
