"""docs/cli.md's `joblease run` block, run as written: the real ``joblease`` command on a
real etcd, in a directory holding the ``./report.sh`` the block names. The script is the
reader's own (the doc does not show one); the test's writes down what it was given and
ends with a JSON line, the result the doc's "The result" paragraph describes."""

from __future__ import annotations

import json
from pathlib import Path

from joblease import EtcdConfig
from tests.support.cli import as_json, doc_block, jl, run_doc_sh

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"

REPORT_SH = """#!/bin/sh
printf '%s\\n' "$*" > args
printf '%s %s %s\\n' "$JOBLEASE_JOB" "$JOBLEASE_TOKEN" "$JOBLEASE_GENERATION" > lease
echo "report for $2"
echo '{"rows": 1234}'
"""


def test_the_run_example_completes_the_job_as_written(etcd_config: EtcdConfig,
                                                      tmp_path: Path) -> None:
    block = doc_block(DOC, "sh", "`joblease run`: a lease around any process")
    assert "./report.sh" in block
    (tmp_path / "report.sh").write_text(REPORT_SH)
    (tmp_path / "report.sh").chmod(0o755)
    done = run_doc_sh(etcd_config, block, tmp_path, cwd=tmp_path)
    assert "report for 2026-12-01" in done.stdout  # the command's output passed through
    assert (tmp_path / "args").read_text().split() == ["--date", "2026-12-01"]
    job, token, generation = (tmp_path / "lease").read_text().split()
    assert (job, generation) == ("default/nightly-report", "1")
    state = as_json(jl(etcd_config, "get", "nightly-report", "-o", "json"))
    assert state["result"]["token"] == int(token)
    assert json.dumps(state["result"]["result"]) == '{"rows": 1234}'
