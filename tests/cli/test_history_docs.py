"""docs/history.md's worked example, run as written: the shell block with the
real ``joblease`` command on a real etcd, then the history it leaves, read as
JSON, is exactly the story the page tells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from joblease import EtcdConfig
from tests.support.cli import as_json, jl

DOC = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def _block(language: str) -> str:
    return DOC.read_text().split(f"```{language}\n", 1)[1].split("```", 1)[0]


def test_the_why_did_my_job_run_twice_example_works_as_written(
        etcd_config: EtcdConfig, tmp_path: Path) -> None:
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
    assert "refused: exit 7" in done.stdout
    table = done.stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("GENERATION"))
    assert table[header].split() == ["GENERATION", "TOKEN", "OWNER", "CLAIMED", "ENDED", "END",
                                     "CHECKPOINTS", "REFUSED"]
    rows = [line.split() for line in table[header + 1:]]
    assert [(r[0], r[2], r[-3], r[-1]) for r in rows] == [
        ("1", "worker-a", "expired", "1"), ("2", "worker-b", "completed", "0")]
    history = as_json(jl(etcd_config, "history", "nightly", "-o", "json"))
    a, b = history["tenures"]
    assert b["token"] > a["token"] and a["endedAt"] is None
    assert (a["refusedCompletions"], b["refusedCompletions"]) == (1, 0)
    state = as_json(jl(etcd_config, "get", "nightly", "-o", "json"))
    assert state["result"]["token"] == b["token"] == int(rows[1][1])
    assert state["result"]["owner"] == "worker-b"
    assert json.dumps(state["result"]["result"]) == '{"rows": 1}'
