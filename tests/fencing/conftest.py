"""Fixtures for the fencing tests: a real PostgreSQL server, a real HTTP destination.

``postgres`` runs ``initdb`` + ``pg_ctl`` into a private temporary directory
on a free loopback port (as the ``postgres`` user when run as root: the
server refuses to run as root). A missing PostgreSQL is a failure, not a
skip: CI installs it.
"""

from __future__ import annotations

import asyncio
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest
import uvicorn

from tests.conftest import _attach_on_failure


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)
    if candidates:
        return candidates[0]
    pytest.fail(f"PostgreSQL's {name} was not found on PATH nor in /usr/lib/postgresql/*/bin: "
                "install the PostgreSQL server (e.g. apt-get install postgresql) to run the "
                "SQL fencing tests", pytrace=False)


@dataclass
class Postgres:
    dsn: str
    base: Path

    def log_tail(self, lines: int = 80) -> str:
        path = self.base / "postgres.log"
        if not path.exists():
            return "(no log)"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _as_user(user: str | None) -> list[str]:
    return ["runuser", "-u", user, "--"] if user else []


@pytest.fixture(scope="session")
def postgres(request: pytest.FixtureRequest) -> Iterator[Postgres]:
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    user: str | None = None
    if os.geteuid() == 0:
        for candidate in ("postgres", "nobody"):
            try:
                pwd.getpwnam(candidate)
            except KeyError:
                continue
            user = candidate
            break
        else:
            pytest.fail("running as root and no 'postgres' or 'nobody' user to run PostgreSQL")
    base = Path(tempfile.mkdtemp(prefix="joblease-pg-"))
    data, sockets = base / "data", base / "sock"
    sockets.mkdir()
    if user is not None:
        info = pwd.getpwnam(user)
        for path in (base, sockets):
            os.chown(path, info.pw_uid, info.pw_gid)
    log = base / "postgres.log"
    port = free_port()
    subprocess.run([*_as_user(user), initdb, "-D", str(data), "-U", "postgres",
                    "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    opts = (f"-p {port} -k {sockets} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c max_connections=200 -c synchronous_commit=off")
    subprocess.run([*_as_user(user), pg_ctl, "-D", str(data), "-l", str(log), "-o", opts,
                    "start"], check=True, capture_output=True, timeout=60)
    server = Postgres(f"host=127.0.0.1 port={port} user=postgres dbname=postgres", base)
    deadline = time.monotonic() + 60
    while True:
        try:
            with psycopg.connect(server.dsn, connect_timeout=2):
                break
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                pytest.fail(f"PostgreSQL did not accept connections within 60s:\n"
                            f"{server.log_tail()}", pytrace=False)
            time.sleep(0.05)  # polling interval under a deadline
    try:
        yield server
    finally:
        subprocess.run([*_as_user(user), pg_ctl, "-D", str(data), "-m", "immediate", "stop"],
                       capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pg_dsn(postgres: Postgres, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database per test (so tables never leak between tests)."""
    name = f"t_{os.urandom(6).hex()}"
    with psycopg.connect(postgres.dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    yield postgres.dsn.replace("dbname=postgres", f"dbname={name}")
    _attach_on_failure(request, "postgres log", postgres.log_tail)


class Served:
    """An ASGI app served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app: Any) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # timeout_keep_alive: uvicorn closes an idle connection after 5 s, httpx keeps
        # one pooled for 5 s: a request sent on it as the server closes it fails with
        # "Server disconnected without sending a response" (a flake under load).
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="off", backlog=512, timeout_keep_alive=300)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)  # polling interval under a deadline
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def serve() -> Iterator[Callable[[Any], Served]]:
    started: list[Served] = []

    def start(app: Any) -> Served:
        served = Served(app).start()
        started.append(served)
        return served

    yield start
    for s in started:
        s.stop()


class HoldingProxy:
    """A TCP proxy that holds the client's bytes until :meth:`release` (a delayed request)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.received = asyncio.Event()  # the client's request reached the proxy
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def __aenter__(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def release(self) -> None:
        self._release.set()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

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

