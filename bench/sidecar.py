"""Claim+complete through the sidecar's HTTP API, next to the library, same run.

A sidecar serves one job for the life of its process (one pod, one job), so a
cycle through it is: start ``python -m joblease.sidecar`` → it claims → the
worker reads ``GET /v1/lease`` → ``POST /v1/complete`` → SIGTERM. The figures
separate the process start (paid once per pod) from the HTTP part (what a
worker pays): ``lease visible → completion answered``, and the latency of
``GET /v1/lease`` on a held lease. The library baseline is one
``claim`` + ``complete`` in-process on the same etcd.

    python bench/sidecar.py [--cycles 24] [--concurrency 1,8]
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
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402


async def sidecar_cycle(config: EtcdConfig, job: JobRef, workdir: Path) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
    env.update({
        "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints), "JOBLEASE_ROOT": config.root,
        "JOBLEASE_JOB_NAME": job.name, "JOBLEASE_JOB_NAMESPACE": job.namespace,
        "POD_NAME": f"pod-{job.name}", "POD_UID": uuid.uuid4().hex[:8],
        "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PORT_FILE": str(workdir / "port"),
        "JOBLEASE_SIDECAR_PROBE_PORT": "off", "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
        "JOBLEASE_SIDECAR_ON_LOSS": "none", "JOBLEASE_SIDECAR_RATE_LIMIT": "off",
    })
    started = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "joblease.sidecar"], env=env,  # noqa: ASYNC220
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        port_file = workdir / "port"
        while not (port_file.exists() and port_file.read_text().strip()):  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        url = f"http://127.0.0.1:{port_file.read_text().strip()}"
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            while (r := await http.get("/v1/lease")).status_code != 200:  # noqa: ASYNC110
                await asyncio.sleep(0.005)
            held = time.perf_counter()
            token = r.json()["token"]
            gets = []
            for _ in range(20):
                t = time.perf_counter()
                await http.get("/v1/lease")
                gets.append(time.perf_counter() - t)
            t = time.perf_counter()
            done = await http.post("/v1/complete", json={"token": token, "result": {"ok": 1}})
            assert done.status_code == 200, done.text
            completed = time.perf_counter()
        return {"start_to_held": held - started, "complete_http": completed - t,
                "get_lease_p50": pct(gets, 0.5)}
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.to_thread(proc.wait, 10)


async def run(config: EtcdConfig, cycles: int, concurrency: int) -> dict[str, Any]:
    async with JobLeaseClient(config) as c:
        jobs = [JobRef("bench", f"sc-{uuid.uuid4().hex[:8]}") for _ in range(cycles)]
        for j in jobs:
            await c.register(j, JobSpec(30, 3))
        lib_jobs = [JobRef("bench", f"lib-{uuid.uuid4().hex[:8]}") for _ in range(cycles)]
        for j in lib_jobs:
            await c.register(j, JobSpec(30, 3))
        lib = []
        for j in lib_jobs:
            t = time.perf_counter()
            lease = await c.claim(j, "lib")
            await lease.complete({"ok": 1})
            lib.append(time.perf_counter() - t)
    results: list[dict[str, float]] = []
    queue = list(jobs)
    with tempfile.TemporaryDirectory() as tmp:

        async def worker() -> None:
            while queue:
                job = queue.pop()
                d = Path(tmp) / job.name
                d.mkdir()
                results.append(await sidecar_cycle(config, job, d))

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "concurrency": concurrency, "cycles": cycles,
        "sidecar_cycles_per_s": round(cycles / elapsed, 2),
        "start_to_held_p50_ms": round(pct([r["start_to_held"] for r in results], .5) * 1e3, 1),
        "complete_http_p50_ms": round(pct([r["complete_http"] for r in results], .5) * 1e3, 2),
        "complete_http_p99_ms": round(pct([r["complete_http"] for r in results], .99) * 1e3, 2),
        "get_lease_p50_ms": round(pct([r["get_lease_p50"] for r in results], .5) * 1e3, 2),
        "library_cycle_p50_ms": round(pct(lib, .5) * 1e3, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=24)
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 8])
    parser.add_argument("--json", default=str(HERE / "results" / "sidecar.json"))
    args = parser.parse_args()
    with EtcdCluster(1) as cluster:
        config = EtcdConfig(endpoints=cluster.endpoints, root="/bench-sidecar")
        rows = [asyncio.run(run(config, args.cycles, c)) for c in args.concurrency]
    for r in rows:
        print(json.dumps(r))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
