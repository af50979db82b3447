"""Claim+complete cycles/s with etcd auth and a per-namespace tenant role, against
auth off: the cost of isolation by default on the hot path.

Two etcds of the same binary and flags, started by this run: one without auth,
one with auth on and the benchmark's namespace as a tenant (``joblease-ns-bench``,
READWRITE on ``<root>/bench/`` only, exactly as the operator makes it). The same
``bench_joblease`` loop (bench/claims.py) runs against each, alternating which goes
first per concurrency, and the ratio auth/no-auth is printed (target >= 0.9).

    python bench/auth_claims.py [--cycles 3000] [--concurrency 1,64] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.claims import bench_joblease
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.etcd_store import EtcdStore
from joblease.tenancy import enable_auth, ensure_namespace_tenant

ROOT_PASSWORD = "bench-root-" + uuid.uuid4().hex


async def tenant_config(endpoints: tuple[str, ...], root: str) -> EtcdConfig:
    """Auth on, the ``bench`` namespace's tenant: its credentials."""
    plain = EtcdConfig(endpoints=endpoints)
    async with EtcdStore(plain) as store:
        await enable_auth(store, ROOT_PASSWORD)
    async with EtcdStore(plain.with_(username="root", password=ROOT_PASSWORD)) as admin:
        creds = await ensure_namespace_tenant(admin, root, "bench")
    return creds.etcd_config(plain)


async def main_async(args: argparse.Namespace, open_endpoints: tuple[str, ...],
                     auth_endpoints: tuple[str, ...]) -> dict[str, Any]:
    rows = []
    for i, conc in enumerate(args.concurrency):
        cycles = max(args.cycles if conc > 1 else args.cycles // 6, 50)
        root = f"/bench/auth-{uuid.uuid4().hex[:6]}"
        tenant = await tenant_config(auth_endpoints, root) if i == 0 else await \
            _tenant_again(auth_endpoints, root)
        runs: dict[str, dict[str, Any]] = {}
        order = ("open", "auth") if i % 2 == 0 else ("auth", "open")
        for side in order:
            if side == "open":
                runs[side] = await bench_joblease(EtcdConfig(endpoints=open_endpoints),
                                                  cycles, conc)
            else:
                runs[side] = await bench_joblease(tenant, cycles, conc, root=root)
        rows.append({"concurrency": conc, **runs,
                     "ratio_cycles": round(runs["auth"]["cycles_per_s"]
                                           / runs["open"]["cycles_per_s"], 3)})
    return {"benchmark": "auth_claims", "rows": rows}


async def _tenant_again(endpoints: tuple[str, ...], root: str) -> EtcdConfig:
    """The tenant for another key root (auth is already on)."""
    plain = EtcdConfig(endpoints=endpoints)
    async with EtcdStore(plain.with_(username="root", password=ROOT_PASSWORD)) as admin:
        creds = await ensure_namespace_tenant(admin, root, "bench", password=None)
    return creds.etcd_config(plain)


def print_table(report: dict[str, Any]) -> None:
    print(f"{'conc':>4}  {'side':<5} {'cycles/s':>9} {'claim p50':>9} {'claim p99':>9} "
          f"{'compl p50':>9} {'compl p99':>9}")
    for row in report["rows"]:
        for side in ("open", "auth"):
            r = row[side]
            print(f"{row['concurrency']:>4}  {side:<5} {r['cycles_per_s']:>9} "
                  f"{r['claim_p50_ms']:>7}ms {r['claim_p99_ms']:>7}ms "
                  f"{r['complete_p50_ms']:>7}ms {r['complete_p99_ms']:>7}ms")
        print(f"{row['concurrency']:>4}  ratio auth+tenant role / auth off, cycles/s = "
              f"{row['ratio_cycles']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    binary = etcd_binary_or_none()
    with EtcdCluster(1, binary=binary) as open_etcd, EtcdCluster(1, binary=binary) as auth_etcd:
        report = asyncio.run(main_async(args, open_etcd.endpoints, auth_etcd.endpoints))
        report["etcd_binary"] = open_etcd.binary
    print_table(report)
    save(report, args.json)


if __name__ == "__main__":
    main()
