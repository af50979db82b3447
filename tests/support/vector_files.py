"""Reading the shared vector files (tests/vectors/README.md): a vector's stored
bytes, and JSON equality that tells an integer from a float and a bool."""

from __future__ import annotations

import base64
import json
from typing import Any


def stored(vector: dict[str, Any]) -> bytes:
    """The value exactly as etcd holds it."""
    if "stored_base64" in vector:
        return base64.b64decode(vector["stored_base64"])
    text: str = vector["stored"]
    return text.encode("utf-8")


def spelled_alike(a: Any, b: Any) -> bool:
    """Equal as JSON values *and* of the same JSON types (``1 == 1.0 == True`` in
    Python, but a reader must tell an integer from a float and a bool)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
