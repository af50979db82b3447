"""A real PostgreSQL server for the SQL fencing tests (a pytest plugin).

``postgres`` runs ``initdb`` + ``pg_ctl`` into a private temporary directory
on a free loopback port (as the ``postgres`` user when run as root: the
server refuses to run as root), once per session; ``pg_dsn`` gives each test
a fresh database. A missing PostgreSQL is a failure, not a skip: CI installs
it. Loaded by tests/conftest.py (``pytest_plugins``), so the fencing and the
chaos tests share one server.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from joblease.embedded import free_port
from tests.support.failure_logs import attach_on_failure


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
    attach_on_failure(request, "postgres log", postgres.log_tail)
