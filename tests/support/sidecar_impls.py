"""Which sidecar implementations the conformance suite runs, and how to start each.

The protocol must not fork (issue 19): ``tests/sidecar`` and the chaos suite's
sidecar pairs run once per implementation, with test ids ``[python]`` and
``[go]``. Choose with ``--sidecar-impl=python,go`` (or ``JOBLEASE_SIDECAR_IMPL``).
This module is also the pytest plugin (loaded by tests/conftest.py) that adds
the option, parametrizes every test that takes the ``sidecar_impl`` fixture
and provides ``sidecar_argv``.

The default is every implementation this checkout contains: ``python``, plus
``go`` when ``sidecar-go/`` exists. A checkout with Go sources whose binary
cannot be located or built is a **failure** of every ``[go]`` test (with the
reason), never a skip: ``hack/test`` builds the binary first, so a missing one
means something is broken, and a suite that went green without judging the Go
sidecar would be a lie. ``--sidecar-impl=python`` is the explicit way to judge
only the Python one (e.g. on a machine without Go).
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.support.binaries import GO_SIDECAR_DIR, BinaryNotFound, go_sidecar_binary
from tests.support.sidecar_process import PYTHON_SIDECAR

IMPLEMENTATIONS = ("python", "go")
ENV_VAR = "JOBLEASE_SIDECAR_IMPL"


def default() -> str:
    """Every implementation in this checkout, comma-separated."""
    return "python,go" if GO_SIDECAR_DIR.is_dir() else "python"


def selected(option: str | None) -> list[str]:
    """The implementations asked for (``--sidecar-impl``, else the env var, else all).

    Unknown names are an error, not ignored: a typo must not shrink the suite.
    """
    text = option or os.environ.get(ENV_VAR) or default()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise ValueError(f"--sidecar-impl={text!r}: choose from {', '.join(IMPLEMENTATIONS)}")
    return list(dict.fromkeys(names))


def argv(impl: str) -> tuple[str, ...]:
    """The command line that starts a sidecar of ``impl`` (raises BinaryNotFound)."""
    found, why = argv_or_reason(impl)
    if found is None:
        raise BinaryNotFound(why)
    return found


@functools.cache
def argv_or_reason(impl: str) -> tuple[tuple[str, ...] | None, str]:
    """``(argv, "")``, or ``(None, why)`` when the implementation cannot be started.

    Cached, failures included: one build attempt per session, not one per test.
    """
    if impl == "python":
        return PYTHON_SIDECAR, ""
    if impl != "go":
        raise ValueError(f"unknown sidecar implementation {impl!r}")
    try:
        return (go_sidecar_binary(),), ""
    except BinaryNotFound as exc:
        return None, str(exc)


# -- the pytest plugin -------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sidecar-impl", default=None,
                     help="comma-separated sidecar implementations for tests/sidecar and the "
                          "chaos pairs: python, go (default: every one in the checkout)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "python_sidecar_only(reason): drives the Python sidecar's internals "
                   "in-process; runs for [python] only")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sidecar_impl" not in metafunc.fixturenames:
        return
    impls = selected(metafunc.config.getoption("--sidecar-impl"))
    if metafunc.definition.get_closest_marker("python_sidecar_only") is not None:
        # Not a conformance test: it judges Python internals, whatever was selected.
        impls = ["python"]
    metafunc.parametrize("sidecar_impl", impls, ids=impls, scope="session")


@pytest.fixture(scope="session")
def sidecar_argv(sidecar_impl: str) -> list[str]:
    """How to start a sidecar of this implementation; a [go] test fails (not skips)
    when the binary cannot be located or built."""
    found, why = argv_or_reason(sidecar_impl)
    if found is None:
        pytest.fail(f"the {sidecar_impl} sidecar is not available: {why}", pytrace=False)
    return list(found)
