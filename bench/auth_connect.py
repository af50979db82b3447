"""A tenant's first request on a new connection (authenticate, then one read)
with etcd's default bcrypt work factor against the chart's ``etcd.bcryptCost`` 4.

Every sidecar start, operator connect and re-authentication after a token's
expiry pays etcd's password check once; etcd compares the password with bcrypt
at the work factor the user's password was stored with (``--bcrypt-cost`` when
the user was added). Two etcds of the same binary, started by this run: one with
etcd's default (10), one with ``--bcrypt-cost=4``; each gets a tenant as the
operator makes one (a 256-bit generated password). The connects alternate
between the two, and the ratio of medians is printed.

    python bench/auth_connect.py [--connects 30] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.tenancy import enable_auth, ensure_namespace_tenant

ROOT_PASSWORD = "bench-root-" + uuid.uuid4().hex
ROOT = "/bench/auth-connect"


async def tenant(endpoints: tuple[str, ...]) -> EtcdConfig:
    plain = EtcdConfig(endpoints=endpoints)
    async with EtcdStore(plain) as store:
        await enable_auth(store, ROOT_PASSWORD)
    async with EtcdStore(plain.with_(username="root", password=ROOT_PASSWORD)) as admin:
        creds = await ensure_namespace_tenant(admin, ROOT, "bench", password=None)
    return creds.etcd_config(plain)


async def connect_once(config: EtcdConfig) -> float:
    """Milliseconds from a new client to its first read's answer (authentication included)."""
    start = time.perf_counter()
    async with EtcdStore(config) as store:
        await store.get(f"{ROOT}/bench/probe".encode())
    return (time.perf_counter() - start) * 1000


async def main_async(connects: int, sides: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    configs = {name: await tenant(endpoints) for name, endpoints in sides.items()}
    times: dict[str, list[float]] = {name: [] for name in sides}
    for i in range(connects):
        order = list(configs) if i % 2 == 0 else list(reversed(configs))
        for name in order:
            times[name].append(await connect_once(configs[name]))
    rows = {name: {"p50_ms": round(statistics.median(t), 2),
                   "p90_ms": round(statistics.quantiles(t, n=10)[-1], 2),
                   "min_ms": round(min(t), 2)} for name, t in times.items()}
    return {"benchmark": "auth_connect", "connects": connects, "sides": rows,
            "ratio_p50_default_over_4": round(rows["default"]["p50_ms"]
                                              / rows["bcrypt4"]["p50_ms"], 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connects", type=int, default=30)
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    binary = etcd_binary_or_none()
    with EtcdCluster(1, binary=binary) as default, \
            EtcdCluster(1, binary=binary,
                        extra_args=("--unsafe-no-fsync", "--bcrypt-cost=4")) as cheap:
        report = asyncio.run(main_async(args.connects, {"default": default.endpoints,
                                                        "bcrypt4": cheap.endpoints}))
        report["etcd_binary"] = default.binary
    print("side      connect+auth+read p50 / p90 / min (ms)")
    for name, row in report["sides"].items():
        print(f"{name:<9} {row['p50_ms']:>8} / {row['p90_ms']} / {row['min_ms']}")
    print(f"default (bcrypt 10) / bcrypt 4, p50: {report['ratio_p50_default_over_4']}x")
    save(report, args.json)


if __name__ == "__main__":
    main()
