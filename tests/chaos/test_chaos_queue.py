"""The queue workload under faults (tests/chaos/queue_runner.py): zero violations of
the queue's rules (tests/chaos/queue_checker.py), every fault type injected.

The bounded run is part of the default test command (about a minute on 2 cores:
30 s of faults, then the drain); ``--soak`` (or ``JOBLEASE_SOAK=1``) runs the long
one (>= 1,000 fault trials, thousands of items). Each prints its report; the run
directory is kept as for the job workload (``$JOBLEASE_CHAOS_DIR`` when set).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.queue_runner import QueueChaosConfig, run
from tests.chaos.verdict import judge_queue
from tests.chaos.verdict import run_dir as _run_dir


@pytest.mark.timeout(300)
async def test_bounded_queue_chaos_run_has_no_violations(tmp_path: Path, pg_dsn: str) -> None:
    cfg = QueueChaosConfig(workers=4, ttl=2, fault_interval=1.0, duration=30.0,
                           liveness_bound=45.0, items=150, poison=3, max_attempts=20,
                           pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, "queue-bounded"))
    judge_queue(report)


@pytest.mark.timeout(7200)
@pytest.mark.soak
async def test_queue_soak(soak: bool, tmp_path: Path, pg_dsn: str) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    cfg = QueueChaosConfig(workers=5, ttl=2, fault_interval=1.0, duration=3 * 3600.0,
                           trials=1000, liveness_bound=90.0, items=3000, poison=10,
                           max_attempts=20, pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, "queue-soak"))
    judge_queue(report)
    assert report.trials >= 1000
    # the fences were exercised: late effects and completions were refused as stale
    assert report.operations["write"].get("rejected_stale", 0) > 0
    assert report.operations["complete"].get("rejected_stale", 0) > 0
