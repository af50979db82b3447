"""docs/cli.md's exit-code table is the errors' own: every error class's
reason and exit code has its row, and no row names a code nothing raises."""

from __future__ import annotations

import re
from pathlib import Path

from joblease import errors

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"


def _classes() -> list[type[errors.JobLeaseError]]:
    found = []
    for value in vars(errors).values():
        if isinstance(value, type) and issubclass(value, errors.JobLeaseError):
            found.append(value)
    return found


def test_every_exit_code_is_documented_with_its_reason() -> None:
    section = DOC.read_text().split("## Errors and exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(code): reason for code, reason in
            re.findall(r"^\| (\d+) \| `(\w+)` \|", section, flags=re.MULTILINE)}
    raised = {cls.exit_code: cls.reason for cls in _classes()
              if cls.exit_code not in (1, 13)}  # 1: generic; 13: watch-internal compaction
    for code, reason in raised.items():
        assert rows.get(code) == reason, f"exit {code} ({reason}) is not in docs/cli.md's table"
    assert set(rows) <= set(raised), "docs/cli.md documents exit codes nothing raises"
