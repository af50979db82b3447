"""Operator leader takeover time: the active replica dies or is stopped, how long until
the standby acts?

What runs (all real processes on this machine): a ControlPlane (its own etcd +
kube-apiserver, tests/support/controlplane.py) with the CRD applied, a separate
etcd for joblease (EtcdCluster), and two operator replicas (``python -m
joblease.operator``, leader election on, ``--leader-election-ttl`` = ``--ttl``).

Each trial: find the leader (etcd's leader key names its pid), send it the signal
(``KILL``: a crash, the lease must expire; ``TERM``: a deleted pod, the leader
resigns), create a JobLease right away, and time two things from the signal:

- ``elected``: the standby holds the leader key (a new term);
- ``registered``: the JobLease created at the signal is registered in etcd, i.e.
  the new leader's kopf is up and handled it: what a user waits for.

Then the stopped replica is started again (it stands by) and the next trial
begins once it is ready. Prints p50/p99/max per signal.

    python bench/operator_takeover.py [--trials 10] [--ttl 10] [--signals KILL,TERM]
                                      [--json bench/results/operator_takeover.json]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct  # noqa: E402
from bench.report import save  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient, JobRef  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402
from joblease.operator.election import Election  # noqa: E402


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from tests.support.binaries import REPO_ROOT, etcd_binary
    from tests.support.controlplane import ControlPlane
    from tests.support.operator import Kube, OperatorProcess, wait_for

    class Replica(OperatorProcess):
        def environment(self) -> dict[str, str]:
            return dict(super().environment(), JOBLEASE_LEADER_ELECTION_TTL=str(args.ttl))

    tmp = Path(tempfile.mkdtemp(prefix="takeover-"))
    cp = ControlPlane().start()
    etcd = EtcdCluster(1, binary=etcd_binary()).start()
    replicas: list[Replica] = []
    try:
        cp.kubectl("apply", "-f", str(REPO_ROOT / "crds"), check=True)
        cp.kubectl("wait", "--for=condition=Established", "crd/jobleases.joblease.io",
                   "--timeout=60s", check=True)
        ns = "takeover"
        cp.kubectl("create", "namespace", ns, check=True)
        config = EtcdConfig(endpoints=etcd.endpoints, root=f"/bench/{uuid.uuid4().hex[:8]}")
        replicas = [Replica(cp, config, ns, tmp / f"op{i}.log") for i in range(2)]
        for r in replicas:
            r.start()
        for r in replicas:
            await r.wait_ready(120)
        kube = Kube(cp, ns)
        results: dict[str, dict[str, list[float]]] = {}
        async with JobLeaseClient(config) as client:
            election = Election(client.store, config.root, ns, "bench")

            async def leader(but: Replica | None = None) -> Replica:
                async def probe() -> Replica | None:
                    ident = (await election.leader()).identity or ""
                    return next((r for r in replicas if r is not but and r.proc is not None
                                 and r.proc.poll() is None
                                 and ident.endswith(f"/{r.proc.pid}")), None)
                return await wait_for("a leader", probe, 120, interval=0.02)

            n = 0
            for sig_name in args.signals:
                sig = getattr(signal, f"SIG{sig_name}")
                elected, registered = [], []
                for trial in range(args.trials):
                    old = await leader()
                    await asyncio.sleep(args.pause)  # a settled leader, kopf up
                    name = f"probe-{n:03d}"
                    n += 1
                    assert old.proc is not None
                    t0 = time.monotonic()
                    old.proc.send_signal(sig)
                    create = asyncio.create_task(kube.apply(name, {"leaseDurationSeconds": 30}))
                    await leader(but=old)
                    elected.append(time.monotonic() - t0)

                    async def is_registered(job: str = name) -> bool:
                        return (await client.get(JobRef(ns, job))).registered
                    await wait_for(f"{name} registered", is_registered, 120, interval=0.02)
                    registered.append(time.monotonic() - t0)
                    await create
                    await asyncio.to_thread(old.proc.wait, 30)
                    old.start()
                    await old.wait_ready(120)
                    print(f"{sig_name} trial {trial + 1}: elected {elected[-1]:.2f}s, "
                          f"registered {registered[-1]:.2f}s (load {loadavg()[0]:.1f})",
                          flush=True)
                results[sig_name] = {"elected": elected, "registered": registered}
    finally:
        for r in replicas:
            r.stop()
        etcd.stop()
        cp.stop()
    return {"ttl": args.ttl, "trials": args.trials, "loadavg_end": loadavg(),
            "results": {s: {k: summarize(v) for k, v in r.items()}
                        for s, r in results.items()}}


def summarize(values: list[float]) -> dict[str, Any]:
    ordered = sorted(values)
    return {"n": len(values), "p50": round(pct(ordered, 0.5), 3),
            "p99": round(pct(ordered, 0.99), 3), "max": round(max(values), 3),
            "all": [round(v, 3) for v in values]}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--ttl", type=int, default=10, help="--leader-election-ttl, seconds")
    parser.add_argument("--signals", type=lambda s: [x.strip().upper() for x in s.split(",")],
                        default=["KILL", "TERM"])
    parser.add_argument("--pause", type=float, default=2.0,
                        help="seconds the leader runs before each signal")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    report = asyncio.run(run(args))
    print(f"\nttl {report['ttl']}s, {report['trials']} trials per signal")
    print(f"{'signal':<6} {'measure':<11} {'p50':>7} {'p99':>7} {'max':>7}")
    for sig, measures in report["results"].items():
        for measure, s in measures.items():
            print(f"{sig:<6} {measure:<11} {s['p50']:>6.2f}s {s['p99']:>6.2f}s {s['max']:>6.2f}s")
    save(report, args.json)


if __name__ == "__main__":
    main()
