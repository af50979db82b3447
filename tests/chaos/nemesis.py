"""Faults on a schedule: pauses, kills, partitions, delays, etcd member loss.

Every fault is logged (``faults.jsonl`` in the run directory) with its type,
target, and the runner's monotonic and wall times at start and end.

Fault types (``FAULT_TYPES``):

* ``pause-short-worker`` / ``pause-short-sidecar``: SIGSTOP then SIGCONT after
  less than the TTL;
* ``pause-long-worker`` / ``pause-long-sidecar``: the same, longer than the TTL
  (the lease expires in etcd while the process sleeps);
* ``kill-worker``: SIGKILL a library worker, restart it a moment later;
* ``kill-sidecar``: SIGKILL a pair's current sidecar (its worker starts a new one);
* ``partition``: blackhole every byte between one process and etcd (its own
  proxies), then heal by resetting the connections;
* ``delay``: delay that traffic by hundreds of milliseconds per chunk;
* ``delay-destination``: hold one process's HTTP traffic to the ledger for
  about a TTL per chunk (its own proxy): requests time out at the worker and
  arrive late, after its lease may have passed to a successor -- the delayed
  network request that only the destination's fence can stop;
* ``etcd-kill-leader`` / ``etcd-kill-follower``: SIGKILL a member of the 3-member
  cluster, restart it (it rejoins from its data dir); one member down at a time.

``clock-skew`` is not scheduled: workers and sidecars run under libfaketime
for the whole run (hours ahead/behind, x0.5 / x2); each such start is logged.

``OPERATOR_FAULT_TYPES``, scheduled only in runs with the operator
(``tests/chaos/test_chaos_operator.py``; the queue workload's operator run in
``tests/chaos/test_chaos_queue.py``):

* ``kill-operator``: SIGKILL the operator and restart it a moment later;
* ``rollout-operator``: start a second operator, let both run for 1-3 x TTL,
  then SIGTERM the old one (a rolling update: the new one stands by until the
  old one hands over its leadership).

The operator's etcd traffic goes through its own proxies, so ``partition``
and ``delay`` can pick it too, and its API-server traffic through a proxy
that ``delay-destination`` can hold.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joblease import EtcdConfig
from joblease.embedded import EtcdCluster
from joblease.errors import JobLeaseError
from joblease.etcd_store import EtcdStore
from tests.support.proxy import ChaosProxy, PartitionMode

FAULT_TYPES = (
    "pause-short-worker", "pause-long-worker", "pause-short-sidecar", "pause-long-sidecar",
    "kill-worker", "kill-sidecar", "partition", "delay", "delay-destination",
    "etcd-kill-leader", "etcd-kill-follower",
)

OPERATOR_FAULT_TYPES = ("kill-operator", "rollout-operator")

Mode = PartitionMode

class ProxyGroup:
    """One process's own proxies, one per etcd member: its only way to etcd."""

    def __init__(self, cluster: EtcdCluster) -> None:
        self.proxies = [ChaosProxy(("127.0.0.1", m.client_port)) for m in cluster.members]

    async def start(self) -> ProxyGroup:
        for p in self.proxies:
            await p.start()
        return self

    @property
    def endpoints(self) -> str:
        return ",".join(p.endpoint for p in self.proxies)

    def set(self, mode: Mode, delay: float = 0.0) -> None:
        healing = mode == "pass" and any(p.mode == "blackhole" for p in self.proxies)
        for p in self.proxies:
            p.mode, p.delay = mode, delay
            if healing:
                p.sever()

    async def close(self) -> None:
        for p in self.proxies:
            await p.close()


@dataclass
class FaultLog:
    path: Path
    started: float = field(default_factory=time.monotonic)
    counts: Counter[str] = field(default_factory=Counter)
    records: list[dict[str, Any]] = field(default_factory=list)

    def log(self, kind: str, target: str, start: float, end: float, **detail: Any) -> None:
        rec = {"type": kind, "target": target, "start": round(start - self.started, 3),
               "end": round(end - self.started, 3), "wall": time.time(), **detail}
        self.counts[kind] += 1
        self.records.append(rec)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")


class Target:
    """Something the nemesis can pause or kill: the runner supplies these."""

    def __init__(self, name: str, kind: str, pid: Callable[[], int | None],
                 restart: Callable[[], None] | None = None,
                 proxies: ProxyGroup | None = None,
                 destination: ChaosProxy | None = None,
                 rollout: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.name, self.kind, self.pid = name, kind, pid
        self.restart, self.proxies, self.destination = restart, proxies, destination
        self.rollout = rollout


async def leader_index(cluster: EtcdCluster,
                       credentials: tuple[str, str] | None = None) -> int | None:
    user, password = credentials or (None, None)
    for i, m in enumerate(cluster.members):
        if not m.running:
            continue
        try:
            async with EtcdStore(EtcdConfig(endpoints=(m.endpoint,), request_timeout=1.0,
                                            username=user, password=password)) as store:
                status = await store.status()
        except JobLeaseError:
            continue
        if status["leader"] == status["member"]:
            return i
    return None


def _signal(pid: int | None, sig: int) -> bool:
    import os

    if not pid:
        return False
    try:
        os.kill(pid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


class Nemesis:
    """Injects one fault every ``interval`` seconds (jittered), each type in turn
    first (so every type is covered early), then at random."""

    def __init__(self, cluster: EtcdCluster, targets: list[Target], log: FaultLog, *,
                 ttl: float, interval: float, rng: random.Random,
                 types: tuple[str, ...] = FAULT_TYPES,
                 credentials: tuple[str, str] | None = None) -> None:
        unknown = set(types) - set(FAULT_TYPES) - set(OPERATOR_FAULT_TYPES)
        if unknown or not types:
            raise ValueError(f"unknown fault types {sorted(unknown)} (or none given)")
        self.cluster, self.targets, self.log = cluster, targets, log
        self.types, self.credentials = types, credentials
        self.ttl, self.interval, self.rng = ttl, interval, rng
        self.busy: set[str] = set()
        self.etcd_busy = False
        self.tasks: set[asyncio.Task[None]] = set()
        self.skipped: Counter[str] = Counter()
        self.member_recovery: list[float] = []

    def _free(self, kind: str) -> list[Target]:
        return [t for t in self.targets if t.kind == kind and t.name not in self.busy
                and t.pid()]

    async def run(self, stop: Callable[[], bool]) -> None:
        plan: list[str] = []
        while not stop():
            if not plan:
                plan = list(self.types)
                self.rng.shuffle(plan)
            kind = plan.pop(0)
            if not self.start(kind):
                self.skipped[kind] += 1
                if self.log.counts[kind] == 0:
                    plan.append(kind)  # not covered yet: try again later
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.interval)
        await self.settle()

    async def settle(self) -> None:
        """Wait for faults in progress to end (each ends itself: SIGCONT, heal, restart)."""
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)

    def start(self, kind: str) -> bool:
        coro = None
        if kind.startswith("pause-"):
            short = "short" in kind
            pool = self._free("sidecar" if kind.endswith("sidecar") else "worker")
            if pool:
                t = self.rng.choice(pool)
                secs = (self.rng.uniform(0.2, 0.7) * self.ttl if short
                        else self.rng.uniform(1.3, 2.5) * self.ttl)
                coro = self._pause(kind, t, secs)
        elif kind in ("kill-worker", "kill-sidecar", "kill-operator"):
            pool = self._free(kind.split("-")[1])
            if pool:
                coro = self._kill(kind, self.rng.choice(pool))
        elif kind == "rollout-operator":
            pool = [t for t in self._free("operator") if t.rollout is not None]
            if pool:
                coro = self._rollout(kind, self.rng.choice(pool))
        elif kind in ("partition", "delay"):
            pool = [t for t in self.targets if t.proxies is not None and t.name not in self.busy]
            if pool:
                coro = self._network(kind, self.rng.choice(pool))
        elif kind == "delay-destination":
            pool = [t for t in self.targets
                    if t.destination is not None and t.name not in self.busy]
            if pool:
                coro = self._hold_destination(kind, self.rng.choice(pool))
        elif kind.startswith("etcd-") and not self.etcd_busy:
            coro = self._member(kind)
        if coro is None:
            return False
        task = asyncio.create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return True

    async def _pause(self, kind: str, t: Target, secs: float) -> None:
        self.busy.add(t.name)
        try:
            pid = t.pid()
            start = time.monotonic()
            if not _signal(pid, signal.SIGSTOP):
                return
            try:
                await asyncio.sleep(secs)
            finally:
                _signal(pid, signal.SIGCONT)
            self.log.log(kind, t.name, start, time.monotonic(), pid=pid, seconds=round(secs, 2))
        finally:
            self.busy.discard(t.name)

    async def _kill(self, kind: str, t: Target) -> None:
        self.busy.add(t.name)
        try:
            pid = t.pid()
            start = time.monotonic()
            _signal(pid, signal.SIGCONT)
            if not _signal(pid, signal.SIGKILL):
                return
            await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            if t.restart is not None:
                t.restart()
            self.log.log(kind, t.name, start, time.monotonic(), pid=pid)
        finally:
            self.busy.discard(t.name)

    async def _rollout(self, kind: str, t: Target) -> None:
        assert t.rollout is not None
        self.busy.add(t.name)
        try:
            start = time.monotonic()
            overlap = self.rng.uniform(1.0, 3.0) * self.ttl
            await t.rollout(overlap)
            self.log.log(kind, t.name, start, time.monotonic(), overlap=round(overlap, 2))
        finally:
            self.busy.discard(t.name)

    async def _network(self, kind: str, t: Target) -> None:
        assert t.proxies is not None
        self.busy.add(t.name)
        try:
            start = time.monotonic()
            if kind == "partition":
                secs = self.rng.uniform(0.5, 2.0) * self.ttl
                t.proxies.set("blackhole")
                detail: dict[str, Any] = {"seconds": round(secs, 2)}
            else:
                secs = self.rng.uniform(1.0, 2.0) * self.ttl
                delay = self.rng.uniform(0.1, 0.6) * self.ttl
                t.proxies.set("delay", delay)
                detail = {"seconds": round(secs, 2), "delay": round(delay, 2)}
            try:
                await asyncio.sleep(secs)
            finally:
                t.proxies.set("pass")
            self.log.log(kind, t.name, start, time.monotonic(), **detail)
        finally:
            self.busy.discard(t.name)

    async def _hold_destination(self, kind: str, t: Target) -> None:
        assert t.destination is not None
        self.busy.add(t.name)
        try:
            start = time.monotonic()
            secs = self.rng.uniform(1.0, 2.0) * self.ttl
            delay = self.rng.uniform(0.7, 1.5) * self.ttl
            t.destination.mode, t.destination.delay = "delay", delay
            try:
                await asyncio.sleep(secs)
            finally:
                t.destination.mode, t.destination.delay = "pass", 0.0
            self.log.log(kind, t.name, start, time.monotonic(), seconds=round(secs, 2),
                         delay=round(delay, 2))
        finally:
            self.busy.discard(t.name)

    async def _member(self, kind: str) -> None:
        self.etcd_busy = True
        try:
            leader = await leader_index(self.cluster, self.credentials)
            if leader is None:
                self.skipped[kind] += 1
                return
            if kind == "etcd-kill-leader":
                victim = leader
            else:
                victim = self.rng.choice([i for i, m in enumerate(self.cluster.members)
                                          if i != leader and m.running])
            member = self.cluster.members[victim]
            start = time.monotonic()
            await asyncio.to_thread(member.kill)
            await asyncio.sleep(self.rng.uniform(0.5, 1.5) * self.ttl)
            member.start()
            await asyncio.to_thread(self.cluster.wait_healthy, 60, [member])
            end = time.monotonic()
            self.member_recovery.append(end - start)
            self.log.log(kind, member.name, start, end, wasLeader=victim == leader)
        finally:
            self.etcd_busy = False

    def heal_all(self) -> None:
        for t in self.targets:
            _signal(t.pid(), signal.SIGCONT)
            if t.proxies is not None:
                t.proxies.set("pass")
            if t.destination is not None:
                t.destination.mode, t.destination.delay = "pass", 0.0
