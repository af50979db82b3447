"""The gates themselves: etcd (real etcd), SQLite (stdlib) and PostgreSQL (real server).

Each effect is written in the same transaction as the gate's decision, so the
destination's state (the ledger) is exactly the set of accepted effects, in
commit order.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest

from joblease import EtcdConfig, InvalidInputError, JobLeaseClient, StaleTokenError
from joblease.fencing import (
    Decision,
    Effect,
    EtcdGate,
    IdempotencyKeyConflictError,
    MemoryGate,
    PostgresGate,
    SqliteGate,
    StaleFenceError,
    admit,
    admit_async,
    ensure_schema,
    idempotency_key,
)
from joblease.fencing.sql import ensure_schema_async, immediate_transaction
from joblease.store import Put
from tests.support.fenced_history import Outcome, check_fenced_history

TOKENS = [(i * 37) % 23 + 1 for i in range(100)]  # mixed, with repeats, max 23


# -- etcd ---------------------------------------------------------------------------------------

def etcd_gate(client: JobLeaseClient, config: EtcdConfig) -> EtcdGate:
    return EtcdGate(client.store, root=f"{config.root}/fence")


async def test_etcd_gate_concurrent_writers_accept_only_non_decreasing_tokens(
        client: JobLeaseClient, etcd_config: EtcdConfig) -> None:
    gate = etcd_gate(client, etcd_config)
    ledger = f"{etcd_config.root}/ledger/".encode()

    async def write(i: int) -> Outcome:
        put = Put(ledger + f"{i:03d}".encode(),
                  json.dumps({"writer": i, "token": TOKENS[i]}).encode())
        try:
            d = await gate.admit(Effect("ledger/hot", TOKENS[i], f"w{i}"), [put])
        except StaleFenceError as e:
            return i, TOKENS[i], False, e.highest_token
        assert not d.duplicate
        return i, TOKENS[i], True, None

    outcomes = await asyncio.gather(*(write(i) for i in range(100)))
    _, kvs = await client.store.get(ledger, prefix=True)
    entries = [json.loads(kv.value) for kv in sorted(kvs, key=lambda kv: kv.mod_revision)]
    check_fenced_history(list(outcomes), [(e["writer"], e["token"]) for e in entries])
    assert await gate.highest("ledger/hot") == max(TOKENS)


async def test_etcd_gate_applies_a_duplicate_once_and_returns_the_first_outcome(
        client: JobLeaseClient, etcd_config: EtcdConfig) -> None:
    gate = etcd_gate(client, etcd_config)
    out = f"{etcd_config.root}/out".encode()
    key = idempotency_key("default/j", 3, "send", token=10)
    first = await gate.admit(Effect("r", 10, key, "first"), [Put(out, b"1")])
    assert not first.duplicate
    again = await gate.admit(Effect("r", 10, key, "second"), [Put(out, b"2")])
    assert (again.duplicate, again.response, again.token) == (True, "first", 10)
    _, kvs = await client.store.get(out)
    assert kvs[0].value == b"1" and kvs[0].version == 1
    # concurrent duplicates of a fresh key: exactly one applies
    racing = await asyncio.gather(*(gate.admit(Effect("r", 10, "k2", f"r{i}"),
                                               [Put(out + b"2", str(i).encode())])
                                    for i in range(10)))
    assert sum(1 for d in racing if not d.duplicate) == 1
    assert len({d.response for d in racing}) == 1
    _, kvs = await client.store.get(out + b"2")
    assert kvs[0].version == 1
    # a newer token fences the old one, but the old key still replays
    await gate.admit(Effect("r", 20, "k3"))
    with pytest.raises(StaleFenceError) as stale:
        await gate.admit(Effect("r", 10, "k4"), [Put(out, b"late")])
    assert (stale.value.highest_token, stale.value.http_status, stale.value.exit_code) == (
        20, 409, 7)
    assert isinstance(stale.value, StaleTokenError)
    assert (await gate.admit(Effect("r", 10, key, "x"))).response == "first"
    with pytest.raises(IdempotencyKeyConflictError):
        await gate.admit(Effect("r", 20, key))
    _, kvs = await client.store.get(out)
    assert kvs[0].value == b"1"
    recalled = await gate.recall(key)
    assert recalled is not None and (recalled.response, recalled.highest_token) == ("first", 20)


# -- SQLite -------------------------------------------------------------------------------------

LEDGER_SQLITE = ("CREATE TABLE IF NOT EXISTS ledger (seq INTEGER PRIMARY KEY AUTOINCREMENT,"
                 " writer INTEGER NOT NULL, token INTEGER NOT NULL)")


def sqlite_connect(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, timeout=60, isolation_level=None, check_same_thread=False)


def sqlite_write(path: Path, writer: int, effect: Effect) -> Decision:
    """One destination transaction: the gate and the effect commit together."""
    conn = sqlite_connect(path)
    try:
        with immediate_transaction(conn):
            decision = admit(conn, effect)
            if not decision.duplicate:
                conn.execute("INSERT INTO ledger (writer, token) VALUES (?, ?)",
                             (writer, effect.token))
        return decision
    finally:
        conn.close()


@pytest.fixture
def sqlite_db(tmp_path: Path) -> Path:
    path = tmp_path / "dest.sqlite"
    conn = sqlite_connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    ensure_schema(conn)
    conn.execute(LEDGER_SQLITE)
    conn.close()
    return path


def test_sqlite_concurrent_writers_accept_only_non_decreasing_tokens(sqlite_db: Path) -> None:
    outcomes: list[Outcome] = []
    start = threading.Barrier(100)
    lock = threading.Lock()

    def write(i: int) -> None:
        start.wait()
        try:
            sqlite_write(sqlite_db, i, Effect("ledger/hot", TOKENS[i], f"w{i}"))
            result: Outcome = (i, TOKENS[i], True, None)
        except StaleFenceError as e:
            result = (i, TOKENS[i], False, e.highest_token)
        with lock:
            outcomes.append(result)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert len(outcomes) == 100
    conn = sqlite_connect(sqlite_db)
    committed = conn.execute("SELECT writer, token FROM ledger ORDER BY seq").fetchall()
    mark = conn.execute("SELECT token FROM joblease_fence WHERE resource = 'ledger/hot'")
    assert mark.fetchone()[0] == max(TOKENS)
    conn.close()
    check_fenced_history(outcomes, [(w, t) for w, t in committed])


def test_sqlite_duplicate_is_applied_once_and_stale_rolls_back(sqlite_db: Path) -> None:
    first = sqlite_write(sqlite_db, 1, Effect("r", 10, "k", "first"))
    again = sqlite_write(sqlite_db, 1, Effect("r", 10, "k", "second"))
    assert (first.duplicate, again.duplicate, again.response) == (False, True, "first")
    sqlite_write(sqlite_db, 2, Effect("r", 20, "k2", "newer"))
    with pytest.raises(StaleFenceError) as stale:
        sqlite_write(sqlite_db, 3, Effect("r", 19, "k3"))
    assert stale.value.highest_token == 20
    assert sqlite_write(sqlite_db, 1, Effect("r", 10, "k", "x")).response == "first"
    with pytest.raises(IdempotencyKeyConflictError):
        sqlite_write(sqlite_db, 4, Effect("r", 21, "k"))
    conn = sqlite_connect(sqlite_db)
    assert conn.execute("SELECT writer, token FROM ledger ORDER BY seq").fetchall() == [
        (1, 10), (2, 20)]
    # the refused and conflicting transactions left no record and did not move the mark
    assert conn.execute("SELECT token FROM joblease_fence").fetchall() == [(20,)]
    assert conn.execute("SELECT count(*) FROM joblease_effects").fetchone() == (2,)
    conn.close()


async def test_sqlite_gate_as_a_token_gate(tmp_path: Path) -> None:
    gate = SqliteGate(str(tmp_path / "gate.sqlite"))
    assert await gate.highest("r") == 0
    assert not (await gate.admit(Effect("r", 3, "a", "A"))).duplicate
    assert (await gate.admit(Effect("r", 3, "a", "B"))).response == "A"
    with pytest.raises(StaleFenceError):
        await gate.admit(Effect("r", 2, "b"))
    recalled = await gate.recall("a")
    assert recalled is not None and recalled.duplicate and recalled.response == "A"
    assert await gate.highest("r") == 3


# -- PostgreSQL ---------------------------------------------------------------------------------

async def pg_setup(dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        await ensure_schema_async(conn)
        await conn.execute("CREATE TABLE ledger (seq BIGSERIAL PRIMARY KEY,"
                           " writer INTEGER NOT NULL, token BIGINT NOT NULL)")


async def pg_write(conn: psycopg.AsyncConnection[Any], writer: int, effect: Effect
                   ) -> Decision:
    async with conn.transaction():  # READ COMMITTED, the default
        decision = await admit_async(conn, effect)
        if not decision.duplicate:
            await conn.execute("INSERT INTO ledger (writer, token) VALUES (%s, %s)",
                               (writer, effect.token))
        return decision


async def test_postgres_concurrent_writers_accept_only_non_decreasing_tokens(
        pg_dsn: str) -> None:
    await pg_setup(pg_dsn)
    pool: asyncio.Queue[psycopg.AsyncConnection[Any]] = asyncio.Queue()
    conns = [await psycopg.AsyncConnection.connect(pg_dsn) for _ in range(25)]
    for c in conns:
        pool.put_nowait(c)

    async def write(i: int) -> Outcome:
        conn = await pool.get()
        try:
            await pg_write(conn, i, Effect("ledger/hot", TOKENS[i], f"w{i}"))
            return i, TOKENS[i], True, None
        except StaleFenceError as e:
            return i, TOKENS[i], False, e.highest_token
        finally:
            pool.put_nowait(conn)

    try:
        outcomes = await asyncio.gather(*(write(i) for i in range(100)))
        async with conns[0].cursor() as cur:
            await cur.execute("SELECT writer, token FROM ledger ORDER BY seq")
            committed = [(int(w), int(t)) for w, t in await cur.fetchall()]
    finally:
        for c in conns:
            await c.close()
    check_fenced_history(list(outcomes), committed)
    assert await PostgresGate(pg_dsn).highest("ledger/hot") == max(TOKENS)


async def test_postgres_duplicate_is_applied_once_and_stale_rolls_back(pg_dsn: str) -> None:
    await pg_setup(pg_dsn)
    conns = [await psycopg.AsyncConnection.connect(pg_dsn) for _ in range(5)]
    try:
        c = conns[0]
        first = await pg_write(c, 1, Effect("r", 10, "k", "first"))
        again = await pg_write(c, 1, Effect("r", 10, "k", "second"))
        assert (first.duplicate, again.duplicate, again.response) == (False, True, "first")
        racing = await asyncio.gather(*(pg_write(conn, 7, Effect("r", 10, "k2", f"r{i}"))
                                        for i, conn in enumerate(conns)))
        assert sum(1 for d in racing if not d.duplicate) == 1
        assert len({d.response for d in racing}) == 1
        await pg_write(c, 2, Effect("r", 20, "k3"))
        with pytest.raises(StaleFenceError) as stale:
            await pg_write(c, 3, Effect("r", 19, "k4"))
        assert stale.value.highest_token == 20
        assert (await pg_write(c, 1, Effect("r", 10, "k", "x"))).response == "first"
        async with c.cursor() as cur:
            await cur.execute("SELECT writer, token FROM ledger ORDER BY seq")
            assert await cur.fetchall() == [(1, 10), (7, 10), (2, 20)]
            await cur.execute("SELECT token FROM joblease_fence")
            assert await cur.fetchall() == [(20,)]
    finally:
        for conn in conns:
            await conn.close()
    gate = PostgresGate(pg_dsn)
    recalled = await gate.recall("k")
    assert recalled is not None and recalled.response == "first"
    with pytest.raises(StaleFenceError):
        await gate.admit(Effect("r", 11, "k5"))


def test_postgres_sync_connection_works_too(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn) as conn:
        ensure_schema(conn)
        conn.commit()
        with conn.transaction():
            assert not admit(conn, Effect("r", 4, "a", "A")).duplicate
        with conn.transaction():
            assert admit(conn, Effect("r", 4, "a", "B")).response == "A"
        with pytest.raises(StaleFenceError), conn.transaction():
            admit(conn, Effect("r", 3, "b"))


# -- memory and shared validation ---------------------------------------------------------------

async def test_memory_gate_has_the_reference_semantics() -> None:
    gate = MemoryGate()
    assert not (await gate.admit(Effect("r", 5, "a", "A"))).duplicate
    assert (await gate.admit(Effect("r", 5, None))).token == 5  # same token: accepted
    with pytest.raises(StaleFenceError) as stale:
        await gate.admit(Effect("r", 4, "b"))
    assert stale.value.to_dict() == {"error": "stale", "message": str(stale.value),
                                     "resource": "r", "token": 4, "highestToken": 5}
    assert (await gate.admit(Effect("r", 5, "a", "B"))).response == "A"
    assert await gate.highest("other") == 0  # fences are per resource
    assert not (await gate.admit(Effect("other", 1, "c"))).duplicate


@pytest.mark.parametrize("token", [0, -1, 2**63, True, "5"])
def test_effects_with_invalid_tokens_are_refused_before_any_gate_runs(token: Any) -> None:
    with pytest.raises(InvalidInputError):
        Effect("r", token)


@pytest.mark.parametrize("resource, key", [("r\n", "k"), ("r", "k\n"), ("", "k"), ("r\x00", "k")])
def test_effects_with_unprintable_resources_or_keys_are_refused(resource: str, key: str) -> None:
    """A trailing newline is refused too (a ``$`` anchor would let it through)."""
    with pytest.raises(InvalidInputError):
        Effect(resource, 5, key)


def test_idempotency_key_names_one_claims_attempt() -> None:
    assert idempotency_key("ns/job", 7, token=1234) == "ns/job#g7.t1234"
    assert idempotency_key("ns/job", 7, "upload", token=1234) == "ns/job#g7.t1234:upload"
    with pytest.raises(InvalidInputError):
        idempotency_key("ns/job", 0, token=1234)
    with pytest.raises(InvalidInputError):
        idempotency_key("ns/job", 7, token=0)
