"""What sending an auth token costs the client: this process's CPU per etcd call
with a token-sized metadata entry against none, on the same etcd, same calls.

With auth on, every call of ``EtcdStore`` carries ``("token", <simple token>)``
as gRPC metadata; without, none. etcd ignores metadata keys it does not know,
so this sends the entry under another key to an etcd *without* auth: the
answers are byte for byte the same on both sides and only the client's
handling of the metadata differs. ``--rounds`` alternating rounds of
``--calls`` transactions each (the claim's shape is irrelevant here: a
one-key read-only transaction), at ``--concurrency``; the median of the paired
rounds' ratio of client CPU per call (bench/cpu_cost.py).

    python bench/auth_metadata.py [--calls 3000] [--rounds 6] [--concurrency 1,16]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.cpu_cost import Snapshot
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.store import Get

#: The shape of an etcd simple token (``<16 letters>.<index>``).
TOKEN = "AbCdEfGhIjKlMnOp.1234"


async def one_round(store: EtcdStore, calls: int, concurrency: int) -> dict[str, float]:
    left = [calls]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            await store.txn([], [Get(b"/bench/metadata/k")])

    snap = Snapshot.take()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    cost = snap.until(Snapshot.take())
    return {"client_cpu_us": 1e6 * cost["client_cpu_s"] / calls,
            "wall_us": 1e6 * cost["wall_s"] / calls}


async def main_async(args: argparse.Namespace, endpoints: tuple[str, ...]) -> dict[str, Any]:
    async with EtcdStore(EtcdConfig(endpoints=endpoints)) as store:
        plain = store._metadata

        async def with_token() -> tuple[tuple[str, str], ...]:
            return (("x-joblease-bench-token", TOKEN),)

        await store.put(b"/bench/metadata/k", b"v" * 64)
        rows = []
        for conc in args.concurrency:
            await one_round(store, 200, conc)  # warm
            sides: dict[str, list[dict[str, float]]] = {"none": [], "token": []}
            for r in range(args.rounds):
                for side in (("none", "token") if r % 2 == 0 else ("token", "none")):
                    store._metadata = with_token if side == "token" else plain  # type: ignore[method-assign]
                    sides[side].append(await one_round(store, args.calls, conc))
            store._metadata = plain  # type: ignore[method-assign]
            pairs = [b["client_cpu_us"] - a["client_cpu_us"]
                     for a, b in zip(sides["none"], sides["token"], strict=True)]
            rows.append({
                "concurrency": conc,
                **{side: {k: round(statistics.median(x[k] for x in runs), 2)
                          for k in ("client_cpu_us", "wall_us")} for side, runs in sides.items()},
                "token_extra_client_cpu_us_per_call": round(statistics.median(pairs), 2),
                "paired_extra_us": [round(p, 2) for p in pairs]})
    return {"benchmark": "auth_metadata", "calls": args.calls, "rounds": args.rounds,
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 16])
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    before = os.getloadavg()
    started = time.time()
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        report = asyncio.run(main_async(args, cluster.endpoints))
    report["loadavg_before"] = [round(x, 2) for x in before]
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    for row in report["rows"]:
        print(f"c={row['concurrency']:>3}  client CPU per call: no metadata "
              f"{row['none']['client_cpu_us']} us, token-sized entry "
              f"{row['token']['client_cpu_us']} us; median paired extra "
              f"{row['token_extra_client_cpu_us_per_call']} us per call "
              f"(pairs {row['paired_extra_us']})")
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}; "
          f"{time.time() - started:.1f} s")
    save(report, args.json)


if __name__ == "__main__":
    main()
