"""BackgroundTasks: spawned work stays owned until it ends; wait and cancel reach it."""

from __future__ import annotations

import asyncio
import gc

from joblease.background import BackgroundTasks


async def test_spawned_work_is_kept_until_it_ends_and_wait_sees_it_finish() -> None:
    tasks = BackgroundTasks()
    release = asyncio.Event()
    finished: list[str] = []

    async def work() -> None:
        await release.wait()
        finished.append("done")

    tasks.spawn(work())
    gc.collect()  # the set holds the only strong reference: the task must survive this
    assert len(tasks) == 1
    release.set()
    await asyncio.wait_for(tasks.wait(), 5)
    assert finished == ["done"]
    assert len(tasks) == 0  # forgotten once ended


async def test_wait_swallows_a_task_error_and_cancel_ends_pending_work() -> None:
    tasks = BackgroundTasks()

    async def fails() -> None:
        raise RuntimeError("logged by its owner, not raised by wait")

    async def forever() -> None:
        await asyncio.Event().wait()

    tasks.spawn(fails())
    await asyncio.wait_for(tasks.wait(), 5)
    pending = tasks.spawn(forever())
    await asyncio.wait_for(tasks.cancel(), 5)
    assert pending.cancelled() and len(tasks) == 0
