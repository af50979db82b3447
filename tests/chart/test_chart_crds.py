"""The chart's CRDs are byte-for-byte copies of crds/ (one source of truth).

Helm installs a chart's ``crds/`` directory, so the chart carries a copy;
``hack/sync-chart-crds`` makes it, and this test fails on any drift.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "crds"
CHART_CRDS = ROOT / "charts" / "joblease-operator" / "crds"


def test_chart_crds_are_identical_to_the_repository_crds() -> None:
    source = {p.name: p.read_bytes() for p in SOURCE.glob("*.yaml")}
    chart = {p.name: p.read_bytes() for p in CHART_CRDS.glob("*.yaml")}
    assert source, "no CRDs in crds/"
    assert sorted(chart) == sorted(source), (
        "chart crds/ holds other files than crds/: run hack/sync-chart-crds")
    drifted = [name for name in source if chart[name] != source[name]]
    assert not drifted, f"chart copies differ from crds/: {drifted}; run hack/sync-chart-crds"


def test_sync_script_check_mode_agrees() -> None:
    result = subprocess.run([str(ROOT / "hack" / "sync-chart-crds"), "--check"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stdout + result.stderr
