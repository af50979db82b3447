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
- :class:`HoldingProxy` holds the client's bytes until :meth:`HoldingProxy.release`
  (a request delayed in the network, e.g. a paused worker's late write).
- :class:`ChaosProxy` partitions (``blackhole``), slows (``delay``) or severs
  every connection, for the fault runs (tests/chaos/nemesis.py).
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


class HoldingProxy(_LoopbackProxy):
    """Holds the client's bytes until :meth:`release` (a delayed request), then
    forwards them and everything after; the server's answers pass at once."""

    def __init__(self, target_port: int) -> None:
        super().__init__("127.0.0.1", target_port)
        self.received = asyncio.Event()  # the client's request reached the proxy
        self._release = asyncio.Event()

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def release(self) -> None:
        self._release.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(*self.upstream)

        async def upstream() -> None:
            held = b""
            while not self._release.is_set():
                get = asyncio.ensure_future(reader.read(65536))
                rel = asyncio.ensure_future(self._release.wait())
                done, _ = await asyncio.wait({get, rel}, return_when=asyncio.FIRST_COMPLETED)
                if get in done:
                    chunk = get.result()
                    rel.cancel()
                    if not chunk:
                        break
                    held += chunk
                    self.received.set()
                else:
                    get.cancel()
            up_writer.write(held)
            await up_writer.drain()
            while chunk := await reader.read(65536):
                up_writer.write(chunk)
                await up_writer.drain()

        async def downstream() -> None:
            while chunk := await up_reader.read(65536):
                writer.write(chunk)
                await writer.drain()
            writer.close()

        tasks = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        self._tasks.update(tasks)
        await asyncio.gather(*tasks, return_exceptions=True)
        up_writer.close()


PartitionMode = Literal["pass", "blackhole", "delay"]


class ChaosProxy(_LoopbackProxy):
    """A TCP proxy to one etcd member for the fault runs.

    ``pass`` forwards; ``blackhole`` swallows every byte both ways (connections
    stay open, nothing arrives: a partition); ``delay`` holds each chunk for
    ``delay`` seconds, keeping order. :meth:`sever` closes every connection
    (what a client sees when a partition heals: its old connections are dead).
    """

    def __init__(self, upstream: tuple[str, int]) -> None:
        super().__init__(*upstream)
        self.mode: PartitionMode = "pass"
        self.delay = 0.0
        self._conns: set[asyncio.StreamWriter] = set()

    def blackholed(self) -> bool:
        return self.mode == "blackhole"

    def sever(self) -> None:
        for w in list(self._conns):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._conns.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection(*self.upstream), 2.0)
        except (OSError, TimeoutError):
            writer.transport.abort()  # member down: the client fails over
            return
        self._conns.update((writer, up_writer))

        async def pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter,
                       linger: float) -> None:
            with contextlib.suppress(ConnectionError, asyncio.CancelledError, OSError):
                while data := await src.read(65536):
                    if self.mode == "blackhole":
                        continue
                    if self.mode == "delay" and self.delay > 0:
                        await asyncio.sleep(self.delay)
                        if self.blackholed():  # the mode may have changed meanwhile
                            continue
                    dst.write(data)
                    await dst.drain()
                # The client gave up (e.g. a timeout): what it sent was delivered
                # already; give the server a moment with it before closing.
                await asyncio.sleep(linger)
            with contextlib.suppress(Exception):
                dst.transport.abort()
            self._conns.discard(dst)

        self._spawn(pump(reader, up_writer, 1.0))
        self._spawn(pump(up_reader, writer, 0.0))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self.sever()
        await super().close()
