"""docs/queues.md's quick start, run as written: the shell block with the real
``joblease`` command on a real etcd, and the Python block's ``drain``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from joblease import EtcdConfig
from tests.support.cli import doc_block, run_doc_sh

DOC = Path(__file__).resolve().parents[2] / "docs" / "queues.md"


def test_the_quick_start_shell_block_works_as_written(etcd_config: EtcdConfig,
                                                      tmp_path: Path) -> None:
    done = run_doc_sh(etcd_config, doc_block(DOC, "sh"), tmp_path)
    counts = json.loads(done.stdout[done.stdout.rindex("\n{"):])
    assert (counts["total"], counts["completed"], counts["pending"]) == (3, 3, 0)
    for item in "abc":  # each item's command ran once, under its own token
        assert f'"item": "{item}"' in done.stdout
    assert "Completed" in done.stdout  # the items table


async def test_the_quick_start_python_block_works_as_written(
        etcd_config: EtcdConfig, monkeypatch: Any) -> None:
    monkeypatch.setenv("JOBLEASE_ETCD_ENDPOINTS", ",".join(etcd_config.endpoints))
    monkeypatch.setenv("JOBLEASE_ROOT", etcd_config.root)
    namespace: dict[str, Any] = {}
    exec(compile(doc_block(DOC, "python"), str(DOC), "exec"), namespace)
    await namespace["drain"]()
    from joblease import JobLeaseClient
    from joblease.keys import ItemRef, QueueRef
    from joblease.queue import Queues
    async with JobLeaseClient(etcd_config) as client:
        state = await Queues(client).item(ItemRef(QueueRef("default", "files"), "e"))
    assert state.result is not None and state.result.result == {"double": 10}
