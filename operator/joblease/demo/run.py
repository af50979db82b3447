"""The seed's worked example, end to end, with real processes.

1. an embedded etcd and the example ledger destination start on free ports;
2. earlier workers use up generations 1-6 (claimed and released);
3. worker A claims generation 7 and writes once to the destination;
4. A is paused (SIGSTOP) past its TTL; etcd expires A's lease;
5. worker B claims generation 8 (a larger token) and writes;
6. A resumes (SIGCONT), tries to complete and sends its delayed write:
   the store rejects the completion as stale, the destination rejects the write;
7. B completes.

Exit status 0 only if both of A's late effects were rejected.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from joblease.embedded import EtcdCluster, free_port
from joblease.keys import DEFAULT_ROOT
from joblease.validation import DEFAULT_HISTORY_LIMIT

TTL = 2
JOB = "demo/nightly-report"
ROOT = DEFAULT_ROOT


@dataclass
class Timeline:
    started: float = field(default_factory=time.monotonic)
    rows: list[dict[str, Any]] = field(default_factory=list)
    echo: bool = True

    def add(self, actor: str, action: str, outcome: str, generation: int | None = None,
            token: int | None = None) -> None:
        row = {"t": round(time.monotonic() - self.started, 2), "actor": actor, "action": action,
               "generation": generation, "token": token, "outcome": outcome}
        self.rows.append(row)
        if self.echo:
            print(format_row(row), flush=True)


HEADER = f"{'TIME':>6}  {'ACTOR':<9} {'ACTION':<34} {'GEN':>4} {'TOKEN':>6}  OUTCOME"


def format_row(r: dict[str, Any]) -> str:
    gen = "" if r["generation"] is None else str(r["generation"])
    tok = "" if r["token"] is None else str(r["token"])
    return (f"{r['t']:>5.2f}s  {r['actor']:<9} {r['action']:<34} {gen:>4} {tok:>6}  "
            f"{r['outcome']}")


class Worker:
    """``python -m joblease.demo.worker`` as a child process."""

    def __init__(self, endpoints: str, owner: str) -> None:
        self.owner = owner
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "joblease.demo.worker", endpoints, ROOT, JOB, owner],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self._events: queue.Queue[dict[str, Any]] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._events.put(json.loads(line))

    def next(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self._events.get(timeout=left)
            except queue.Empty:
                break
            if event["event"] == kind:
                return event
        raise RuntimeError(f"worker {self.owner}: no {kind} event within {timeout}s")

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)


class Destination:
    """The example ledger destination, served by uvicorn on a free loopback port."""

    def __init__(self) -> None:
        import uvicorn

        from joblease.fencing.destination import create_app

        self.port = free_port()
        config = uvicorn.Config(create_app(), host="127.0.0.1", port=self.port,
                                log_level="warning", lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> Destination:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("destination did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def run_demo(echo: bool = True) -> dict[str, Any]:
    import asyncio

    import httpx

    from joblease.client import JobLeaseClient
    from joblease.etcd_store import EtcdConfig
    from joblease.keys import JobRef
    from joblease.records import JobSpec

    timeline = Timeline(echo=echo)
    if echo:
        print(HEADER, flush=True)
    cluster = EtcdCluster(1)
    workers: list[Worker] = []
    try:
        cluster.start()
        endpoints = ",".join(cluster.endpoints)
        config = EtcdConfig(endpoints=cluster.endpoints, root=ROOT)
        job = JobRef.parse(JOB)
        timeline.add("etcd", "embedded etcd started", endpoints)

        async def prepare() -> None:
            async with JobLeaseClient(config) as c:
                await c.register(job, JobSpec(lease_duration_seconds=TTL, max_attempts=10,
                                              history_limit=DEFAULT_HISTORY_LIMIT))
                for i in range(6):
                    lease = await c.claim(job, f"earlier-{i + 1}")
                    await lease.release()

        async def wait_for_expiry(paused: float) -> None:
            """Poll etcd (one client) until it has deleted A's holder key."""
            async with JobLeaseClient(config) as c:
                while (await c.get(job)).holder is not None:
                    if time.monotonic() - paused > TTL + 10:
                        raise RuntimeError("etcd did not expire A's lease")
                    await asyncio.sleep(0.05)

        async def final_state() -> tuple[dict[str, Any], dict[str, Any]]:
            async with JobLeaseClient(config) as c:
                return (await c.get(job)).to_dict(), (await c.history(job)).to_dict()

        asyncio.run(prepare())
        timeline.add("operator", f"register {JOB} (TTL {TTL}s)", "registered")
        timeline.add("earlier", "generations 1-6 claimed, released", "ok", 6)

        with Destination() as dest:
            resource = f"{dest.url}/resources/report"
            def claim_and_write(owner: str, line: str) -> tuple[Worker, dict[str, Any]]:
                """Start a worker process; it claims, then writes ``line`` once."""
                worker = Worker(endpoints, owner)
                workers.append(worker)
                claimed = worker.next("claim")
                timeline.add(owner, "claim", "granted", claimed["generation"], claimed["token"])
                worker.send("write " + resource + " " + json.dumps({"line": line}))
                wrote = worker.next("write")
                timeline.add(owner, "write to destination", f"HTTP {wrote['status']} accepted",
                             claimed["generation"], claimed["token"])
                return worker, claimed

            a, ca = claim_and_write("worker-a", "A: partial report")

            a.proc.send_signal(signal.SIGSTOP)
            paused = time.monotonic()
            timeline.add("worker-a", "paused (SIGSTOP)", "stops renewing")
            asyncio.run(wait_for_expiry(paused))
            timeline.add("etcd", "lease of worker-a expired",
                         f"{time.monotonic() - paused:.1f}s after the pause (TTL {TTL}s "
                         "from A's last keep-alive)")

            b, cb = claim_and_write("worker-b", "B: full report")

            a.proc.send_signal(signal.SIGCONT)
            timeline.add("worker-a", "resumed (SIGCONT)", "still has its old token",
                         ca["generation"], ca["token"])
            a.send('complete {"by": "worker-a"}')
            late_complete = a.next("complete")
            store_rejected = (not late_complete["ok"]) and late_complete.get("error") == "stale"
            timeline.add("worker-a", "complete (late)",
                         f"REJECTED by etcd: {late_complete.get('error')} (current token "
                         f"{late_complete.get('currentToken')})" if store_rejected
                         else f"ACCEPTED (unsafe!) {late_complete}",
                         ca["generation"], ca["token"])
            a.send('write ' + resource + ' {"line": "A: delayed write"}')
            late_write = a.next("write")
            dest_rejected = late_write["status"] == 409 and \
                late_write["body"].get("error") == "stale"
            timeline.add("worker-a", "write to destination (delayed)",
                         f"REJECTED by destination: HTTP {late_write['status']} "
                         f"{late_write['body'].get('error')}" if dest_rejected
                         else f"ACCEPTED (unsafe!) HTTP {late_write['status']}",
                         ca["generation"], ca["token"])

            b.send('complete {"by": "worker-b", "lines": 1}')
            done = b.next("complete")
            timeline.add("worker-b", "complete", "accepted" if done["ok"] else str(done),
                         cb["generation"], cb["token"])
            ledger = httpx.get(resource, timeout=10).json()

        state, history = asyncio.run(final_state())
        tenures = {t["generation"]: t for t in history["tenures"]}
        told = (tenures.get(ca["generation"], {}), tenures.get(cb["generation"], {}))
        timeline.add("history", "joblease history " + JOB,
                     f"A's tenure {told[0].get('end')} ({told[0].get('refusedCompletions')} "
                     f"refused completion), B's {told[1].get('end')}")
        return {
            "job": JOB,
            "ttlSeconds": TTL,
            "workerA": {"generation": ca["generation"], "token": ca["token"]},
            "workerB": {"generation": cb["generation"], "token": cb["token"]},
            "lateCompletion": late_complete,
            "lateWrite": {"status": late_write["status"], "body": late_write["body"]},
            "destination": ledger,
            "finalState": state,
            "history": history,
            "timeline": timeline.rows,
            "verdicts": {
                "staleCompletionRejectedByStore": store_rejected,
                "staleWriteRejectedByDestination": dest_rejected,
                "resultIsWorkerB": (state.get("result") or {}).get("owner") == "worker-b",
                "historyTellsIt": (
                    (told[0].get("token"), told[0].get("end"), told[0].get("refusedCompletions"))
                    == (ca["token"], "expired", 1)
                    and (told[1].get("token"), told[1].get("end")) == (cb["token"], "completed")),
            },
        }
    finally:
        for w in workers:
            w.stop()
        cluster.stop()


def verdict_lines(report: dict[str, Any]) -> list[str]:
    v = report["verdicts"]
    mark = {True: "PASS", False: "FAIL"}
    return [
        f"{mark[v['staleCompletionRejectedByStore']]}  stale completion rejected by the store "
        f"(A: generation {report['workerA']['generation']}, token "
        f"{report['workerA']['token']} < B's token {report['workerB']['token']})",
        f"{mark[v['staleWriteRejectedByDestination']]}  stale write rejected by the destination "
        f"(HTTP {report['lateWrite']['status']})",
        f"{mark[v['resultIsWorkerB']]}  the recorded result is worker-b's "
        f"(generation {report['workerB']['generation']})",
        f"{mark[v['historyTellsIt']]}  the history says it: A's tenure expired with its late "
        "completion refused, B's completed (joblease history)",
    ]


def exit_code(report: dict[str, Any]) -> int:
    return 0 if all(report["verdicts"].values()) else 1


__all__ = ["exit_code", "run_demo", "verdict_lines"]

