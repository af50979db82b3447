"""A TCP proxy that can lose traffic on purpose, to make outcomes ambiguous.

Modes: ``pass`` forwards both ways; ``drop_responses`` forwards requests to
the server but swallows everything it answers (the write commits, the client
never hears); ``drop_requests`` swallows what the client sends (nothing
reaches the server). Runs in the test's event loop on a free loopback port.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Literal

Mode = Literal["pass", "drop_responses", "drop_requests"]


class LossyProxy:
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.mode: Mode = "pass"
        self.port = 0
        self.forwarded_requests = 0  # chunks forwarded client -> server
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> LossyProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter, request: bool
                       ) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await src.read(65536):
                    if request and self.mode == "drop_requests":
                        continue
                    if not request and self.mode == "drop_responses":
                        continue
                    if request:
                        self.forwarded_requests += 1
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        for coro in (pump(reader, up_writer, True), pump(up_reader, writer, False)):
            task = asyncio.create_task(coro)
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
