"""Fault injection with a history checker: zero violations, every fault type injected.

The bounded run is part of the default test command (about 1.5-2.5 minutes on
2 cores); ``--soak`` (or ``JOBLEASE_SOAK=1``) runs the long one (>= 1,000 fault
trials). Each prints its report; the run directory (histories, fault log,
report.json) is kept under pytest's tmp_path, or under ``$JOBLEASE_CHAOS_DIR``
when set (pytest rotates old tmp_paths away).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from tests.chaos.nemesis import FAULT_TYPES
from tests.chaos.runner import ChaosConfig, Report, run


def _run_dir(tmp_path: Path, name: str) -> Path:
    base = os.environ.get("JOBLEASE_CHAOS_DIR")
    if base:
        return Path(base) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return tmp_path / name


def _judge(report: Report) -> None:
    print("\n" + report.summary())
    print(f"report: {Path(report.run_dir) / 'report.json'}")
    assert report.violations == [], json.dumps(report.violations[:10], indent=2)
    missing = [t for t in (*FAULT_TYPES, "clock-skew") if not report.faults_by_type.get(t)]
    assert not missing, f"fault types never injected: {missing}"
    assert report.unexpected_exits == [], report.unexpected_exits
    assert report.jobs_completed == report.jobs_registered
    ops = report.operations
    assert ops["claim"]["accepted"] >= report.jobs_registered
    assert ops["write"]["accepted"] > 0
    # the sidecar pairs really worked (claims through the sidecar's HTTP API)
    assert report.sidecar_claims > 0


@pytest.mark.timeout(400)
async def test_bounded_chaos_run_has_no_violations(tmp_path: Path, pg_dsn: str) -> None:
    cfg = ChaosConfig(workers=4, sidecar_pairs=1, open_jobs=6, ttl=2, fault_interval=1.0,
                      duration=60.0, liveness_bound=60.0, pg_dsn=pg_dsn)
    _judge(await run(cfg, _run_dir(tmp_path, "bounded")))


@pytest.mark.timeout(7200)
@pytest.mark.soak
async def test_soak(soak: bool, tmp_path: Path, pg_dsn: str) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    cfg = ChaosConfig(workers=5, sidecar_pairs=1, open_jobs=8, ttl=2, fault_interval=1.0,
                      duration=3 * 3600.0, trials=1000, liveness_bound=90.0, pg_dsn=pg_dsn)
    report = await run(cfg, _run_dir(tmp_path, "soak"))
    _judge(report)
    assert report.trials >= 1000
    # the fences were exercised: late effects and completions were refused as stale
    assert report.operations["write"].get("rejected_stale", 0) > 0
    assert report.operations["complete"].get("rejected_stale", 0) > 0
