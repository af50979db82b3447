"""Fixtures for tests that need a real Kubernetes API server (marked ``kube``): a
``pytest_plugins`` entry of tests/conftest.py, so every test directory that needs
one (tests/kube, tests/chart) shares the session's one control plane.

One control plane per session: starting etcd + kube-apiserver costs seconds,
and tests isolate themselves with their own namespaces instead.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator

import pytest

from tests.support.binaries import REPO_ROOT
from tests.support.controlplane import ControlPlane

CRDS_DIR = REPO_ROOT / "crds"


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    cp = ControlPlane().start()
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def crds_installed(control_plane: ControlPlane) -> ControlPlane:
    """Apply crds/ once and wait until the API server serves the new types."""
    control_plane.kubectl("apply", "-f", str(CRDS_DIR), check=True)
    control_plane.kubectl(
        "wait", "--for=condition=Established", "crd/jobleases.joblease.io",
        "crd/jobqueues.joblease.io", "crd/jobsemaphores.joblease.io", "--timeout=60s",
        check=True,
    )
    return control_plane


@pytest.fixture
def namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A fresh namespace per test (never finalized: no controller-manager runs)."""
    readable = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower())[:40].strip("-")
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = f"t-{readable}-{digest}"  # a valid DNS label, unique per test id
    control_plane.kubectl("create", "namespace", name, check=True)
    return name


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """Attach the etcd / kube-apiserver log tails to any failing kube test."""
    report = yield
    cp = getattr(item, "funcargs", {}).get("control_plane")
    if report.failed and isinstance(cp, ControlPlane):
        report.sections.append(("control plane logs", cp.log_tails()))
    return report
