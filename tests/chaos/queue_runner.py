"""The chaos suite's queue workload: one queue, N items enqueued in batches while
the nemesis runs, a fleet of queue workers draining it; then the queue's rules.

    python -m tests.chaos.queue_runner [--duration 30 | --trials 1000] [--items 150] ...

The same cluster, proxies, destinations, nemesis and history format as the job
workload (``runner.py``: this runner overrides its workload hooks). The runner
creates the queue (``maxAttempts`` large enough that the nemesis alone should
exhaust no item) and enqueues the items in batches, recording each enqueue in
its own history file (``history-runner.jsonl``; an unknown outcome is sent
again, which must be a no-op for what committed). ``poison`` of the items are
poison: their workers always give them back unfinished, so each must end
``Failed`` after ``maxAttempts`` claims. Items are enqueued while fewer than
``backlog`` are open, so the fleet has work for the whole fault period; what is
left when the faults stop is enqueued then. After the faults, the workers drain
the queue within ``liveness_bound`` seconds; then they are stopped, etcd's
final state of every item and the destinations are read, and
``queue_checker.check_queue`` judges (tests/chaos/queue_checker.py).

Worker processes run ``tests.chaos.queue_workload``: library workers
(``--mode worker``: the core library's ``Queues``) and ``sidecar_pairs`` pairs
(``--mode sidecar``: a draining Go sidecar in queue mode and a worker talking
HTTP to it), so every fault type has a target: the sidecar faults pause, kill,
partition or delay the pairs' sidecars as in the job workload.

With a control plane (``tests.support.controlplane``, the CRDs installed:
:func:`run`'s ``control_plane``) the real operator runs too (started with
``--queue-interval``), the queue is a ``JobQueue`` created with ``kubectl
apply`` as a user would (the operator registers it in etcd; the runner waits
for that before it enqueues), the nemesis also kills and rolls out the operator
and cuts or delays its traffic (``OPERATOR_FAULT_TYPES``), and a watch records
every JobQueue status the API server served. After the drain the runner waits
(bounded) until the last one shows etcd's final counts, and the checker judges
them (``queue_checker.check_queue_statuses``: never backwards, counts that add
up and equal etcd's at their ``etcdRevision``, the last one etcd's final).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from joblease import JobLeaseClient
from joblease.errors import JobLeaseError, StoreUnavailableError
from joblease.keys import KeySpace, QueueRef
from joblease.queue import Queues
from joblease.records import QueueSpec
from joblease.store import Get
from tests.chaos import checker, history, queue_checker, queue_from_etcd
from tests.chaos.history import History
from tests.chaos.nemesis import FAULT_TYPES
from tests.chaos.runner import NAMESPACE, ChaosConfig, ChaosRunner, Report, _retry

#: The nemesis's faults that need no sidecar pair (a run with ``sidecar_pairs=0``).
NO_PAIR_FAULT_TYPES = tuple(t for t in FAULT_TYPES if "sidecar" not in t)
QUEUE = QueueRef(NAMESPACE, "q")


@dataclass
class QueueChaosConfig(ChaosConfig):
    sidecar_pairs: int = 1            # draining Go sidecars + their HTTP workers
    fault_types: tuple[str, ...] = FAULT_TYPES
    step_delay: float = 0.3           # items are many: ~1 s each (a job's ~1-2 s)
    liveness_bound: float = 45.0      # after the faults, the drain's deadline
    items: int = 150                  # items enqueued in all, poison ones included
    poison: int = 3                   # items no worker completes: they must end Failed
    max_attempts: int = 20            # the queue's; the nemesis alone should exhaust none
    batch: int = 8                    # an enqueue's size: 1 .. 2 x batch
    backlog: int = 24                 # enqueue while fewer items than this are open
    concurrency: int = 2              # claimers per worker process (one shared pool)
    claim_wait: float = 1.0           # claim_next's wait (a watch) before "empty"
    status_interval: float = 0.5      # with the operator: its --queue-interval

    def __post_init__(self) -> None:
        pair_faults = [t for t in self.fault_types if "sidecar" in t]
        if pair_faults and not self.sidecar_pairs:
            raise ValueError(f"fault types {pair_faults} need a sidecar pair to target: "
                             "sidecar_pairs=0 schedules NO_PAIR_FAULT_TYPES")
        if not 0 <= self.poison <= self.items:
            raise ValueError(f"poison {self.poison} must be within 0..items ({self.items})")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be >= 1: poison items must be able to fail")


@dataclass
class QueueReport(Report):
    items_enqueued: int = 0           # acknowledged enqueues promised these
    items_completed: int = 0
    items_failed: int = 0
    enqueues: int = 0                 # batches acknowledged
    failed_poison: list[str] = field(default_factory=list)
    failed_exhausted: list[str] = field(default_factory=list)  # not poison: the nemesis
    max_claims_of_an_item: int = 0    # the highest generation of a non-poison item

    def summary(self) -> str:
        lines = super().summary().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("  jobs:"))
        lines[at:at + 1] = [
            f"  queue {QUEUE}: {self.items_enqueued} items enqueued (in {self.enqueues} "
            f"acknowledged batches), {self.items_completed} completed, "
            f"{self.items_failed} failed",
            f"  failed: poison {len(self.failed_poison)}, exhausted by the nemesis "
            f"{len(self.failed_exhausted)}" + (f" {self.failed_exhausted}"
                                               if self.failed_exhausted else ""),
            f"  most claims of one (non-poison) item: {self.max_claims_of_an_item}",
        ]
        lines = [line.replace("every job completed", "every item settled") for line in lines]
        return "\n".join(lines)


class QueueChaosRunner(ChaosRunner):
    worker_module = "tests.chaos.queue_workload"
    report_class = QueueReport
    status_plural = "jobqueues"

    def __init__(self, cfg: QueueChaosConfig, run_dir: Path | None = None,
                 control_plane: Any = None) -> None:
        super().__init__(cfg, run_dir, control_plane)
        self.qcfg = cfg
        width = len(str(cfg.items))
        ids = [f"poison-{n}" for n in range(cfg.poison)]
        ids += [f"i{n:0{width}d}" for n in range(cfg.items - cfg.poison)]
        self.poison = [f"{QUEUE}/{i}" for i in ids[:cfg.poison]]
        self.unsent = ids  # enqueued from the front; the poison ones first
        self.settled: set[str] = set()  # completed or failed, as last polled
        self.h: History | None = None
        self.queues: Queues | None = None

    def _worker_args(self) -> list[str]:
        return ["--queue", str(QUEUE), "--concurrency", str(self.qcfg.concurrency),
                "--claim-wait", str(self.qcfg.claim_wait)]

    def _operator_args(self) -> list[str]:
        return ["--queue-interval", str(self.qcfg.status_interval)]

    def _holder_key(self, job: str) -> bytes:
        queue, _, item_id = job.rpartition("/")
        return KeySpace(self.root).queue(QueueRef.parse(queue)).item(item_id).holder

    # -- enqueueing ----------------------------------------------------------------------

    async def _begin(self, client: JobLeaseClient) -> None:
        self.h = History(self.dir / "history-runner.jsonl", "runner")
        queues = self.queues = Queues(client)
        if self.cp is None:
            spec = QueueSpec(self.qcfg.ttl, self.qcfg.max_attempts)
            await _retry(lambda: queues.create(QUEUE, spec))
        else:
            await self._create_job_queue(queues)
        await self._enqueue(max(self.qcfg.poison, self.qcfg.backlog))

    async def _create_job_queue(self, queues: Queues, timeout: float = 60.0) -> None:
        """As a user does: a JobQueue resource; the operator creates the queue in etcd
        (items are enqueued through the library: a queue has no object per item)."""
        assert self.cp is not None
        doc = json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobQueue",
                          "metadata": {"name": QUEUE.name, "namespace": QUEUE.namespace},
                          "spec": {"leaseDurationSeconds": self.qcfg.ttl,
                                   "maxAttempts": self.qcfg.max_attempts}})
        r = await asyncio.to_thread(self.cp.kubectl, "apply", "-f", "-", input=doc)
        if r.returncode != 0:
            raise RuntimeError(f"kubectl apply of the JobQueue failed: {r.stderr}")
        deadline = time.monotonic() + timeout
        while True:
            try:
                await queues.spec(QUEUE, refresh=True)
                return
            except JobLeaseError as e:  # QueueNotFoundError until the operator created it
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the operator did not create queue {QUEUE} in etcd "
                                       f"within {timeout:.0f}s: {e}") from e
            self._check_operator()
            await asyncio.sleep(0.2)

    async def _enqueue(self, n: int) -> None:
        """The next ``n`` ids as one batch; an unknown outcome is sent again until
        acknowledged (a re-enqueue of what committed is a no-op)."""
        assert self.h is not None and self.queues is not None
        ids, self.unsent = self.unsent[:n], self.unsent[n:]
        if not ids:
            return
        self.jobs.extend(f"{QUEUE}/{i}" for i in ids)
        poison = [i for i in ids if f"{QUEUE}/{i}" in self.poison]
        batch = [(i, {"poison": True} if i in poison else {"n": i}) for i in ids]
        first: str | None = None
        for _ in range(40):
            extra: dict[str, Any] = {"ids": ids, "poison": poison}
            if first:
                extra["resend"] = first
            inv = self.h.invoke("enqueue", job=str(QUEUE), extra=extra)
            first = first or inv.op
            try:
                r = await self.queues.enqueue(QUEUE, batch)
            except StoreUnavailableError as e:  # incl. OutcomeUnknownError
                self.h.unknown(inv, e.reason)
                await asyncio.sleep(0.5)
                continue
            except JobLeaseError as e:
                self.h.fail(inv, e.reason)
                raise
            self.h.ok(inv, extra={"added": len(r.added), "existing": len(r.existing)})
            return
        raise RuntimeError(f"enqueue of {len(ids)} items not acknowledged after 40 tries")

    async def _poll(self, client: JobLeaseClient) -> None:
        """Which items are settled (a result or a failed record): two key-only ranges."""
        keys = KeySpace(self.root).queue(QUEUE)
        try:
            r = await client.store.txn([], [
                Get(keys.field_prefix(f), prefix=True, keys_only=True)
                for f in ("results", "failed")])
        except JobLeaseError:
            return
        now = time.monotonic()
        for n, f in enumerate(("results", "failed")):
            for kv in r.kvs(n):
                item = f"{QUEUE}/{kv.key[len(keys.field_prefix(f)):].decode()}"
                if item not in self.settled:
                    self.settled.add(item)
                    self.completed_at[item] = now

    async def _during_faults(self, client: JobLeaseClient) -> None:
        await self._poll(client)
        open_items = len(self.jobs) - len(self.settled)
        if open_items < self.qcfg.backlog and self.unsent:
            await self._enqueue(self.rng.randint(1, 2 * self.qcfg.batch))

    async def _faults_stopped(self, client: JobLeaseClient) -> None:
        while self.unsent:
            await self._enqueue(64)

    async def _settled(self, client: JobLeaseClient) -> bool:
        await self._poll(client)
        return not self.unsent and all(j in self.settled for j in self.jobs)

    # -- the verdict ---------------------------------------------------------------------

    async def _final_items(self, client: JobLeaseClient) -> dict[str, queue_checker.FinalItem]:
        """Every item's keys, read at one revision."""
        keys = KeySpace(self.root).queue(QUEUE)
        fields = queue_from_etcd.FIELDS
        r = await _retry(lambda: client.store.txn([], [
            Get(keys.field_prefix(f), prefix=True, keys_only=f in ("items", "pending", "held"))
            for f in fields]))
        by: dict[str, dict[str, queue_from_etcd.Kv]] = {f: {} for f in fields}
        for n, f in enumerate(fields):
            for kv in r.kvs(n):
                by[f][kv.key[len(keys.field_prefix(f)):].decode()] = queue_from_etcd.Kv(
                    kv.create_revision, kv.mod_revision, kv.version, kv.value)
        return queue_from_etcd.final_items(str(QUEUE), by)

    async def _judge(self, client: JobLeaseClient, report: Report, stopped: float
                     ) -> tuple[list[history.Op], dict[str, list[checker.Entry]],
                                list[checker.Violation]]:
        assert isinstance(report, QueueReport)
        if self.h is not None:
            self.h.close()
        final = await self._final_items(client)
        statuses = await self._queue_converged(final)
        ops = history.merge(self.dir.glob("history-*.jsonl"))
        holders = await self._holders(client, ops)
        destinations = await self._destinations(client)
        violations = queue_checker.check_queue(
            ops, final=final, max_attempts=self.qcfg.max_attempts, poison=self.poison,
            destinations=destinations, holders=holders, statuses=statuses)
        # a watch that could not resume (410 Gone) missed statuses: the verdict on
        # them would be incomplete, so the run cannot pass
        violations += [checker.Violation("status-watch-gap", gap, job=str(QUEUE))
                       for gap in (self.recorder.gaps if self.recorder else [])]
        report.statuses_served = sum(len(v) for v in (statuses or {}).values())
        operations = history.pair(ops)
        report.items_enqueued = len(queue_checker.enqueued(operations))
        report.enqueues = sum(1 for o in operations if o.kind == "enqueue" and o.phase == "ok")
        report.items_completed = sum(1 for s in final.values() if s.result_token is not None)
        report.items_failed = sum(1 for s in final.values() if s.failed_generation is not None)
        failed = queue_checker.failures(final, self.poison)
        report.failed_poison, report.failed_exhausted = failed["poison"], failed["exhausted"]
        report.max_claims_of_an_item = max(
            (s.generation for i, s in final.items() if i not in self.poison), default=0)
        report.jobs_registered = len(self.jobs)
        return ops, destinations, violations


    async def _queue_converged(self, final: dict[str, queue_checker.FinalItem],
                               timeout: float = 60.0) -> dict[str, list[dict[str, Any]]] | None:
        """With the operator: wait (bounded) until the last JobQueue status served shows
        etcd's final counts; return every status served, keyed ``<namespace>/<name>``
        (the checker judges them, the last one included: a timeout is its finding)."""
        if self.recorder is None:
            return None
        want = queue_checker.final_counts(final)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_operator()
            last = self.recorder.last(QUEUE.name)
            if {f: last.get(f) for f in want} == want:
                break
            await asyncio.sleep(0.5)
        return {f"{NAMESPACE}/{name}": served
                for name, served in self.recorder.snapshot().items()}


async def run(cfg: QueueChaosConfig, run_dir: Path | None = None,
              control_plane: Any = None) -> QueueReport:
    """One queue chaos run; with ``control_plane`` (the CRDs installed) the operator
    runs too and the queue is a JobQueue whose served statuses are judged."""
    report = await QueueChaosRunner(cfg, run_dir, control_plane).run()
    assert isinstance(report, QueueReport)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.queue_runner")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--sidecar-pairs", type=int, default=1)
    p.add_argument("--items", type=int, default=150)
    p.add_argument("--poison", type=int, default=3)
    p.add_argument("--max-attempts", type=int, default=20)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--pg", default=None, help="PostgreSQL conninfo (else SQLite only)")
    p.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    cfg = QueueChaosConfig(workers=a.workers, sidecar_pairs=a.sidecar_pairs,
                           fault_types=FAULT_TYPES if a.sidecar_pairs else NO_PAIR_FAULT_TYPES,
                           duration=a.duration, trials=a.trials,
                           items=a.items, poison=a.poison, max_attempts=a.max_attempts,
                           fault_interval=a.interval, seed=a.seed, pg_dsn=a.pg)
    report = asyncio.run(run(cfg, Path(a.out) if a.out else None))
    print(report.summary())
    print(json.dumps(asdict(report)["violations"][:10], indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
