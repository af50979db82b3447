"""The semaphore workload under faults (tests/chaos/sem_runner.py): zero violations
of the semaphore's rules (tests/chaos/sem_checker.py) and the job rules, every
fault type injected, no operator at any time.

The bounded run is part of the default test command (under a minute on 2 cores:
20 s of faults, then the drain); ``--soak`` (or ``JOBLEASE_SOAK=1``) runs the long
one (>= 1,000 fault trials). Each prints its report; the run directory is kept
as for the job workload (``$JOBLEASE_CHAOS_DIR`` when set).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.sem_runner import SemChaosConfig, run
from tests.chaos.verdict import judge_semaphore
from tests.chaos.verdict import run_dir as _run_dir


@pytest.mark.timeout(240)
async def test_bounded_semaphore_chaos_run_has_no_violations(tmp_path: Path,
                                                             pg_dsn: str) -> None:
    cfg = SemChaosConfig(workers=4, ttl=2, fault_interval=1.0, duration=20.0,
                         liveness_bound=30.0, open_jobs=6, limits=(2, 3), limit_every=7.0,
                         pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, "semaphore-bounded"))
    judge_semaphore(report)


@pytest.mark.timeout(7200)
@pytest.mark.soak
async def test_semaphore_soak(soak: bool, tmp_path: Path, pg_dsn: str) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    cfg = SemChaosConfig(workers=5, ttl=2, fault_interval=1.0, duration=3 * 3600.0,
                         trials=1000, liveness_bound=90.0, open_jobs=8, limits=(2, 3),
                         limit_every=20.0, pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, "semaphore-soak"))
    judge_semaphore(report)
    assert report.trials >= 1000
    # the slot fences were exercised: late effects under superseded slot tokens refused
    assert report.operations["write"].get("rejected_stale", 0) > 0
