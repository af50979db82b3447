"""``python -m joblease.operator`` under tracemalloc, for ``bench/operator_lag.py --tracemalloc``.

Bench-only: the product never traces. Tracing starts before the operator imports
anything, so every allocation it keeps is attributed; SIGUSR2 writes a summary of
what is live at that moment to ``JOBLEASE_TRACEMALLOC_OUT`` (JSON), then
``<that>.done`` so the bench knows it is complete.

The summary attributes each live block to the innermost frame of *our* code or of
a library that is not the standard library (kopf, aiohttp, grpc, protobuf,
joblease), so ``json.loads`` called by kopf counts as kopf's, and also lists the
top lines as tracemalloc sees them. tracemalloc's own bookkeeping
(``tracemalloc.get_tracemalloc_memory()``) is reported too: it is part of the RSS
of a traced process and not of an untraced one.

    python -m bench.traced_operator --namespace ns ...   (the operator's own arguments)
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import sysconfig
import tracemalloc
from collections import defaultdict
from pathlib import Path
from types import FrameType

#: Frames kept per allocation (``JOBLEASE_TRACEMALLOC_FRAMES``). 1 (tracemalloc's
#: default) attributes a block to the line that allocated it; more frames find the
#: caller of ``json.loads`` and friends, but slowed the operator's creation handling
#: about 15x at 12 frames on a loaded machine, too much for 1,000 JobLeases.
FRAMES = int(os.environ.get("JOBLEASE_TRACEMALLOC_FRAMES") or 1)
_STDLIB = sysconfig.get_paths()["stdlib"]


def _owner(trace: tracemalloc.Trace) -> str:
    """The innermost frame outside the standard library, as ``module-ish path:line``."""
    for frame in trace.traceback:  # most recent call first
        name = frame.filename
        if name.startswith(_STDLIB) and "site-packages" not in name:
            continue
        if name.startswith("<"):
            continue
        return f"{_short(name)}:{frame.lineno}"
    first = trace.traceback[0]
    return f"{_short(first.filename)}:{first.lineno}"


def _package(where: str) -> str:
    path = where.rsplit(":", 1)[0]
    parts = path.split("/")
    return parts[0] if parts[0] != "joblease" else "/".join(parts[:2])


def _short(filename: str) -> str:
    for marker in ("site-packages/", "/operator/joblease/", "/lib/python3"):
        if marker in filename:
            tail = filename.split(marker, 1)[1]
            return ("joblease/" + tail) if marker == "/operator/joblease/" else tail
    return filename


def summary(top: int = 30) -> dict[str, object]:
    snapshot = tracemalloc.take_snapshot()
    by_owner: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    by_package: dict[str, int] = defaultdict(int)
    total = 0
    for trace in snapshot.traces:
        where = _owner(trace)
        by_owner[where][0] += trace.size
        by_owner[where][1] += 1
        by_package[_package(where)] += trace.size
        total += trace.size
    owners = sorted(by_owner.items(), key=lambda kv: -kv[1][0])[:top]
    lines = snapshot.statistics("lineno")[:top]
    mib = 1024 * 1024
    return {
        "traced_mib": round(total / mib, 1),
        "traced_peak_mib": round(tracemalloc.get_traced_memory()[1] / mib, 1),
        "tracemalloc_overhead_mib": round(tracemalloc.get_tracemalloc_memory() / mib, 1),
        "by_package_mib": {k: round(v / mib, 1) for k, v in
                           sorted(by_package.items(), key=lambda kv: -kv[1])[:15]},
        "top_owners": [{"where": k, "mib": round(v[0] / mib, 2), "blocks": v[1]}
                       for k, v in owners],
        "top_lines": [{"where": f"{_short(s.traceback[0].filename)}:{s.traceback[0].lineno}",
                       "mib": round(s.size / mib, 2), "blocks": s.count} for s in lines],
    }


def _dump(_signum: int, _frame: FrameType | None) -> None:
    out = Path(os.environ["JOBLEASE_TRACEMALLOC_OUT"])
    out.write_text(json.dumps(summary(), indent=2) + "\n")
    Path(f"{out}.done").write_text("done")


def main() -> None:
    tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv = ["joblease.operator", *sys.argv[1:]]
    runpy.run_module("joblease.operator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
