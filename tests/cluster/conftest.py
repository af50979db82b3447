"""The session-scoped single-node cluster (tests/support/cluster.py).

Tests opt in with ``@pytest.mark.cluster`` and the ``cluster`` fixture; the
cluster starts once per session, on first use, and is torn down at the end
of the session. If the teardown leaves anything behind (a process, mount,
cgroup, network namespace, state dir), the teardown fails and so does the run.
With ``JOBLEASE_TEST_KUBECONFIG`` set, that cluster is used instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.waiting import wait_until


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    instance = Cluster("test")
    instance.up()
    if instance.startup_seconds is not None:
        print(f"\ncluster ready in {instance.startup_seconds}s {instance.timings}")
    yield instance
    instance.down()
    left = instance.leftovers()
    assert not left, f"the session cluster left things behind: {left}"


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (deleted afterwards, without waiting). Waits for
    its ``default`` ServiceAccount: pods are refused until the controller made it."""
    name = "t-" + request.node.name.lower().replace("_", "-")[:40].strip("-")
    cluster.kubectl("create", "namespace", name, check=True)
    wait_until(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n",
                                       name).returncode == 0,
               timeout=120, what=f"serviceaccount default in {name}", interval=0.5)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")
