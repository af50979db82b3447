"""``kubectl joblease items QUEUE``: the real kubectl finds the ``kubectl-joblease``
script (the same CLI) on PATH and lists a queue's items from a real etcd
(``joblease items`` itself: tests/cli/test_queue_cli.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from joblease import EtcdConfig, JobLeaseClient
from joblease.keys import ItemRef, QueueRef
from joblease.queue import Queues
from joblease.records import QueueSpec
from tests.support.binaries import kubectl_binary
from tests.support.cli import as_json

Q = QueueRef("team-a", "files")


async def _queue_with_items(client: JobLeaseClient) -> None:
    queues = Queues(client)
    await queues.create(Q, QueueSpec(600, 3))
    await queues.enqueue(Q, [("a", {"n": 1}), ("b", {"n": 2}), ("c", None)])
    lease = await queues.claim(ItemRef(Q, "a"), "w1")
    await lease.complete({"ok": True})
    await queues.claim(ItemRef(Q, "b"), "w2")


async def test_kubectl_runs_items_as_a_plugin(etcd_config: EtcdConfig,
                                              client: JobLeaseClient) -> None:
    """kubectl finds ``kubectl-joblease`` on PATH and runs ``kubectl joblease items``;
    it talks to etcd, so no cluster is needed."""
    await _queue_with_items(client)
    bindir = Path(sys.executable).parent
    assert (bindir / "kubectl-joblease").exists()
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    done = subprocess.run([kubectl_binary(), "joblease", "items", "team-a/files", "-o", "json"],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [i["item"] for i in as_json(done)] == ["a", "b", "c"]
