"""The README's two fresh-machine commands stay true.

The first (set up + demo) is run as written, in a clean copy of the tree and
a new virtualenv. The second is the test command itself; running it from
inside the test suite would recurse, so this checks that CI runs exactly it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

from tests.support.cli import doc_block

ROOT = Path(__file__).resolve().parent.parent


def readme_commands() -> list[str]:
    block = doc_block(ROOT / "README.md", "sh")
    return [line.strip() for line in block.splitlines() if line.strip()]


def test_readme_starts_with_the_two_commands() -> None:
    first_lines = (ROOT / "README.md").read_text().splitlines()[:6]
    assert "```sh" in first_lines
    commands = readme_commands()
    assert len(commands) == 2
    assert "joblease demo" in commands[0]


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert f"exec {readme_commands()[1]}" in ci


def test_readme_demo_command_works_in_a_clean_copy(tmp_path: Path) -> None:
    copy = tmp_path / "joblease"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns(
        ".venv", ".git", "*.egg-info", "__pycache__", ".mypy_cache", ".ruff_cache",
        ".pytest_cache", "build", "dist", ".hypothesis"))
    done = subprocess.run(["bash", "-c", readme_commands()[0]], cwd=copy, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "PASS  stale completion rejected by the store" in done.stdout
    assert "PASS  stale write rejected by the destination" in done.stdout
    report = subprocess.run([str(copy / ".venv/bin/joblease"), "demo", "--json"], cwd=copy,
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr[-3000:]
    data = json.loads(report.stdout)
    assert data["workerA"]["generation"] == 7 and data["workerB"]["generation"] == 8
    assert data["workerB"]["token"] > data["workerA"]["token"]
    assert data["lateCompletion"]["error"] == "stale"
    assert data["lateCompletion"]["currentToken"] == data["workerB"]["token"]
    assert data["lateWrite"]["status"] == 409
    assert data["verdicts"]["historyTellsIt"]
    assert [t["generation"] for t in data["history"]["tenures"]] == [1, 2, 3, 4, 5, 6, 7, 8]
