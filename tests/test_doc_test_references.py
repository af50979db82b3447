"""Every test the docs name exists: ``tests/...py`` as a file, ``tests/...py::name`` as a
test function or class in it. A doc that says "guarded by tests/x.py" is a claim; the
file being renamed or deleted (a retired sidecar's tests, once) must not leave it behind.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.support.binaries import REPO_ROOT

DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
REFERENCE = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")


def named_tests() -> set[tuple[str, str]]:
    return {(str(doc.relative_to(REPO_ROOT)), ref)
            for doc in DOCS for ref in REFERENCE.findall(doc.read_text())}


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
