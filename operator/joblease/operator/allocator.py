"""Giving freed memory back to the system: glibc's allocator, tuned once and trimmed.

Measured at 10,000 JobLeases (docs/benchmarks-operator.md, issue 29), most of the
operator's resident memory beyond its live objects was memory Python had already
freed and glibc had kept: the creation burst's parsed API responses, kopf's
per-object workers, and the 256 KiB read buffer asyncio gives every TLS
connection while it is open. glibc returns freed memory to the system only from
the top of its heap; a hole in the middle stays resident until ``malloc_trim``.
And after the first large block is freed, glibc raises its ``mmap`` threshold
(its *dynamic* threshold), so later TLS buffers come from the heap too and leave
such holes when their connection closes.

So the operator, on glibc:

- fixes the ``mmap`` threshold (:data:`MMAP_THRESHOLD`, glibc's own initial value):
  blocks that large are mapped on their own and unmapped when freed, whatever was
  freed before (unless a free hole in the heap fits one: then it is reused, and the
  trim below gives its pages back once it is free again);
- caps the number of malloc arenas (:data:`ARENA_MAX`): each thread that allocates
  (gRPC's, the default executor's) may otherwise get an arena of its own, whose
  free memory the others cannot reuse;
- runs ``malloc_trim(0)`` every :data:`TRIM_INTERVAL` seconds, which gives back
  the free pages inside the heap and the arenas.

None of this changes what the operator does: the same allocations, made and
freed at the same moments; only where glibc keeps the free memory differs.
Elsewhere (musl, macOS) every function here is a no-op that says so (returns
False). A trim walks the free memory of every arena: tens of milliseconds for a
few hundred MiB of heap on a loaded machine, more when it releases much; it runs
in a worker thread (ctypes releases the GIL), so the event loop goes on except
when it needs the arena being trimmed.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import time

log = logging.getLogger(__name__)

#: Bytes from which glibc maps a block on its own (its initial default; set once,
#: the dynamic adjustment is off).
MMAP_THRESHOLD = 128 * 1024
#: malloc arenas at most (glibc's default: 8 per core).
ARENA_MAX = 2
#: Seconds between two trims.
TRIM_INTERVAL = 10.0

# mallopt parameters (glibc's malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


def _glibc() -> ctypes.CDLL | None:
    """The process's C library if it is glibc (it has ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(None)  # the symbols already loaded into this process
    except OSError:
        return None
    if not all(hasattr(libc, name) for name in ("gnu_get_libc_version", "malloc_trim",
                                                 "mallopt")):
        return None
    return libc


_LIBC = _glibc()


def available() -> bool:
    """True when the C library is glibc and these controls do something."""
    return _LIBC is not None


def tune() -> bool:
    """Fix the mmap threshold (and with it the trim threshold) and cap the arenas.

    Call it early, before other threads allocate (an arena is made on a thread's
    first allocation). Returns False when not on glibc or glibc refused a value."""
    if _LIBC is None:
        return False
    ok = True
    for param, value in ((_M_MMAP_THRESHOLD, MMAP_THRESHOLD),
                         (_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD),
                         (_M_ARENA_MAX, ARENA_MAX)):
        ok = bool(_LIBC.mallopt(ctypes.c_int(param), ctypes.c_int(value))) and ok
    return ok


def trim() -> bool:
    """``malloc_trim(0)``: give the free pages of every arena back to the system.

    True when some memory was released; False when none was, or not on glibc."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(ctypes.c_size_t(0)))


async def trim_periodically(interval: float = TRIM_INTERVAL) -> None:
    """:func:`trim` every ``interval`` seconds, until cancelled (a no-op loop
    that ends at once where :func:`available` is False)."""
    if not available():
        return
    while True:
        await asyncio.sleep(interval)
        start = time.perf_counter()
        released = await asyncio.to_thread(trim)
        log.debug("malloc_trim: %s in %.1f ms", "released memory" if released else "nothing",
                  (time.perf_counter() - start) * 1000)
