"""Worker processes for the chaos suite; every operation goes into a history file.

    python -m tests.chaos.workload --id w1 --dir RUNDIR --endpoints P1,P2,P3 --root ROOT \
        --ledger-url URL --sqlite PATH [--pg DSN] [--mode worker|sidecar] ...

Both modes loop until ``RUNDIR/stop`` exists, over the jobs listed in
``RUNDIR/jobs.txt`` (the runner keeps it current): claim a job, make
``--effects`` fenced effects, then complete it. Effect ``k`` goes to the
destination ``k % 6``: the example ledger over HTTP (FencingMiddleware), then
SQLite, then PostgreSQL (``joblease.fencing.sql.admit`` in the same
transaction as the insert; without ``--pg`` those effects go to SQLite too),
then the gates with nothing in front of them: a ``MemoryGate`` and a
``SqliteGate`` called directly by the runner's ``/direct`` destination
(``destinations.py``), and the etcd gate (``EtcdGate.admit`` with the effect
as its transaction's own put, under ``<root>-fx/``), called by this process.

Re-sends: a write whose outcome is unknown is sent again with the same
idempotency key with probability ``--resend-unknown``, and an acknowledged
one with ``--resend-ok`` (a duplicate delivery); the re-send's invoke carries
``extra.resend`` = the first copy's op id. Each key must be applied once.

* ``--mode worker``: the core library (``JobLeaseClient``) in this process.
* ``--mode sidecar``: the sidecar (``--sidecar-cmd``, the Go binary) per claim (its pid in
  ``RUNDIR/<id>.sidecar.pid`` so the nemesis can pause or kill it) and this
  process talks to its HTTP API, as a worker in any language would.

A well-behaved worker checks the lease before each effect (``ensure_valid()``,
or ``GET /v1/lease`` for the sidecar). With probability ``--unchecked`` it
skips the check, and once it knows its lease is lost it still sends one
"rogue" effect with probability ``--rogue`` and still tries to complete with
probability ``--complete-anyway``: the destinations and etcd must refuse
whatever is stale.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from joblease import (
    AlreadyCompletedError,
    EtcdConfig,
    HeldError,
    JobLeaseClient,
    JobLeaseError,
    JobRef,
    Lease,
    OutcomeUnknownError,
    StaleTokenError,
)
from joblease.errors import LeaseLostError, StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.fencing import Effect, StaleFenceError, admit, admit_async, idempotency_key
from joblease.fencing.etcd_gate import EtcdGate
from joblease.fencing.gate import IdempotencyKeyConflictError
from joblease.fencing.http import HEADER_IDEMPOTENCY_KEY, HEADER_JOB, HEADER_REPLAYED, HEADER_TOKEN
from joblease.store import Put
from tests.chaos.history import History, Op

SQL_TABLE = ("CREATE TABLE IF NOT EXISTS chaos_effects ("
             " seq {serial} PRIMARY KEY, resource TEXT NOT NULL, token BIGINT NOT NULL,"
             " job TEXT NOT NULL, generation BIGINT NOT NULL, key TEXT NOT NULL,"
             " worker TEXT NOT NULL)")


def ledger_name(job: str) -> str:
    return job.replace("/", "-")


def resource_of(dest: str, job: str) -> str:
    """The history's resource name: ``<destination>/<the gate's resource>``."""
    if dest == "http":
        return f"http/ledger/{ledger_name(job)}"
    if dest.startswith("direct-"):
        return f"{dest}/{ledger_name(job)}"
    return f"{dest}/{job}"


def fence_root(root: str) -> str:
    """The etcd gate's own root (marks and idempotency records)."""
    return root.rstrip("/") + "-fence"


def effects_prefix(root: str) -> str:
    """Where the etcd destination's effects live: ``<prefix><job>/<op id>``."""
    return root.rstrip("/") + "-fx/"


def etcd_config(args: argparse.Namespace) -> EtcdConfig:
    return EtcdConfig(endpoints=tuple(args.endpoints.split(",")), root=args.root,
                      request_timeout=args.request_timeout,
                      username=args.etcd_user or None, password=args.etcd_password or None)


class Effects:
    """The three destinations, as one worker process reaches them."""

    def __init__(self, args: argparse.Namespace, history: History) -> None:
        self.args = args
        self.h = history
        self.http = httpx.AsyncClient(base_url=args.ledger_url, timeout=3.0)
        self.sqlite_path = args.sqlite
        self.pg_dsn = args.pg
        self._pg: Any = None
        self._pg_lock = asyncio.Lock()
        self.dests = ["http", "sqlite", "pg" if args.pg else "sqlite", "direct-memory",
                      "direct-sqlite", "etcd"]
        self.rng = random.Random(args.seed + 1 if args.seed else None)
        self._store: EtcdStore | None = None
        self._gate: EtcdGate | None = None

    async def close(self) -> None:
        await self.http.aclose()
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.close()
        if self._pg is not None:
            with contextlib.suppress(Exception):
                await self._pg.close()

    async def write(self, job: str, token: int, generation: int, step: int, *,
                    checked: bool, rogue: bool = False) -> str:
        """One fenced effect (step ``k`` goes to destination ``k % 3``); returns the
        outcome phase."""
        dest = self.dests[step % len(self.dests)]
        return await self.write_to(dest, job, token, generation, f"e{step}", checked=checked,
                                   rogue=rogue)

    async def rogue(self, job: str, token: int, generation: int) -> None:
        """A lost lease's late effects, one per destination, with fresh keys: each
        must be refused wherever the successor has written already."""
        for i, dest in enumerate(self.dests):
            await self.write_to(dest, job, token, generation, f"rogue{i}", checked=False,
                                rogue=True)

    async def write_to(self, dest: str, job: str, token: int, generation: int, step: str, *,
                       checked: bool, rogue: bool = False) -> str:
        key = idempotency_key(job, generation, step, token=token)
        first, phase = await self._send(dest, job, token, generation, key, checked=checked,
                                        rogue=rogue)
        p = {"unknown": self.args.resend_unknown, "ok": self.args.resend_ok}.get(phase, 0.0)
        if self.rng.random() < p:
            # A retry with the same key, as a client does after a timeout (or a
            # network that delivers twice): the destination must apply it once.
            await asyncio.sleep(self.rng.uniform(0.05, 0.5))
            await self._send(dest, job, token, generation, key, checked=checked,
                             rogue=rogue, resend=first.op)
        return phase

    async def _send(self, dest: str, job: str, token: int, generation: int, key: str, *,
                    checked: bool, rogue: bool, resend: str | None = None) -> tuple[Op, str]:
        extra: dict[str, Any] = {}
        if rogue:
            extra["rogue"] = True
        if resend:
            extra["resend"] = resend
        inv = self.h.invoke("write", job=job, token=token, generation=generation,
                            resource=resource_of(dest, job), key=key, checked=checked,
                            extra=extra)
        try:
            if dest == "http":
                return inv, await self._http(inv, job, token, key, generation)
            if dest.startswith("direct-"):
                return inv, await self._direct(inv, dest, job, token, key, generation)
            if dest == "sqlite":
                return inv, await asyncio.to_thread(self._sqlite, inv, job, token, generation,
                                                    key)
            if dest == "etcd":
                return inv, await self._etcd(inv, job, token, generation, key)
            return inv, await self._postgres(inv, job, token, generation, key)
        except Exception as exc:  # anything unexpected: outcome unknown, keep going
            self.h.unknown(inv, f"error: {type(exc).__name__}: {exc}"[:200])
            return inv, "unknown"

    async def _direct(self, inv: Op, dest: str, job: str, token: int, key: str,
                      generation: int) -> str:
        headers = {HEADER_JOB: job, HEADER_TOKEN: str(token), HEADER_IDEMPOTENCY_KEY: key}
        body = {"generation": generation, "worker": self.h.process}
        gate = dest.removeprefix("direct-")
        try:
            r = await self.http.post(f"/direct/{gate}/{ledger_name(job)}", json=body,
                                     headers=headers)
        except httpx.HTTPError as exc:
            self.h.unknown(inv, f"http: {type(exc).__name__}")
            return "unknown"
        if r.status_code in (200, 201):
            answer = r.json()
            self.h.ok(inv, extra={"seq": answer.get("seq"),
                                  "duplicate": bool(answer.get("duplicate"))})
            return "ok"
        try:
            reason = str(r.json().get("error", r.status_code))
        except ValueError:
            reason = f"http {r.status_code}"
        self.h.fail(inv, reason, extra={"status": r.status_code})
        return "fail"

    async def _etcd(self, inv: Op, job: str, token: int, generation: int, key: str) -> str:
        if self._gate is None:
            self._store = EtcdStore(etcd_config(self.args))
            self._gate = EtcdGate(self._store, fence_root(self.args.root), timeout=5.0)
        value = json.dumps({"token": token, "job": job, "generation": generation, "key": key,
                            "worker": self.h.process}, separators=(",", ":")).encode()
        effect_key = f"{effects_prefix(self.args.root)}{job}/{inv.op}".encode()
        try:
            d = await self._gate.admit(Effect(f"etcd/{job}", token, key, response="ok"),
                                       puts=[Put(effect_key, value)])
        except StaleFenceError:
            self.h.fail(inv, "stale")
            return "fail"
        except IdempotencyKeyConflictError:
            self.h.fail(inv, "conflict")
            return "fail"
        except JobLeaseError as exc:  # OutcomeUnknownError, StoreUnavailableError, ...
            self.h.unknown(inv, f"etcd: {exc.reason}: {exc}"[:200])
            return "unknown"
        self.h.ok(inv, extra={"duplicate": d.duplicate})
        return "ok"

    async def _http(self, inv: Op, job: str, token: int, key: str, generation: int) -> str:
        headers = {HEADER_JOB: job, HEADER_TOKEN: str(token), HEADER_IDEMPOTENCY_KEY: key}
        body = {"key": key, "generation": generation, "worker": self.h.process}
        try:
            r = await self.http.post(f"/resources/{ledger_name(job)}", json=body,
                                     headers=headers)
        except httpx.HTTPError as exc:
            self.h.unknown(inv, f"http: {type(exc).__name__}")
            return "unknown"
        if r.status_code in (200, 201):
            self.h.ok(inv, extra={"seq": r.json().get("seq"),
                                  "duplicate": r.headers.get(HEADER_REPLAYED) == "true"})
            return "ok"
        try:
            reason = str(r.json().get("error", r.status_code))
        except ValueError:
            reason = f"http {r.status_code}"
        self.h.fail(inv, reason, extra={"status": r.status_code})
        return "fail"

    def _sqlite(self, inv: Op, job: str, token: int, generation: int, key: str) -> str:
        conn = sqlite3.connect(self.sqlite_path, timeout=60, isolation_level=None)
        try:
            conn.execute("BEGIN IMMEDIATE")
            try:
                d = admit(conn, Effect(f"sqlite/{job}", token, key, response="ok"))
                if not d.duplicate:
                    conn.execute("INSERT INTO chaos_effects (resource, token, job, generation,"
                                 " key, worker) VALUES (?, ?, ?, ?, ?, ?)",
                                 (f"sqlite/{job}", token, job, generation, key,
                                  self.h.process))
            except StaleFenceError:
                conn.execute("ROLLBACK")
                self.h.fail(inv, "stale")
                return "fail"
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            try:
                conn.execute("COMMIT")
            except sqlite3.Error as exc:
                self.h.unknown(inv, f"commit: {exc}")
                return "unknown"
            self.h.ok(inv, extra={"duplicate": d.duplicate})
            return "ok"
        finally:
            conn.close()

    async def _postgres(self, inv: Op, job: str, token: int, generation: int,
                        key: str) -> str:
        import psycopg
        from psycopg.pq import TransactionStatus

        # One connection, one transaction at a time: the late "rogue" effects run
        # in background tasks, and two tasks' transaction() blocks on one
        # connection would nest as savepoints of a transaction nobody commits.
        async with self._pg_lock:
            if self._pg is None or self._pg.closed:
                self._pg = await psycopg.AsyncConnection.connect(self.pg_dsn, autocommit=True,
                                                                 connect_timeout=5)
            conn = self._pg
            try:
                async with conn.transaction():
                    d = await admit_async(conn, Effect(f"pg/{job}", token, key,
                                                       response="ok"))
                    if not d.duplicate:
                        await conn.execute(
                            "INSERT INTO chaos_effects (resource, token, job, generation, key,"
                            " worker) VALUES (%s, %s, %s, %s, %s, %s)",
                            (f"pg/{job}", token, job, generation, key, self.h.process))
            except StaleFenceError:
                self.h.fail(inv, "stale")
                return "fail"
            except psycopg.OperationalError as exc:
                self._pg = None
                self.h.unknown(inv, f"pg: {exc}"[:200])
                return "unknown"
            if conn.info.transaction_status != TransactionStatus.IDLE:
                # not committed after all: never acknowledge it
                self._pg = None
                await conn.close()
                self.h.unknown(inv, f"pg: transaction still open ({conn.info.transaction_status})")
                return "unknown"
        self.h.ok(inv, extra={"duplicate": d.duplicate})
        return "ok"


def open_jobs(run: Path, name: str = "jobs.txt") -> list[str]:
    try:
        return [j for j in (run / name).read_text().split() if j]
    except OSError:
        return []


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.run = Path(args.dir)
        self.process = f"{args.id}.{os.getpid()}"
        self.h = History(self.run / f"history-{self.process}.jsonl", self.process)
        self.rng = random.Random(args.seed or None)
        self.effects = Effects(args, self.h)
        self.done: set[str] = set()
        self.background: set[asyncio.Task[None]] = set()

    def late_rogue(self, job: str, token: int, generation: int) -> None:
        """Send the rogue effects later, in the background, like requests stuck in
        a network buffer, while this worker goes on with other jobs."""
        async def later() -> None:
            await asyncio.sleep(self.rng.uniform(0.1, self.args.rogue_delay))
            await self.effects.rogue(job, token, generation)

        task = asyncio.create_task(later())
        self.background.add(task)
        task.add_done_callback(self.background.discard)

    def stopping(self) -> bool:
        return (self.run / "stop").exists()

    def pick(self) -> str | None:
        """A random open job. The runner marks some jobs as the sidecar pairs'
        (``pairs.txt``): a pair picks those, library workers the others, each
        four times in five, so the pairs (whose sidecar needs seconds to start
        on a loaded machine) get claims too, and everyone still competes."""
        jobs = [j for j in open_jobs(self.run) if j not in self.done]
        if not jobs:
            return None
        reserved = set(open_jobs(self.run, "pairs.txt"))
        pair = self.args.mode == "sidecar"
        preferred = [j for j in jobs if (j in reserved) == pair]
        if preferred and self.rng.random() < 0.8:
            return self.rng.choice(preferred)
        return self.rng.choice(jobs)

    async def pace(self) -> None:
        await asyncio.sleep(self.rng.uniform(0.02, self.args.step_delay))

    # -- the library worker ----------------------------------------------------------------

    async def run_library(self) -> None:
        async with JobLeaseClient(etcd_config(self.args)) as client:
            while not self.stopping():
                job = self.pick()
                if job is None:
                    await asyncio.sleep(0.1)
                    continue
                await self.one_library_job(client, job)

    async def one_library_job(self, client: JobLeaseClient, job: str) -> None:
        inv = self.h.invoke("claim", job=job)
        try:
            lease = await client.claim(JobRef.parse(job), self.process)
        except HeldError as e:
            self.h.fail(inv, "held", extra={"holderToken": e.token})
            await asyncio.sleep(self.rng.uniform(0.02, 0.1))
            return
        except AlreadyCompletedError:
            self.h.fail(inv, "completed")
            self.done.add(job)
            return
        except (StoreUnavailableError, LeaseLostError) as e:  # incl. OutcomeUnknownError
            self.h.unknown(inv, e.reason)  # LeaseLostError: committed, but lost already
            await asyncio.sleep(0.2)
            return
        except JobLeaseError as e:
            self.h.fail(inv, e.reason)
            await asyncio.sleep(0.2)
            return
        self.h.ok(inv, token=lease.token, generation=lease.generation,
                  extra={"owner": self.process})
        try:
            await self._library_job(lease, job)
        finally:
            if lease.lost_reason is not None:
                self.note_lost(job, lease.token, lease.generation, lease.lost_reason)

    def note_lost(self, job: str, token: int, generation: int, reason: str) -> None:
        inv = self.h.invoke("lost", job=job, token=token, generation=generation)
        self.h.ok(inv, reason=reason[:300])

    async def effect(self, lease: Lease, job: str, step: int, *, checked: bool) -> None:
        """Effect ``step`` of a claim (tests/chaos/sem_workload.py adds its slots')."""
        await self.effects.write(job, lease.token, lease.generation, step, checked=checked)

    def rogue_after_loss(self, lease: Lease, job: str) -> None:
        """A lost claim's late effects, under everything it was fenced by."""
        self.late_rogue(job, lease.token, lease.generation)

    async def _library_job(self, lease: Lease, job: str) -> None:
        lost = False
        for step in range(self.args.effects):
            await self.pace()
            checked = self.rng.random() >= self.args.unchecked
            if checked:
                try:
                    lease.ensure_valid()
                except LeaseLostError:
                    lost = True
                    if self.rng.random() < self.args.rogue:
                        self.rogue_after_loss(lease, job)
                    break
            await self.effect(lease, job, step, checked=checked)
        if lost and self.rng.random() >= self.args.complete_anyway:
            with contextlib.suppress(JobLeaseError):
                await lease.release()  # a well-behaved worker gives up (stale: refused)
            return
        await self.pace()
        inv = self.h.invoke("complete", job=job, token=lease.token, generation=lease.generation)
        try:
            await lease.complete({"by": self.process})
        except StaleTokenError as e:
            self.h.fail(inv, "stale", extra={"currentToken": e.current_token})
            return
        except OutcomeUnknownError as e:
            self.h.unknown(inv, e.reason)
            return
        except StoreUnavailableError as e:
            self.h.unknown(inv, e.reason)
            return
        except JobLeaseError as e:
            self.h.fail(inv, e.reason)
            return
        self.h.ok(inv)
        self.done.add(job)

    # -- the sidecar pair ------------------------------------------------------------------

    async def run_sidecar(self) -> None:
        n = 0
        async with httpx.AsyncClient(timeout=3.0) as api:
            while not self.stopping():
                job = self.pick()
                if job is None:
                    await asyncio.sleep(0.1)
                    continue
                n += 1
                await self.one_sidecar_job(api, job, n)

    def sidecar_env(self) -> dict[str, str]:
        """The environment a sidecar of this pair runs with: its etcd (through this
        worker's proxies), no probe listener, the runner's extra variables; never the
        worker's fault-injection preload."""
        env = {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": self.args.endpoints,
               "JOBLEASE_ROOT": self.args.root, "JOBLEASE_LOG_LEVEL": "WARNING",
               "JOBLEASE_SIDECAR_PROBE_PORT": "off"}
        if self.args.etcd_user:
            env["JOBLEASE_ETCD_USERNAME"] = self.args.etcd_user
            env["JOBLEASE_ETCD_PASSWORD"] = self.args.etcd_password
        env.pop("LD_PRELOAD", None)
        env.update(json.loads(self.args.sidecar_env or "{}"))
        return env

    def start_sidecar(self, job: str, n: int) -> tuple[subprocess.Popen[bytes], Path]:
        port_file = self.run / f"{self.args.id}.sidecar-{n}.port"
        port_file.unlink(missing_ok=True)
        env = self.sidecar_env()
        log = open(self.run / f"{self.args.id}.sidecar.log", "ab")
        # the sidecar under test (--sidecar-cmd: the Go binary, passed by the runner)
        sidecar = json.loads(self.args.sidecar_cmd)
        proc = subprocess.Popen(
            [*sidecar, "--job", job,
             "--owner", self.sidecar_owner(n), "--port", "0",
             "--port-file", str(port_file),
             "--token-file", str(self.run / f"{self.args.id}.token"), "--on-loss", "none",
             # a plain process here: a final claim answer ends it with its code
             "--on-final", "exit",
             "--claim-backoff-initial", "0.05", "--claim-backoff-max", "0.3",
             "--registration-wait", "5"],
            env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        (self.run / f"{self.args.id}.sidecar.pid").write_text(str(proc.pid))
        return proc, port_file

    def sidecar_owner(self, n: int) -> str:
        return f"{self.args.id}-sc{n}.{os.getpid()}"

    async def stop_sidecar(self, proc: subprocess.Popen[bytes]) -> None:
        (self.run / f"{self.args.id}.sidecar.pid").unlink(missing_ok=True)
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)
                proc.send_signal(signal.SIGTERM)
            for _ in range(100):
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
        proc.wait()

    async def one_sidecar_job(self, api: httpx.AsyncClient, job: str, n: int) -> None:
        proc, port_file = self.start_sidecar(job, n)
        try:
            await self._sidecar_job(api, job, proc, port_file, n)
        finally:
            await self.stop_sidecar(proc)
            port_file.unlink(missing_ok=True)

    async def _lease(self, api: httpx.AsyncClient, base: str) -> tuple[int, dict[str, Any]]:
        try:
            r = await api.get(base + "/v1/lease")
            return r.status_code, r.json()
        except (httpx.HTTPError, ValueError) as exc:
            return 0, {"error": type(exc).__name__}

    async def _sidecar_job(self, api: httpx.AsyncClient, job: str,
                           proc: subprocess.Popen[bytes], port_file: Path, n: int) -> None:
        inv = self.h.invoke("claim", job=job)
        deadline = time.monotonic() + self.args.sidecar_claim_wait
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                code = proc.poll()
                if code == 0:
                    self.h.fail(inv, "completed")
                    self.done.add(job)
                else:
                    self.h.fail(inv, "held" if code is None else f"sidecar exit {code}")
                return
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        while True:
            status, body = await self._lease(api, base)
            if status == 200:
                break
            if status == 409 and body.get("error") == "completed":
                self.h.fail(inv, "completed")
                self.done.add(job)
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                code = proc.poll()
                if code == 0:
                    self.h.fail(inv, "completed")
                    self.done.add(job)
                elif status == 409:
                    self.h.fail(inv, str(body.get("error")))  # claimed, then lost at once
                else:
                    self.h.fail(inv, "held" if code is None else f"sidecar exit {code}")
                return
            await asyncio.sleep(0.05)
        token, generation = int(body["token"]), int(body["generation"])
        self.h.ok(inv, token=token, generation=generation, extra={"owner": self.sidecar_owner(n)})
        lost = False
        for step in range(self.args.effects):
            await self.pace()
            checked = self.rng.random() >= self.args.unchecked
            if checked:
                status, now = await self._lease(api, base)
                if status != 200 or now.get("token") != token:
                    lost = True
                    if now.get("error") == "lost":
                        self.note_lost(job, token, generation, str(now.get("message")))
                    if self.rng.random() < self.args.rogue:
                        self.late_rogue(job, token, generation)
                    break
            await self.effects.write(job, token, generation, step, checked=checked)
        if lost and self.rng.random() >= self.args.complete_anyway:
            return
        await self.pace()
        inv = self.h.invoke("complete", job=job, token=token, generation=generation)
        try:
            r = await api.post(base + "/v1/complete",
                               json={"token": token, "result": {"by": self.process}})
        except httpx.HTTPError as exc:
            self.h.unknown(inv, f"sidecar: {type(exc).__name__}")
            return
        if r.status_code == 200:
            self.h.ok(inv)
            self.done.add(job)
        elif r.status_code == 409:
            self.h.fail(inv, str(r.json().get("error", "stale")))
        else:
            self.h.unknown(inv, f"sidecar http {r.status_code}")


def parser(prog: str = "python -m tests.chaos.workload") -> argparse.ArgumentParser:
    """The options every chaos worker takes (tests/chaos/queue_workload.py adds its own)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--id", required=True)
    p.add_argument("--dir", required=True)
    p.add_argument("--endpoints", required=True)
    p.add_argument("--root", required=True)
    p.add_argument("--ledger-url", required=True)
    p.add_argument("--sqlite", required=True)
    p.add_argument("--pg", default=None)
    p.add_argument("--mode", choices=("worker", "sidecar"), default="worker")
    p.add_argument("--effects", type=int, default=3)
    p.add_argument("--step-delay", type=float, default=0.25)
    p.add_argument("--unchecked", type=float, default=0.1)
    p.add_argument("--rogue", type=float, default=0.5)
    p.add_argument("--rogue-delay", type=float, default=4.0)
    p.add_argument("--complete-anyway", type=float, default=0.3)
    p.add_argument("--request-timeout", type=float, default=1.5)
    p.add_argument("--sidecar-claim-wait", type=float, default=4.0)
    p.add_argument("--sidecar-env", default="")
    p.add_argument("--sidecar-cmd", default="",
                   help="JSON list: the sidecar's command line (needed with --mode sidecar)")
    p.add_argument("--resend-unknown", type=float, default=0.7)
    p.add_argument("--resend-ok", type=float, default=0.1)
    p.add_argument("--etcd-user", default="")
    p.add_argument("--etcd-password", default="")
    p.add_argument("--seed", type=int, default=0)
    return p


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    return parser().parse_args(argv)


async def amain(args: argparse.Namespace) -> None:
    w = Worker(args)
    try:
        if args.mode == "worker":
            await w.run_library()
        else:
            await w.run_sidecar()
    finally:
        if w.background:
            await asyncio.wait(w.background, timeout=args.rogue_delay + 5)
        await w.effects.close()
        w.h.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(amain(parse()))
