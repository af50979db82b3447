"""The operator's allocator controls really give freed memory back (glibc, the
platform of the image and of these machines)."""

from __future__ import annotations

import asyncio
import ctypes
import platform
from pathlib import Path

import pytest

from joblease.operator import allocator

MIB = 1024 * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in (
        "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
        "fordblks", "keepcost")]


def _mapped_bytes() -> int:
    """Bytes glibc holds in blocks mapped on their own (``mallinfo2().hblkhd``)."""
    libc = ctypes.CDLL(None)
    libc.mallinfo2.restype = _MallInfo2
    info: _MallInfo2 = libc.mallinfo2()
    return int(info.hblkhd)


def _rss() -> int:
    return int(Path("/proc/self/statm").read_text().split()[1]) * 4096


def test_the_controls_are_there_on_glibc() -> None:
    assert platform.libc_ver()[0] == "glibc"  # these tests' premise
    assert allocator.available()
    assert allocator.tune()


def test_trim_gives_back_the_free_memory_inside_the_heap() -> None:
    """Freed blocks between live ones stay resident (glibc only returns the top of
    its heap by itself) until trimmed."""
    kept, freed = [], []
    for i in range(100_000):  # 1 KB blocks: from glibc's heap, not pymalloc's arenas
        (kept if i % 16 == 0 else freed).append(bytes(1000 + i % 7))
    del freed
    before = _rss()
    assert allocator.trim()
    after = _rss()
    assert before - after >= 40 * MIB, (before / MIB, after / MIB)
    assert len(kept) == 6250


def test_after_tune_large_blocks_are_mapped_on_their_own_whatever_was_freed_before() -> None:
    """glibc's dynamic threshold would serve large blocks (asyncio's 256 KiB TLS read
    buffers) from the heap once a larger mapped block was freed; tuned, it maps them
    (unless a free hole in the heap fits one: hence many, and at least half mapped),
    and unmaps them when they are freed."""
    assert allocator.tune()
    big = bytearray(4 * MIB)  # mapped, then freed: raises a dynamic threshold to 4 MiB
    del big
    before = _mapped_bytes()
    blocks = [bytearray(2 * MIB) for _ in range(32)]
    assert _mapped_bytes() - before >= 32 * MIB, (_mapped_bytes() - before) / MIB
    del blocks
    assert _mapped_bytes() <= before


async def test_trim_periodically_trims_until_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []
    real = allocator.trim

    def counted() -> bool:
        calls.append(real())
        return calls[-1]

    monkeypatch.setattr(allocator, "trim", counted)
    task = asyncio.create_task(allocator.trim_periodically(0.01))
    deadline = asyncio.get_running_loop().time() + 30
    while len(calls) < 3:
        assert asyncio.get_running_loop().time() < deadline, "no trims within 30 s"
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
