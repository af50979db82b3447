"""The Go sidecar's start → held, step by step, against an etcd set up like the chart's.

Issue 25 asks for start → held <= 50 ms + one round trip in a pod. This bench
breaks one start down on the host, against one etcd started as the chart's
bundled etcd is: mutual TLS (``--client-cert-auth`` with a CA made here), auth
on (a root user, and a tenant user and role limited to its namespace's prefix,
as the operator makes them), ``--bcrypt-cost=4``, fsync on (no
``--unsafe-no-fsync``: every raft write of a start waits for the disk, as in
the pod). Each start is a fresh process with the pod's settings (CA, client
certificate, the tenant's user and password file) claiming a job of its own.

Measured per start: Popen → the token file exists (polled every 0.2 ms), and,
from a sidecar that logs it, its ``start timeline`` debug line: each step's
offset from the top of ``main`` and duration (config, etcd client, listen,
connect = TCP + TLS until gRPC calls the connection ready, authenticate, spec
read, lease grant, claim, token files). "before main" is the Popen → token
file time minus the timeline's total: exec, the Go runtime and package
initialisation (and the poll's granularity); the same is measured alone as
``--help``'s Popen → exit, three times ``--starts`` times per binary.

Several binaries alternate start by start in one run (``--binary NAME=PATH``,
repeated; default: this tree's build), so a change is measured beside its
baseline at the same load; the report prints each binary's p50 over the first
one's. ``--delay-ms 0,5`` also runs every binary from a network namespace this
bench starts (tests/support/proxy.py's ``DelayingProxy``, in a process of its
own: every byte etcd sends reaches the sidecar that much later, so each round
trip after the TCP handshake, the TLS handshake's included, costs that much
more; the proxy's own hop is in those figures too). This machine's kernel has
no ``netem`` qdisc, so a delaying network namespace is not possible here.

    python bench/sidecar_start.py [--starts 12] [--binary main=/tmp/sidecar-main --binary new=...]
                                  [--delay-ms 0,5] [--lease-ttl-hint 30 [--hinted new]]
                                  [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from bench.report import save  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402
from joblease.etcd_store import EtcdStore  # noqa: E402
from joblease.tenancy import enable_auth, ensure_namespace_tenant  # noqa: E402
from tests.support.binaries import go_sidecar_binary  # noqa: E402
from tests.support.secure_etcd import Pki, write_pki  # noqa: E402

ROOT_PASSWORD = "bench-root-" + uuid.uuid4().hex
ROOT = "/bench/start"
NAMESPACE = "bench"
TTL = 30


def load() -> str:
    return " / ".join(Path("/proc/loadavg").read_text().split()[:3])


@contextlib.contextmanager
def delaying_proxy(upstream_port: int, delay_ms: float) -> Iterator[str]:
    """A DelayingProxy to 127.0.0.1:upstream_port in a process of its own; its endpoint."""
    code = ("import asyncio, sys\n"
            "from tests.support.proxy import DelayingProxy\n"
            "async def main():\n"
            f"    p = DelayingProxy('127.0.0.1', {upstream_port}, {delay_ms / 1000})\n"
            "    await p.start()\n"
            "    print(p.endpoint, flush=True)\n"
            "    await asyncio.Event().wait()\n"
            "asyncio.run(main())\n")
    env = os.environ | {"PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            cwd=str(HERE.parent), env=env)
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().decode().strip()
        if not endpoint:
            raise RuntimeError(f"the delaying proxy did not start ({proc.wait()})")
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


def sidecar_env(pki: Pki, endpoint: str, username: str, password_file: Path, job: JobRef,
                workdir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JOBLEASE_", "GODEBUG"))}
    env.update({
        "JOBLEASE_ETCD_ENDPOINTS": f"https://{endpoint}", "JOBLEASE_ROOT": ROOT,
        "JOBLEASE_ETCD_CA_FILE": str(pki.ca), "JOBLEASE_ETCD_CERT_FILE": str(pki.client_cert),
        "JOBLEASE_ETCD_KEY_FILE": str(pki.client_key), "JOBLEASE_ETCD_SERVER_NAME": "localhost",
        "JOBLEASE_ETCD_USERNAME": username, "JOBLEASE_ETCD_PASSWORD_FILE": str(password_file),
        "JOBLEASE_JOB_NAME": job.name, "JOBLEASE_JOB_NAMESPACE": job.namespace,
        "POD_NAME": f"pod-{job.name}", "POD_UID": uuid.uuid4().hex[:8],
        "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PORT_FILE": str(workdir / "port"),
        "JOBLEASE_SIDECAR_PROBE_PORT": "off", "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
        "JOBLEASE_SIDECAR_ON_LOSS": "none", "JOBLEASE_SIDECAR_RATE_LIMIT": "off",
        "JOBLEASE_LOG_LEVEL": "DEBUG",
    })
    return env


def timeline(log: str) -> dict[str, Any] | None:
    """The ``start timeline`` line's steps and total, or None (a sidecar without it)."""
    for line in log.splitlines():
        if '"start timeline"' in line:
            rec = json.loads(line)
            return {"total": rec["totalMs"], "steps": rec["steps"]}
    return None


def step_times(tl: dict[str, Any]) -> dict[str, float]:
    """Per step, ms. A request waits for what it needs first: "authenticate" is
    counted from the connection being ready, "spec read" and "lease grant" from the
    token (the first request dials and authenticates before it is sent)."""
    out: dict[str, float] = {}
    spans = {s["step"]: (s["atMs"], s["atMs"] + s["ms"]) for s in tl["steps"]}
    for s in tl["steps"]:
        out[s["step"]] = out.get(s["step"], 0.0) + s["ms"]
    needs = {"authenticate": ["connect"], "spec read": ["connect", "authenticate"],
             "lease grant": ["connect", "authenticate"]}
    for step, before in needs.items():
        if step in spans:
            begin = max([spans[step][0]] + [spans[b][1] for b in before if b in spans])
            out[step] = round(spans[step][1] - begin, 2)
    return out


def help_exits(binaries: dict[str, str], count: int) -> dict[str, dict[str, float]]:
    """Popen → exit of ``--help``, alternating the binaries: exec, the Go runtime and
    package init (and exit), nothing of etcd's."""
    times: dict[str, list[float]] = {n: [] for n in binaries}
    for i in range(count):
        for name in (list(binaries) if i % 2 == 0 else list(reversed(binaries))):
            t0 = time.perf_counter()
            subprocess.run([binaries[name], "--help"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, check=True)
            times[name].append((time.perf_counter() - t0) * 1000)
    return {n: {"p50": round(statistics.median(t), 2), "min": round(min(t), 2),
                "max": round(max(t), 2)} for n, t in times.items()}


def start_once(argv: list[str], env: dict[str, str], workdir: Path) -> dict[str, Any]:
    token = workdir / "token"
    err = workdir / "stderr"
    with open(err, "wb") as stderr:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
        deadline = t0 + 30
        while not token.exists():
            if proc.poll() is not None or time.perf_counter() > deadline:
                proc.kill()
                raise RuntimeError(f"sidecar exited ({proc.poll()}) or never held:\n"
                                   + err.read_text()[-2000:])
            time.sleep(0.0002)
        held = (time.perf_counter() - t0) * 1000
        proc.send_signal(signal.SIGTERM)
        proc.wait(10)
    return {"held_ms": round(held, 2), "timeline": timeline(err.read_text())}


async def setup(endpoint: str, pki: Pki, jobs: list[JobRef]) -> tuple[str, str]:
    """Auth on (root), the bench namespace's tenant, the jobs registered; (user, password)."""
    plain = EtcdConfig(endpoints=(f"https://{endpoint}",), ca_file=str(pki.ca),
                       cert_file=str(pki.client_cert), key_file=str(pki.client_key),
                       server_name="localhost", root=ROOT)
    async with EtcdStore(plain) as store:
        await enable_auth(store, ROOT_PASSWORD)
    root = plain.with_(username="root", password=ROOT_PASSWORD)
    async with EtcdStore(root) as admin:
        creds = await ensure_namespace_tenant(admin, ROOT, NAMESPACE, password=None)
    async with JobLeaseClient(root) as c:
        for j in jobs:
            await c.register(j, JobSpec(TTL, 3))
    return creds.username, creds.password


def summarize(starts: list[dict[str, Any]]) -> dict[str, Any]:
    held = [s["held_ms"] for s in starts]
    out: dict[str, Any] = {"n": len(held), "held_ms": {"p50": round(statistics.median(held), 2),
                                                       "min": min(held), "max": max(held)}}
    tls = [s["timeline"] for s in starts if s["timeline"]]
    if tls:
        per: dict[str, list[float]] = {}
        for s in starts:
            if s["timeline"]:
                times = step_times(s["timeline"])
                times["before main"] = round(s["held_ms"] - s["timeline"]["total"], 2)
                for k, v in times.items():
                    per.setdefault(k, []).append(v)
        out["steps_ms"] = {k: {"p50": round(statistics.median(v), 2), "min": min(v), "max": max(v)}
                           for k, v in per.items()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--starts", type=int, default=12, help="starts per binary and delay")
    parser.add_argument("--binary", action="append", default=[],
                        help="NAME=PATH, repeated (default: this tree's build, as 'this')")
    parser.add_argument("--delay-ms", default="0",
                        help="comma-separated added round-trip delays (0: loopback)")
    parser.add_argument("--lease-ttl-hint", type=int, default=0,
                        help="set JOBLEASE_LEASE_TTL to this for every binary (the jobs' TTL "
                             f"is {TTL}; binaries without the setting ignore it); 0: unset")
    parser.add_argument("--hinted", default=None,
                        help="comma-separated names of the binaries that get --lease-ttl-hint "
                             "(default: all); one path may be given under two names")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args()
    binaries = dict(b.split("=", 1) for b in args.binary) or {"this": go_sidecar_binary()}
    delays = [float(d) for d in args.delay_ms.split(",")]
    hinted = set(args.hinted.split(",")) if args.hinted else set(binaries)
    count = args.starts * len(binaries) * len(delays)
    jobs = [JobRef(NAMESPACE, f"st-{uuid.uuid4().hex[:8]}") for _ in range(count)]
    report: dict[str, Any] = {"benchmark": "sidecar_start", "binaries": binaries,
                              "lease_ttl_hint": args.lease_ttl_hint, "hinted": sorted(hinted),
                              "load_before": load(), "results": {}}
    with tempfile.TemporaryDirectory() as tmp:
        pki = write_pki(Path(tmp))
        args_tls = ["--cert-file", str(pki.server_cert), "--key-file", str(pki.server_key),
                    "--client-cert-auth", "--trusted-ca-file", str(pki.ca), "--bcrypt-cost=4"]
        import ssl

        health = ssl.create_default_context(cafile=str(pki.ca))
        health.load_cert_chain(str(pki.client_cert), str(pki.client_key))
        cluster = EtcdCluster(1, binary=etcd_binary_or_none(), extra_args=args_tls,
                              client_scheme="https", health_ssl_context=health)
        member = cluster.members[0]
        with cluster:
            user, password = asyncio.run(setup(member.endpoint, pki, jobs))
            password_file = Path(tmp) / "password"
            password_file.write_text(password)
            report["etcd_binary"] = cluster.binary
            for delay in delays:
                with contextlib.ExitStack() as stack:
                    endpoint = (stack.enter_context(delaying_proxy(member.client_port, delay))
                                if delay > 0 else member.endpoint)
                    results: dict[str, list[dict[str, Any]]] = {n: [] for n in binaries}
                    for i in range(args.starts):
                        order = list(binaries) if i % 2 == 0 else list(reversed(binaries))
                        for name in order:
                            job = jobs.pop()
                            d = Path(tmp) / job.name
                            d.mkdir()
                            env = sidecar_env(pki, endpoint, user, password_file, job, d)
                            if args.lease_ttl_hint and name in hinted:
                                env["JOBLEASE_LEASE_TTL"] = str(args.lease_ttl_hint)
                            results[name].append(start_once([binaries[name]], env, d))
                    report["results"][f"{delay:g}ms"] = {
                        n: summarize(r) | {"starts": r} for n, r in results.items()}
    report["help_exit_ms"] = help_exits(binaries, 3 * args.starts)
    report["load_after"] = load()
    print(f"load average before {report['load_before']}, after {report['load_after']}")
    first = next(iter(binaries))
    print(f"\n--help, Popen → exit (exec, Go runtime, package init), ms, n={3 * args.starts}:")
    for name, h in report["help_exit_ms"].items():
        print(f"  {name:<10} p50 {h['p50']:>7.2f}  min {h['min']:>7.2f}  max {h['max']:>7.2f}"
              f"  (p50 / {first}'s: {h['p50'] / report['help_exit_ms'][first]['p50']:.2f})")
    for delay, by_binary in report["results"].items():
        print(f"\nadded round-trip delay {delay}: Popen → token file, ms")
        base = by_binary[first]["held_ms"]["p50"]
        for name, r in by_binary.items():
            h = r["held_ms"]
            print(f"  {name:<10} p50 {h['p50']:>7.2f}  min {h['min']:>7.2f}  max {h['max']:>7.2f}"
                  f"  (n={r['n']}; p50 / {first}'s: {h['p50'] / base:.2f})")
            for step, v in r.get("steps_ms", {}).items():
                print(f"      {step:<14} p50 {v['p50']:>7.2f}  min {v['min']:>7.2f}"
                      f"  max {v['max']:>7.2f}")
    save(report, args.json)


if __name__ == "__main__":
    main()
