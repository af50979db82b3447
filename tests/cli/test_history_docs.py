"""docs/history.md's worked example, run as written: the shell block with the
real ``joblease`` command on a real etcd, then the history it leaves, read as
JSON, is exactly the story the page tells."""

from __future__ import annotations

import json
from pathlib import Path

from joblease import EtcdConfig
from tests.support.cli import as_json, doc_block, jl, run_doc_sh

DOC = Path(__file__).resolve().parents[2] / "docs" / "history.md"


def test_the_why_did_my_job_run_twice_example_works_as_written(
        etcd_config: EtcdConfig, tmp_path: Path) -> None:
    done = run_doc_sh(etcd_config, doc_block(DOC, "sh"), tmp_path)
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


def test_the_queue_item_example_works_as_written(etcd_config: EtcdConfig,
                                                 tmp_path: Path) -> None:
    """docs/history.md, "Queue items": A's claim released, B's run completed."""
    done = run_doc_sh(etcd_config, doc_block(DOC, "sh", "Queue items"), tmp_path)
    table = done.stdout.splitlines()
    header = next(i for i, line in enumerate(table) if line.startswith("GENERATION"))
    rows = [line.split() for line in table[header + 1:]]
    assert [(r[0], r[2], r[-3], r[-2], r[-1]) for r in rows] == [
        ("1", "worker-a", "released", "0", "0"), ("2", "worker-b", "completed", "0", "0")]
    history = as_json(jl(etcd_config, "history", "default/files/x", "-o", "json"))
    assert (history["queue"], history["item"], history["historyLimit"]) == (
        "default/files", "x", 3)
    assert [t["token"] for t in history["tenures"]] == [int(rows[0][1]), int(rows[1][1])]
