"""The library's own Python per claim+complete cycle, apart from etcd and gRPC.

``bench/claims.py`` measures the library against its raw transactions on a
real etcd, where a busy machine moves both sides by more than the difference
between them. This runs the same two sides (``client.claim`` then
``lease.complete``; the raw side's exact ops, built per cycle as
``bench/claims.py``'s raw side builds them) over a store that answers every
transaction at once, in one process, alternating rounds, and reports the
main thread's CPU per cycle of each side and their difference: what the
library adds per cycle in Python (validation, claim id, records, the handle,
the session pool). Neither side converts its ops to protobuf or calls gRPC
(that cost is the same on both sides and is what ``bench/claims.py``'s raw
side measures); ``--build`` adds the conversion and serialisation of each
transaction (``EtcdStore``'s own functions) to both.

``--concurrency N`` keeps N cycles in flight at once (N workers, as
``bench/claims.py``'s pool does), so what the library keeps alive per cycle
in flight (handles, pending coroutines) is in the figure too.
Every cycle claims a job of its own whose spec is cached, as in
``bench/claims.py`` (a job claimed again is cheaper: ``--same-job``).
It measures CPU, never correctness: the store is not etcd and is no test.

    python bench/claim_overhead.py [--cycles 5000] [--rounds 5] [--build] [--same-job]
                                   [--concurrency 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, etcd_wire
from joblease.etcd_store import _writes
from joblease.store import Compare, Delete, Get, KeyValue, Put, TxnOp, TxnResult


class _KeepAlive:
    async def renew(self, timeout: float) -> int:
        return 30

    async def close(self) -> None:
        pass


class InstantStore:
    """Answers every transaction at once as committed (the success branch's reads
    find a ``claims`` key); one event-loop step per transaction, as a real
    answer costs at least."""

    def __init__(self, build: bool) -> None:
        self.revision = 100
        self.build = build

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        self.revision += 1
        if self.build:
            etcd_wire.txn_request(compares, success, failure)
            _writes((*success, *failure))
        responses: list[Any] = []
        for op in success:
            if isinstance(op, Get):
                responses.append([KeyValue(op.key, b"{}", 5, self.revision, 1, 0)]
                                 if op.key.endswith(b"/claims") else [])
            else:
                responses.append(1 if isinstance(op, Delete) else None)
        await asyncio.sleep(0)
        return TxnResult(True, self.revision, responses)

    async def grant(self, ttl: int) -> tuple[int, int]:
        return 7, ttl

    async def revoke(self, lease_id: int) -> None:
        pass

    def keep_alive(self, lease_id: int) -> _KeepAlive:
        return _KeepAlive()

    async def close(self) -> None:
        pass


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    store = InstantStore(args.build)
    client = JobLeaseClient(EtcdConfig(root="/bench/overhead"), store=store)  # type: ignore[arg-type]
    n_jobs = 1 if args.same_job else (2 * args.rounds + 2) * args.cycles
    client._spec_cache_size = max(client._spec_cache_size, n_jobs)
    jobs = [JobRef("bench", f"job-{i}") for i in range(n_jobs)]
    for job in jobs:  # every spec cached, as bench/claims.py's warm-up leaves them
        client._specs[job] = (5, JobSpec(30, 3))
        client._generations[job] = 0
    order = iter(jobs * (10**9 if args.same_job else 1))
    holder = json.dumps({"owner": "bench-worker", "claimId": "x" * 32, "ttl": 30,
                         "claimedAt": time.time()}).encode()

    async def library() -> None:
        lease = await client.claim(next(order), "bench-worker")
        await lease.complete({"ok": True})

    async def raw() -> None:
        k = client.keys.job(next(order))
        r = await store.txn(
            [Compare(k.spec, "mod", "==", 5), Compare(k.holder, "create", "==", 0),
             Compare(k.result, "version", "==", 0), Compare(k.claims, "version", "<", 3)],
            [Put(k.holder, holder, lease=7), Put(k.claims, b"{}"), Get(k.claims),
             Get(k.checkpoint)],
            [Get(k.spec), Get(k.holder), Get(k.result), Get(k.claims)])
        await store.txn(
            [Compare(k.holder, "create", "==", r.revision),
             Compare(k.holder, "value", "==", holder)],
            [Put(k.result, holder), Delete(k.holder)], [Get(k.holder), Get(k.result)])

    sides = {"library": library, "raw": raw}
    for side in sides.values():  # warm up
        for _ in range(args.cycles // 5):
            await side()
    runs: dict[str, list[float]] = {name: [] for name in sides}
    per_worker = max(args.cycles // args.concurrency, 1)

    async def worker(side: Any) -> None:
        for _ in range(per_worker):
            await side()

    for r in range(args.rounds):
        for name in (("library", "raw") if r % 2 == 0 else ("raw", "library")):
            t = time.thread_time()
            # --concurrency workers in flight at once, as bench/claims.py's pool
            await asyncio.gather(*(worker(sides[name]) for _ in range(args.concurrency)))
            runs[name].append(1e6 * (time.thread_time() - t) / (per_worker * args.concurrency))
    # the quietest round of each side: the least disturbed by the rest of the machine
    best = {name: min(values) for name, values in runs.items()}
    return {"benchmark": "claim_overhead", "build": args.build, "same_job": args.same_job,
            "concurrency": args.concurrency, "cycles": args.cycles, "rounds": args.rounds,
            "library_us": round(best["library"], 1), "raw_us": round(best["raw"], 1),
            "library_only_us": round(best["library"] - best["raw"], 1),
            "rounds_us": {k: [round(v, 1) for v in vs] for k, vs in runs.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--build", action="store_true",
                        help="also convert and serialise each transaction, on both sides")
    parser.add_argument("--concurrency", type=int, default=1,
                        help="cycles in flight at once (workers, as bench/claims.py's pool)")
    parser.add_argument("--same-job", action="store_true",
                        help="claim one job again and again instead of a job per cycle")
    args = parser.parse_args()
    report = asyncio.run(measure(args))
    print(f"main-thread CPU per cycle (quietest of {args.rounds} rounds of {args.cycles}): "
          f"library {report['library_us']} us, raw {report['raw_us']} us, "
          f"library only {report['library_only_us']} us "
          f"(build={args.build}, same_job={args.same_job}, "
          f"concurrency={args.concurrency}; load "
          f"{open('/proc/loadavg').read().split()[0]})")


if __name__ == "__main__":
    main()
