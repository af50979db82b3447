"""The session-scoped single-node cluster (tests/support/cluster/).

Tests opt in with ``@pytest.mark.cluster`` and the ``cluster`` fixture; the
cluster starts once per session, on first use, and is torn down at the end
of the session. Each test process gets its own cluster name (``t<pid>``), so
concurrent test runs do not collide; clusters of crashed runs (their lock is
free) are cleaned up first. If the teardown leaves anything behind (a process, mount,
cgroup, network namespace, state dir), the teardown fails and so does the run.
With ``JOBLEASE_TEST_KUBECONFIG`` set, that cluster is used instead, and the
tests marked ``node`` (they reach into this machine's cgroups or container
processes, or start a cluster of their own) are skipped, saying why.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.binaries import REPO_ROOT
from tests.support.cluster import KUBELET_SYSCTLS, STATE_ROOT, Cluster, image_ref, read_sysctl
from tests.support.release import Release, install_as_documented
from tests.support.waiting import wait_until


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    _own_releases_first(items)
    if not os.environ.get("JOBLEASE_TEST_KUBECONFIG"):
        return
    skip = pytest.mark.skip(reason="needs this machine to be the cluster's node (marker "
                                   "`node`); JOBLEASE_TEST_KUBECONFIG names another cluster")
    for item in items:
        if item.get_closest_marker("node"):
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    # a name of its own per test process: several test runs may share the machine
    cleaned = Cluster.recover_stale()  # clusters of crashed earlier runs
    if cleaned:
        print(f"\ncleaned up clusters of crashed runs: {cleaned}")
    instance = Cluster(f"t{os.getpid()}")
    others_before = running_clusters()
    sysctls_before = {key: read_sysctl(key) for key in KUBELET_SYSCTLS}
    instance.up()
    if instance.startup_seconds is not None:
        print(f"\ncluster ready in {instance.startup_seconds}s {instance.timings}")
    yield instance
    instance.down()
    left = instance.leftovers()
    assert not left, f"the session cluster left things behind: {left}"
    if not others_before and not running_clusters():  # else the last one restores them
        sysctls_after = {key: read_sysctl(key) for key in KUBELET_SYSCTLS}
        assert sysctls_after == sysctls_before, "the kubelet's sysctls were not restored"


def running_clusters() -> list[str]:
    """Clusters of other processes running on this machine now."""
    root = Path(os.environ.get("JOBLEASE_CLUSTER_DIR") or STATE_ROOT)
    return [d.name for d in root.glob("*")
            if d.is_dir() and Cluster(d.name, state_dir=d, local=True).in_use()]


def _make_namespace(cluster: Cluster, name: str) -> None:
    cluster.kubectl("create", "namespace", name, check=True)
    wait_until(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n",
                                       name).returncode == 0,
               timeout=120, what=f"serviceaccount default in {name}", interval=0.5)


@pytest.fixture
def namespace(cluster: Cluster, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test (deleted afterwards, without waiting). Waits for
    its ``default`` ServiceAccount: pods are refused until the controller made it."""
    # Truncated names can collide (the ids of a parametrized test come last, and the
    # namespace of the previous case may still be terminating): a short hash of the
    # whole node id keeps each test's namespace its own.
    digest = hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:6]
    name = "t-" + request.node.name.lower().replace("_", "-")[:40].strip("-") + "-" + digest
    _make_namespace(cluster, name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false")


def _own_releases_first(items: list[pytest.Item]) -> None:
    """Tests with a ``release`` of their own run before those of the shared
    ``joblease_release``, which lives from its first user to the end of the session.

    Why: both operators would be cluster-scoped, and two operators watching the same
    JobLeases register them in two etcds and write two truths into one status. The
    ``release`` fixture refuses to start while the shared one is installed, so a
    test needing both would fail loudly, not race. Only tests/cluster items move,
    within the places they already take (stable: the order inside each group stays).
    """
    slots = [i for i, item in enumerate(items) if "release" in getattr(item, "fixturenames", ())
             or "joblease_release" in getattr(item, "fixturenames", ())]
    group = [items[i] for i in slots]
    group.sort(key=lambda item: "release" not in item.fixturenames)  # own releases first
    for i, item in zip(slots, group, strict=True):
        items[i] = item


@pytest.fixture
def release(cluster: Cluster, namespace: str, tmp_path: Path) -> Iterator[Release]:
    """A release of the chart of this test's own, in its namespace (not installed yet:
    the test installs it with the values it is about); uninstalled afterwards."""
    shared = cluster.kubectl("get", "deployment", "-n", "joblease-system", "-o", "name")
    if shared.returncode == 0 and shared.stdout.strip():
        pytest.fail("the shared joblease_release is installed: a second cluster-scoped "
                    "operator would fight it over every JobLease (see "
                    "pytest_collection_modifyitems in tests/cluster/conftest.py)")
    rel = Release(cluster, namespace, tmp_path / "helm")
    yield rel
    rel.uninstall()


@pytest.fixture(scope="session")
def joblease_release(cluster: Cluster,
                     tmp_path_factory: pytest.TempPathFactory) -> Iterator[Release]:
    """The chart installed once per session by docs/helm.md's install, its commands run
    as written (``install_as_documented``): release ``joblease`` in ``joblease-system``
    (so the bundled etcd is the ``joblease-etcd.joblease-system.svc`` that
    examples/worker-pod.yaml names), the CRDs, the chart's defaults (etcd auth on, its
    data on a PersistentVolumeClaim, tenants following the label), ``default`` opted
    in. Shared by the tests that only use it (their JobLeases and pods in their own
    namespaces, see ``worker_namespace``); tests that upgrade, uninstall or break the
    operator or etcd install a ``release`` of their own."""
    rel = Release(cluster, "joblease-system", tmp_path_factory.mktemp("helm"),
                  name="joblease")
    install_as_documented(rel)
    yield rel
    rel.uninstall("default")
    cluster.kubectl("delete", "namespace", "joblease-system", "--wait=false")


@pytest.fixture
def worker_namespace(namespace: str, joblease_release: Release) -> str:
    """This test's namespace, opted in to the shared release: its own etcd user in the
    Secret ``joblease-etcd-credentials`` (what examples/worker-pod.yaml mounts)."""
    joblease_release.opt_in(namespace)
    return namespace


@pytest.fixture
def queue_namespace(cluster: Cluster, worker_namespace: str) -> str:
    """This test's namespace for queue workers: opted in to injection (so given its
    tenant Secret), and running the example ledger (examples/ledger.yaml)."""
    ns = worker_namespace
    r = cluster.kubectl("apply", "-n", ns, "-f", str(REPO_ROOT / "examples" / "ledger.yaml"))
    assert r.returncode == 0, r.stderr
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "probe", "namespace": ns,
                          "annotations": {"joblease.io/queue": "probe"}},
             "spec": {"containers": [{"name": "w", "command": ["true"],
                                      "image": image_ref("docker.io/curlimages/curl")}]}}

    def injecting() -> bool:  # the shared release's webhook may still be starting
        r = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                            input=json.dumps(probe), timeout=60)
        return r.returncode == 0 and any(
            c["name"] == "joblease" for c in json.loads(r.stdout)["spec"].get(
                "initContainers") or [])
    wait_until(injecting, timeout=180, what="the webhook injecting queue pods", interval=1)
    rollout = cluster.kubectl("rollout", "status", "deployment/ledger", "-n", ns,
                              "--timeout=300s", timeout=330)
    assert rollout.returncode == 0, rollout.stderr
    return ns
