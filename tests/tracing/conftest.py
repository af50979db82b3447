"""Fixtures for the tracing suite: one real OTLP/HTTP receiver process for the
session (tests/support/otlp_receiver.py); each test tells its spans apart by a
service name of its own (``OTEL_SERVICE_NAME``)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from joblease import tracing
from tests.support.otlp_receiver import OtlpReceiver


@pytest.fixture(scope="session")
def otlp_receiver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver(tmp_path_factory.mktemp("otlp"))
    yield receiver
    receiver.stop()


@pytest.fixture
def service() -> str:
    """A service name no other test's spans carry."""
    return f"test-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def traced(otlp_receiver: OtlpReceiver, service: str) -> Iterator[OtlpReceiver]:
    """This process's library traces go to the receiver for the test, and are off after it."""
    assert tracing.configure(otlp_receiver.env(service))
    yield otlp_receiver
    tracing.configure({})
