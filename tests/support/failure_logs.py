"""Logs attached to a failed test's report, so a failure explains itself.

The root conftest's ``pytest_runtest_makereport`` hook records each phase's
report on the item (``rep_call``); fixtures call :func:`attach_on_failure` in
their teardown with a callable that reads the logs only when needed.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest


def attach_on_failure(request: pytest.FixtureRequest, name: str, text: Callable[[], str],
                      *, always: bool = False) -> None:
    """Add ``text()`` as section ``name`` to the report if the test body failed
    (or, with ``always``, whatever the outcome)."""
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and (rep.failed or always):
        rep.sections.append((name, text()))
