"""The pinned helm binary runs (the real chart is tested once it exists)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.binaries import versions
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def test_helm_version(control_plane: ControlPlane) -> None:
    out = control_plane.helm("version", "--short", check=True).stdout
    assert out.startswith(versions()["HELM_VERSION"]), out


def test_helm_create_and_lint(control_plane: ControlPlane, tmp_path: Path) -> None:
    chart = tmp_path / "throwaway"
    control_plane.helm("create", str(chart), check=True)
    lint = control_plane.helm("lint", str(chart))
    assert lint.returncode == 0, lint.stdout + lint.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in lint.stdout
