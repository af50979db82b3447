"""Fire-and-forget tasks that are still owned: a set that keeps each task referenced
until it ends (asyncio holds only weak references to running tasks, so an
unreferenced one can be garbage-collected mid-flight) and that its owner can wait
for, or cancel, when it closes."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Iterator


class BackgroundTasks:
    """The background work of one owner (a client, the status mirror)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Future[None]] = set()

    def spawn(self, work: Awaitable[None]) -> asyncio.Future[None]:
        """Run ``work`` in the background; it is forgotten once it ends."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def __len__(self) -> int:
        return len(self._tasks)

    def __iter__(self) -> Iterator[asyncio.Future[None]]:
        return iter(list(self._tasks))

    async def wait(self) -> None:
        """Until every task spawned so far has ended (their errors are theirs: each
        task logs what it must; none is raised here)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def cancel(self) -> None:
        """Cancel every task and wait until they have ended."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def until_first(works: Iterable[Awaitable[object]], timeout: float | None) -> None:
    """Until the first of ``works`` ends (or ``timeout`` seconds pass); the others
    are then cancelled and waited for, so none outlives the call."""
    tasks = [asyncio.ensure_future(w) for w in works]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
