"""The fencing gate in SQL (PostgreSQL via psycopg 3, SQLite via the stdlib).

Two tables (:func:`ensure_schema` creates them)::

    joblease_fence(resource TEXT PRIMARY KEY, token BIGINT NOT NULL)
    joblease_effects(idempotency_key TEXT PRIMARY KEY, resource TEXT, token BIGINT,
                     response TEXT)

:func:`admit` (sync: ``sqlite3.Connection`` or ``psycopg.Connection``) and
:func:`admit_async` (``psycopg.AsyncConnection``) run *inside the caller's
transaction* and never commit: the caller writes its effect in the same
transaction, so the effect, the new mark and the idempotency record commit
together or not at all. A refusal raises, and the caller rolls back::

    with conn.transaction():                  # psycopg; sqlite3: BEGIN IMMEDIATE ... COMMIT
        decision = admit(conn, Effect("ledger/a", token, key, response="ok"))
        if not decision.duplicate:
            conn.execute("INSERT INTO ledger ...")

The statements, in this order:

1. ``INSERT INTO joblease_fence ... ON CONFLICT (resource) DO UPDATE SET
   token = excluded.token WHERE joblease_fence.token <= excluded.token
   RETURNING token`` -- raises the mark if the token is not stale. It locks
   the resource's row whether or not its WHERE holds, so every writer of one
   resource is serialised from here until its transaction ends.
2. Look up the idempotency key: a recorded key is a duplicate (its first
   outcome is returned; the caller must not apply the effect again).
3. No row returned by 1: stale, :class:`StaleFenceError` with the mark.
4. Record the key with the effect's response.

Isolation. PostgreSQL: correct under READ COMMITTED (the default) because
step 1 takes the row lock and re-checks the WHERE against the latest
committed mark, and step 2, a new statement, sees whatever the previous
lock holder committed. Under REPEATABLE READ or SERIALIZABLE a concurrent
update of the same row makes step 1 fail with a serialization error: retry
the whole transaction, as those levels always require. SQLite: a writer
holds the database-wide write lock from step 1 to commit; begin with
``BEGIN IMMEDIATE`` (or make :func:`admit` the transaction's first statement)
and set a busy timeout, so writers queue instead of failing with
``database is locked``.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from joblease.fencing.gate import (
    Decision,
    Effect,
    IdempotencyKeyConflictError,
    StaleFenceError,
    check_key,
    check_resource,
)

if TYPE_CHECKING:
    import psycopg

    SyncConnection = sqlite3.Connection | psycopg.Connection[Any]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS joblease_fence ("
    " resource TEXT PRIMARY KEY, token BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS joblease_effects ("
    " idempotency_key TEXT PRIMARY KEY, resource TEXT NOT NULL, token BIGINT NOT NULL,"
    " response TEXT NOT NULL)",
)
_UPSERT = ("INSERT INTO joblease_fence (resource, token) VALUES ({p}, {p}) "
           "ON CONFLICT (resource) DO UPDATE SET token = excluded.token "
           "WHERE joblease_fence.token <= excluded.token RETURNING token")
_RECORD = "SELECT resource, token, response FROM joblease_effects WHERE idempotency_key = {p}"
_MARK = "SELECT token FROM joblease_fence WHERE resource = {p}"
_INSERT_RECORD = ("INSERT INTO joblease_effects (idempotency_key, resource, token, response) "
                  "VALUES ({p}, {p}, {p}, {p})")


def _sql(template: str, conn: object) -> str:
    return template.format(p="?" if isinstance(conn, sqlite3.Connection) else "%s")


def _one(conn: SyncConnection, template: str, params: tuple[Any, ...]) -> Any:
    cur = conn.execute(_sql(template, conn), params)
    return cur.fetchone()


def ensure_schema(conn: SyncConnection) -> None:
    """Create the two tables if missing (in the caller's transaction for psycopg;
    the caller commits)."""
    for statement in SCHEMA:
        conn.execute(statement)


async def ensure_schema_async(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`ensure_schema` for ``psycopg.AsyncConnection``."""
    for statement in SCHEMA:
        await conn.execute(statement)


def _duplicate(effect: Effect, record: Any, mark: int) -> Decision:
    resource, token, response = str(record[0]), int(record[1]), str(record[2])
    assert effect.idempotency_key is not None
    if (resource, token) != (effect.resource, effect.token):
        raise IdempotencyKeyConflictError(effect.idempotency_key, effect.resource, effect.token,
                                          resource, token)
    return Decision(resource, token, mark, effect.idempotency_key, True, response)


def _accepted(effect: Effect) -> Decision:
    return Decision(effect.resource, effect.token, effect.token, effect.idempotency_key,
                    False, effect.response)


def admit(conn: SyncConnection, effect: Effect) -> Decision:
    """Gate ``effect`` inside the caller's open transaction (see the module doc).

    Returns the decision; ``duplicate=True`` means: do not apply the effect,
    answer with ``decision.response``. Raises :class:`StaleFenceError` (roll
    back) or :class:`IdempotencyKeyConflictError` (roll back).
    """
    params = (effect.resource, effect.token)
    raised = _one(conn, _UPSERT, params)
    key = effect.idempotency_key
    if key is not None:
        record = _one(conn, _RECORD, (key,))
        if record is not None:
            return _duplicate(effect, record, int(_one(conn, _MARK, (effect.resource,))[0]))
    if raised is None:
        raise StaleFenceError(effect.resource, effect.token,
                              int(_one(conn, _MARK, (effect.resource,))[0]))
    if key is not None:
        conn.execute(_sql(_INSERT_RECORD, conn),
                     (key, effect.resource, effect.token, effect.response))
    return _accepted(effect)


async def _aone(conn: psycopg.AsyncConnection[Any], template: str,
                params: tuple[Any, ...]) -> Any:
    cur = await conn.execute(template.format(p="%s"), params)
    return await cur.fetchone()


async def admit_async(conn: psycopg.AsyncConnection[Any], effect: Effect) -> Decision:
    """:func:`admit` for ``psycopg.AsyncConnection``, in the caller's transaction."""
    raised = await _aone(conn, _UPSERT, (effect.resource, effect.token))
    key = effect.idempotency_key
    if key is not None:
        record = await _aone(conn, _RECORD, (key,))
        if record is not None:
            mark = int((await _aone(conn, _MARK, (effect.resource,)))[0])
            return _duplicate(effect, record, mark)
    if raised is None:
        mark = int((await _aone(conn, _MARK, (effect.resource,)))[0])
        raise StaleFenceError(effect.resource, effect.token, mark)
    if key is not None:
        await _aone_exec(conn, _INSERT_RECORD, (key, effect.resource, effect.token,
                                                effect.response))
    return _accepted(effect)


async def _aone_exec(conn: psycopg.AsyncConnection[Any], template: str,
                     params: tuple[Any, ...]) -> None:
    await conn.execute(template.format(p="%s"), params)


def _recall(conn: SyncConnection, key: str) -> Decision | None:
    record = _one(conn, _RECORD, (check_key(key),))
    if record is None:
        return None
    mark = _one(conn, _MARK, (str(record[0]),))
    return Decision(str(record[0]), int(record[1]), int(mark[0]) if mark else 0, key, True,
                    str(record[2]))


def _highest(conn: SyncConnection, resource: str) -> int:
    row = _one(conn, _MARK, (check_resource(resource),))
    return int(row[0]) if row else 0


@contextlib.contextmanager
def immediate_transaction(conn: sqlite3.Connection) -> Iterator[None]:
    """One SQLite write transaction (``BEGIN IMMEDIATE``: writers queue on the
    database's write lock before reading the mark, as the module docstring
    requires): committed if the block returns, rolled back if it raises. The
    connection must be in autocommit mode (``isolation_level=None``)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    if conn.in_transaction:
        conn.execute("COMMIT")


class SqliteGate:
    """A :class:`~joblease.fencing.gate.TokenGate` on a SQLite file, one
    transaction per :meth:`admit` (``BEGIN IMMEDIATE``), run in a thread.

    Use it where the gate alone is the transaction (e.g. behind
    :class:`~joblease.fencing.http.FencingMiddleware`); to make the gate
    atomic with your own SQLite writes, call :func:`admit` in their transaction.
    """

    def __init__(self, path: str, *, busy_timeout: float = 30.0) -> None:
        self.path = path
        self.busy_timeout = busy_timeout
        conn = self._connect()
        try:
            ensure_schema(conn)
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=self.busy_timeout, isolation_level=None)

    def admit_sync(self, effect: Effect) -> Decision:
        conn = self._connect()
        try:
            with immediate_transaction(conn):
                return admit(conn, effect)
        finally:
            conn.close()

    async def admit(self, effect: Effect) -> Decision:
        return await asyncio.to_thread(self.admit_sync, effect)

    def _read(self, fn: Any, arg: str) -> Any:
        conn = self._connect()
        try:
            return fn(conn, arg)
        finally:
            conn.close()

    async def recall(self, idempotency_key: str) -> Decision | None:
        result: Decision | None = await asyncio.to_thread(self._read, _recall, idempotency_key)
        return result

    async def highest(self, resource: str) -> int:
        return int(await asyncio.to_thread(self._read, _highest, resource))


class PostgresGate:
    """A :class:`~joblease.fencing.gate.TokenGate` on PostgreSQL, one transaction
    per :meth:`admit` on a fresh connection from ``conninfo``.

    As with :class:`SqliteGate`, call :func:`admit_async` inside your own
    transaction when the effect is a write to the same database.
    """

    def __init__(self, conninfo: str) -> None:
        self.conninfo = conninfo

    async def _connect(self) -> psycopg.AsyncConnection[Any]:
        import psycopg

        return await psycopg.AsyncConnection.connect(self.conninfo)

    async def setup(self) -> None:
        """Create the tables (idempotent)."""
        async with await self._connect() as conn:
            await ensure_schema_async(conn)

    async def admit(self, effect: Effect) -> Decision:
        async with await self._connect() as conn, conn.transaction():
            return await admit_async(conn, effect)

    async def recall(self, idempotency_key: str) -> Decision | None:
        async with await self._connect() as conn:
            record = await _aone(conn, _RECORD, (check_key(idempotency_key),))
            if record is None:
                return None
            mark = await _aone(conn, _MARK, (str(record[0]),))
            return Decision(str(record[0]), int(record[1]), int(mark[0]) if mark else 0,
                            idempotency_key, True, str(record[2]))

    async def highest(self, resource: str) -> int:
        async with await self._connect() as conn:
            row = await _aone(conn, _MARK, (check_resource(resource),))
            return int(row[0]) if row else 0
