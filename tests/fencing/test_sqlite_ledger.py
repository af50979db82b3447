"""The SQLite-backed example ledger applies an entry and its gate in one transaction.

The fault is real SQLite machinery: a trigger makes recording one idempotency
key fail, after the ledger's insert ran. If the insert and the gate were two
transactions, the entry would stay while its key and mark were never recorded,
and the worker's retry with the same key would append it a second time.
The ledger is served by a real uvicorn on a loopback port.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from joblease.fencing.destination import create_app
from joblease.fencing.http import HEADER_IDEMPOTENCY_KEY, HEADER_JOB, HEADER_REPLAYED, HEADER_TOKEN
from tests.support.served import Served

POISON = ("CREATE TRIGGER poison BEFORE INSERT ON joblease_effects "
          "WHEN NEW.idempotency_key = 'default/j#g1.t7:append' "
          "BEGIN SELECT RAISE(ABORT, 'injected: recording the key failed'); END")


def _rows(db: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    with sqlite3.connect(db) as conn:
        return (conn.execute("SELECT name, token, data FROM ledger_entries").fetchall(),
                conn.execute("SELECT resource, token FROM joblease_fence").fetchall(),
                conn.execute("SELECT idempotency_key FROM joblease_effects").fetchall())


async def test_sqlite_ledger_entry_and_gate_commit_together(
        serve: Callable[[Any], Served], tmp_path: Path) -> None:
    db = tmp_path / "ledger.sqlite"
    served = serve(create_app(db=str(db)))
    with sqlite3.connect(db) as conn:
        conn.execute(POISON)
    headers = {HEADER_JOB: "default/j", HEADER_TOKEN: "7",
               HEADER_IDEMPOTENCY_KEY: "default/j#g1.t7:append"}
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
        failed = await http.post("/resources/out", json={"n": 1}, headers=headers)
        assert failed.status_code == 503, failed.text
        assert failed.json()["applied"] is False
        assert _rows(db) == ([], [], []), "an entry was applied without its gate"

        with sqlite3.connect(db) as conn:
            conn.execute("DROP TRIGGER poison")
        retry = await http.post("/resources/out", json={"n": 1}, headers=headers)
        assert retry.status_code == 201, retry.text
        again = await http.post("/resources/out", json={"n": 1}, headers=headers)
        assert again.status_code == 201 and again.headers.get(HEADER_REPLAYED) == "true"
        assert again.json() == retry.json()
        stale = await http.post("/resources/out", json={"n": 2},
                                headers={HEADER_JOB: "default/j", HEADER_TOKEN: "6"})
        assert stale.status_code == 409
    entries, marks, keys = _rows(db)
    assert entries == [("out", 7, '{"n": 1}')]
    assert marks == [("ledger/out", 7)]
    assert keys == [("default/j#g1.t7:append",)]
