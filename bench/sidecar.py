"""The sidecar's cost per pod, in one run.

Every worker pod carries one sidecar (issue 19), so its footprint is multiplied
by the number of running jobs. The sidecar is the Go binary built from
``sidecar-go/`` by ``hack/build-sidecar`` (or ``$JOBLEASE_SIDECAR_GO``); the
retired Python sidecar's figures stay in docs/sidecar-go.md for comparison.
On one etcd:

- **cycles**: start the process → it claims → the worker reads
  ``GET /v1/lease`` → ``POST /v1/complete`` → SIGTERM. Reported: process start
  to lease held (paid once per pod), the latency of ``GET /v1/lease`` on a held
  lease and of ``POST /v1/complete`` (a completion transaction included: what a
  worker pays), and resident memory while holding (``VmRSS``, and the peak
  ``VmHWM``, from /proc);
- **holding**: one sidecar holding one lease (TTL 10 s) for ``--hold`` seconds:
  CPU in millicores (renewals only) and memory at the end;
- **image**: the size of the image that carries the sidecar (the archive
  ``hack/build-images`` wrote, listed in ``${JOBLEASE_CACHE}/images/index.json``;
  or ``--image-go``), and the binary's size.

Then a table. A sidecar that is not available (no binary, no image built) is
reported as such, with the reason, never left out silently. The library
baseline is one ``claim`` + ``complete`` in-process on the same etcd.

    python bench/sidecar.py [--cycles 24] [--concurrency 1,8] [--hold 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct  # noqa: E402
from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402
from tests.support import sidecar_impls  # noqa: E402

GETS_PER_CYCLE = 20
HOLD_TTL = 10


def proc_status(pid: int) -> dict[str, int]:
    """``VmRSS`` and ``VmHWM`` of ``pid`` in KiB (0 if gone)."""
    out = {"VmRSS": 0, "VmHWM": 0}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in out:
                out[key] = int(value.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return out


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def sidecar_env(config: EtcdConfig, job: JobRef, workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
    env.update({
        "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints), "JOBLEASE_ROOT": config.root,
        "JOBLEASE_JOB_NAME": job.name, "JOBLEASE_JOB_NAMESPACE": job.namespace,
        "POD_NAME": f"pod-{job.name}", "POD_UID": uuid.uuid4().hex[:8],
        "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PORT_FILE": str(workdir / "port"),
        "JOBLEASE_SIDECAR_PROBE_PORT": "off", "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
        "JOBLEASE_SIDECAR_ON_LOSS": "none", "JOBLEASE_SIDECAR_RATE_LIMIT": "off",
    })
    return env


async def _held(proc: subprocess.Popen[bytes], workdir: Path
                ) -> tuple[httpx.AsyncClient, dict[str, Any]]:
    """Wait (polling, 5 ms) for the port file and then for ``GET /v1/lease`` 200."""
    port_file = workdir / "port"
    deadline = time.monotonic() + 60
    while not (port_file.exists() and port_file.read_text().strip()):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"sidecar exited ({proc.poll()}) or never wrote its port")
        await asyncio.sleep(0.005)
    http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_file.read_text().strip()}",
                             timeout=10)
    while (r := await http.get("/v1/lease")).status_code != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            await http.aclose()
            raise RuntimeError(f"sidecar exited ({proc.poll()}) or never held: {r.text}")
        await asyncio.sleep(0.005)
    return http, r.json()


async def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    await asyncio.to_thread(proc.wait, 10)


async def sidecar_cycle(argv: list[str], config: EtcdConfig, job: JobRef, workdir: Path
                        ) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=sidecar_env(config, job, workdir),  # noqa: ASYNC220
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        http, lease = await _held(proc, workdir)
        held = time.perf_counter()
        try:
            gets = []
            for _ in range(GETS_PER_CYCLE):
                t = time.perf_counter()
                await http.get("/v1/lease")
                gets.append(time.perf_counter() - t)
            memory = proc_status(proc.pid)  # holding, after serving requests
            t = time.perf_counter()
            done = await http.post("/v1/complete",
                                   json={"token": lease["token"], "result": {"ok": 1}})
            assert done.status_code == 200, done.text
            completed = time.perf_counter()
        finally:
            await http.aclose()
        return {"start_to_held": held - started, "complete_http": completed - t,
                "gets": gets, "rss_kib": memory["VmRSS"], "hwm_kib": memory["VmHWM"]}
    finally:
        await _stop(proc)


async def cycles(argv: list[str], config: EtcdConfig, count: int, concurrency: int
                 ) -> dict[str, Any]:
    async with JobLeaseClient(config) as c:
        jobs = [JobRef("bench", f"sc-{uuid.uuid4().hex[:8]}") for _ in range(count)]
        for j in jobs:
            await c.register(j, JobSpec(30, 3))
    results: list[dict[str, Any]] = []
    queue = list(jobs)
    with tempfile.TemporaryDirectory() as tmp:

        async def worker() -> None:
            while queue:
                job = queue.pop()
                d = Path(tmp) / job.name
                d.mkdir()
                results.append(await sidecar_cycle(argv, config, job, d))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    gets = [g for r in results for g in r["gets"]]
    held = [r["start_to_held"] for r in results]
    completes = [r["complete_http"] for r in results]
    return {
        "concurrency": concurrency, "cycles": count,
        "cycles_per_s": round(count / elapsed, 2),
        "start_to_held_p50_ms": round(pct(held, .5) * 1e3, 1),
        "start_to_held_p99_ms": round(pct(held, .99) * 1e3, 1),
        "get_lease_p50_ms": round(pct(gets, .5) * 1e3, 2),
        "get_lease_p99_ms": round(pct(gets, .99) * 1e3, 2),
        "complete_http_p50_ms": round(pct(completes, .5) * 1e3, 2),
        "complete_http_p99_ms": round(pct(completes, .99) * 1e3, 2),
        "rss_p50_mib": round(pct([r["rss_kib"] for r in results], .5) / 1024, 1),
        "hwm_max_mib": round(max(r["hwm_kib"] for r in results) / 1024, 1),
    }


async def holding(argv: list[str], config: EtcdConfig, seconds: float) -> dict[str, Any]:
    """One sidecar holding one lease at TTL 10 s: CPU over ``seconds`` and memory."""
    job = JobRef("bench", f"hold-{uuid.uuid4().hex[:8]}")
    async with JobLeaseClient(config) as c:
        await c.register(job, JobSpec(HOLD_TTL, 3))
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        proc = subprocess.Popen(argv, env=sidecar_env(config, job, workdir),  # noqa: ASYNC220
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            http, lease = await _held(proc, workdir)
            try:
                cpu0, t0 = cpu_seconds(proc.pid), time.monotonic()
                await asyncio.sleep(seconds)  # the measurement window itself, not a wait
                cpu1, t1 = cpu_seconds(proc.pid), time.monotonic()
                still = await http.get("/v1/lease")
                assert still.status_code == 200 and still.json()["token"] == lease["token"], \
                    still.text  # it renewed throughout
            finally:
                await http.aclose()
            memory = proc_status(proc.pid)
        finally:
            await _stop(proc)
    return {"ttl": HOLD_TTL, "seconds": round(t1 - t0, 1),
            "cpu_millicores": round((cpu1 - cpu0) / (t1 - t0) * 1000, 2),
            "rss_mib": round(memory["VmRSS"] / 1024, 1),
            "hwm_mib": round(memory["VmHWM"] / 1024, 1)}


def image(impl: str, override: str | None) -> dict[str, Any]:
    """The image archive carrying ``impl``'s sidecar, from hack/build-images' index."""
    if override:
        path = Path(override)
    else:
        cache = Path(os.environ.get("JOBLEASE_CACHE") or Path.home() / ".cache" / "joblease")
        try:
            index = json.loads((cache / "images" / "index.json").read_text())
        except (OSError, ValueError):
            return {"missing": f"no image index at {cache / 'images' / 'index.json'} "
                               "(run hack/build-images)"}
        names = [e.get("name", "") for e in index]
        wanted = [n for n in names if "sidecar" in n]
        if not wanted:
            return {"missing": f"no {impl} sidecar image in the index (has {names})"}
        entry = next(e for e in index if e.get("name") == wanted[0])
        path = Path(entry["archive"])
    if not path.is_file():
        return {"missing": f"{path} does not exist"}
    return {"archive": str(path), "mb": round(path.stat().st_size / 1e6, 1)}


def size_mb(path: str) -> float:
    return round(os.path.getsize(path) / 1e6, 1)


async def library_baseline(config: EtcdConfig, count: int) -> float:
    async with JobLeaseClient(config) as c:
        jobs = [JobRef("bench", f"lib-{uuid.uuid4().hex[:8]}") for _ in range(count)]
        for j in jobs:
            await c.register(j, JobSpec(30, 3))
        lib = []
        for j in jobs:
            t = time.perf_counter()
            lease = await c.claim(j, "lib")
            await lease.complete({"ok": 1})
            lib.append(time.perf_counter() - t)
    return round(pct(lib, .5) * 1e3, 2)


async def run(args: argparse.Namespace, config: EtcdConfig) -> dict[str, Any]:
    report: dict[str, Any] = {"implementations": {}, "library_cycle_p50_ms":
                              await library_baseline(config, args.cycles)}
    for impl in args.impl:
        found, why = sidecar_impls.argv_or_reason(impl)
        entry: dict[str, Any] = {"image": image(impl, getattr(args, f"image_{impl}"))}
        if found is None:
            entry["missing"] = why
        else:
            argv = list(found)
            entry["argv"] = argv
            if impl == "go":
                entry["binary_mb"] = size_mb(argv[0])
            entry["cycles"] = [await cycles(argv, config, args.cycles, c)
                               for c in args.concurrency]
            entry["holding"] = await holding(argv, config, args.hold)
        report["implementations"][impl] = entry
    return report


def _rows(concurrency: list[int]) -> list[tuple[str, Any]]:
    """(label, the figure from one implementation's entry or None); lower is better."""
    rows: list[tuple[str, Any]] = []
    for i, c in enumerate(concurrency):
        for key, label in (("start_to_held_p50_ms", "start to held p50 ms"),
                           ("start_to_held_p99_ms", "start to held p99 ms"),
                           ("get_lease_p50_ms", "GET /v1/lease p50 ms"),
                           ("get_lease_p99_ms", "GET /v1/lease p99 ms"),
                           ("complete_http_p50_ms", "POST /v1/complete p50 ms"),
                           ("complete_http_p99_ms", "POST /v1/complete p99 ms"),
                           ("rss_p50_mib", "VmRSS holding p50 MiB"),
                           ("hwm_max_mib", "VmHWM max MiB")):
            rows.append((f"{label} (c={c})",
                         lambda e, i=i, key=key: e["cycles"][i][key] if "cycles" in e else None))
    for key, label in (("cpu_millicores", "CPU holding, millicores"),
                       ("rss_mib", "VmRSS after holding MiB"),
                       ("hwm_mib", "VmHWM after holding MiB")):
        rows.append((label, lambda e, key=key: e["holding"][key] if "holding" in e else None))
    rows.append(("image MB", lambda e: e["image"].get("mb")))
    rows.append(("binary MB", lambda e: e.get("binary_mb")))
    return rows


def print_report(report: dict[str, Any], concurrency: list[int]) -> None:
    impls = report["implementations"]
    names = list(impls)
    ratio = "python" in impls and "go" in impls
    print(f"\n{'':<32}" + "".join(f"{n:>12}" for n in names) + (f"{'python/go':>12}"
                                                                if ratio else ""))
    for label, get in _rows(concurrency):
        values = [get(impls[n]) for n in names]
        if all(v is None for v in values):
            continue
        line = f"{label:<32}" + "".join(f"{'n/a' if v is None else v:>12}" for v in values)
        if ratio:
            py, go = get(impls["python"]), get(impls["go"])
            line += f"{(f'{py / go:.1f}x' if py is not None and go else 'n/a'):>12}"
        print(line)
    print(f"\nlibrary claim+complete in-process p50: {report['library_cycle_p50_ms']} ms")
    for name, e in impls.items():
        if "missing" in e:
            print(f"{name}: NOT AVAILABLE: {e['missing']}")
        if "missing" in e["image"]:
            print(f"{name} image: not measured: {e['image']['missing']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--impl", type=lambda s: sidecar_impls.selected(s),
                        default=sidecar_impls.selected("go"),
                        help="implementations (go, the only one)")
    parser.add_argument("--cycles", type=int, default=24)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8])
    parser.add_argument("--hold", type=float, default=10.0,
                        help="seconds one sidecar holds a lease (TTL 10 s) for the CPU figure")
    parser.add_argument("--image-go", default=None, help="image archive (default: index)")
    parser.add_argument("--json", default=str(HERE / "results" / "sidecar.json"))
    args = parser.parse_args()
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        config = EtcdConfig(endpoints=cluster.endpoints, root="/bench-sidecar")
        report = asyncio.run(run(args, config))
        report["etcd_binary"] = cluster.binary
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "load_average": os.getloadavg()}
    print_report(report, args.concurrency)
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2))
    print(f"\nJSON: {args.json}")


if __name__ == "__main__":
    main()
