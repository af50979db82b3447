"""The queue workload under faults (tests/chaos/queue_runner.py): zero violations of
the queue's rules (tests/chaos/queue_checker.py), every fault type injected.

The bounded run is part of the default test command (about a minute on 2 cores:
30 s of faults, then the drain): library workers and a sidecar pair (a draining Go
sidecar in queue mode and its HTTP worker), so the sidecar faults have a target.
The operator run (also in the default command, one short run: the control plane
starts in seconds) adds the real operator managing the queue as a JobQueue: the
nemesis kills it, rolls it out, cuts and delays its traffic, and every JobQueue
status the API server served is judged. ``--soak`` (or ``JOBLEASE_SOAK=1``) runs
the long one (>= 1,000 fault trials, thousands of items). Each prints its report;
the run directory is kept as for the job workload (``$JOBLEASE_CHAOS_DIR`` when set).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chaos.nemesis import FAULT_TYPES, OPERATOR_FAULT_TYPES
from tests.chaos.queue_runner import QueueChaosConfig, run
from tests.chaos.verdict import judge_queue
from tests.chaos.verdict import run_dir as _run_dir
from tests.support.binaries import REPO_ROOT
from tests.support.controlplane import ControlPlane


@pytest.fixture(scope="module")
def control_plane() -> Iterator[ControlPlane]:
    """The operator run's own API server (its own etcd), the CRDs installed: nothing
    another module's runs left in the ``chaos`` namespace is seen here."""
    cp = ControlPlane().start()
    try:
        cp.kubectl("apply", "-f", str(REPO_ROOT / "crds"), check=True)
        cp.kubectl("wait", "--for=condition=Established", "crd/jobqueues.joblease.io",
                   "crd/jobleases.joblease.io", "--timeout=60s", check=True)
        yield cp
    finally:
        cp.stop()


@pytest.mark.timeout(300)
async def test_bounded_queue_chaos_run_has_no_violations(
        tmp_path: Path, pg_dsn: str, sidecar_impl: str, sidecar_argv: list[str]) -> None:
    cfg = QueueChaosConfig(workers=4, sidecar_pairs=1, sidecar_argv=tuple(sidecar_argv),
                           ttl=2, fault_interval=1.0, duration=30.0, liveness_bound=45.0,
                           items=150, poison=3, max_attempts=20, pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, f"queue-bounded-{sidecar_impl}"))
    judge_queue(report)


@pytest.mark.kube
@pytest.mark.timeout(400)
async def test_queue_operator_status_under_faults(
        tmp_path: Path, pg_dsn: str, sidecar_impl: str, sidecar_argv: list[str],
        control_plane: ControlPlane) -> None:
    """The JobQueue is created with ``kubectl apply`` and registered by the operator,
    which is killed (``kill-operator``), rolled out (``rollout-operator``: a second
    replica takes over the election), partitioned and delayed while the fleet drains
    the queue; its served statuses never move backwards and end at etcd's counts."""
    cfg = QueueChaosConfig(workers=3, sidecar_pairs=1, sidecar_argv=tuple(sidecar_argv),
                           ttl=2, fault_interval=1.0, duration=30.0, liveness_bound=45.0,
                           items=120, poison=2, max_attempts=20, pg_dsn=pg_dsn,
                           fault_types=FAULT_TYPES + OPERATOR_FAULT_TYPES)
    report = await run(cfg, _run_dir(tmp_path, f"queue-operator-{sidecar_impl}"),
                       control_plane)
    judge_queue(report)
    assert report.faults_by_type.get("kill-operator", 0) > 0
    assert report.faults_by_type.get("rollout-operator", 0) > 0
    assert report.statuses_served > 0


@pytest.mark.timeout(7200)
@pytest.mark.soak
async def test_queue_soak(soak: bool, tmp_path: Path, pg_dsn: str, sidecar_impl: str,
                          sidecar_argv: list[str]) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    cfg = QueueChaosConfig(workers=5, sidecar_pairs=1, sidecar_argv=tuple(sidecar_argv),
                           ttl=2, fault_interval=1.0, duration=3 * 3600.0,
                           trials=1000, liveness_bound=90.0, items=3000, poison=10,
                           max_attempts=20, pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, f"queue-soak-{sidecar_impl}"))
    judge_queue(report)
    assert report.trials >= 1000
    # the fences were exercised: late effects and completions were refused as stale
    assert report.operations["write"].get("rejected_stale", 0) > 0
    assert report.operations["complete"].get("rejected_stale", 0) > 0
