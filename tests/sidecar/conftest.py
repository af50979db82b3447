"""Fixtures for the sidecar conformance suite: real sidecar processes, of each
implementation, against the session's real etcd.

Every test that takes ``env`` (or ``registered``) runs once per selected
implementation (``[python]``, ``[go]``; see tests/support/sidecar_impls.py);
the harness itself lives in tests/support/sidecar_process.py. Tests that drive
the Python sidecar's internals in-process carry the ``python_sidecar_only``
marker with the reason, and run for ``[python]`` alone.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from joblease import EtcdConfig, JobLeaseClient
from tests.support import sidecar_impls
from tests.support.sidecar_process import Env, Proc, Sidecar
from tests.waiting import poll

# Re-exported for modules outside tests/sidecar that still import them from here
# (tests/security, tests/test_harness: issue 14 item 5 moves those imports to
# tests/support/sidecar_process.py). No module in tests/sidecar imports this file.
__all__ = ["Env", "Proc", "Sidecar", "poll"]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "python_sidecar_only(reason): drives the Python sidecar's internals "
                   "in-process; runs for [python] only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sidecar_impl" not in metafunc.fixturenames:
        return
    impls = sidecar_impls.selected(metafunc.config.getoption("--sidecar-impl"))
    if metafunc.definition.get_closest_marker("python_sidecar_only") is not None:
        # Not a conformance test: it judges Python internals, whatever was selected.
        impls = ["python"]
    metafunc.parametrize("sidecar_impl", impls, ids=impls, scope="session")


@pytest.fixture(scope="session")
def sidecar_argv(sidecar_impl: str) -> list[str]:
    """How to start a sidecar of this implementation; a [go] test fails (not skips)
    when the binary cannot be located or built."""
    found, why = sidecar_impls.argv_or_reason(sidecar_impl)
    if found is None:
        pytest.fail(f"the {sidecar_impl} sidecar is not available: {why}", pytrace=False)
    return list(found)


@pytest.fixture
def env(tmp_path: Path, etcd_config: EtcdConfig, sidecar_impl: str, sidecar_argv: list[str],
        request: pytest.FixtureRequest) -> Iterator[Env]:
    e = Env(tmp_path, etcd_config, sidecar_argv, sidecar_impl)
    yield e
    e.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        rep.sections.append((f"sidecar/worker logs ({sidecar_impl})", e.logs()))


@pytest.fixture
async def registered(env: Env, client: JobLeaseClient) -> AsyncIterator[Env]:
    """A job registered with a 2 s TTL and unlimited attempts."""
    await env.register(client)
    yield env
