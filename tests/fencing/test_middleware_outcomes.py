"""When the app has applied an effect and the gate then fails, the answer says so.

Behind ``FencingMiddleware`` with a gate that is not in the app's transaction,
the app's write is done before the gate records it. If the gate then refuses
(another replica raised the mark meanwhile) or fails (the record cannot be
written), a plain 409 "nothing was applied" or a bare 500 would be false: the
effect is applied. Real SQLite gates, real uvicorn servers on loopback ports.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from joblease.fencing.destination import create_app
from joblease.fencing.http import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_JOB,
    HEADER_TOKEN,
    FencingMiddleware,
)
from joblease.fencing.sql import SqliteGate
from tests.support.served import Served


def _h(token: int, key: str | None = None) -> dict[str, str]:
    h = {HEADER_JOB: "default/j", HEADER_TOKEN: str(token)}
    if key:
        h[HEADER_IDEMPOTENCY_KEY] = key
    return h


async def test_a_gate_failure_after_the_app_applied_is_reported_as_applied(
        serve: Callable[[Any], Served], tmp_path: Path) -> None:
    db = str(tmp_path / "ledger.sqlite")
    served = serve(create_app(db=db, gate=SqliteGate(db)))  # gate outside the insert's txn
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TRIGGER poison BEFORE INSERT ON joblease_effects BEGIN "
                     "SELECT RAISE(ABORT, 'injected: the record cannot be written'); END")
    async with httpx.AsyncClient(base_url=served.url, timeout=30) as http:
        r = await http.post("/resources/out", json={"n": 1}, headers=_h(7, "k1"))
        assert r.status_code == 500
        body = r.json()
        assert body["applied"] is True and "may apply it again" in body["message"]
        entries = (await http.get("/resources/out")).json()["entries"]
    assert [e["token"] for e in entries] == [7]  # it was applied, as the answer says


async def test_a_refusal_after_the_app_applied_does_not_claim_nothing_was_applied(
        serve: Callable[[Any], Served], tmp_path: Path) -> None:
    """Two replicas share one SQLite gate; A's app is between its write and the gate
    when B raises the mark: A's answer must say the effect was applied."""
    db = str(tmp_path / "gate.sqlite")
    applied: list[tuple[str, int]] = []
    a_in_app, a_may_finish = threading.Event(), threading.Event()

    def replica(name: str) -> FencingMiddleware:
        async def app(scope: Any, receive: Any, send: Any) -> None:
            token = int(dict(scope["headers"])[HEADER_TOKEN.lower().encode()])
            applied.append((name, token))
            if name == "a":
                a_in_app.set()
                await asyncio.to_thread(a_may_finish.wait, 30)
            await send({"type": "http.response.start", "status": 201,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": b"{}"})
        return FencingMiddleware(app, SqliteGate(db))

    a, b = serve(replica("a")), serve(replica("b"))
    async with httpx.AsyncClient(timeout=30) as http:
        first = asyncio.create_task(http.post(f"{a.url}/r", headers=_h(5)))
        assert await asyncio.to_thread(a_in_app.wait, 30)
        newer = await http.post(f"{b.url}/r", headers=_h(9))
        assert newer.status_code == 201
        a_may_finish.set()
        r = await first
    assert r.status_code == 409
    body = r.json()
    assert body["error"] == "stale" and body["applied"] is True
    assert body["highestToken"] == 9
    assert applied == [("a", 5), ("b", 9)]
