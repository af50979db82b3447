"""TCP proxies on free loopback ports, to lose or slow traffic on purpose.

Each runs in the test's event loop and forwards to one upstream (an etcd
member); only the network between the client and the server is faked.

- :class:`LossyProxy` makes outcomes ambiguous. Modes: ``pass`` forwards both
  ways; ``drop_responses`` forwards requests to the server but swallows
  everything it answers (the write commits, the client never hears);
  ``drop_requests`` swallows what the client sends (nothing reaches the server).
- :class:`DelayingProxy` holds back every byte the server sends for ``delay``
  seconds (requests pass at once), so every answer is slow on its way back
  while the server acts on time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable
from typing import Literal, Self

Mode = Literal["pass", "drop_responses", "drop_requests"]


class _LoopbackProxy:
    """Listens on a free loopback port; :meth:`_handle` forwards each connection."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.port = 0
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def start(self) -> Self:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _spawn(self, coro: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class LossyProxy(_LoopbackProxy):
    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__(upstream_host, upstream_port)
        self.mode: Mode = "pass"
        self.forwarded_requests = 0  # chunks forwarded client -> server

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

        self._spawn(pump(reader, up_writer, True))
        self._spawn(pump(up_reader, writer, False))


class DelayingProxy(_LoopbackProxy):
    """Forwards loopback TCP to ``upstream``, delaying the server's bytes by ``delay`` s."""

    def __init__(self, upstream_host: str, upstream_port: int, delay: float) -> None:
        super().__init__(upstream_host, upstream_port)
        self.delay = delay

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        late: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def forward(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            with contextlib.suppress(Exception):
                dst.close()

        async def hold_back() -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while data := await up_reader.read(65536):
                    late.put_nowait((time.monotonic() + self.delay, data))
            late.put_nowait((time.monotonic() + self.delay, b""))

        async def release() -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError):
                while True:
                    due, data = await late.get()
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
                    if not data:
                        break
                    writer.write(data)
                    await writer.drain()
            with contextlib.suppress(Exception):
                writer.close()

        self._spawn(forward(reader, up_writer))
        self._spawn(hold_back())
        self._spawn(release())
