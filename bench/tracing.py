"""Claim+complete cycles/s with OpenTelemetry tracing on against off, same run.

Both sides are ``bench/claims.py``'s joblease side (``client.claim`` then
``lease.complete``) on one etcd, in one process. "on" exports every tenure and
completion span (two spans per cycle) over OTLP/HTTP to a real receiver process
(tests/support/otlp_receiver.py, on a free loopback port) through the SDK's
batch processor; "off" is the default (no OTEL_* variables). Rounds alternate
off/on so neither side always runs on a warmer etcd; the ratio on/off of the
summed cycles/s is printed, with the spans the receiver got.

    python bench/tracing.py [--cycles 1200] [--concurrency 1,64] [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import bench_joblease
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig, tracing
from joblease.embedded import EtcdCluster
from tests.support.otlp_receiver import OtlpReceiver


async def main_async(args: argparse.Namespace, endpoints: tuple[str, ...],
                     receiver: OtlpReceiver) -> dict[str, Any]:
    config = EtcdConfig(endpoints=endpoints)
    rows = []
    for conc in args.concurrency:
        cycles = max(args.cycles if conc > 1 else args.cycles // 4, 50)
        sides: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for _ in range(args.rounds):
            for side in ("off", "on"):
                tracing.configure(receiver.env("bench-tracing") if side == "on" else {})
                sides[side].append(await bench_joblease(config, cycles, conc))
                tracing.flush(timeout=30)
        tracing.configure({})
        rate = {side: round(sum(r["cycles_per_s"] for r in runs) / len(runs), 1)
                for side, runs in sides.items()}
        rows.append({"concurrency": conc, "cycles_per_round": cycles, "rounds": args.rounds,
                     "off": sides["off"], "on": sides["on"], "cycles_per_s": rate,
                     "ratio_on_off": round(rate["on"] / rate["off"], 3)})
    return {"benchmark": "tracing", "rows": rows}


def count_spans(report: dict[str, Any], receiver: OtlpReceiver) -> None:
    """How many of the "on" rounds' spans (two per cycle) the receiver got."""
    expected = 2 * sum(r["cycles_per_round"] * r["rounds"] for r in report["rows"])
    deadline = time.monotonic() + 30
    while len(receiver.spans()) < expected and time.monotonic() < deadline:
        time.sleep(0.2)  # polling the receiver's file under a deadline
    report.update(spans_expected=expected, spans_received=len(receiver.spans()))


def print_table(report: dict[str, Any]) -> None:
    print(f"{'conc':>4}  {'off cycles/s':>12} {'on cycles/s':>12} {'ratio on/off':>12}")
    for row in report["rows"]:
        rate = row["cycles_per_s"]
        print(f"{row['concurrency']:>4}  {rate['off']:>12} {rate['on']:>12} "
              f"{row['ratio_on_off']:>12}")
    print(f"spans received {report['spans_received']} of {report['spans_expected']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=1200)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    binary = etcd_binary_or_none()
    with tempfile.TemporaryDirectory() as tmp, EtcdCluster(1, binary=binary) as cluster:
        receiver = OtlpReceiver(Path(tmp))
        try:
            report = asyncio.run(main_async(args, cluster.endpoints, receiver))
            count_spans(report, receiver)
        finally:
            receiver.stop()
    print_table(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
