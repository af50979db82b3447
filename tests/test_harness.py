"""The test harness's own guarantees: "nothing written" is judged on the keys a test
owns, and a stopped process's log can still be attached to a failure report."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from joblease import EtcdConfig, JobLeaseClient
from joblease.embedded import EtcdCluster
from joblease.store import Delete
from tests.support.etcd_keys import gateway_snapshot, snapshot, writes
from tests.support.sidecar_process import Proc


async def test_writes_under_a_prefix_are_seen_and_others_are_not(
        client: JobLeaseClient, etcd: EtcdCluster, etcd_config: EtcdConfig) -> None:
    mine = f"{etcd_config.root}/job/"
    await client.store.put(f"{mine}spec".encode(), b"1")
    await client.store.put(f"{mine}holder".encode(), b"1")
    before = await snapshot(client.store, mine)
    assert gateway_snapshot(etcd.endpoints[0], mine) == before

    # another test's write (the shared etcd's revision moves) is not ours
    await client.store.put(f"{etcd_config.root}/job-other/spec".encode(), b"x")
    assert not writes(before, await snapshot(client.store, mine))

    await client.store.put(f"{mine}spec".encode(), b"2")
    await client.store.txn([], [Delete(f"{mine}holder".encode())])
    await client.store.put(f"{mine}result".encode(), b"3")
    after = await snapshot(client.store, mine)
    assert gateway_snapshot(etcd.endpoints[0], mine) == after
    changed = writes(before, after)
    assert [line.split()[0] for line in changed] == ["deleted", "created", "modified"], changed


def test_a_stopped_process_log_is_still_readable(tmp_path: Path) -> None:
    """Fixtures stop their processes first and attach the logs after (when they are
    complete); reading a log after ``stop()`` must work."""
    p = Proc("echo", [sys.executable, "-c", "print('hello from the child')"], {},
             tmp_path / "echo.log")
    p.popen.wait(30)
    p.stop()
    p.stop()  # idempotent
    assert "hello from the child" in p.output()


def test_pids_in_cgroup_survives_cgroups_removed_while_it_walks(tmp_path: Path) -> None:
    """The cluster's teardown reads the pids of its cgroups while the kubelet and
    containerd may still remove some: a directory gone mid-walk must not raise (a
    full run's teardown once failed on it). A plain directory tree stands in for the
    cgroup hierarchy (creating and removing real cgroups here would need a cluster)."""
    import shutil
    import threading

    from tests.support.cluster.host import pids_in_cgroup

    top = tmp_path / "kubepods"
    top.mkdir()
    (top / "cgroup.procs").write_text("1\n")
    stop = threading.Event()

    def churn() -> None:  # pods' cgroups coming and going, as containerd makes them
        n = 0
        while not stop.is_set():
            pod = top / f"pod{n % 8}"
            shutil.rmtree(pod, ignore_errors=True)
            for c in range(4):
                (pod / f"c{c}" / "x").mkdir(parents=True, exist_ok=True)
                (pod / f"c{c}" / "cgroup.procs").write_text(f"{100 + c}\n")
            n += 1

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(1000):
            assert 1 in pids_in_cgroup(top)
    finally:
        stop.set()
        worker.join()


def test_a_port_taken_before_etcd_binds_it_is_picked_again() -> None:
    """Ports are picked by bind-then-release; another process can take one before
    etcd binds it (a full run's error: "bind: address already in use"). Here the
    test itself holds member m0's client and m1's peer port, as that process did:
    the first start must move to new ports and bring the whole cluster up."""

    cluster = EtcdCluster(3)
    held = []
    for port in (cluster.members[0].client_port, cluster.members[1].peer_port):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", port))
        s.listen()
        held.append(s)
    taken = {s.getsockname()[1] for s in held}
    try:
        cluster.start(timeout=30)
        ports = {p for m in cluster.members for p in (m.client_port, m.peer_port)}
        assert not ports & taken, (ports, taken)
        assert all(m.healthy() for m in cluster.members)
    finally:
        cluster.stop()
        for s in held:
            s.close()
