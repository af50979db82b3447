"""joblease side by side with what users would otherwise pick, in one run.

Claim+complete cycles/s and p50/p99 cycle latency at concurrency 1, 8, 64 for:

- **raw etcd txn**: the same two transactions joblease sends (claim, complete),
  bare, through the same gRPC client: the physical ceiling for this client;
- **joblease**: the library (``claim`` then ``complete``);
- **etcd mutex recipe**: etcd's ``concurrency.Mutex`` algorithm (what
  ``etcdctl lock`` does): put a key bound to a lease under the lock prefix if
  absent, read the prefix's lowest create revision (owner check), write the
  result, delete the key: three round trips per cycle;
- **Kubernetes Lease CAS**: a ``coordination.k8s.io/v1`` Lease through a real
  kube-apiserver, client-go leader-election style: GET, then PUT with the
  resourceVersion to take it, then PUT to hand it back with the result.

Also: failover time (SIGKILL of a holder process until another worker's claim
succeeds, against the floor TTL + etcd's 0.5 s expiry check) and renewal cost
(etcd requests per second while one client holds 1,000 leases).

    python bench/compare.py [--quick] [--json bench/results/compare.json] [--plot out.png]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import RAW_LEASE_TTL, bench_joblease, bench_raw, pct  # noqa: E402
from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from joblease import EtcdConfig, HeldError, JobLeaseClient, JobRef, JobSpec  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402
from joblease.store import Compare, Delete, Get, Put  # noqa: E402


def summarize(latencies: list[float], elapsed: float, concurrency: int) -> dict[str, Any]:
    return {"cycles": len(latencies), "seconds": round(elapsed, 3),
            "cycles_per_s": round(len(latencies) / elapsed, 1) if elapsed else 0.0,
            "p50_ms": round(pct(latencies, 0.5) * 1000, 2),
            "p99_ms": round(pct(latencies, 0.99) * 1000, 2), "concurrency": concurrency}


async def pool(items: list[Any], concurrency: int, cycle: Any) -> dict[str, Any]:
    queue = list(reversed(items))
    lat: list[float] = []

    async def worker() -> None:
        while queue:
            item = queue.pop()
            t = time.perf_counter()
            await cycle(item)
            lat.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return summarize(lat, time.perf_counter() - start, concurrency)


def from_claims_bench(r: dict[str, Any], concurrency: int) -> dict[str, Any]:
    # bench.claims records claim and completion latencies separately
    return {"cycles": r["cycles"], "seconds": r["seconds"], "cycles_per_s": r["cycles_per_s"],
            "p50_ms": round(r["claim_p50_ms"] + r["complete_p50_ms"], 2),
            "p99_ms": round(r["claim_p99_ms"] + r["complete_p99_ms"], 2),
            "concurrency": concurrency}


async def bench_mutex(config: EtcdConfig, cycles: int, concurrency: int) -> dict[str, Any]:
    """etcd's concurrency.Mutex recipe, one lock per job, uncontended."""
    root = f"/bench/mutex-{uuid.uuid4().hex[:6]}"
    async with JobLeaseClient(config.with_(root=root)) as c:
        store = c.store
        # never kept alive: it must outlive the pool at any load (as bench/claims.py's raw side)
        lease_id, _ = await store.grant(RAW_LEASE_TTL)

        async def cycle(i: int) -> None:
            prefix = f"{root}/lock-{i}/".encode()
            key = prefix + f"{lease_id:x}".encode()
            r = await store.txn([Compare(key, "create", "==", 0)],
                                [Put(key, b"", lease=lease_id)], [Get(key)])
            _, owners = await store.get(prefix, prefix=True)
            mine = r.revision if r.succeeded else (r.kv(0).create_revision if r.kv(0) else 0)
            assert min(o.create_revision for o in owners) == mine
            await store.txn([], [Put(f"{root}/result-{i}".encode(), b'{"ok":true}'),
                                 Delete(key)])

        out = await pool(list(range(cycles)), concurrency, cycle)
        await store.revoke(lease_id)
        return out


class KubeLeases:
    """Lease CAS through the real kube-apiserver (tests/support/controlplane.py)."""

    def __init__(self) -> None:
        from tests.support.controlplane import ControlPlane

        self.cp = ControlPlane().start()
        pki = self.cp.tmp / "pki"
        self.ssl = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ssl.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def close(self) -> None:
        self.cp.stop()

    async def bench(self, cycles: int, concurrency: int) -> dict[str, Any]:
        import httpx

        ns = "default"
        base = f"{self.cp.server}/apis/coordination.k8s.io/v1/namespaces/{ns}/leases"
        tag = uuid.uuid4().hex[:6]
        limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
        async with httpx.AsyncClient(verify=self.ssl, limits=limits, timeout=30,
                                     http2=False) as http:
            sem = asyncio.Semaphore(32)

            async def create(i: int) -> None:
                async with sem:
                    r = await http.post(base, json={
                        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                        "metadata": {"name": f"job-{tag}-{i}"}, "spec": {}})
                    r.raise_for_status()

            await asyncio.gather(*(create(i) for i in range(cycles)))

            async def cycle(i: int) -> None:
                url = f"{base}/job-{tag}-{i}"
                obj = (await http.get(url)).json()
                assert not obj["spec"].get("holderIdentity")
                now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
                obj["spec"].update(holderIdentity="bench-worker", leaseDurationSeconds=30,
                                   acquireTime=now, renewTime=now,
                                   leaseTransitions=obj["spec"].get("leaseTransitions", 0) + 1)
                r = await http.put(url, json=obj)  # CAS on metadata.resourceVersion
                r.raise_for_status()
                obj = r.json()
                obj["spec"]["holderIdentity"] = ""
                obj["metadata"].setdefault("annotations", {})["result"] = '{"ok":true}'
                (await http.put(url, json=obj)).raise_for_status()

            return await pool(list(range(cycles)), concurrency, cycle)


HOLDER = """
import asyncio, sys
from joblease import EtcdConfig, JobLeaseClient, JobRef
async def main():
    cfg = EtcdConfig(endpoints=(sys.argv[1],), root=sys.argv[2])
    c = JobLeaseClient(cfg)
    lease = await c.claim(JobRef("bench", sys.argv[3]), "victim")
    print(lease.token, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def bench_failover(config: EtcdConfig, ttl: int, trials: int) -> dict[str, Any]:
    root = f"/bench/failover-{uuid.uuid4().hex[:6]}"
    cfg = config.with_(root=root)
    times: list[float] = []
    async with JobLeaseClient(cfg) as c:
        for i in range(trials):
            job = JobRef("bench", f"f-{i}")
            await c.register(job, JobSpec(ttl, 0))
            p = subprocess.Popen(  # noqa: ASYNC220 - a holder process to SIGKILL
                [sys.executable, "-c", HOLDER, config.endpoints[0], root, job.name],
                stdout=subprocess.PIPE, text=True,
                env={**os.environ, "PYTHONPATH": str(HERE.parent / "operator")})
            assert p.stdout is not None
            p.stdout.readline()
            await asyncio.sleep(ttl / 2)  # mid-lease, like a real crash
            p.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            p.wait()
            while True:
                try:
                    lease = await c.claim(job, "successor")
                    break
                except HeldError:
                    await asyncio.sleep(0.01)
            times.append(time.monotonic() - killed)
            await lease.release()
    floor = ttl + 0.5
    return {"ttl": ttl, "trials": trials, "floor_s": floor,
            "p50_s": round(pct(times, 0.5), 3), "p99_s": round(pct(times, 0.99), 3),
            "max_s": round(max(times), 3), "samples": [round(t, 3) for t in times]}


def etcd_request_count(member_url: str) -> int:
    text = urllib.request.urlopen(member_url + "/metrics", timeout=5).read().decode()
    total = 0
    for line in text.splitlines():
        if line.startswith("grpc_server_handled_total{"):
            total += int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("grpc_server_msg_received_total{") and "LeaseKeepAlive" in line:
            total += int(float(line.rsplit(" ", 1)[1]))
    return total


async def bench_renewal(config: EtcdConfig, member_url: str, leases: int, ttl: int,
                        window: float) -> dict[str, Any]:
    async with JobLeaseClient(config.with_(root=f"/bench/renew-{uuid.uuid4().hex[:6]}")) as c:
        jobs = [JobRef("bench", f"r-{i}") for i in range(leases)]
        sem = asyncio.Semaphore(64)

        async def hold(job: JobRef) -> Any:
            async with sem:
                await c.register(job, JobSpec(ttl, 0))
                return await c.claim(job, "holder")

        held = await asyncio.gather(*(hold(j) for j in jobs))
        await asyncio.sleep(ttl / 3 + 0.5)
        before = etcd_request_count(member_url)
        await asyncio.sleep(window)
        after = etcd_request_count(member_url)
        valid = sum(1 for h in held if h.valid)
        rate = (after - before) / window
        return {"held": leases, "still_valid": valid, "ttl": ttl, "window_s": window,
                "requests_per_s": round(rate, 1),
                "requests_per_s_per_1000": round(rate * 1000 / leases, 1)}


def plot(report: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, rows in report["throughput"].items():
        xs = [r["concurrency"] for r in rows]
        ax.plot(xs, [r["cycles_per_s"] for r in rows], marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrency")
    ax.set_ylabel("claim+complete cycles/s")
    ax.set_title("joblease vs alternatives (same machine, same run)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(args: argparse.Namespace, cluster: EtcdCluster) -> dict[str, Any]:
    config = EtcdConfig(endpoints=cluster.endpoints)
    kube = None if args.no_kube else KubeLeases()
    throughput: dict[str, list[dict[str, Any]]] = {
        "raw etcd txn": [], "joblease": [], "etcd mutex recipe": []}
    if kube:
        throughput["k8s Lease CAS"] = []
    try:
        for conc in args.concurrency:
            n = args.cycles if conc > 1 else max(50, args.cycles // 5)
            throughput["raw etcd txn"].append(from_claims_bench(
                await bench_raw(config, n, conc), conc))
            throughput["joblease"].append(from_claims_bench(
                await bench_joblease(config, n, conc), conc))
            throughput["etcd mutex recipe"].append(await bench_mutex(config, n, conc))
            if kube:
                throughput["k8s Lease CAS"].append(
                    await kube.bench(max(50, n // 4), conc))
    finally:
        if kube:
            kube.close()
    ratios = {}
    for i, conc in enumerate(args.concurrency):
        jl = throughput["joblease"][i]["cycles_per_s"]
        raw = throughput["raw etcd txn"][i]["cycles_per_s"]
        ratios[f"joblease/raw@{conc}"] = round(jl / raw, 3)
        ratios[f"joblease/mutex@{conc}"] = round(
            jl / throughput["etcd mutex recipe"][i]["cycles_per_s"], 3)
        if "k8s Lease CAS" in throughput:
            ratios[f"joblease/k8s@{conc}"] = round(
                jl / throughput["k8s Lease CAS"][i]["cycles_per_s"], 3)
    failover = await bench_failover(config, args.failover_ttl, args.failover_trials)
    renewal = await bench_renewal(config, cluster.members[0].client_url, args.renew_leases,
                                  ttl=10, window=args.renew_window)
    return {"throughput": throughput, "ratios": ratios, "failover": failover,
            "renewal": renewal}


def print_report(report: dict[str, Any]) -> None:
    print(f"\n{'system':<18} {'conc':>4} {'cycles/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for name, rows in report["throughput"].items():
        for r in rows:
            print(f"{name:<18} {r['concurrency']:>4} {r['cycles_per_s']:>9} {r['p50_ms']:>8} "
                  f"{r['p99_ms']:>8}")
    print("\nratios:", json.dumps(report["ratios"]))
    f = report["failover"]
    print(f"failover (TTL {f['ttl']} s, {f['trials']} trials): p50 {f['p50_s']} s, "
          f"p99 {f['p99_s']} s, floor {f['floor_s']} s")
    r = report["renewal"]
    print(f"renewal: {r['requests_per_s']} etcd requests/s for {r['held']} held leases "
          f"(TTL {r['ttl']} s) = {r['requests_per_s_per_1000']} per 1,000")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    parser.add_argument("--cycles", type=int, default=2000)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8, 64])
    parser.add_argument("--no-kube", action="store_true", help="skip the kube-apiserver side")
    parser.add_argument("--failover-ttl", type=int, default=5)
    parser.add_argument("--failover-trials", type=int, default=10)
    parser.add_argument("--renew-leases", type=int, default=1000)
    parser.add_argument("--renew-window", type=float, default=10.0)
    parser.add_argument("--json", default=str(HERE / "results" / "compare.json"))
    parser.add_argument("--plot", default=str(HERE / "results" / "compare.png"))
    args = parser.parse_args()
    if args.quick:
        args.cycles, args.failover_trials, args.failover_ttl = 200, 2, 2
        args.renew_leases, args.renew_window = 100, 3.0
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        report = asyncio.run(run(args, cluster))
        report["etcd_binary"] = cluster.binary
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "uname": " ".join(os.uname())}
    print_report(report)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {args.json}")
    try:
        plot(report, args.plot)
        print(f"plot: {args.plot}")
    except ImportError:
        print("plot skipped: pip install matplotlib", file=sys.stderr)


if __name__ == "__main__":
    main()

