"""The shared stored-value vectors (tests/vectors/values.json; format in the
README there): what a result or checkpoint may be, for every test that judges
a writer or reader of them (the records' own tests, the sidecars' API)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

PATH = Path(__file__).resolve().parents[1] / "vectors" / "values.json"
VALUES: dict[str, Any] = json.loads(PATH.read_text())


def value_text(v: dict[str, Any]) -> bytes:
    """The value's JSON text exactly as a writer is given it."""
    if "json_base64" in v:
        return base64.b64decode(v["json_base64"])
    if "json_parts" in v:
        return "".join(text * count for text, count in v["json_parts"]).encode("utf-8")
    text: str = v["json"]
    return text.encode("utf-8")


def values(*verdicts: str) -> list[dict[str, Any]]:
    return [v for v in VALUES["values"] if v["verdict"] in verdicts]
