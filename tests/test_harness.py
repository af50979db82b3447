"""The test harness's own guarantees: "nothing written" is judged on the keys a test
owns, and a stopped process's log can still be attached to a failure report."""

from __future__ import annotations

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
