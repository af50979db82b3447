"""A sidecar run in the test's process, on a real etcd, with faults injected around its store.

The sidecar is the real :class:`~joblease.sidecar.runner.SidecarRunner`,
serving its real HTTP API on a loopback port, with a real
:class:`~joblease.etcd_store.EtcdStore` inside a
:class:`~tests.support.faulty_store.FaultyStore` (every call still goes to
etcd; the wrapper only delays or loses replies, or refuses to send). The
worker it signals is a real process.

:class:`FileEvents` watches a directory with Linux inotify, so a token file
that exists for a microsecond is still seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.etcd_store import EtcdStore
from joblease.sidecar.config import Backoff, SidecarConfig
from joblease.sidecar.runner import SidecarRunner
from joblease.sidecar.serve import Sidecar
from tests.support.faulty_store import FaultyStore
from tests.waiting import poll


@dataclass
class InProcessSidecar:
    runner: SidecarRunner
    store: FaultyStore
    url: str
    token_file: Path
    task: asyncio.Task[int]

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as http:
            return await http.request(method, path, **kw)

    async def lease(self) -> dict[str, Any]:
        r = await self.request("GET", "/v1/lease")
        return {"status": r.status_code, **r.json()}

    async def held(self, timeout: float = 30) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            try:
                lease = await self.lease()
            except httpx.TransportError:
                lease = {"status": 0}
            if self.task.done():
                raise AssertionError(f"the sidecar stopped (exit code {self.task.result()})")
            return lease if lease["status"] == 200 else None
        found: dict[str, Any] = await poll(check, timeout, "the sidecar to hold the lease")
        return found


@contextlib.asynccontextmanager
async def sidecar_in_process(etcd_config: EtcdConfig, job: JobRef, workdir: Path,
                             **config: Any) -> AsyncIterator[InProcessSidecar]:
    """Run the real sidecar runner on its own real HTTP port, in this event loop."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = FaultyStore(EtcdStore(etcd_config))
    client = JobLeaseClient(etcd_config, store=store)
    settings: dict[str, Any] = {
        "job": job, "owner": "pod-a/uid-a", "etcd": etcd_config, "port": 0,
        "port_file": workdir / "port", "probe_port": None, "token_file": workdir / "token",
        "on_loss": "none", "backoff": Backoff(initial=0.05, maximum=0.2),
        **config}
    sidecar = Sidecar(SidecarConfig(**settings), client=client)
    runner = sidecar.runner
    task = asyncio.create_task(sidecar.run())
    try:
        port = await poll(lambda: sidecar.ports.get("api"), 30, "the sidecar's port")
        yield InProcessSidecar(runner, store, f"http://127.0.0.1:{port}", workdir / "token",
                               task)
    finally:
        store.unreachable = False
        for held in (store.hold_completion_reply, store.hold_release_reply):
            if held is not None:
                held.set()
        runner.request_stop()
        await asyncio.wait_for(task, 60)


# -- inotify -------------------------------------------------------------------------------------

_IN_MOVED_TO, _IN_CREATE = 0x80, 0x100
_EVENT = struct.Struct("iIII")


class FileEvents:
    """The names that appeared in ``directory`` (created or renamed into it)."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self._fd, str(directory).encode(),
                                  _IN_MOVED_TO | _IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        self.appeared: list[str] = []

    def read(self) -> list[str]:
        """Everything seen so far (drains the kernel's queue)."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return self.appeared
            offset = 0
            while offset < len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset:offset + length].rstrip(b"\0").decode()
                offset += length
                self.appeared.append(name)

    def close(self) -> None:
        os.close(self._fd)
