"""docs/queues.md's quick start, run as written: the shell block with the real
``joblease`` command on a real etcd, and the Python block's ``drain``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from joblease import EtcdConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "queues.md"


def _block(language: str) -> str:
    text = DOC.read_text()
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_quick_start_shell_block_works_as_written(etcd_config: EtcdConfig,
                                                      tmp_path: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "joblease").write_text(f"#!/bin/sh\nexec {sys.executable} -m joblease.cli \"$@\"\n")
    (bindir / "joblease").chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}",
           "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    done = subprocess.run(["sh", "-e", "-c", _block("sh")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, (done.stdout, done.stderr)
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
    exec(compile(_block("python"), str(DOC), "exec"), namespace)
    await namespace["drain"]()
    from joblease import JobLeaseClient
    from joblease.keys import ItemRef, QueueRef
    from joblease.queue import Queues
    async with JobLeaseClient(etcd_config) as client:
        state = await Queues(client).item(ItemRef(QueueRef("default", "files"), "e"))
    assert state.result is not None and state.result.result == {"double": 10}
