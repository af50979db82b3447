"""Fault injection with a history checker: zero violations, every fault type injected.

The bounded run is part of the default test command (about 1.5-2.5 minutes on
2 cores); ``--soak`` (or ``JOBLEASE_SOAK=1``) runs the long one (>= 1,000 fault
trials). Each prints its report; the run directory (histories, fault log,
report.json) is kept under pytest's tmp_path, or under ``$JOBLEASE_CHAOS_DIR``
when set (pytest rotates old tmp_paths away).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from tests.chaos.runner import ChaosConfig, run
from tests.chaos.verdict import judge as _judge
from tests.chaos.verdict import run_dir as _run_dir


def _sidecars(argv: list[str], shorter: float | None = None) -> dict[str, Any]:
    """The sidecar pairs' settings (the Go sidecar: tests/support/sidecar_impls.py).

    Two pairs, so that more claims go through the sidecar; ``shorter`` (the bounded
    run) cuts its duration, and ``--soak`` runs them full length. No clock skew for
    the sidecars (see ``ChaosConfig.sidecar_clock``).
    """
    return {"sidecar_argv": tuple(argv), "sidecar_clock": None, "sidecar_pairs": 2,
            **({} if shorter is None else {"duration": shorter})}


@pytest.mark.timeout(400)
async def test_bounded_chaos_run_has_no_violations(tmp_path: Path, pg_dsn: str,
                                                   sidecar_impl: str, sidecar_argv: list[str]
                                                   ) -> None:
    cfg = replace(ChaosConfig(workers=4, sidecar_pairs=1, open_jobs=6, ttl=2,
                              fault_interval=1.0, duration=60.0, liveness_bound=60.0,
                              pg_dsn=pg_dsn), **_sidecars(sidecar_argv, 30.0))
    _judge(await run(cfg, _run_dir(tmp_path, f"bounded-{sidecar_impl}")))


@pytest.mark.timeout(400)
async def test_etcd_restarts_with_auth_on_cost_no_lease(tmp_path: Path, pg_dsn: str,
                                                        sidecar_impl: str,
                                                        sidecar_argv: list[str]) -> None:
    """Leader and follower kills while etcd auth is on and every client (workers,
    sidecars, the runner) logs in as root: besides the usual checks, no lease may
    be lost because etcd refused a token (``auth-loss``): a restarted member has
    forgotten every simple auth token, and the client must log in again on its
    streams (keep-alive, watch) as it does on unary calls (issue 20 item 15). Full
    length: the sidecar's etcd client is its own code (and at 30 s the two member
    kills are not reliably both injected on a loaded machine)."""
    cfg = replace(ChaosConfig(workers=3, sidecar_pairs=1, open_jobs=5, ttl=2,
                              fault_interval=1.0, duration=60.0, liveness_bound=60.0,
                              pg_dsn=pg_dsn, auth=True,
                              fault_types=("etcd-kill-leader", "etcd-kill-follower")),
                  **_sidecars(sidecar_argv))
    _judge(await run(cfg, _run_dir(tmp_path, f"auth-etcd-kill-{sidecar_impl}")))


@pytest.mark.timeout(7200)
@pytest.mark.soak
async def test_soak(soak: bool, tmp_path: Path, pg_dsn: str, sidecar_impl: str,
                    sidecar_argv: list[str]) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    cfg = replace(ChaosConfig(workers=5, sidecar_pairs=1, open_jobs=8, ttl=2,
                              fault_interval=1.0, duration=3 * 3600.0, trials=1000,
                              liveness_bound=90.0, pg_dsn=pg_dsn),
                  **_sidecars(sidecar_argv))
    report = await run(cfg, _run_dir(tmp_path, f"soak-{sidecar_impl}"))
    _judge(report)
    assert report.trials >= 1000
    # the fences were exercised: late effects and completions were refused as stale
    assert report.operations["write"].get("rejected_stale", 0) > 0
    assert report.operations["complete"].get("rejected_stale", 0) > 0
