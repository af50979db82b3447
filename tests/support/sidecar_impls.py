"""The sidecar the conformance suite runs, and how to start it.

The product ships one sidecar, the Go binary built from ``sidecar-go/``
(issue 25; the Python sidecar is retired). ``tests/sidecar``, the security
suite and the chaos suite's sidecar pairs run against it, with the test id
``[go]``. The option ``--sidecar-impl`` (or ``JOBLEASE_SIDECAR_IMPL``) stays
for the command lines and CI configs that pass it, with ``go`` as its only
value. This module is also the pytest plugin (loaded by tests/conftest.py)
that adds the option, parametrizes every test that takes the ``sidecar_impl``
fixture and provides ``sidecar_argv``.

A binary that cannot be located or built is a **failure** of every test that
needs it (with the reason), never a skip: ``hack/test`` builds it first, so a
missing one means something is broken, and a suite that went green without
judging the sidecar would be a lie.
"""

from __future__ import annotations

import functools
import os

import pytest

from tests.support.binaries import BinaryNotFound, go_sidecar_binary

IMPLEMENTATIONS = ("go",)
ENV_VAR = "JOBLEASE_SIDECAR_IMPL"


def default() -> str:
    """The one implementation the product ships."""
    return "go"


def selected(option: str | None) -> list[str]:
    """The implementations asked for (``--sidecar-impl``, else the env var, else ``go``).

    Unknown names (``python`` included: retired) are an error, not ignored: a typo
    must not shrink the suite.
    """
    text = option or os.environ.get(ENV_VAR) or default()
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or not names:
        raise ValueError(f"--sidecar-impl={text!r}: choose from {', '.join(IMPLEMENTATIONS)}")
    return list(dict.fromkeys(names))


def argv(impl: str = "go") -> tuple[str, ...]:
    """The command line that starts the sidecar (raises BinaryNotFound)."""
    found, why = argv_or_reason(impl)
    if found is None:
        raise BinaryNotFound(why)
    return found


@functools.cache
def argv_or_reason(impl: str = "go") -> tuple[tuple[str, ...] | None, str]:
    """``(argv, "")``, or ``(None, why)`` when the sidecar cannot be started.

    Cached, failures included: one build attempt per session, not one per test.
    """
    if impl not in IMPLEMENTATIONS:
        raise ValueError(f"unknown sidecar implementation {impl!r}")
    try:
        return (go_sidecar_binary(),), ""
    except BinaryNotFound as exc:
        return None, str(exc)


# -- the pytest plugin -------------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sidecar-impl", default=None,
                     help="the sidecar implementation for tests/sidecar, tests/security and "
                          "the chaos pairs: go (the only one; kept for existing command lines)")


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "sidecar_impl" not in metafunc.fixturenames:
        return
    impls = selected(metafunc.config.getoption("--sidecar-impl"))
    metafunc.parametrize("sidecar_impl", impls, ids=impls, scope="session")


@pytest.fixture(scope="session")
def sidecar_argv(sidecar_impl: str) -> list[str]:
    """How to start the sidecar; a test fails (not skips) when the binary cannot be
    located or built."""
    found, why = argv_or_reason(sidecar_impl)
    if found is None:
        pytest.fail(f"the {sidecar_impl} sidecar is not available: {why}", pytrace=False)
    return list(found)
