"""JSON-lines logging for the sidecar.

Log collectors parse one JSON object per line without multi-line stitching,
and fields (``job``, ``token``, ``reason``) stay queryable. Secrets never
reach a record: the config's ``describe()`` omits them and the bearer token
is never formatted into a message.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

#: ``LogRecord`` attributes that are not user-supplied ``extra`` fields.
_STANDARD = set(logging.LogRecord("", 0, "", 0, "", None, None).__dict__) | {
    "message", "asctime", "color_message", "taskName",
}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: ts, level, logger, msg, any ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in record.__dict__.items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str, separators=(",", ":"))


def configure_logging(level: str = "INFO") -> None:
    """Send every logger (ours, uvicorn's, grpc's) to stderr as JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
    logging.getLogger("uvicorn.access").setLevel(logging.WARNING)
