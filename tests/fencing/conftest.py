"""Fixtures for the fencing tests: real HTTP destinations under uvicorn.

``serve`` starts apps (tests/support/served.py) and stops them after the
test. PostgreSQL (``postgres``, ``pg_dsn``) comes from tests/support/postgres.py,
loaded for every directory by tests/conftest.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.served import Served


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Served]]:
    started: list[Served] = []

    def start(app: Any) -> Served:
        served = Served(app).start()
        started.append(served)
        return served

    yield start
    for s in started:
        s.stop()
