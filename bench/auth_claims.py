"""Claim+complete cycles/s with etcd auth and a per-namespace tenant role, against
auth off: the cost of isolation by default on the hot path.

Two etcds of the same binary and flags, started by this run: one without auth,
one with auth on and the benchmark's namespace as a tenant (``joblease-ns-bench``,
READWRITE on ``<root>/bench/`` only, exactly as the operator makes it). The same
``bench_joblease`` loop (bench/claims.py) runs against each, alternating which goes
first per round (``--rounds``), and the ratio auth/no-auth is printed (target >= 0.9):
cycles/s over the rounds' sums, and beside it the medians of the paired rounds'
ratios of cycles/s and of CPU per cycle, the client's and etcd's
(bench/cpu_cost.py), which say where auth's cost sits. Each auth round connects
(and authenticates) once, before its timed part; the count of ``Authenticate``
calls etcd handled per round is printed to show it.

``--tls``: both etcds serve the client port as the chart's bundled etcd does
(mutual TLS: ``--client-cert-auth`` with a CA, server and client certificate
made for the run), so the ratio is the one a chart install sees; without it
both are plaintext, which isolates auth's own cost.

    python bench/auth_claims.py [--cycles 3000] [--concurrency 1,64] [--rounds 6]
                                [--bcrypt-cost 4] [--tls] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import ssl
import statistics
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cpu_cost
from bench.claims import bench_joblease
from bench.etcd_binary import etcd_binary_or_none
from bench.report import save
from joblease import EtcdConfig
from joblease.embedded import EtcdCluster, free_port
from joblease.etcd_store import EtcdStore
from joblease.tenancy import enable_auth, ensure_namespace_tenant
from tests.support.secure_etcd import write_pki

ROOT_PASSWORD = "bench-root-" + uuid.uuid4().hex


async def tenant_config(plain: EtcdConfig, root: str) -> EtcdConfig:
    """Auth on, the ``bench`` namespace's tenant: its credentials (``plain``: the
    etcd's endpoints and TLS, no user)."""
    async with EtcdStore(plain) as store:
        await enable_auth(store, ROOT_PASSWORD)
    async with EtcdStore(plain.with_(username="root", password=ROOT_PASSWORD)) as admin:
        creds = await ensure_namespace_tenant(admin, root, "bench")
    return creds.etcd_config(plain)


async def main_async(args: argparse.Namespace, open_etcd: EtcdCluster,
                     auth_etcd: EtcdCluster, tls: EtcdConfig,
                     metrics: dict[str, str]) -> dict[str, Any]:
    """``tls``: the client's TLS settings (no endpoints; empty: plaintext);
    ``metrics``: each side's plain-HTTP ``host:port`` serving etcd's /metrics."""
    open_endpoints, auth_endpoints = open_etcd.endpoints, auth_etcd.endpoints
    auth_plain = tls.with_(endpoints=auth_endpoints)
    pids = {"open": cpu_cost.pids_of(open_etcd), "auth": cpu_cost.pids_of(auth_etcd)}
    rows = []
    for i, conc in enumerate(args.concurrency):
        cycles = max(args.cycles if conc > 1 else args.cycles // 6, 50)
        per_round = max(cycles // args.rounds, 20)
        root = f"/bench/auth-{uuid.uuid4().hex[:6]}"
        tenant = await tenant_config(auth_plain, root) if i == 0 else await \
            _tenant_again(auth_plain, root)
        configs = {"open": tls.with_(endpoints=open_endpoints), "auth": tenant}
        roots = {"open": f"/bench/open-{uuid.uuid4().hex[:6]}", "auth": root}
        runs: dict[str, list[dict[str, Any]]] = {"open": [], "auth": []}
        costs: list[cpu_cost.RoundCost] = []
        authenticates: list[int] = []
        for r in range(args.rounds):
            # alternate per round, and the first round's order per row
            order = ("open", "auth") if (r + i) % 2 == 0 else ("auth", "open")
            for side in order:
                before = cpu_cost.etcd_rpc_counts(metrics["auth"])
                result, cost = await cpu_cost.measured(side, functools.partial(
                    bench_joblease, configs[side], per_round, conc, root=roots[side],
                    prefix=f"r{r}", etcd_pids=pids[side],
                    rpc_endpoint=metrics[side]))
                after = cpu_cost.etcd_rpc_counts(metrics["auth"])
                if side == "auth":
                    authenticates.append(after.get("Authenticate", 0)
                                         - before.get("Authenticate", 0))
                runs[side].append(result)
                costs.append(cost)
        merged = {side: _merged(results) for side, results in runs.items()}
        for side, results in runs.items():  # etcd's calls per cycle, the rounds' median
            methods = {m for x in results for m in x.get("rpcs_per_cycle", {})}
            merged[side]["rpcs_per_cycle"] = {m: statistics.median(
                x.get("rpcs_per_cycle", {}).get(m, 0) for x in results) for m in sorted(methods)}
        rows.append({"concurrency": conc, **merged,
                     "ratio_cycles": round(merged["auth"]["cycles_per_s"]
                                           / merged["open"]["cycles_per_s"], 3),
                     "authenticate_calls_per_auth_round": authenticates,
                     "cpu": cpu_cost.summarize(costs, "open", "auth")})
    return {"benchmark": "auth_claims", "rounds": args.rounds,
            "bcrypt_cost": args.bcrypt_cost, "tls": bool(tls.ca_file), "rows": rows}


def _merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """One side's rounds: cycles/s over the sums, latencies the median of the rounds'."""
    total, seconds = sum(x["cycles"] for x in results), sum(x["seconds"] for x in results)
    out: dict[str, Any] = {"cycles": total, "seconds": round(seconds, 3),
                           "cycles_per_s": round(total / seconds, 1),
                           "round_cycles_per_s": [x["cycles_per_s"] for x in results]}
    for key in ("claim_p50_ms", "claim_p99_ms", "complete_p50_ms", "complete_p99_ms"):
        out[key] = round(statistics.median(x[key] for x in results), 2)
    return out


async def _tenant_again(plain: EtcdConfig, root: str) -> EtcdConfig:
    """The tenant for another key root (auth is already on)."""
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
              f"{row['ratio_cycles']} (sums over the rounds); Authenticate calls per auth "
              f"round: {row['authenticate_calls_per_auth_round']}")
        print(f"{row['concurrency']:>4}  etcd calls per cycle: open "
              f"{row['open']['rpcs_per_cycle']}, auth {row['auth']['rpcs_per_cycle']}")
        print(cpu_cost.format_row(f"c={row['concurrency']}", row["cpu"], "open", "auth"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=3000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--rounds", type=int, default=6,
                        help="alternating rounds per concurrency, each of cycles/rounds cycles")
    parser.add_argument("--bcrypt-cost", type=int, default=4,
                        help="etcd's --bcrypt-cost, both etcds (default 4, the chart's)")
    parser.add_argument("--tls", action="store_true",
                        help="both etcds with mutual TLS, as the chart's bundled etcd")
    parser.add_argument("--json", help="write the report here")
    args = parser.parse_args()
    binary = etcd_binary_or_none()
    extra = ["--unsafe-no-fsync", f"--bcrypt-cost={args.bcrypt_cost}"]
    load_before = os.getloadavg()
    with contextlib.ExitStack() as stack:
        tls = EtcdConfig(endpoints=())
        serving: dict[str, Any] = {}
        if args.tls:
            pki = write_pki(Path(stack.enter_context(tempfile.TemporaryDirectory())))
            extra += ["--cert-file", str(pki.server_cert), "--key-file", str(pki.server_key),
                      "--client-cert-auth", "--trusted-ca-file", str(pki.ca)]
            tls = tls.with_(ca_file=str(pki.ca), cert_file=str(pki.client_cert),
                            key_file=str(pki.client_key))
            health = ssl.create_default_context(cafile=str(pki.ca))
            health.load_cert_chain(str(pki.client_cert), str(pki.client_key))
            serving = {"client_scheme": "https", "health_ssl_context": health}
        # /metrics on a plain-HTTP port of its own (the client port may be TLS)
        metrics = {side: f"127.0.0.1:{free_port()}" for side in ("open", "auth")}
        open_etcd, auth_etcd = (stack.enter_context(EtcdCluster(
            1, binary=binary, extra_args=[*extra, "--listen-metrics-urls",
                                          f"http://{metrics[side]}"], **serving))
            for side in ("open", "auth"))
        report = asyncio.run(main_async(args, open_etcd, auth_etcd, tls, metrics))
        report["etcd_binary"] = open_etcd.binary
    report["loadavg_before"] = [round(x, 2) for x in load_before]
    report["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    print_table(report)
    print(f"load average before {report['loadavg_before']}, after {report['loadavg_after']}")
    save(report, args.json)


if __name__ == "__main__":
    main()
