"""Fixtures for the sidecar suite: real processes of the Go sidecar (the product's
one sidecar), against the session's real etcd.

Every test that takes ``env`` (or ``registered``) runs against the binary built
from ``sidecar-go/`` (test id ``[go]``; ``sidecar_argv`` and why a missing
binary fails rather than skips: tests/support/sidecar_impls.py). The harness
itself lives in tests/support/sidecar_process.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from joblease import EtcdConfig, JobLeaseClient
from tests.support.sidecar_process import Env


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
