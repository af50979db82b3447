"""Waiting on conditions with deadlines (never a bare sleep as synchronisation)."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable
from typing import Any

from joblease import HeldError, JobLeaseClient, JobRef, Lease


def wait_until(predicate: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.02) -> Any:
    """Poll ``predicate`` until truthy; fail with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


async def claim_when_free(client: JobLeaseClient, job: JobRef, owner: str,
                          timeout: float = 20.0, interval: float = 0.02) -> Lease:
    """Claim as soon as etcd has expired (or someone released) the previous holder;
    re-raise HeldError after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await client.claim(job, owner)
        except HeldError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(interval)


async def poll(cond: Callable[[], Any], timeout: float, what: str,
               interval: float = 0.05) -> Any:
    """Call ``cond`` (sync or async) until it returns something truthy."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        last = cond()
        if inspect.isawaitable(last):
            last = await last
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r})")
        await asyncio.sleep(interval)
