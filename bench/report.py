"""The tail every benchmark shares: its report written as JSON where ``--json`` says."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def save(report: Any, path: str | Path | None, *, announce: bool = True) -> None:
    """Write ``report`` (indented JSON) to ``path``, creating its directory; nothing if
    ``path`` is None or empty. ``announce`` prints where it went."""
    if not path:
        return
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(report, indent=2) + "\n")
    if announce:
        print(f"\nJSON: {target}")
