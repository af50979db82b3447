"""Every test the docs name exists: ``tests/...py`` as a file, ``tests/...py::name`` as a
test function or class in it; every pytest command they give selects tests as written.
A doc that says "guarded by tests/x.py" is a claim; the file being renamed or deleted (a
retired sidecar's tests, once) must not leave it behind.
"""

from __future__ import annotations

import ast
import concurrent.futures
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tests.support.binaries import REPO_ROOT
from tests.support.cli import PROJECT_DOCS

REFERENCE = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")


def named_tests() -> set[tuple[str, str]]:
    return {(str(doc.relative_to(REPO_ROOT)), ref)
            for doc in PROJECT_DOCS for ref in REFERENCE.findall(doc.read_text())}


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


def test_the_docs_name_tests() -> None:
    assert len(named_tests()) > 50  # the pattern finds them


def test_every_test_the_docs_name_exists() -> None:
    missing = []
    for doc, ref in sorted(named_tests()):
        path, _, name = ref.partition("::")
        if not (REPO_ROOT / path).is_file():
            missing.append(f"{doc}: {ref} (no such file)")
        elif name and name not in defined_names(REPO_ROOT / path):
            missing.append(f"{doc}: {ref} (no such test in it)")
    assert not missing, "\n".join(missing)


#: ``[VAR=value ...] [python -m |.venv/bin/]pytest ARGS``, ARGS starting with a path or -m
PYTEST_COMMAND = re.compile(
    r"((?:\b[A-Z_]+=\S+ )*)(?:python3? -m |\.venv/bin/)?\bpytest ((?:tests/|-m )[^`#|\n]*)")


def pytest_commands() -> list[tuple[str, str, str]]:
    """``(doc, env assignments, arguments)`` of each pytest command the docs give."""
    found: dict[tuple[str, str, str], None] = {}
    for doc in PROJECT_DOCS:
        text = " ".join(line.strip() for line in doc.read_text().split("\n"))  # prose wraps
        for env, args in PYTEST_COMMAND.findall(text):
            found[(str(doc.relative_to(REPO_ROOT)), env.strip(), " ".join(args.split()))] = None
    return list(found)


PYTEST_COMMANDS = pytest_commands()


def test_the_docs_give_pytest_commands() -> None:
    assert ("docs/fault-tests.md", "", "tests/chaos --soak -q -p no:cacheprovider -s"
            ) in PYTEST_COMMANDS, PYTEST_COMMANDS
    assert len(PYTEST_COMMANDS) >= 12


def _selected(doc: str, env: str, args: str) -> str | None:
    """None if ``pytest ARGS`` (with ``env``) collects at least one test, else why not."""
    variables = dict(assignment.split("=", 1) for assignment in shlex.split(env))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
         *shlex.split(args)], cwd=REPO_ROOT, env={**os.environ, **variables},
        capture_output=True, text=True, timeout=300)
    # -q prints node ids and "N tests collected"; -q twice (the command's own -q), "path: N"
    counts = [int(n) for n in re.findall(r"^\S+\.py: (\d+)$", done.stdout, re.M)]
    if done.returncode == 0 and (sum(counts) > 0 or re.search(r"^\S+::\S+", done.stdout, re.M)):
        return None
    return (f"{doc}: `{env + ' ' if env else ''}pytest {args}` selects nothing (exit "
            f"{done.returncode}):\n{done.stdout[-1500:]}{done.stderr[-1500:]}")


def test_each_documented_pytest_command_selects_tests() -> None:
    """Each command's paths, options (``--soak``), markers and ``-k`` expressions, as
    written, select at least one test: collected only, nothing runs (four at a time:
    each collection is a Python start and the suite's imports)."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        problems = [p for p in pool.map(lambda c: _selected(*c), PYTEST_COMMANDS) if p]
    assert not problems, "\n\n".join(problems)


def test_a_command_selecting_nothing_is_caught() -> None:
    assert _selected("doc", "", "tests/chaos/test_checker.py -k no_such_test_anywhere -q")
    assert _selected("doc", "", "tests/chaos --no-such-option")
    assert _selected("doc", "", "tests/chaos/test_checker.py -q") is None
