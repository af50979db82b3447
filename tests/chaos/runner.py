"""Run a fleet of workers against a 3-member etcd and three fenced destinations
while the nemesis injects faults; then check the merged history.

    python -m tests.chaos.runner [--duration 60 | --trials 1000] [--pg DSN] [--out DIR]

In the test suite: ``tests/chaos/test_chaos.py`` (bounded run; ``--soak`` for
the long one). The run directory holds ``history-*.jsonl`` (one per worker
process), ``faults.jsonl``, ``report.json``, ``report.txt`` and the logs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import EtcdCluster
from joblease.errors import JobLeaseError
from joblease.etcd_store import EtcdStore
from joblease.fencing.destination import create_app
from joblease.fencing.sql import ensure_schema
from joblease.keys import KeySpace
from joblease.operator.main import EXIT_LEADERSHIP_LOST
from joblease.records import Holder
from joblease.tenancy import enable_auth
from tests.chaos import checker, history
from tests.chaos.destinations import GATES, Dispatch, direct_app
from tests.chaos.nemesis import (
    FAULT_TYPES,
    ChaosProxy,
    FaultLog,
    Nemesis,
    ProxyGroup,
    Target,
)
from tests.chaos.workload import SQL_TABLE, effects_prefix, ledger_name
from tests.support import sidecar_impls
from tests.support.served import Served  # the example ledger and the /direct gates
from tests.support.status_history import StatusWatch

ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "chaos"


def _libfaketime() -> str | None:
    for c in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
              "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
              "/usr/lib/faketime/libfaketime.so.1"):
        if os.path.exists(c):
            return c
    return None


def faketime_env(spec: str | None) -> dict[str, str]:
    """libfaketime preloaded into the process itself (never the forking wrapper)."""
    if not spec:
        return {}
    lib = _libfaketime()
    if lib is None:
        raise RuntimeError("libfaketime missing: apt-get install faketime")
    return {"LD_PRELOAD": lib, "FAKETIME": spec, "FAKETIME_NO_CACHE": "1"}


@dataclass
class ChaosConfig:
    workers: int = 4                  # library workers
    sidecar_pairs: int = 1            # sidecar + HTTP worker pairs
    open_jobs: int = 6                # jobs kept open while faults run
    ttl: int = 2
    effects: int = 6                  # effects per claim: one per destination (workload.py)
    step_delay: float = 0.5           # max pause before each effect (jobs take ~1-2 s)
    fault_interval: float = 1.0
    duration: float = 60.0            # seconds of faults (ends early at ``trials``)
    trials: int = 0                   # stop after this many faults (0: duration only)
    liveness_bound: float = 60.0      # after faults stop, every job completes within
    unchecked: float = 0.1
    rogue: float = 0.8               # a lost lease still sends late effects
    rogue_delay: float = 6.0          # ... 0.1 s to this much later (mostly after a successor's)
    complete_anyway: float = 0.3
    # libfaketime specs per library worker (cycled) and for the sidecars. None for
    # the sidecars: libfaketime interposes libc's clock functions and the Go sidecar
    # reads the clock through the vDSO, so a skew would be logged as a fault but
    # never happen (the library workers' skewed clocks still are).
    worker_clocks: tuple[str | None, ...] = (None, "-5h", "+3h x2", "-2h x0.5")
    sidecar_clock: str | None = None
    # the sidecar's command line; empty: the Go binary (tests/support/sidecar_impls.py)
    sidecar_argv: tuple[str, ...] = ()
    seed: int = 0
    pg_dsn: str | None = None
    fault_types: tuple[str, ...] = FAULT_TYPES  # what the nemesis schedules
    auth: bool = False                # etcd auth on; every client logs in as root
    resend_unknown: float = 0.7       # re-send an unknown-outcome write (same key)
    resend_ok: float = 0.1            # re-send an acknowledged write (same key)


@dataclass
class Report:
    config: dict[str, Any]
    run_dir: str
    wall_seconds: float = 0.0
    fault_seconds: float = 0.0
    trials: int = 0
    faults_by_type: dict[str, int] = field(default_factory=dict)
    faults_skipped: dict[str, int] = field(default_factory=dict)
    jobs_registered: int = 0
    jobs_completed: int = 0
    operations: dict[str, dict[str, int]] = field(default_factory=dict)
    destination_entries: dict[str, int] = field(default_factory=dict)
    violations: list[dict[str, Any]] = field(default_factory=list)
    recovery_seconds: float | None = None
    etcd_member_recovery_seconds: dict[str, float] = field(default_factory=dict)
    next_completion_after_fault: dict[str, dict[str, float]] = field(default_factory=dict)
    worker_restarts: int = 0
    sidecar_claims: int = 0
    statuses_served: int = 0          # with the operator: statuses the watch recorded
    operator_stepdowns: int = 0       # the operator lost leadership and exited (code 3)
    unexpected_exits: list[str] = field(default_factory=list)

    def summary(self) -> str:
        lines = [
            f"chaos run in {self.run_dir}",
            f"  wall {self.wall_seconds:.0f}s, faults for {self.fault_seconds:.0f}s, "
            f"trials (faults injected): {self.trials}",
            "  faults by type: " + ", ".join(f"{k}={v}" for k, v in
                                            sorted(self.faults_by_type.items())),
            f"  jobs: {self.jobs_registered} registered, {self.jobs_completed} completed",
        ]
        for kind, counts in self.operations.items():
            lines.append(f"  {kind}: " + ", ".join(f"{k}={v}" for k, v in counts.items()))
        lines.append("  destination entries: " + ", ".join(
            f"{k}={v}" for k, v in self.destination_entries.items()))
        rec = "n/a" if self.recovery_seconds is None else f"{self.recovery_seconds:.1f}s"
        lines.append(f"  recovery (faults stopped -> every job completed): {rec}")
        if self.etcd_member_recovery_seconds:
            lines.append("  etcd member kill -> healthy again: " + ", ".join(
                f"{k}={v:.1f}" for k, v in self.etcd_member_recovery_seconds.items()))
        for kind, s in sorted(self.next_completion_after_fault.items()):
            lines.append(f"  after {kind}: next job completion in mean {s['mean']:.2f}s, "
                         f"max {s['max']:.2f}s")
        lines.append(f"  claims through sidecars: {self.sidecar_claims}")
        if self.statuses_served:
            lines.append(f"  operator statuses served (watched): {self.statuses_served}; "
                         f"step-downs (leadership lost, exit 3): {self.operator_stepdowns}")
        lines.append(f"  worker restarts: {self.worker_restarts}; unexpected exits: "
                     f"{len(self.unexpected_exits)}")
        lines.append(f"  VIOLATIONS: {len(self.violations)}")
        lines += [f"    [{v['kind']}] {v['job'] or v['resource']}: {v['message']}"
                  for v in self.violations[:20]]
        return "\n".join(lines)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Proc:
    """One worker slot: restarted (new pid, new history file) after a kill."""

    def __init__(self, runner: ChaosRunner, wid: str, mode: str, clock: str | None,
                 proxies: ProxyGroup, ledger: ChaosProxy) -> None:
        self.runner, self.wid, self.mode, self.clock = runner, wid, mode, clock
        self.proxies, self.ledger = proxies, ledger
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        r = self.runner
        cmd = [sys.executable, "-m", r.worker_module, "--id", self.wid,
               "--dir", str(r.dir), "--endpoints", self.proxies.endpoints, "--root", r.root,
               "--ledger-url", f"http://{self.ledger.endpoint}",
               "--sqlite", str(r.sqlite_path),
               "--mode", self.mode, "--effects", str(r.cfg.effects),
               "--step-delay", str(r.cfg.step_delay),
               "--unchecked", str(r.cfg.unchecked), "--rogue", str(r.cfg.rogue),
               "--rogue-delay", str(r.cfg.rogue_delay),
               "--complete-anyway", str(r.cfg.complete_anyway),
               "--resend-unknown", str(r.cfg.resend_unknown),
               "--resend-ok", str(r.cfg.resend_ok),
               "--seed", str(r.rng.randrange(1, 2**31)), *r._worker_args()]
        if r.cfg.auth:
            cmd += ["--etcd-user", "root", "--etcd-password", r.password]
        if r.cfg.pg_dsn:
            cmd += ["--pg", r.cfg.pg_dsn]
        # This checkout's product code first (so a scratch copy tests itself).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join((str(ROOT / "operator"), str(ROOT)))}
        if self.mode == "sidecar":
            cmd += ["--sidecar-env", json.dumps(faketime_env(r.cfg.sidecar_clock))]
            argv = r.cfg.sidecar_argv or sidecar_impls.argv()
            cmd += ["--sidecar-cmd", json.dumps(list(argv))]
        else:
            env.update(faketime_env(self.clock))
        log = open(r.dir / f"{self.wid}.log", "ab")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=log,
                                     stdin=subprocess.DEVNULL)
        log.close()
        self.starts += 1
        if self.clock and self.mode == "worker":
            now = time.monotonic()
            r.faults.log("clock-skew", self.wid, now, now, faketime=self.clock)

    def restart(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        self.runner.restarts += 1
        self.start()

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def sidecar_pid(self) -> int | None:
        try:
            pid = int((self.runner.dir / f"{self.wid}.sidecar.pid").read_text())
        except (OSError, ValueError):
            return None
        try:
            os.kill(pid, 0)
        except OSError:
            return None
        return pid


class OperatorProc:
    """``python -m joblease.operator`` for the chaos namespace, against the real
    kube-apiserver of ``control_plane`` and, through its own proxies, the chaos etcd.
    Restarted (after a ``kill-operator``) with the same arguments."""

    def __init__(self, runner: ChaosRunner, control_plane: Any, proxies: ProxyGroup,
                 kube: ChaosProxy | None = None) -> None:
        self.runner, self.cp, self.proxies = runner, control_plane, proxies
        self.proc: subprocess.Popen[bytes] | None = None
        self.wid = "operator"
        self.mode = "operator"
        self.port = 0  # its metrics/probe port, new for every start
        self.kubeconfig = Path(control_plane.kubeconfig)
        if kube is not None:
            self.kubeconfig = runner.dir / "operator.kubeconfig"
            config = json.loads(Path(control_plane.kubeconfig).read_text())
            config["clusters"][0]["cluster"]["server"] = f"https://{kube.endpoint}"
            self.kubeconfig.write_text(json.dumps(config))
            self.kubeconfig.chmod(0o600)

    @staticmethod
    def api_server(control_plane: Any) -> tuple[str, int] | None:
        """The loopback (host, port) of the test's own API server, whose JSON
        kubeconfig can be pointed at a proxy; None for anything else."""
        try:
            config = json.loads(Path(control_plane.kubeconfig).read_text())
            server = str(config["clusters"][0]["cluster"]["server"])
        except (OSError, ValueError, KeyError, IndexError):
            return None
        host, _, port = server.removeprefix("https://").partition(":")
        return (host, int(port)) if host == "127.0.0.1" and port.isdigit() else None

    def start(self) -> None:
        r = self.runner
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig),
               "JOBLEASE_ETCD_ENDPOINTS": self.proxies.endpoints, "JOBLEASE_ROOT": r.root,
               "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": os.pathsep.join((str(ROOT / "operator"), str(ROOT)))}
        if r.cfg.auth:
            env.update(JOBLEASE_ETCD_USERNAME="root", JOBLEASE_ETCD_PASSWORD=r.password)
        self.port = free_port()
        with open(r.dir / "operator.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "joblease.operator", "--namespace", NAMESPACE,
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
                 "--watch-timeout", "60", *r._operator_args()],
                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL)

    def restart(self) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            self.proc.wait()
        self.runner.restarts += 1
        self.start()

    async def rollout(self, overlap: float) -> None:
        """A rolling update: the new operator starts, and once it is ready (or 30 s
        passed) both run for ``overlap`` seconds, then the old one gets SIGTERM
        (SIGKILL after 15 s)."""
        old = self.proc
        self.start()
        self.runner.restarts += 1
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not await asyncio.to_thread(self.ready):
            await asyncio.sleep(0.2)
        await asyncio.sleep(overlap)
        if old is not None and old.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                old.send_signal(signal.SIGCONT)
                old.terminate()
            try:
                await asyncio.to_thread(old.wait, 15)
            except subprocess.TimeoutExpired:
                old.kill()
                await asyncio.to_thread(old.wait)

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz",
                                        timeout=1) as resp:
                return int(resp.status) == 200
        except OSError:
            return False

    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.poll() is None else None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class ChaosRunner:
    #: the worker processes' module (its ``--mode worker|sidecar`` and the options
    #: of ``tests.chaos.workload.parser``)
    worker_module = "tests.chaos.workload"
    report_class = Report
    #: the resources whose statuses the watch records (runs with the operator)
    status_plural = "jobleases"

    def __init__(self, cfg: ChaosConfig, run_dir: Path | None = None,
                 control_plane: Any = None) -> None:
        self.cfg = cfg
        self.cp = control_plane
        self.operator: OperatorProc | None = None
        self.recorder: StatusWatch | None = None
        self.dir = run_dir or Path(tempfile.mkdtemp(prefix="joblease-chaos-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(cfg.seed or None)
        self.root = f"/chaos/{os.urandom(4).hex()}"
        self.password = os.urandom(12).hex()
        self.sqlite_path = self.dir / "effects.sqlite"
        self.faults = FaultLog(self.dir / "faults.jsonl")
        self.restarts = 0
        self.jobs: list[str] = []
        self.completed_at: dict[str, float] = {}
        self.next_job = 0
        self.cluster: EtcdCluster | None = None
        self.ledger: Served
        self.procs: list[Proc] = []
        self.unexpected: list[str] = []
        self.operator_stepdowns = 0

    # -- setup ---------------------------------------------------------------------------

    def _setup_sql(self) -> None:
        conn = sqlite3.connect(self.sqlite_path, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        ensure_schema(conn)
        conn.execute(SQL_TABLE.format(serial="INTEGER"))  # INTEGER PRIMARY KEY = rowid
        conn.close()
        if self.cfg.pg_dsn:
            import psycopg

            with psycopg.connect(self.cfg.pg_dsn, autocommit=True) as pg:
                ensure_schema(pg)
                pg.execute(SQL_TABLE.format(serial="BIGSERIAL"))
                pg.execute("TRUNCATE chaos_effects, joblease_fence, joblease_effects")

    async def _register(self, client: JobLeaseClient, n: int) -> None:
        new = []
        for _ in range(n):
            self.next_job += 1
            new.append(f"{NAMESPACE}/j{self.next_job}")
        if self.cp is None:
            for job in new:
                await client.register(JobRef.parse(job), JobSpec(self.cfg.ttl, 0))
        else:
            # As users do: a JobLease per job; the operator registers it in etcd
            # (workers meanwhile get "not registered" and try another job).
            items = [{"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
                      "metadata": {"name": job.split("/", 1)[1], "namespace": NAMESPACE},
                      "spec": {"leaseDurationSeconds": self.cfg.ttl, "maxAttempts": 0}}
                     for job in new]
            doc = json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
            r = await asyncio.to_thread(self.cp.kubectl, "apply", "-f", "-", input=doc)
            if r.returncode != 0:
                raise RuntimeError(f"kubectl apply failed: {r.stderr}")
        self.jobs.extend(new)

    def _write_jobs(self) -> None:
        open_jobs = [j for j in self.jobs if j not in self.completed_at]
        # every (workers + pairs)-th job is the sidecar pairs' (see Worker.pick)
        share = self.cfg.workers + self.cfg.sidecar_pairs
        pairs = [j for j in open_jobs if self.cfg.sidecar_pairs
                 and int(j.rsplit("j", 1)[1]) % share == 0]
        for name, jobs in (("pairs.txt", pairs), ("jobs.txt", open_jobs)):
            tmp = self.dir / f"{name}.tmp"
            tmp.write_text("\n".join(jobs) + "\n")
            tmp.replace(self.dir / name)

    async def _poll(self, client: JobLeaseClient) -> None:
        try:
            states = await client.list(NAMESPACE)
        except JobLeaseError:
            return
        now = time.monotonic()
        for s in states:
            job = str(s.job)
            if s.result is not None and job not in self.completed_at:
                self.completed_at[job] = now

    # -- the run -------------------------------------------------------------------------

    async def run(self) -> Report:
        began = time.monotonic()
        cfg = self.cfg
        (self.dir / "etcd").mkdir(exist_ok=True)
        self.cluster = EtcdCluster(3, binary=_etcd_binary(),
                                   base_dir=str(self.dir / "etcd"))
        await asyncio.to_thread(self.cluster.start)
        self.ledger = Served(Dispatch(create_app(),
                                      direct_app(self.dir / "direct.sqlite"))).start()
        self._setup_sql()
        config = EtcdConfig(endpoints=self.cluster.endpoints, root=self.root,
                            request_timeout=2.0)
        if cfg.auth:
            async with EtcdStore(config) as admin:
                await enable_auth(admin, self.password)
            config = EtcdConfig(endpoints=self.cluster.endpoints, root=self.root,
                                request_timeout=2.0, username="root", password=self.password)
        self.config = config
        groups: list[ProxyGroup] = []
        ledger_proxies: list[ChaosProxy] = []
        report = self.report_class(config=asdict(cfg) | {"pg_dsn": bool(cfg.pg_dsn)},
                        run_dir=str(self.dir))
        nemesis: Nemesis | None = None
        try:
            async with JobLeaseClient(config) as client:
                operator_target: list[Target] = []
                if self.cp is not None:
                    r = await asyncio.to_thread(self.cp.kubectl, "create", "namespace",
                                                NAMESPACE)
                    if r.returncode != 0 and "AlreadyExists" not in r.stderr:
                        raise RuntimeError(r.stderr)
                    self.recorder = await asyncio.to_thread(
                        StatusWatch, self.cp.kubeconfig, NAMESPACE,
                        log=self.dir / "statuses.jsonl", plural=self.status_plural)
                    g = await ProxyGroup(self.cluster).start()
                    groups.append(g)
                    # its API-server traffic too, so "delay-destination" can hold it
                    api = OperatorProc.api_server(self.cp)
                    kube = await ChaosProxy(api).start() if api else None
                    if kube is not None:
                        ledger_proxies.append(kube)
                    self.operator = OperatorProc(self, self.cp, g, kube)
                    self.operator.start()
                    operator_target.append(Target("operator", "operator", self.operator.pid,
                                                  self.operator.restart, g, kube,
                                                  rollout=self.operator.rollout))
                await self._begin(client)
                targets: list[Target] = list(operator_target)
                for i in range(cfg.workers + cfg.sidecar_pairs):
                    g = await ProxyGroup(self.cluster).start()
                    groups.append(g)
                    lp = await ChaosProxy(("127.0.0.1", self.ledger.port)).start()
                    ledger_proxies.append(lp)
                    if i < cfg.workers:
                        p = Proc(self, f"w{i}", "worker",
                                 cfg.worker_clocks[i % len(cfg.worker_clocks)]
                                 if cfg.worker_clocks else None, g, lp)
                        targets.append(Target(p.wid, "worker", p.pid, p.restart, g, lp))
                    else:
                        p = Proc(self, f"s{i - cfg.workers}", "sidecar", None, g, lp)
                        targets.append(Target(p.wid, "pair", p.pid, None, None, lp))
                        targets.append(Target(p.wid + ".sidecar", "sidecar", p.sidecar_pid,
                                              None, g))
                    self.procs.append(p)
                    p.start()
                if cfg.sidecar_pairs and cfg.sidecar_clock:
                    now = time.monotonic()
                    self.faults.log("clock-skew", "sidecars", now, now,
                                    faketime=cfg.sidecar_clock)
                nemesis = Nemesis(self.cluster, targets, self.faults, ttl=cfg.ttl,
                                  interval=cfg.fault_interval, rng=self.rng,
                                  types=cfg.fault_types, credentials=(
                                      ("root", self.password) if cfg.auth else None))
                fault_start = time.monotonic()

                def faults_over() -> bool:
                    if cfg.trials and self._trials() >= cfg.trials:
                        return True
                    return time.monotonic() - fault_start >= cfg.duration

                nem_task = asyncio.create_task(nemesis.run(faults_over))
                while not nem_task.done():
                    await self._during_faults(client)
                    self._check_alive()
                    await asyncio.sleep(0.3)
                await nem_task
                nemesis.heal_all()
                stopped = time.monotonic()
                report.fault_seconds = stopped - fault_start
                await self._faults_stopped(client)
                while time.monotonic() - stopped < cfg.liveness_bound + 5:
                    settled = await self._settled(client)
                    self._check_alive()
                    if settled:
                        break
                    await asyncio.sleep(0.3)
                done_at = max((self.completed_at.get(j, float("inf")) for j in self.jobs),
                              default=stopped)
                report.recovery_seconds = (max(0.0, done_at - stopped)
                                           if done_at != float("inf") else None)
                await self._stop_workers()
                ops, destinations, violations = await self._judge(client, report, stopped)
            report.violations = [v.to_dict() for v in violations]
            report.operations = checker.summarize(ops)
            report.destination_entries = self._entry_counts(destinations)
            report.trials = self._trials()
            report.faults_by_type = dict(sorted(self.faults.counts.items()))
            report.faults_skipped = dict(nemesis.skipped)
            report.etcd_member_recovery_seconds = _stats(nemesis.member_recovery)
            report.next_completion_after_fault = self._progress_after_faults()
            report.worker_restarts = self.restarts
            report.sidecar_claims = sum(1 for o in history.pair(ops) if o.kind == "claim"
                                        and o.phase == "ok" and o.invoke.process[0] == "s")
            report.unexpected_exits = self.unexpected
            report.operator_stepdowns = self.operator_stepdowns
            report.wall_seconds = time.monotonic() - began
            (self.dir / "report.json").write_text(json.dumps(asdict(report), indent=2))
            (self.dir / "report.txt").write_text(report.summary() + "\n")
            return report
        finally:
            if nemesis is not None:
                nemesis.heal_all()
            await self._stop_workers()
            if self.operator is not None:
                await asyncio.to_thread(self.operator.stop)
            if self.recorder is not None:
                await asyncio.to_thread(self.recorder.stop)
            for g in groups:
                await g.close()
            for lp in ledger_proxies:
                await lp.close()
            self.ledger.stop()
            await asyncio.to_thread(self.cluster.stop)

    # -- the workload's part (tests/chaos/queue_runner.py overrides these) ------------------

    async def _begin(self, client: JobLeaseClient) -> None:
        """Before the workers start: the first open jobs."""
        await self._register(client, self.cfg.open_jobs)
        self._write_jobs()

    def _worker_args(self) -> list[str]:
        """Extra arguments of every ``tests.chaos.workload`` process."""
        return []

    def _operator_args(self) -> list[str]:
        """Extra arguments of the operator (runs with a control plane)."""
        return []

    async def _during_faults(self, client: JobLeaseClient) -> None:
        """Every 0.3 s while the nemesis runs: note completions, keep jobs open."""
        await self._poll(client)
        open_now = [j for j in self.jobs if j not in self.completed_at]
        if len(open_now) < self.cfg.open_jobs:
            await self._register(client, self.cfg.open_jobs - len(open_now))
        self._write_jobs()

    async def _faults_stopped(self, client: JobLeaseClient) -> None:
        self._write_jobs()

    async def _settled(self, client: JobLeaseClient) -> bool:
        """After the faults, every 0.3 s until the liveness bound: is all work done?"""
        await self._poll(client)
        self._write_jobs()
        return all(j in self.completed_at for j in self.jobs)

    async def _judge(self, client: JobLeaseClient, report: Report, stopped: float
                     ) -> tuple[list[history.Op], dict[str, list[checker.Entry]],
                                list[checker.Violation]]:
        """The workers stopped: read etcd and the destinations, check the history,
        fill the workload's figures of ``report``."""
        final = await self._final(client)
        statuses = await self._converged(final)
        ops = history.merge(self.dir.glob("history-*.jsonl"))
        holders = await self._holders(client, ops)
        destinations = await self._destinations(client)
        violations = checker.check(
            ops, final=final, destinations=destinations, jobs=self.jobs, holders=holders,
            statuses=statuses,
            liveness=checker.Liveness(stopped, self.cfg.liveness_bound, self.completed_at))
        report.jobs_registered = len(self.jobs)
        report.jobs_completed = sum(1 for j in self.jobs if final.get(j) and
                                    final[j].result_token is not None)
        report.statuses_served = sum(len(v) for v in (statuses or {}).values())
        return ops, destinations, violations

    def _holder_key(self, job: str) -> bytes:
        """The etcd key of ``job``'s holder (a history's ``job`` field)."""
        return KeySpace(self.root).job(JobRef.parse(job)).holder

    def _trials(self) -> int:
        return sum(v for k, v in self.faults.counts.items() if k != "clock-skew")

    async def _converged(self, final: dict[str, checker.FinalJob],
                         timeout: float = 60.0) -> dict[str, list[dict[str, Any]]] | None:
        """With the operator: wait (bounded) until the last served status of every job
        says what etcd says; return every status served (the checker judges them)."""
        if self.recorder is None:
            return None
        deadline = time.monotonic() + timeout

        def equal(job: str, state: checker.FinalJob) -> bool:
            last = self.recorder.last(job.removeprefix(f"{NAMESPACE}/")) if self.recorder else {}
            return (last.get("phase"), last.get("fencingToken"), last.get("generation")) == (
                "Completed", state.result_token, state.generation)

        while time.monotonic() < deadline:
            self._check_operator()
            if all(equal(j, s) for j, s in final.items() if s.result_token is not None):
                break
            await asyncio.sleep(0.5)
        # keyed like the checker's jobs, "<namespace>/<name>"
        return {f"{NAMESPACE}/{name}": statuses
                for name, statuses in self.recorder.snapshot().items()}

    def _check_alive(self) -> None:
        """A worker that exits by itself (not killed by the nemesis) is a finding."""
        self._check_operator()
        for p in self.procs:
            if p.proc is not None and p.proc.poll() not in (None, -signal.SIGKILL):
                tail = (self.dir / f"{p.wid}.log").read_text(errors="replace")[-2000:]
                self.unexpected.append(f"{p.wid} exited {p.proc.returncode}: {tail}")
                p.restart()

    def _check_operator(self) -> None:
        """The operator exits by itself only when it lost leadership (exit code 3,
        docs/operator.md: its etcd traffic was cut or delayed past the election's safety
        deadline); it is restarted, as Kubernetes would, and stands by or leads again.
        Any other exit is a finding."""
        op = self.operator
        if op is None or op.proc is None or op.proc.poll() in (None, -signal.SIGKILL):
            return
        if op.proc.returncode == EXIT_LEADERSHIP_LOST:
            self.operator_stepdowns += 1
        else:
            tail = (self.dir / "operator.log").read_text(errors="replace")[-2000:]
            self.unexpected.append(f"operator exited {op.proc.returncode}: {tail}")
        op.restart()

    async def _stop_workers(self) -> None:
        (self.dir / "stop").touch()
        deadline = time.monotonic() + 15
        for p in self.procs:
            if p.proc is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                p.proc.send_signal(signal.SIGCONT)
            while p.proc.poll() is None and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            if p.proc.poll() is None:
                p.proc.kill()
                p.proc.wait()
            pid = p.sidecar_pid()
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    async def _final(self, client: JobLeaseClient) -> dict[str, checker.FinalJob]:
        for attempt in range(20):
            try:
                states = await client.list(NAMESPACE)
                break
            except JobLeaseError:
                if attempt == 19:
                    raise
                await asyncio.sleep(0.5)
        return {str(s.job): checker.FinalJob(
            generation=s.generation,
            result_token=s.result.token if s.result else None,
            result_generation=s.result.generation if s.result else None,
            result_owner=s.result.owner if s.result else None) for s in states}

    async def _holders(self, client: JobLeaseClient, ops: list[history.Op],
                       ) -> dict[tuple[str, int], checker.HolderAt | None]:
        """Each ok claim's holder key as etcd had it at the claim's token (revision)."""
        out: dict[tuple[str, int], checker.HolderAt | None] = {}
        for o in history.pair(ops):
            if o.kind != "claim" or o.phase != "ok" or not o.job or not o.token:
                continue
            key = self._holder_key(o.job)
            _, kvs = await _retry(lambda k=key, t=o.token: client.store.get(k, revision=t))
            if not kvs:
                out[(o.job, o.token)] = None
                continue
            kv = kvs[0]
            try:
                owner = str(Holder.decode_value(kv.value).get("owner"))
            except ValueError:
                owner = None
            out[(o.job, o.token)] = checker.HolderAt(kv.create_revision, kv.mod_revision,
                                                     owner)
        return out

    def _fenced_names(self) -> list[str]:
        """The resources the ledger and the /direct gates are read for (one per job;
        the semaphore workload adds its slots')."""
        return self.jobs

    async def _destinations(self, client: JobLeaseClient) -> dict[str, list[checker.Entry]]:
        out: dict[str, list[checker.Entry]] = defaultdict(list)
        async with httpx.AsyncClient(base_url=self.ledger.url, timeout=10) as http:
            for job in self._fenced_names():
                r = await http.get(f"/resources/{ledger_name(job)}")
                r.raise_for_status()
                res = f"http/ledger/{ledger_name(job)}"
                out[res] = [checker.Entry(e["seq"], e["token"], e["data"].get("key"),
                                          e["job"], e["data"].get("generation"))
                            for e in r.json()["entries"]]
                for gate in GATES:
                    r = await http.get(f"/direct/{gate}/{ledger_name(job)}")
                    r.raise_for_status()
                    out[f"direct-{gate}/{ledger_name(job)}"] = [
                        checker.Entry(e["seq"], e["token"], e["key"], e["job"], e["generation"])
                        for e in r.json()["entries"]]
        prefix = effects_prefix(self.root).encode()
        _, kvs = await _retry(lambda: client.store.get(prefix, prefix=True))
        for kv in kvs:
            e = json.loads(kv.value)
            out[f"etcd/{e['job']}"].append(checker.Entry(kv.create_revision, int(e["token"]),
                                                         e["key"], e["job"],
                                                         int(e["generation"])))
        rows: list[tuple[Any, ...]] = []
        conn = sqlite3.connect(self.sqlite_path)
        rows += [("sqlite", *r) for r in conn.execute(
            "SELECT seq, resource, token, key, job, generation FROM chaos_effects")]
        conn.close()
        if self.cfg.pg_dsn:
            import psycopg

            with psycopg.connect(self.cfg.pg_dsn) as pg:
                rows += [("pg", *r) for r in pg.execute(
                    "SELECT seq, resource, token, key, job, generation FROM chaos_effects")]
        for _, seq, resource, token, key, job, gen in rows:
            out[resource].append(checker.Entry(int(seq), int(token), key, job, int(gen)))
        return dict(out)

    @staticmethod
    def _entry_counts(destinations: dict[str, list[checker.Entry]]) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for resource, entries in destinations.items():
            counts[resource.split("/", 1)[0]] += len(entries)
        return dict(counts)

    def _progress_after_faults(self) -> dict[str, dict[str, float]]:
        """Per fault type: from the fault's end to the next job completion anywhere."""
        completions = sorted(self.completed_at.values())
        per: dict[str, list[float]] = defaultdict(list)
        for rec in self.faults.records:
            if rec["type"] == "clock-skew":
                continue
            end = self.faults.started + rec["end"]
            nxt = next((c for c in completions if c >= end), None)
            if nxt is not None:
                per[rec["type"]].append(nxt - end)
        return {k: {"mean": sum(v) / len(v), "max": max(v)} for k, v in per.items()}


async def _retry(fn: Any, attempts: int = 20) -> Any:
    """A read after the faults: etcd may still be settling."""
    for attempt in range(attempts):
        try:
            return await fn()
        except JobLeaseError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.5)


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"mean": sum(values) / len(values), "max": max(values), "count": len(values)}


def _etcd_binary() -> str | None:
    try:
        from tests.support.binaries import etcd_binary
        return etcd_binary()
    except Exception:
        return None


async def run(cfg: ChaosConfig, run_dir: Path | None = None,
              control_plane: Any = None) -> Report:
    """One chaos run; with ``control_plane`` (``tests.support.controlplane``, the CRDs
    installed) the operator runs too, jobs are JobLeases, and its statuses are judged."""
    return await ChaosRunner(cfg, run_dir, control_plane).run()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.runner")
    p.add_argument("--duration", type=float, default=60.0)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sidecar-pairs", type=int, default=1)
    p.add_argument("--open-jobs", type=int, default=6)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--pg", default=None, help="PostgreSQL conninfo (else SQLite only)")
    p.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--auth", action="store_true", help="etcd auth on (clients log in)")
    p.add_argument("--faults", default=",".join(FAULT_TYPES),
                   help="comma-separated fault types to schedule")
    a = p.parse_args(argv)
    cfg = ChaosConfig(workers=a.workers, sidecar_pairs=a.sidecar_pairs, open_jobs=a.open_jobs,
                      fault_interval=a.interval, duration=a.duration, trials=a.trials,
                      seed=a.seed, pg_dsn=a.pg, auth=a.auth,
                      fault_types=tuple(a.faults.split(",")))
    report = asyncio.run(run(cfg, Path(a.out) if a.out else None))
    print(report.summary())
    return 1 if report.violations else 0


__all__ = ["FAULT_TYPES", "ChaosConfig", "Report", "run"]

if __name__ == "__main__":
    sys.exit(main())
