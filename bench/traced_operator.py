"""``python -m joblease.operator`` under tracemalloc, for ``bench/operator_lag.py --tracemalloc``.

Bench-only: the product never traces. Tracing starts before the operator imports
anything, so every allocation it keeps is attributed; SIGUSR2 writes a summary of
what is live at that moment to ``JOBLEASE_TRACEMALLOC_OUT`` (JSON), then
``<that>.done`` so the bench knows it is complete.

The summary attributes each live block to the innermost frame of *our* code or of
a library that is not the standard library (kopf, aiohttp, grpc, protobuf,
joblease), so ``json.loads`` called by kopf counts as kopf's, and also lists the
top lines as tracemalloc sees them, and with more than one frame per
allocation (``JOBLEASE_TRACEMALLOC_FRAMES``) the top tracebacks. tracemalloc's own
bookkeeping (``tracemalloc.get_tracemalloc_memory()``) is reported too: it is part
of the RSS of a traced process and not of an untraced one.

Beside the live blocks it reports what RSS holds that they do not show: pymalloc's
arenas (``sys._debugmallocstats``: bytes in used blocks against free blocks of
arenas that cannot be returned while one block in them lives), the process's
memory map (``[heap]``, the rest of the anonymous memory, file-backed pages) and
the most numerous live object types (``gc.get_objects()``).

    python -m bench.traced_operator --namespace ns ...   (the operator's own arguments)
"""

from __future__ import annotations

import gc
import json
import os
import re
import runpy
import signal
import sys
import sysconfig
import tempfile
import tracemalloc
from collections import defaultdict
from pathlib import Path
from types import FrameType

#: Frames kept per allocation (``JOBLEASE_TRACEMALLOC_FRAMES``); 0: no tracing, and
#: the summary has only what needs none (``--heap-stats``). 1 (tracemalloc's
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


def pymalloc_stats() -> dict[str, float]:
    """pymalloc's arena accounting (``sys._debugmallocstats``, written to fd 2), MiB."""
    with tempfile.TemporaryFile() as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read().decode(errors="replace")
    wanted = {"# arenas allocated current": "arenas_current",
              "# arenas highwater mark": "arenas_highwater",
              "# bytes in allocated blocks": "allocated_blocks_mib",
              "# bytes in available blocks": "available_blocks_mib",
              "Total": "in_arenas_mib"}
    found: dict[str, float] = {}
    for line in text.splitlines():
        label, _, value = line.partition("=")
        key = wanted.get(label.strip())
        if "unused pools" in label:
            key = "unused_pools_mib"
        if key and key not in found and value.strip():
            number = int(value.strip().replace(",", ""))
            found[key] = number if key.startswith("arenas") else round(number / 2**20, 1)
    return found


def memory_map(pid: int | str = "self") -> dict[str, float]:
    """Resident MiB of ``[heap]`` (glibc's main arena), of the other anonymous
    mappings (pymalloc's arenas, blocks glibc mapped on their own such as asyncio's
    256 KiB TLS read buffers, thread arenas and stacks: the kernel merges adjacent
    ones, so their sizes cannot tell them apart) and of file-backed mappings; and
    the open sockets."""
    out = {"heap_mib": 0.0, "other_anonymous_mib": 0.0, "file_mib": 0.0}
    current = ""
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = re.match(r"^[0-9a-f]+-[0-9a-f]+ \S+ \S+ \S+ (\d+)\s*(.*)$", line)
        if head:
            inode, name = head.groups()
            current = ("heap_mib" if name == "[heap]" else
                       "file_mib" if inode != "0" else "other_anonymous_mib")
        elif line.startswith("Rss:"):
            out[current] += int(line.split()[1]) / 1024
    rounded = {k: round(v, 1) for k, v in out.items()}
    fds = Path(f"/proc/{pid}/fd")
    rounded["sockets"] = sum(1 for fd in fds.iterdir()
                             if _readlink(fd).startswith("socket:"))
    return rounded


def _readlink(path: Path) -> str:
    try:
        return str(path.readlink())
    except OSError:  # closed meanwhile
        return ""


def object_sizes(top: int = 25) -> dict[str, list[float]]:
    """Live objects the garbage collector tracks, by type: count and MiB of their own
    ``sys.getsizeof`` (not of what they refer to; strings, bytes and numbers are not
    tracked by the collector, so they show only inside the containers' figures)."""
    sizes: dict[str, list[float]] = defaultdict(lambda: [0, 0])
    for obj in gc.get_objects():
        entry = sizes[f"{type(obj).__module__}.{type(obj).__qualname__}"]
        entry[0] += 1
        entry[1] += sys.getsizeof(obj)
    ranked = sorted(sizes.items(), key=lambda kv: -kv[1][1])[:top]
    return {k: [int(v[0]), round(v[1] / 2**20, 2)] for k, v in ranked}


def summary(top: int = 30) -> dict[str, object]:
    """What is live now. Without tracing (``JOBLEASE_TRACEMALLOC_FRAMES=0``) only the
    parts that need no tracing: pymalloc, the memory map, the objects by type."""
    untraced: dict[str, object] = {"pymalloc": pymalloc_stats(), "memory_map": memory_map(),
                                   "object_sizes": object_sizes()}
    if not tracemalloc.is_tracing():
        return untraced
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
        "top_tracebacks": [
            {"mib": round(s.size / mib, 2), "blocks": s.count,
             "frames": [f"{_short(f.filename)}:{f.lineno}" for f in s.traceback]}
            for s in (snapshot.statistics("traceback")[:top // 2] if FRAMES > 1 else [])],
        **untraced,
    }


def _dump(_signum: int, _frame: FrameType | None) -> None:
    out = Path(os.environ["JOBLEASE_TRACEMALLOC_OUT"])
    out.write_text(json.dumps(summary(), indent=2) + "\n")
    Path(f"{out}.done").write_text("done")


def main() -> None:
    if FRAMES > 0:
        tracemalloc.start(FRAMES)
    signal.signal(signal.SIGUSR2, _dump)
    sys.argv = ["joblease.operator", *sys.argv[1:]]
    runpy.run_module("joblease.operator", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
