"""The chaos suite's semaphore workload: one semaphore, N jobs whose specs name it,
a fleet of library workers taking slots under the nemesis; then the semaphore's rules.

    python -m tests.chaos.sem_runner [--duration 25 | --trials 1000] [--limits 2,3] ...

The same cluster, proxies, destinations, nemesis and history format as the job
workload (``runner.py``: this runner overrides its workload hooks). No operator
runs at any time: a semaphore needs none (its slots are bound to the claims'
etcd leases), so the whole run is "operator down". The runner records etcd's
revision, creates the semaphore ``chaos/db`` with the first of ``limits`` and
keeps ``open_jobs`` jobs registered (``JobSpec.semaphores`` naming it, weight
1); every ``limit_every`` seconds of faults it changes the limit to the next
of ``limits`` (raised: waiters get in; lowered: nobody is revoked). Workers run
``tests.chaos.sem_workload`` (the core library's ``claim_waiting``, effects
fenced on the slot and on the job). After the faults the workers complete
every job within ``liveness_bound``; then they stop, and the runner reads
etcd's history of ``S/`` (a watch from the recorded revision up to a marker
key it puts under ``S/`` last: the run owns its key root, and the chaos
cluster never compacts), the slot keys still live, every job's final state and
the destinations; ``checker.check`` judges the jobs and
``sem_checker.check_semaphore`` the semaphore (tests/chaos/sem_checker.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.keys import SemaphoreRef
from joblease.records import SemaphoreSpec, SemaphoreUse, SlotRecord
from joblease.semaphore import Semaphores
from joblease.store import Put
from tests.chaos import checker, history, sem_checker
from tests.chaos.nemesis import FAULT_TYPES
from tests.chaos.runner import NAMESPACE, ChaosConfig, ChaosRunner, Report, _retry
from tests.chaos.sem_workload import slot_resource

#: The nemesis's faults that have a target here (no sidecar pairs yet, see
#: sem_workload.py; no operator faults: no operator runs).
SEM_FAULT_TYPES = tuple(t for t in FAULT_TYPES if "sidecar" not in t)
SEMAPHORE = SemaphoreRef(NAMESPACE, "db")
#: Put under ``S/`` once the workers stopped: the end of the history the runner reads.
END_MARKER = b"~chaos-history-end"


@dataclass
class SemChaosConfig(ChaosConfig):
    sidecar_pairs: int = 0            # no pairs in this workload yet (sem_workload.py)
    fault_types: tuple[str, ...] = SEM_FAULT_TYPES
    open_jobs: int = 6                # more than the limit: claims wait in line
    step_delay: float = 0.3           # two effects per step (the slot's, the job's)
    liveness_bound: float = 45.0
    limits: tuple[int, ...] = (2, 3)  # the semaphore's limit, cycled during the faults
    limit_every: float = 8.0          # seconds between limit changes (0: never)
    claim_wait: float = 2.0           # claim_waiting's wait in line

    def __post_init__(self) -> None:
        if self.sidecar_pairs:
            raise ValueError("semaphore runs have no sidecar pairs yet "
                             "(tests/chaos/sem_workload.py)")
        if not self.limits or any(not 1 <= k <= 100 for k in self.limits):
            raise ValueError(f"limits {self.limits}: each 1..100")


@dataclass
class SemReport(Report):
    semaphore: str = str(SEMAPHORE)
    limits_set: list[int] = field(default_factory=list)  # in the order etcd has them
    slot_grants: int = 0              # slot keys created (etcd's history)
    grants_per_slot: dict[str, int] = field(default_factory=dict)
    max_live_slots: int = 0           # at any one revision: must be <= the highest limit
    slot_effects: int = 0             # accepted effects at slot resources
    claims_refused_full: int = 0

    def summary(self) -> str:
        lines = super().summary().splitlines()
        at = next(i for i, line in enumerate(lines) if line.startswith("  jobs:"))
        lines[at + 1:at + 1] = [
            f"  semaphore {self.semaphore}: limits {sorted(set(self.limits_set))} (set "
            f"{len(self.limits_set)} times), {self.slot_grants} "
            f"slot grants ({', '.join(f'{k}={v}' for k, v in self.grants_per_slot.items())}), "
            f"max live slots at one revision {self.max_live_slots}",
            f"  slot effects accepted: {self.slot_effects}; claims refused full (no slot "
            f"within the wait): {self.claims_refused_full}",
        ]
        return "\n".join(lines)


class SemChaosRunner(ChaosRunner):
    worker_module = "tests.chaos.sem_workload"
    report_class = SemReport

    def __init__(self, cfg: SemChaosConfig, run_dir: Path | None = None) -> None:
        super().__init__(cfg, run_dir)
        self.scfg = cfg
        self.start_revision = 0
        self.limit_at = 0.0
        self.limit_n = 0
        self.sems: Semaphores | None = None
        self.granted: set[int] = set()  # slot indexes of etcd's history (read in _judge)

    def _worker_args(self) -> list[str]:
        return ["--claim-wait", str(self.scfg.claim_wait)]

    def _fenced_names(self) -> list[str]:
        # every slot etcd ever granted, not only those below the limits: a grant
        # above the limit (a broken claim) must not look like lost writes
        indexes = set(range(max(self.scfg.limits))) | self.granted
        return self.jobs + [slot_resource(str(SEMAPHORE), i) for i in sorted(indexes)]

    async def _begin(self, client: JobLeaseClient) -> None:
        self.start_revision, _ = await _retry(lambda: client.store.get(b"\0"))
        sems = self.sems = Semaphores(client)
        await _retry(lambda: sems.create(SEMAPHORE, self.scfg.limits[0]))
        self.limit_at = time.monotonic()
        await super()._begin(client)

    async def _register(self, client: JobLeaseClient, n: int) -> None:
        spec = JobSpec(self.cfg.ttl, 0, semaphores=(SemaphoreUse(SEMAPHORE.name, 1),))
        for _ in range(n):
            self.next_job += 1
            job = f"{NAMESPACE}/j{self.next_job}"
            await _retry(lambda j=job: client.register(JobRef.parse(j), spec))
            self.jobs.append(job)

    async def _during_faults(self, client: JobLeaseClient) -> None:
        await super()._during_faults(client)
        cfg = self.scfg
        if (cfg.limit_every and len(cfg.limits) > 1
                and time.monotonic() - self.limit_at >= cfg.limit_every):
            assert self.sems is not None
            self.limit_n += 1
            limit = cfg.limits[self.limit_n % len(cfg.limits)]
            sems = self.sems
            await _retry(lambda: sems.create(SEMAPHORE, limit))
            self.limit_at = time.monotonic()

    # -- the verdict ---------------------------------------------------------------------

    async def _slot_history(self, client: JobLeaseClient) -> list[sem_checker.SlotEvent]:
        """etcd's history of ``S/`` from the run's start: spec puts as limit changes,
        slot puts and deletes. It ends at a marker key put now (the workers stopped):
        a watch with history has no end of its own."""
        keys = client.keys.semaphore(SEMAPHORE)
        marker = keys.prefix + END_MARKER
        r = await _retry(lambda: client.store.txn([], [], [Put(marker, b"end")]))
        end = r.revision
        events: list[sem_checker.SlotEvent] = []

        async def follow() -> None:
            async for batch in client.store.watch(keys.prefix, prefix=True,
                                                  start_revision=self.start_revision + 1):
                for e in batch.events:
                    kv = e.kv
                    if kv.key == keys.spec and e.kind == "put":
                        events.append(sem_checker.SlotEvent(
                            kv.mod_revision, "limit", limit=SemaphoreSpec.decode(kv.value).limit))
                    elif kv.key.startswith(keys.slots):
                        index = keys.slot_index(kv.key)
                        if e.kind == "put":
                            rec = SlotRecord.decode(kv.value)
                            events.append(sem_checker.SlotEvent(
                                kv.mod_revision, "put", index, kv.create_revision,
                                rec.holder, rec.owner))
                        else:
                            events.append(sem_checker.SlotEvent(kv.mod_revision, "delete",
                                                                index))
                    if kv.mod_revision >= end:
                        return

        await asyncio.wait_for(follow(), 60)
        return events

    async def _judge(self, client: JobLeaseClient, report: Report, stopped: float
                     ) -> tuple[list[history.Op], dict[str, list[checker.Entry]],
                                list[checker.Violation]]:
        assert isinstance(report, SemReport)
        events = await self._slot_history(client)  # first: _destinations reads its slots
        self.granted = {e.index for e in events if e.kind == "put"}
        ops, destinations, violations = await super()._judge(client, report, stopped)
        final = await self._final(client)
        keys = client.keys.semaphore(SEMAPHORE)
        _, kvs = await _retry(lambda: client.store.get(keys.slots, prefix=True))
        live_at_end = {keys.slot_index(kv.key): SlotRecord.decode(kv.value).holder
                       for kv in kvs}
        violations = violations + sem_checker.check_semaphore(
            ops, semaphore=str(SEMAPHORE), events=events, jobs=self.jobs, final=final,
            live_at_end=live_at_end, destinations=destinations)
        by_slot = sem_checker.grants(events)
        report.limits_set = [e.limit for e in events if e.kind == "limit"]
        report.slot_grants = sum(len(g) for g in by_slot.values())
        report.grants_per_slot = {str(i): len(g) for i, g in sorted(by_slot.items())}
        report.max_live_slots = sem_checker.max_live(events)
        marks = [f"semaphore/{SEMAPHORE}/slot/", f"semaphore-{SEMAPHORE}-slot-".replace("/", "-")]
        report.slot_effects = sum(len(v) for k, v in destinations.items()
                                  if any(m in k for m in marks))
        report.claims_refused_full = sum(1 for o in history.pair(ops) if o.kind == "claim"
                                         and o.phase == "fail" and o.reason == "full")
        return ops, destinations, violations


async def run(cfg: SemChaosConfig, run_dir: Path | None = None) -> SemReport:
    report = await SemChaosRunner(cfg, run_dir).run()
    assert isinstance(report, SemReport)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.chaos.sem_runner")
    p.add_argument("--duration", type=float, default=25.0)
    p.add_argument("--trials", type=int, default=0)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--open-jobs", type=int, default=6)
    p.add_argument("--limits", default="2,3", help="the limits cycled through, e.g. 2,3")
    p.add_argument("--limit-every", type=float, default=8.0)
    p.add_argument("--interval", type=float, default=1.0)
    p.add_argument("--pg", default=None, help="PostgreSQL conninfo (else SQLite only)")
    p.add_argument("--out", default=None, help="run directory (default: a temp dir)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    cfg = SemChaosConfig(workers=a.workers, duration=a.duration, trials=a.trials,
                         open_jobs=a.open_jobs,
                         limits=tuple(int(x) for x in a.limits.split(",")),
                         limit_every=a.limit_every, fault_interval=a.interval, seed=a.seed,
                         pg_dsn=a.pg)
    report = asyncio.run(run(cfg, Path(a.out) if a.out else None))
    print(report.summary())
    print(json.dumps(asdict(report)["violations"][:10], indent=2))
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
