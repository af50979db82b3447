"""Operator high availability with real processes: two ``python -m joblease.operator``
replicas against the real kube-apiserver (tests.support.controlplane) and the
session's real etcd.

- With leader election (the default), one replica is active and the other
  stands by, ready; when the active one is killed (SIGKILL: a crashed pod) or
  stopped (SIGTERM: a deleted pod) the standby takes over, within the election
  TTL + 2 s, and every JobLease created around the switch is registered, its
  claim and completion mirrored, with no status served that moves backwards.
- With ``--no-leader-election`` on both, two replicas are active at once *by
  construction*: the worst case the election's safety deadline is there to
  avoid (a deposed leader still writing). One replica's etcd traffic goes
  through a proxy that holds every answer back (tests/support/proxy.py's
  DelayingProxy), so its view of etcd lags the other's and it keeps trying to
  write older states; the ``etcdRevision`` guard must refuse every one (before
  the CRD's CEL rule ``self >= oldSelf`` on ``etcdRevision``, the API server's
  second line, has to). A ``kubectl get --watch`` records every status the API
  server served.

Nothing is faked but the delay of one replica's etcd connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import re
import time
from pathlib import Path
from typing import Any

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.errors import JobLeaseError, NotRegisteredError
from joblease.operator.election import Election
from joblease.operator.main import OperatorConfig, election_name
from tests.support.controlplane import ControlPlane
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for
from tests.support.proxy import DelayingProxy, LossyProxy
from tests.support.status_history import StatusWatch, regressions

pytestmark = [pytest.mark.kube, pytest.mark.timeout(400)]

TTL = 3
SPEC = {"leaseDurationSeconds": 10, "maxAttempts": 3}


class Replica(OperatorProcess):
    """One operator replica; ``election=False`` makes it active whatever the other does."""

    def __init__(self, cp: ControlPlane, etcd: EtcdConfig, namespace: str, log: Path,
                 *, election: bool = True) -> None:
        super().__init__(cp, etcd, namespace, log)
        self.election = election

    def environment(self) -> dict[str, str]:
        return dict(super().environment(), JOBLEASE_LEADER_ELECTION_TTL=str(TTL),
                    JOBLEASE_LEADER_ELECTION="true" if self.election else "false")

    def leads(self) -> bool:
        return bool(re.search(r"^joblease_operator_leader 1\.0$", self.metrics(), re.M))

    def patches(self, result: str) -> float:
        found = re.search(rf'^joblease_operator_status_patches_total{{result="{result}"}} (\S+)$',
                          self.metrics(), re.M)
        return float(found.group(1)) if found else 0.0


class Load:
    """Creates a JobLease every ``interval`` seconds and, as a worker would, claims and
    completes each one once etcd has it: a steady stream of registrations, claims and
    completions for the operators to handle while they switch."""

    def __init__(self, kube: Kube, client: JobLeaseClient, namespace: str,
                 interval: float = 0.4) -> None:
        self.kube, self.client, self.ns, self.interval = kube, client, namespace, interval
        self.created: dict[str, float] = {}
        self.completed: dict[str, int] = {}  # name -> fencing token
        self._tasks: list[asyncio.Task[None]] = []
        self._stop = asyncio.Event()

    def start(self) -> Load:
        self._tasks = [asyncio.create_task(self._create()), asyncio.create_task(self._work())]
        return self

    async def _create(self) -> None:
        n = 0
        while not self._stop.is_set():
            name = f"j{n:03d}"
            await self.kube.apply(name, SPEC)
            self.created[name] = time.monotonic()
            n += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self.interval)

    async def _work(self) -> None:
        while True:
            for name in [n for n in self.created if n not in self.completed]:
                try:
                    lease = await self.client.claim(JobRef(self.ns, name), "worker")
                    await lease.complete({"by": "worker"})
                    self.completed[name] = lease.token
                except NotRegisteredError:
                    pass  # the operator has not registered it (yet)
                except JobLeaseError:
                    pass  # held, or an outcome to read back: the next round settles it
            if self._tasks[0].done() and len(self.completed) == len(self.created):
                return  # the creator has stopped, and everything it created is done
            await asyncio.sleep(0.1)

    async def stop(self, timeout: float) -> None:
        self._stop.set()
        await asyncio.wait_for(asyncio.gather(*self._tasks), timeout)


async def leader_of(election: Election, replicas: list[Replica], but: Replica | None = None
                    ) -> Replica:
    """The replica whose pid is in the identity of etcd's leader key (not ``but``)."""
    async def probe() -> Replica | None:
        leader = await election.leader()
        for r in replicas:
            if (r is not but and r.proc is not None and r.proc.poll() is None
                    and leader.identity and leader.identity.endswith(f"/{r.proc.pid}")):
                return r
        return None
    return await wait_for("an operator replica leading", probe, 60, interval=0.05)


def now(check: Any) -> Any:
    """``check()`` as a probe for :func:`wait_for` (which awaits its probe)."""
    async def probe() -> Any:
        return check()
    return probe


async def more_completions(load: Load, more: int = 2) -> None:
    """Wait until the load completed ``more`` JobLeases: each was registered, so the
    leader of the moment is doing its work."""
    n = len(load.completed)
    await wait_for(f"{more} more completions", now(lambda: len(load.completed) >= n + more), 60)


def expect_settled(watch: StatusWatch, load: Load) -> list[str]:
    """What is wrong with the served statuses: anything backwards, and any job whose
    last status is not its completion by the load's worker."""
    wrong = regressions(watch.snapshot()) + watch.gaps
    for name, token in sorted(load.completed.items()):
        last = watch.last(name)
        if last.get("phase") != "Completed" or last.get("fencingToken") != token:
            wrong.append(f"{name}: last served status {last.get('phase')} "
                         f"token {last.get('fencingToken')}, etcd completed it with {token}")
    return wrong


async def test_the_standby_takes_over_and_nothing_created_during_the_switch_is_lost(
        crds_installed: ControlPlane, etcd_config: EtcdConfig, namespace: str,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cp, kube = crds_installed, Kube(crds_installed, namespace)
    a = Replica(cp, etcd_config, namespace, tmp_path / "a.log")
    b = Replica(cp, etcd_config, namespace, tmp_path / "b.log")
    watch = StatusWatch(cp.kubeconfig, namespace)
    async with (JobLeaseClient(etcd_config) as client,
                running_operator(a, request), running_operator(b, request)):
        election = Election(client.store, etcd_config.root,
                            election_name(OperatorConfig(namespaces=(namespace,))), "test")
        first = await leader_of(election, [a, b])
        standby = b if first is a else a
        # Both ready (readiness is "serving", not "leading"); one leads.
        assert a.probe("/readyz") == 200 and b.probe("/readyz") == 200
        assert first.leads() and not standby.leads()
        term = (await election.leader()).term

        load = Load(kube, client, namespace).start()
        await wait_for("the first completions", now(lambda: len(load.completed) >= 2), 60)

        # A crash: the standby is elected once etcd expires the dead leader's lease.
        killed = time.monotonic()
        first.kill()
        second = await leader_of(election, [a, b], but=first)
        crash_takeover = time.monotonic() - killed
        assert second is standby
        assert crash_takeover <= TTL + 2, f"takeover after SIGKILL took {crash_takeover:.2f}s"
        assert (await election.leader()).term > term
        first.start()  # Kubernetes restarts the container: it stands by
        await first.wait_ready()
        assert not first.leads()
        await more_completions(load)  # JobLeases keep coming; the new leader registers them

        # A graceful stop (a deleted pod): the leader resigns, the standby leads at once.
        assert second.proc is not None
        stopped = time.monotonic()
        second.proc.terminate()
        third = await leader_of(election, [a, b], but=second)
        graceful_takeover = time.monotonic() - stopped
        assert await asyncio.to_thread(second.proc.wait, 30) == 0  # a clean exit
        assert third is first
        assert graceful_takeover <= TTL + 2, f"takeover after SIGTERM took {graceful_takeover:.2f}s"
        await more_completions(load)
        await load.stop(timeout=120)

        created = sorted(load.created)
        assert len(created) >= 10, created
        # Registrations of JobLeases created during the switches were not lost: the load
        # could claim and complete every one (it only can once etcd has the spec) ...
        assert sorted(load.completed) == created
        # ... and the statuses caught up, none moving backwards on the way.
        await wait_for("statuses settled", now(lambda: not expect_settled(watch, load)), 90,
                       interval=0.5)
        watch.stop()
        assert regressions(watch.snapshot()) == [] and not watch.gaps
        print(f"takeover after SIGKILL {crash_takeover:.2f}s (TTL {TTL}s), after SIGTERM "
              f"{graceful_takeover:.2f}s; {len(created)} JobLeases, {watch.events} statuses "
              "served")


def logged_at(log: Path, pattern: str) -> float | None:
    """Wall time of the first log line matching ``pattern`` (the operator's asctime)."""
    for line in log.read_text(errors="replace").splitlines():
        if re.search(pattern, line):
            stamp = dt.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    return None


async def test_a_leader_cut_off_from_etcd_steps_down_before_the_standby_leads(
        crds_installed: ControlPlane, etcd_config: EtcdConfig, namespace: str,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The leader's etcd traffic is swallowed (LossyProxy ``drop_requests``): it must
    stop its handlers and exit (code 3, so Kubernetes restarts it) having logged the
    loss before the standby is elected, and the standby registers new JobLeases."""
    cp, kube = crds_installed, Kube(crds_installed, namespace)
    host, port = etcd_config.endpoints[0].rsplit(":", 1)
    proxy = await LossyProxy(host, int(port)).start()
    a = Replica(cp, etcd_config.with_(endpoints=(proxy.endpoint,)), namespace,
                tmp_path / "a.log")
    b = Replica(cp, etcd_config, namespace, tmp_path / "b.log")
    try:
        async with JobLeaseClient(etcd_config) as client, running_operator(a, request):
            election = Election(client.store, etcd_config.root,
                                election_name(OperatorConfig(namespaces=(namespace,))), "test")
            assert await leader_of(election, [a]) is a
            async with running_operator(b, request):
                assert not b.leads()
                cut = time.monotonic()
                proxy.mode = "drop_requests"
                assert await leader_of(election, [b]) is b
                elected = time.monotonic() - cut
                assert elected <= TTL + 2, f"the standby led {elected:.2f}s after the cut"
                assert a.proc is not None
                code = await asyncio.to_thread(a.proc.wait, 60)
                assert code == 3, f"exit code {code}"
                lost = logged_at(a.log, r"leadership of \S+ \(term \d+\) lost")
                # etcd shows b's key as soon as its transaction commits; b logs the win
                # only once the reply reaches it, so its line may still be on the way.
                led = await wait_for("the standby's 'is the leader' line",
                                     now(lambda: logged_at(b.log, r"is the leader")), 10)
                assert lost is not None and led is not None and lost <= led, (lost, led)
                assert logged_at(a.log, "exiting \\(a restart stands by\\)") is not None
                await kube.apply("after-the-cut", SPEC)
                await kube.status_where("after-the-cut", "registered by the new leader",
                                        lambda s: int(s.get("etcdRevision") or 0) > 0, 60)
    finally:
        await proxy.close()


async def test_two_active_operators_never_move_a_status_backwards(
        crds_installed: ControlPlane, etcd_config: EtcdConfig, namespace: str,
        tmp_path: Path, request: pytest.FixtureRequest) -> None:
    cp, kube = crds_installed, Kube(crds_installed, namespace)
    host, port = etcd_config.endpoints[0].rsplit(":", 1)
    lagging_etcd = await DelayingProxy(host, int(port), delay=0.8).start()
    fresh = Replica(cp, etcd_config, namespace, tmp_path / "fresh.log", election=False)
    late = Replica(cp, etcd_config.with_(endpoints=(lagging_etcd.endpoint,)), namespace,
                   tmp_path / "late.log", election=False)
    names = [f"busy-{i}" for i in range(4)]
    watch = StatusWatch(cp.kubeconfig, namespace)
    tokens: dict[str, int] = {}
    try:
        async with (JobLeaseClient(etcd_config) as client,
                    running_operator(fresh, request), running_operator(late, request)):
            assert fresh.leads() and late.leads()  # both active, by construction
            for name in names:
                await kube.apply(name, {"leaseDurationSeconds": 10, "maxAttempts": 5})

            async def registered(name: str) -> bool:
                return (await client.get(JobRef(namespace, name))).registered
            for name in names:
                await wait_for(f"{name} registered", lambda n=name: registered(n), 60)

            async def busy(name: str) -> None:
                # Many revisions per job, faster than the lagging replica's view of them.
                lease = await client.claim(JobRef(namespace, name), "worker")
                for step in range(20):
                    await lease.checkpoint({"step": step})
                    await asyncio.sleep(0.1)
                await lease.complete({"steps": 20})
                tokens[name] = lease.token
            await asyncio.gather(*(busy(n) for n in names))

            def settled() -> bool:
                return all(watch.last(n).get("phase") == "Completed"
                           and watch.last(n).get("fencingToken") == tokens[n] for n in names)
            await wait_for("both operators settled", now(settled), 60, interval=0.5)
            await asyncio.sleep(2 * 0.8 + 1)  # the lagging replica's last (old) states land
            # The guard was exercised: the lagging replica was refused older states, or
            # lost conditional writes to the other one.
            refused = late.patches("stale") + late.patches("conflict")
            assert refused > 0, late.metrics()
            # ... by the operator's own guard: the CRD's CEL rule (etcdRevision never
            # decreases) is the API server's second line, and it had nothing to refuse.
            assert late.patches("rejected") == 0 and fresh.patches("rejected") == 0, (
                late.metrics())
    finally:
        watch.stop()
        await lagging_etcd.close()
    served: dict[str, Any] = watch.snapshot()
    assert not watch.gaps, watch.gaps
    assert regressions(served) == [], regressions(served)
    assert all(watch.last(n).get("phase") == "Completed" for n in names)
    # Not just the first and the last: Pending, Claimed (with checkpoints), Completed.
    assert all(len({s.get("phase") for s in served[n] if s}) >= 3 for n in names), {
        n: [s.get("phase") for s in served[n] if s] for n in names}
