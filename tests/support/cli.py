"""The ``joblease`` command run as a real process against a test's etcd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from joblease import EtcdConfig
from tests.support.binaries import REPO_ROOT

#: TTL for jobs whose holder must still be there a few CLI runs later. A claim
#: without ``--hold`` is never renewed, and each ``jl`` call is a fresh Python
#: process (seconds apiece on a loaded machine), so a short TTL lets the holder
#: expire between steps and the test observe an expiry it is not about. No test
#: here waits for this TTL: it is a lifetime longer than any test, not a wait.
LONG_TTL = "600"


def cli_env(config: EtcdConfig) -> dict[str, str]:
    """This process's environment with the CLI pointed at ``config``'s etcd and key root."""
    return {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints),
            "JOBLEASE_ROOT": config.root}


def jl(config: EtcdConfig, *args: str, check: int | None = 0, timeout: float = 60
       ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "joblease.cli", *args], env=cli_env(config),
                          capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)


def doc_block(doc: Path, language: str, section: str | None = None) -> str:
    """The first ```language block of ``doc`` (of its ``## section`` when named), as written."""
    text = doc.read_text()
    if section is not None:
        text = text.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    return text.split(f"```{language}\n", 1)[1].split("```", 1)[0]


def run_doc_sh(config: EtcdConfig, script: str, tmp_path: Path, timeout: float = 300,
               cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a doc's shell block with ``sh -e`` (in ``cwd`` when given, for a block that names
    files of its own directory), ``joblease`` (this checkout's CLI, under this interpreter)
    first on PATH and pointed at ``config``'s etcd; asserts it exits 0."""
    bindir = tmp_path / "bin"
    bindir.mkdir(exist_ok=True)
    (bindir / "joblease").write_text(f"#!/bin/sh\nexec {sys.executable} -m joblease.cli \"$@\"\n")
    (bindir / "joblease").chmod(0o755)
    env = {**cli_env(config), "PATH": f"{bindir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["sh", "-e", "-c", script], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, (done.stdout, done.stderr)
    return done


#: The project's documentation: README.md and every page of docs/.
PROJECT_DOCS = (REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md")))


def fenced_blocks(doc: Path) -> list[tuple[str, str]]:
    """Every fenced block of ``doc`` as (language, text), in order; language is "" for an
    untagged fence. Fences may be indented (inside a list item)."""
    blocks: list[tuple[str, str]] = []
    fence: str | None = None
    lines: list[str] = []
    for line in doc.read_text().splitlines():
        stripped = line.strip()
        if fence is None:
            if stripped.startswith("```"):
                fence, lines = stripped[3:], []
        elif stripped == "```":
            blocks.append((fence, "\n".join(lines) + "\n"))
            fence = None
        else:
            lines.append(line)
    return blocks
