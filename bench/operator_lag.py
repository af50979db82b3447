"""Operator status lag and resident memory, against a real kube-apiserver and etcd.

Issue 4: "Status lag (etcd change -> visible in the resource's status) p50/p99 with
1,000 JobLeases under a steady claim/complete load, and operator resident memory at
1,000 and 10,000 JobLeases." Issue 29 tightened the goals: RSS <= 150 MiB at 10,000
(untraced), p99 lag <= 1 s at 30 cycles/s at 10,000, fewer API writes per cycle.

What runs (all real processes on this machine):

- a ControlPlane (its own etcd + kube-apiserver, tests/support/controlplane.py) with
  the CRD from crds/ applied, and a *separate* etcd for joblease (EtcdCluster);
- the operator as ``python -m joblease.operator --namespace <ns>`` (the
  OperatorProcess helper of tests/kube/test_operator.py);
- N JobLeases created by direct REST POSTs (httpx, admin client cert), then a wait
  until every one is registered in etcd and carries a status (``settled``);
- a steady claim+complete load through JobLeaseClient (``--rate`` cycles/s, paced)
  while a Kubernetes WATCH on jobleases, in its own process so it does not share
  the load generator's event loop or GIL, stamps each status it sees.

Lag of one etcd change = (wall time the watch delivered a status of that JobLease
with ``status.etcdRevision >=`` the change's revision) - (wall time the etcd
transaction returned to the worker). The claim's revision is the fencing token
(create revision of the holder key), the completion's is ``ResultRecord.revision``.
A claim whose status was coalesced into the completion's counts as visible when the
completion's status is (the status then already reflects a newer state).

Memory: VmRSS (and VmHWM, the peak) of the operator process from /proc/<pid>/status
once settled at each N in ``--sizes`` (default 1000,10000).

API writes: the kube-apiserver's own ``apiserver_request_total`` counter (its
``/metrics``, read with the admin certificate) for every write verb, by resource,
before and after the load, divided by the cycles run: every write of the operator
(status PUTs, Event POSTs and PATCHes, kopf's patches) and nothing of the load
generator, which talks to etcd only.

``--tracemalloc``: the operator runs under tracemalloc (``bench/traced_operator.py``);
once settled at each size the bench asks it (SIGUSR2) for the live allocations,
grouped by the innermost non-stdlib frame. Tracing costs memory of its own (reported
as ``tracemalloc_overhead_mib``), so RSS of a traced run is not comparable with an
untraced one; run once with and once without. ``--heap-stats`` runs the same wrapper
without tracing and reports only what needs none (pymalloc's arenas, the resident
memory map, live objects by type): cheap enough for 10,000 JobLeases, RSS comparable.

``--baseline old.json``: print this run's figures beside a previous run's, with ratios.

``--reuse K``: instead of one claim+complete per job, claim+release the first K jobs
over and over (each job's cycles one after another; unlimited attempts), so every
job gets a Claimed and an Expired Event per cycle: the case Event aggregation is
for. Lag is then measured for claims only (a release returns no revision).

    python bench/operator_lag.py [--sizes 1000,10000] [--rate 30] [--duration 30]
                                 [--lag-at-each-size] [--tracemalloc | --heap-stats]
                                 [--baseline old.json]
                                 [--json bench/results/operator_lag.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import ssl
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct  # noqa: E402
from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from bench.report import save  # noqa: E402
from bench.traced_operator import memory_map  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient, JobRef  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402

GROUP_PATH = "/apis/joblease.io/v1alpha1"


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def proc_memory(pid: int) -> dict[str, Any]:
    """VmRSS, VmHWM (MiB) and where the resident pages are (``memory_map``)."""
    out: dict[str, Any] = {"map": memory_map(pid)}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = round(int(value.split()[0]) / 1024, 1)  # kB -> MiB
    return out


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def ssl_context(pki: Path) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


# --------------------------------------------------------------------------- the watcher
def watch_statuses(server: str, pki: str, namespace: str, out_path: str, ready_path: str
                   ) -> None:
    """Child process: LIST, then WATCH jobleases from that resourceVersion; append one
    line per event: ``time name etcdRevision phase generation``."""
    import httpx

    ctx = ssl_context(Path(pki))
    base = f"{server}{GROUP_PATH}/namespaces/{namespace}/jobleases"
    with httpx.Client(verify=ctx, timeout=httpx.Timeout(30, read=None)) as http, \
            open(out_path, "w", buffering=1) as out:
        rv = http.get(base, params={"limit": 1}).json()["metadata"]["resourceVersion"]
        params = {"watch": "1", "resourceVersion": rv, "timeoutSeconds": "3600"}
        with http.stream("GET", base, params=params) as resp:
            resp.raise_for_status()
            Path(ready_path).write_text("ready")
            for line in resp.iter_lines():
                now = time.time()
                if not line:
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                status = obj.get("status") or {}
                name = obj.get("metadata", {}).get("name", "")
                out.write(f"{now:.6f} {name} {int(status.get('etcdRevision') or 0)} "
                          f"{status.get('phase', '-')} {int(status.get('generation') or 0)}\n")


# --------------------------------------------------------------------------- the bench
class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        from tests.support.controlplane import ControlPlane
        from tests.support.operator import OperatorProcess

        class BenchOperator(OperatorProcess):
            """One operator, no leader election: a loaded (or traced) event loop that
            misses the tests' 5 s election TTL would make it step down mid-run, and
            the election is not what is measured."""

            def environment(self) -> dict[str, str]:
                return {**super().environment(), "JOBLEASE_LEADER_ELECTION": "false"}

        self.args = args
        self.tmp = Path(tempfile.mkdtemp(prefix="joblease-oplag-"))
        self.cp = ControlPlane().start()
        self.etcd = EtcdCluster(1, binary=etcd_binary_or_none()).start()
        self.ns = f"bench-{uuid.uuid4().hex[:6]}"
        self.config = EtcdConfig(endpoints=self.etcd.endpoints, root="/joblease/v1")
        self.cp.kubectl("apply", "-f", str(HERE.parent / "crds"), check=True)
        self.cp.kubectl("wait", "--for=condition=Established", "crd/jobleases.joblease.io",
                        "--timeout=60s", check=True)
        self.cp.kubectl("create", "namespace", self.ns, check=True)
        self.pki = self.cp.tmp / "pki"
        self.ssl = ssl_context(self.pki)
        self.base = f"{self.cp.server}{GROUP_PATH}/namespaces/{self.ns}/jobleases"
        self.op = BenchOperator(self.cp, self.config, self.ns, self.tmp / "operator.log")
        self.traced = args.tracemalloc or args.heap_stats
        if self.traced:
            self.op.module = "bench.traced_operator"
            if not args.tracemalloc:  # the summary's untraced parts only, RSS comparable
                os.environ["JOBLEASE_TRACEMALLOC_FRAMES"] = "0"
            self.trace_out = self.tmp / "tracemalloc.json"
            os.environ["JOBLEASE_TRACEMALLOC_OUT"] = str(self.trace_out)
        self.created = 0

    def close(self) -> None:
        self.op.stop()
        self.etcd.stop()
        self.cp.stop()

    @property
    def pid(self) -> int:
        assert self.op.proc is not None
        return self.op.proc.pid

    def without_history(self, name: str) -> bool:
        """``--split-history``: the odd-numbered JobLeases keep no history."""
        return bool(self.args.split_history) and int(name.rpartition("-")[2]) % 2 == 1

    async def create(self, upto: int) -> float:
        """POST JobLeases ``job-<created>`` .. ``job-<upto-1>``; return seconds taken."""
        import httpx

        start = time.perf_counter()
        names = [f"job-{i}" for i in range(self.created, upto)]
        sem = asyncio.Semaphore(32)
        limits = httpx.Limits(max_connections=32, max_keepalive_connections=32)
        async with httpx.AsyncClient(verify=self.ssl, limits=limits, timeout=60) as http:
            async def one(name: str) -> None:
                async with sem:
                    for attempt in range(5):
                        r = await http.post(self.base, json={
                            "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
                            "metadata": {"name": name},
                            "spec": {"leaseDurationSeconds": 30,
                                     "maxAttempts": 0 if self.args.reuse else 3,
                                     **({"historyLimit": 0} if self.without_history(name)
                                        else {})}})
                        if r.status_code in (201, 409):
                            return
                        await asyncio.sleep(0.5 * (attempt + 1))
                    r.raise_for_status()

            await asyncio.gather(*(one(n) for n in names))
        self.created = upto
        return time.perf_counter() - start

    async def tracemalloc_summary(self, timeout: float = 300) -> dict[str, Any]:
        """Ask the traced operator for its live allocations (SIGUSR2) and read them."""
        done = Path(f"{self.trace_out}.done")
        await asyncio.to_thread(done.unlink, missing_ok=True)
        os.kill(self.pid, signal.SIGUSR2)
        deadline = time.monotonic() + timeout
        while not await asyncio.to_thread(done.exists):
            if time.monotonic() > deadline:
                raise TimeoutError("no tracemalloc summary from the operator")
            await asyncio.sleep(0.5)
        summary: dict[str, Any] = json.loads(await asyncio.to_thread(self.trace_out.read_text))
        return summary

    async def api_writes(self) -> dict[str, float]:
        """The API server's write requests so far, by ``VERB resource[/subresource]``."""
        import httpx

        async with httpx.AsyncClient(verify=self.ssl, timeout=60) as http:
            text = (await http.get(f"{self.cp.server}/metrics")).text
        return count_writes(text)

    async def etcd_requests(self) -> dict[str, float]:
        """The joblease etcd's handled gRPC requests so far, by method (its
        ``/metrics``): the operator's reads (Range: the history's short form;
        LeaseTimeToLive: the lease estimate) and the load's claims and
        completions (Txn), which are the same per cycle in every run."""
        import httpx

        endpoint = self.etcd.endpoints[0]
        if "://" not in endpoint:
            endpoint = "http://" + endpoint  # the embedded etcd serves plain HTTP
        async with httpx.AsyncClient(timeout=60) as http:
            text = (await http.get(f"{endpoint}/metrics")).text
        return count_grpc(text)

    async def registered_in_etcd(self, client: JobLeaseClient) -> int:
        _, kvs = await client.store.get(client.keys.namespace_prefix(self.ns), prefix=True,
                                        keys_only=True)
        return sum(1 for kv in kvs if kv.key.endswith(b"/spec"))

    async def with_status(self) -> int:
        import httpx

        n, cont = 0, ""
        async with httpx.AsyncClient(verify=self.ssl, timeout=120) as http:
            while True:
                params = {"limit": "2000", **({"continue": cont} if cont else {})}
                body = (await http.get(self.base, params=params)).json()
                n += sum(1 for o in body["items"] if (o.get("status") or {}).get("phase"))
                cont = body["metadata"].get("continue") or ""
                if not cont:
                    return n

    async def settle(self, client: JobLeaseClient, n: int, timeout: float) -> dict[str, float]:
        """Wait until ``n`` jobs are registered in etcd and ``n`` statuses exist."""
        start = time.perf_counter()
        deadline = time.monotonic() + timeout
        registered_s = None
        while True:
            assert self.op.proc is not None and self.op.proc.poll() is None, "operator exited"
            if registered_s is None and await self.registered_in_etcd(client) >= n:
                registered_s = time.perf_counter() - start
            if registered_s is not None and await self.with_status() >= n:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"not settled at {n} JobLeases after {timeout:.0f}s; "
                                   f"etcd {await self.registered_in_etcd(client)}, "
                                   f"status {await self.with_status()}")
            await asyncio.sleep(2)
        return {"registered_s": round(registered_s, 2),
                "statuses_s": round(time.perf_counter() - start, 2)}

    async def lag_run(self, client: JobLeaseClient, first: int, last: int
                      ) -> dict[str, Any]:
        """Paced claim+complete on jobs first..last-1 while a watch stamps statuses."""
        rate, duration = self.args.rate, self.args.duration
        reuse = self.args.reuse
        if reuse:
            pool = [JobRef(self.ns, f"job-{i}") for i in range(first, first + reuse)]
            jobs = [pool[i % reuse] for i in range(int(rate * duration))]
        else:
            count = min(last - first, int(rate * duration))
            jobs = [JobRef(self.ns, f"job-{i}") for i in range(first, first + count)]
        for j in dict.fromkeys(jobs):  # the spec read a long-lived worker has cached already
            await client._spec(j, client.keys.job(j))
        turns = {j: asyncio.Lock() for j in jobs}  # one cycle of a job at a time
        out_path = self.tmp / f"watch-{first}.txt"
        ready_path = self.tmp / f"watch-{first}.ready"
        proc = mp.get_context("spawn").Process(
            target=watch_statuses, daemon=True,
            args=(self.cp.server, str(self.pki), self.ns, str(out_path), str(ready_path)))
        proc.start()
        while not ready_path.exists():
            assert proc.is_alive(), "watcher exited"
            await asyncio.sleep(0.05)
        changes: list[tuple[str, str, int, float]] = []  # kind, name, revision, t
        errors = 0
        sem = asyncio.Semaphore(self.args.concurrency)

        async def cycle(job: JobRef) -> None:
            nonlocal errors
            async with sem, turns[job]:
                try:
                    lease = await client.claim(job, "bench-worker")
                    changes.append(("claim", job.name, lease.token, time.time()))
                    if reuse:
                        await lease.release()
                        return
                    rec = await lease.complete({"ok": True})
                    changes.append(("complete", job.name, rec.revision, time.time()))
                except Exception:
                    errors += 1

        writes0 = await self.api_writes()
        etcd0 = await self.etcd_requests()
        cpu0 = proc_cpu_seconds(self.pid)
        load_before = loadavg()
        start = time.monotonic()
        tasks = []
        for i, job in enumerate(jobs):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(cycle(job)))
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - start
        load_during = loadavg()
        cpu = proc_cpu_seconds(self.pid) - cpu0
        # let the last statuses arrive, then stop the watcher
        last_rev = {name: rev for kind, name, rev, _ in changes
                    if kind == ("claim" if reuse else "complete")}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            seen = parse_watch(out_path)
            if all(any(r >= rev for _, r in seen.get(n, [])) for n, rev in last_rev.items()):
                break
            await asyncio.sleep(0.5)
        proc.terminate()
        proc.join(5)
        await asyncio.sleep(2)  # Events are posted after the status write
        writes1 = await self.api_writes()
        etcd1 = await self.etcd_requests()
        cycles = max(1, len(jobs) - errors)
        writes = {k: v - writes0.get(k, 0) for k, v in writes1.items()
                  if v - writes0.get(k, 0) > 0}
        seen = parse_watch(out_path)
        lags: dict[str, list[float]] = {"claim": [], "complete": []}
        missing = 0
        for kind, name, rev, t in changes:
            # >= rev: a status coalesced past this change shows it (or a newer state)
            visible = next((ts for ts, r in seen.get(name, []) if r >= rev), None)
            if visible is None:
                missing += 1
            else:
                lags[kind].append(visible - t)
        both = lags["claim"] + lags["complete"]
        split: dict[str, Any] = {}
        if self.args.split_history:
            for label, off in (("history", False), ("no_history", True)):
                split[f"lag_{label}_ms"] = summarize([
                    visible - t for kind, name, rev, t in changes
                    if self.without_history(name) == off
                    and (visible := next((ts for ts, r in seen.get(name, []) if r >= rev),
                                         None)) is not None])
        return {
            "jobleases": self.created, "reuse": reuse,
            "cycles": len(jobs) - errors, "errors": errors,
            "target_rate": rate, "achieved_rate": round((len(jobs) - errors) / elapsed, 1),
            "seconds": round(elapsed, 1), "changes": len(changes), "never_visible": missing,
            "lag_ms": summarize(both), **split, "claim_lag_ms": summarize(lags["claim"]),
            "complete_lag_ms": summarize(lags["complete"]),
            "operator_cpu_s": round(cpu, 2),
            "operator_cpu_share": round(cpu / elapsed, 2),
            "loadavg_before": load_before, "loadavg_after": load_during,
            "operator_metrics": operator_metrics(self.op.metrics()),
            "api_writes": writes,
            "api_writes_per_cycle": round(sum(writes.values()) / max(1, len(jobs) - errors), 2),
            "etcd_requests_per_cycle": {
                method: round((etcd1[method] - etcd0.get(method, 0)) / cycles, 2)
                for method in sorted(etcd1) if etcd1[method] > etcd0.get(method, 0)},
            "event_writes_per_cycle": round(
                sum(v for k, v in writes.items() if k.split()[1] == "events")
                / max(1, len(jobs) - errors), 2),
        }


def summarize(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"count": 0}
    return {"count": len(values), "p50": round(pct(values, 0.5) * 1000, 1),
            "p99": round(pct(values, 0.99) * 1000, 1), "max": round(max(values) * 1000, 1),
            "min": round(min(values) * 1000, 1)}


def parse_watch(path: Path) -> dict[str, list[tuple[float, int]]]:
    seen: dict[str, list[tuple[float, int]]] = {}
    if not path.exists():
        return seen
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 5:
            seen.setdefault(parts[1], []).append((float(parts[0]), int(parts[2])))
    return seen


WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")


def count_writes(metrics_text: str) -> dict[str, float]:
    """Sum ``apiserver_request_total`` over write verbs, by ``VERB resource[/sub]``."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("apiserver_request_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        labels = dict(part.split("=", 1) for part in
                      labels_text[len("apiserver_request_total{"):-1].split(",") if "=" in part)
        labels = {k: v.strip('"') for k, v in labels.items()}
        if labels.get("verb") not in WRITE_VERBS:
            continue
        resource = labels.get("resource", "?")
        if labels.get("subresource"):
            resource += "/" + labels["subresource"]
        key = f"{labels['verb']} {resource}"
        out[key] = out.get(key, 0) + float(value)
    return out


def count_grpc(metrics_text: str) -> dict[str, float]:
    """Sum etcd's ``grpc_server_handled_total`` by ``grpc_method``."""
    out: dict[str, float] = {}
    for line in metrics_text.splitlines():
        if not line.startswith("grpc_server_handled_total{"):
            continue
        labels_text, _, value = line.rpartition(" ")
        method = labels_text.partition('grpc_method="')[2].partition('"')[0]
        out[method] = out.get(method, 0) + float(value)
    return out


def operator_metrics(text: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(("joblease_operator_status_patches_total{",
                            "joblease_operator_status_lag_seconds_sum",
                            "joblease_operator_status_lag_seconds_count",
                            "joblease_operator_watch_events_total ",
                            "joblease_operator_history_reads_total ")):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    bench = Bench(args)
    report: dict[str, Any] = {"benchmark": "operator_lag", "sizes": [], "lag": [],
                              "args_traced": args.tracemalloc}
    try:
        bench.op.start()
        await bench.op.wait_ready(120)
        await asyncio.sleep(3)
        report["operator_idle"] = {**proc_memory(bench.pid), "loadavg": loadavg()}
        async with JobLeaseClient(bench.config) as client:
            lag_jobs_start = 0
            for i, n in enumerate(args.sizes):
                created_s = await bench.create(n)
                settled = await bench.settle(client, n, timeout=args.settle_timeout)
                await asyncio.sleep(args.settle_extra)
                row = {"jobleases": n, "create_s": round(created_s, 2), **settled,
                       **proc_memory(bench.pid), "loadavg": loadavg()}
                if args.settle_later > args.settle_extra:
                    # idle keep-alive connections of the burst closed meanwhile (aiohttp: 15 s)
                    await asyncio.sleep(args.settle_later - args.settle_extra)
                    row["later"] = {"after_s": args.settle_later, **proc_memory(bench.pid)}
                if bench.traced:
                    row["tracemalloc"] = await bench.tracemalloc_summary()
                    print_tracemalloc(row["tracemalloc"])
                report["sizes"].append(row)
                print(f"N={n}: created in {row['create_s']} s, registered {row['registered_s']}"
                      f" s, statuses {row['statuses_s']} s, RSS {row['VmRSS']} MiB "
                      f"(peak {row['VmHWM']}; {row['map']}), load {row['loadavg']}"
                      + (f"; {row['later']}" if "later" in row else ""), flush=True)
                if i == 0 or args.lag_at_each_size:
                    lag = await bench.lag_run(client, lag_jobs_start, n)
                    lag_jobs_start = n
                    lag.update({f"after_{k}": v for k, v in proc_memory(bench.pid).items()})
                    report["lag"].append(lag)
                    print_lag(lag)
    finally:
        bench.close()
    report["goals"] = goals(report)
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "uname": " ".join(os.uname())}
    return report


#: Issue 29's targets: RSS at 10,000 JobLeases, p99 status lag at 30 cycles/s.
RSS_GOAL_MIB = 150
LAG_GOAL_MS = 1000


def goals(report: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lag in report["lag"]:
        if lag["lag_ms"].get("count"):
            p99 = lag["lag_ms"]["p99"]
            out[f"p99_lag_at_{lag['jobleases']}_ms"] = p99
            out[f"p99_lag_goal_met_at_{lag['jobleases']}"] = p99 <= LAG_GOAL_MS
    at_10000 = next((r for r in report["sizes"] if r["jobleases"] == 10000), None)
    if at_10000:
        out["rss_at_10000_mib"] = at_10000["VmRSS"]
        out["rss_goal_met"] = at_10000["VmRSS"] <= RSS_GOAL_MIB and not report["args_traced"]
    return out


def print_tracemalloc(t: dict[str, Any], top: int = 15) -> None:
    if "traced_mib" in t:
        print(f"tracemalloc: {t['traced_mib']} MiB live in traced blocks, peak "
              f"{t.get('traced_peak_mib', '-')} MiB (+{t['tracemalloc_overhead_mib']} MiB "
              "tracemalloc's own)")
        print("  by package: " + ", ".join(f"{k} {v}" for k, v in t["by_package_mib"].items()))
    for row in t.get("top_owners", [])[:top]:
        print(f"  {row['mib']:>8.2f} MiB {row['blocks']:>8} blocks  {row['where']}")
    for row in t.get("top_tracebacks", [])[:top // 2]:
        print(f"  {row['mib']:>8.2f} MiB {row['blocks']:>8} blocks  "
              + " -> ".join(row["frames"][-6:]))  # oldest call first
    print(f"  pymalloc: {t.get('pymalloc')}\n  memory map: {t.get('memory_map')}")
    print("  objects (count, MiB): " + ", ".join(
        f"{k} {v[0]} {v[1]}" for k, v in list(t.get("object_sizes", {}).items())[:15]))


def print_lag(lag: dict[str, Any]) -> None:
    print(f"\nlag at {lag['jobleases']} JobLeases, {lag['cycles']} cycles at "
          f"{lag['achieved_rate']}/s (target {lag['target_rate']}), errors {lag['errors']}, "
          f"never visible {lag['never_visible']}, load {lag['loadavg_after']}")
    print(f"{'change':<10} {'count':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for label, key in (("claim", "claim_lag_ms"), ("complete", "complete_lag_ms"),
                       ("all", "lag_ms"), ("history", "lag_history_ms"),
                       ("no history", "lag_no_history_ms")):
        if key not in lag:
            continue
        s = lag[key]
        print(f"{label:<10} {s.get('count', 0):>6} {s.get('p50', '-'):>8} "
              f"{s.get('p99', '-'):>8} {s.get('max', '-'):>8}")
    print(f"operator CPU {lag['operator_cpu_s']} s ({lag['operator_cpu_share']} core), "
          f"RSS after {lag.get('after_VmRSS')} MiB", flush=True)
    if "api_writes" in lag:
        print(f"API writes per cycle {lag['api_writes_per_cycle']} (Events "
              f"{lag['event_writes_per_cycle']}): " + ", ".join(
                  f"{k} {v:.0f}" for k, v in sorted(lag["api_writes"].items())), flush=True)
    if "etcd_requests_per_cycle" in lag:
        print("etcd requests per cycle (operator and load): " + ", ".join(
            f"{k} {v}" for k, v in lag["etcd_requests_per_cycle"].items()), flush=True)


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{'JobLeases':>9} {'create s':>9} {'etcd reg s':>10} {'status s':>9} "
          f"{'RSS MiB':>8} {'peak MiB':>8}  loadavg")
    idle = report.get("operator_idle", {})
    print(f"{0:>9} {'-':>9} {'-':>10} {'-':>9} {idle.get('VmRSS', '-'):>8} "
          f"{idle.get('VmHWM', '-'):>8}  {idle.get('loadavg')}")
    for r in report["sizes"]:
        print(f"{r['jobleases']:>9} {r['create_s']:>9} {r['registered_s']:>10} "
              f"{r['statuses_s']:>9} {r['VmRSS']:>8} {r['VmHWM']:>8}  {r['loadavg']}")
    for lag in report["lag"]:
        print_lag(lag)
    print("\ngoals:", json.dumps(report["goals"]))


def figures(report: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of a report, for side-by-side comparison."""
    out: dict[str, float] = {}
    for r in report.get("sizes", []):
        out[f"RSS MiB at {r['jobleases']}"] = r["VmRSS"]
        if "tracemalloc" in r:
            out[f"traced MiB at {r['jobleases']}"] = r["tracemalloc"]["traced_mib"]
    for lag in report.get("lag", []):
        n = lag["jobleases"]
        if lag["lag_ms"].get("count"):
            out[f"lag p50 ms at {n}"] = lag["lag_ms"]["p50"]
            out[f"lag p99 ms at {n}"] = lag["lag_ms"]["p99"]
        for label in ("history", "no_history"):
            if lag.get(f"lag_{label}_ms", {}).get("count"):
                out[f"lag p50 ms {label} at {n}"] = lag[f"lag_{label}_ms"]["p50"]
                out[f"lag p99 ms {label} at {n}"] = lag[f"lag_{label}_ms"]["p99"]
        out[f"operator CPU core at {n}"] = lag["operator_cpu_share"]
        if "api_writes_per_cycle" in lag:
            out[f"API writes/cycle at {n}"] = lag["api_writes_per_cycle"]
            out[f"Event writes/cycle at {n}"] = lag["event_writes_per_cycle"]
        for method in ("Range", "LeaseTimeToLive"):
            if method in lag.get("etcd_requests_per_cycle", {}):
                out[f"etcd {method}/cycle at {n}"] = lag["etcd_requests_per_cycle"][method]
    return out


def print_comparison(baseline: dict[str, Any], report: dict[str, Any]) -> None:
    old, new = figures(baseline), figures(report)
    print(f"\n{'figure':<28} {'baseline':>10} {'this run':>10} {'ratio':>7}")
    for key in new:
        if key in old:
            ratio = f"{new[key] / old[key]:.2f}" if old[key] else "-"
            print(f"{key:<28} {old[key]:>10} {new[key]:>10} {ratio:>7}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1000, 10000], help="JobLease counts, ascending")
    parser.add_argument("--rate", type=float, default=30.0, help="claim+complete cycles/s")
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of load")
    parser.add_argument("--concurrency", type=int, default=16,
                        help="cycles in flight at most")
    parser.add_argument("--lag-at-each-size", action="store_true",
                        help="also measure lag at every size, not only the first")
    parser.add_argument("--settle-timeout", type=float, default=1800.0)
    parser.add_argument("--settle-extra", type=float, default=5.0,
                        help="seconds to wait after settling before reading RSS")
    parser.add_argument("--settle-later", type=float, default=0.0,
                        help="seconds after settling to read RSS a second time (0: not)")
    parser.add_argument("--reuse", type=int, default=0, metavar="K",
                        help="claim+release the first K jobs repeatedly instead of one "
                             "claim+complete per job (repeated Events)")
    parser.add_argument("--tracemalloc", action="store_true",
                        help="run the operator under tracemalloc and report its live "
                             "allocations at each size (costs memory: RSS not comparable)")
    parser.add_argument("--heap-stats", action="store_true",
                        help="untraced, but at each size report pymalloc's arenas, the "
                             "memory map and live objects by type (RSS comparable)")
    parser.add_argument("--split-history", action="store_true",
                        help="odd-numbered JobLeases keep no history (historyLimit 0): the "
                             "lag of jobs with and without status.recentTenures, one run")
    parser.add_argument("--baseline", help="a previous run's JSON: print figures side by side")
    parser.add_argument("--json", default=str(HERE / "results" / "operator_lag.json"))
    args = parser.parse_args()
    baseline = json.loads(Path(args.baseline).read_text()) if args.baseline else None
    report = asyncio.run(run(args))
    report["args"] = {k: v for k, v in vars(args).items() if k != "json"}
    print_table(report)
    if baseline is not None:
        print_comparison(baseline, report)
    save(report, args.json)


if __name__ == "__main__":
    main()
