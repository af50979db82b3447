"""The chart driven by the real helm binary against a test control plane."""

from __future__ import annotations

import json
from typing import Any

from tests.support.binaries import REPO_ROOT
from tests.support.controlplane import ControlPlane

CHART = REPO_ROOT / "charts" / "joblease-operator"


def release_name(namespace: str) -> str:
    """Unique per test (the namespace ends in a digest of the test id)."""
    return f"jl-{namespace[-6:]}"


def set_args(values: dict[str, Any]) -> list[str]:
    """``--set-json`` arguments for a flat {dotted.key: value} mapping."""
    args: list[str] = []
    for key, value in values.items():
        args += ["--set-json", f"{key}={json.dumps(value)}"]
    return args


def helm_ok(cp: ControlPlane, *args: str, timeout: float = 120) -> str:
    result = cp.helm(*args, timeout=timeout)
    assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
    return result.stdout
