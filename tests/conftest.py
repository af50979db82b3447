"""Shared fixtures: real etcd processes on free loopback ports, private data dirs.

One etcd member serves the whole session; each test gets its own key root
(``EtcdConfig.root``) so tests cannot see each other's jobs. Fault tests that
kill or pause etcd start their own clusters with ``etcd_cluster_factory``.
On failure, the tails of the etcd logs are attached to the report.
"""

from __future__ import annotations

import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.embedded import EtcdCluster
from tests.support.etcd import etcd_binary
from tests.support.failure_logs import attach_on_failure

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests.support.* and examples.* importable

# --sidecar-impl and the [go] parametrization of the sidecar
# suite (tests/sidecar, the chaos suite's sidecar pairs)
#: Fixtures shared by several test directories, from the harness in tests/support/.
pytest_plugins = ["tests.support.postgres", "tests.support.secure_etcd",
                  "tests.support.sidecar_impls", "tests.support.kube_fixtures"]


def pytest_configure(config: pytest.Config) -> None:
    # SIGTERM (a CI timeout, hack/test stopping its other half) ends the run as ^C
    # does, so that session fixtures still tear down: the cluster's processes,
    # mounts, network namespace and iptables rules, the etcd and API-server processes.
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")
    signal.signal(signal.SIGTERM, interrupt)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--soak", action="store_true", default=False,
                     help="run long soak variants of the fault tests")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Soak tests run only when asked for (``--soak`` or ``JOBLEASE_SOAK=1``); otherwise
    they are deselected, not skipped: the default run is the bounded one."""
    if config.getoption("--soak") or os.environ.get("JOBLEASE_SOAK") == "1":
        return
    keep = [item for item in items if item.get_closest_marker("soak") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[i for i in items if i not in keep])
        items[:] = keep


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)


@pytest.fixture(scope="session")
def etcd() -> Iterator[EtcdCluster]:
    """A single-member etcd for the whole session."""
    cluster = EtcdCluster(1, binary=etcd_binary() or None)
    cluster.start()
    yield cluster
    cluster.stop()


@pytest.fixture
def etcd_config(etcd: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[EtcdConfig]:
    """Config for the session etcd with a key root private to this test."""
    yield EtcdConfig(endpoints=etcd.endpoints, root=f"/joblease-test/{uuid.uuid4().hex[:12]}")
    attach_on_failure(request, "etcd log", etcd.log_tails)


@pytest.fixture
async def client(etcd_config: EtcdConfig) -> AsyncIterator[JobLeaseClient]:
    async with JobLeaseClient(etcd_config) as c:
        yield c


@pytest.fixture
def etcd_cluster_factory(request: pytest.FixtureRequest) -> Iterator[Callable[[int], EtcdCluster]]:
    """Start private etcd clusters (e.g. 3 members for member-loss tests)."""
    started: list[EtcdCluster] = []

    def start(size: int = 3) -> EtcdCluster:
        cluster = EtcdCluster(size, binary=etcd_binary() or None)
        started.append(cluster)
        return cluster.start()

    yield start
    for c in started:
        attach_on_failure(request, f"etcd cluster {c.base_dir}", c.log_tails)
        c.stop()


@pytest.fixture
def soak(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--soak")) or os.environ.get("JOBLEASE_SOAK") == "1"
