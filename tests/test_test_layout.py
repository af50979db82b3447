"""The test harness has one home: no test module imports another test module or a conftest.

Helpers live in tests/support/ (and a suite's own helper modules beside it,
e.g. tests/chaos/runner.py); fixtures reach other directories through
ancestor conftests or ``pytest_plugins`` in tests/conftest.py. Importing a
test module runs its collection-time code twice and couples unrelated tests;
importing a conftest registers its fixtures a second time. This reads every
real file under tests/ with :mod:`ast` (imports inside functions included).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent

#: Imports tolerated while a move is under way in another branch (none now).
PENDING: set[str] = set()


def _is_test_or_conftest(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return last == "conftest" or last.startswith("test_")


def _imported(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            # ``from tests.cli import test_cli`` imports a module too
            found |= {f"{node.module}.{alias.name}" for alias in node.names}
    return {m for m in found if m == "tests" or m.startswith("tests.")}


def offending_imports(root: Path) -> set[tuple[str, str]]:
    """(file relative to ``root``, imported test module or conftest) for every such import."""
    bad: set[tuple[str, str]] = set()
    for path in sorted(root.rglob("*.py")):
        for module in _imported(ast.parse(path.read_text(), str(path))):
            if _is_test_or_conftest(module):
                bad.add((path.relative_to(root).as_posix(), module))
    return bad


def test_no_test_module_imports_a_test_module_or_a_conftest() -> None:
    bad = offending_imports(TESTS)
    new = {(file, module) for file, module in bad if module not in PENDING}
    assert new == set(), "\n".join(
        f"{file} imports {module}: move what it needs to tests/support/"
        for file, module in sorted(new))
    still = {module for _, module in bad}
    assert PENDING <= still, f"no longer needed, drop from PENDING: {sorted(PENDING - still)}"


def test_the_check_sees_each_kind_of_import(tmp_path: Path) -> None:
    """The checker itself: each way of importing a test module or conftest is caught,
    helpers are not."""
    (tmp_path / "test_a.py").write_text(
        "from tests.cli.test_cli import jl\n"
        "import tests.fencing.conftest\n"
        "from tests.kube import test_chart\n"
        "def f():\n    from tests.conftest import x\n"
        "from tests.support.cli import jl as ok\n"
        "from tests.chaos.runner import run\n")
    assert offending_imports(tmp_path) == {
        ("test_a.py", "tests.cli.test_cli"), ("test_a.py", "tests.fencing.conftest"),
        ("test_a.py", "tests.kube.test_chart"), ("test_a.py", "tests.conftest")}
