"""The example "ledger" destination: only the current lease holder's writes land.

Shipped in the package so that `joblease demo` runs from a plain install;
``joblease ledger`` runs it as a service (in a cluster: examples/ledger.yaml).

    POST /resources/{name}   JSON body -> appends an entry, 201 {"seq", "token", ...}
    GET  /resources/{name}   -> {"resource", "highestToken",
                                 "entries": [{seq, token, job, data, slots}]}
    GET  /fences/{resource}  -> {"resource", "highestToken"}: any fence's mark
                                (e.g. ``semaphore/ns/db/slot/0``)
    GET  /healthz

Writes must carry the joblease fencing headers (``Joblease-Job``,
``Joblease-Token``, optionally ``Joblease-Idempotency-Key``);
:class:`~joblease.fencing.http.FencingMiddleware` refuses bad headers (400),
stale tokens (409) and replays duplicates, before this app runs. Each ledger
name is one fenced resource (``ledger/<name>``). A write that also carries
``Joblease-Slot`` (a claim holding semaphore slots) is gated on each slot's
resource too (``semaphore/<ns>/<name>/slot/<index>``, docs/semaphores.md):
refused if any of its fences is stale, and its entry records the slots it
was admitted under (``slots``: ``[{"resource", "token"}]``), in seq order, so
a reader can check that each slot's accepted tokens never go backwards.

With ``--db PATH`` both the ledger and the gate live in that SQLite file, and
each append is one SQLite transaction: the entry, the resource's new mark (and
its slots' marks) and the idempotency record commit together or not at all (the app calls
:func:`joblease.fencing.sql.admit` in its insert's transaction; the middleware
only pre-checks). Otherwise both live in memory, in one process, and the
middleware's per-resource lock makes "check the token, append, record the
mark" one step.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from joblease.errors import InvalidInputError
from joblease.fencing.gate import MemoryGate, StaleFenceError, TokenGate, check_resource
from joblease.fencing.http import (
    HEADER_JOB,
    HEADER_TOKEN,
    SCOPE_KEY,
    ASGIApp,
    Fenced,
    FencingMiddleware,
    Scope,
    replayed,
    route_path,
)
from joblease.fencing.sql import SqliteGate, admit, immediate_transaction

PREFIX = "/resources/"
# An entry's slots, as stored and shown: [{"resource": ..., "token": ...}]
Slots = list[dict[str, Any]]

log = logging.getLogger(__name__)


def resource_for(scope: Scope) -> str | None:
    """``POST /resources/{name}`` is fenced on ``ledger/{name}``; reads are not.

    Matched on the route path (the path below any ``root_path``), as Starlette
    routes it: every request that reaches ``append`` is fenced."""
    path = route_path(scope)
    if scope.get("method") == "POST" and path.startswith(PREFIX) and len(path) > len(PREFIX):
        return "ledger/" + path[len(PREFIX):]
    return None


def _slots(fenced: Fenced | None) -> Slots:
    if fenced is None:
        return []
    return [{"resource": s.resource, "token": s.token} for s in fenced.headers.slots]


class MemoryLedger:
    def __init__(self) -> None:
        self._entries: dict[str, list[dict[str, Any]]] = {}
        self._seq = 0

    async def append(self, name: str, token: int, job: str, data: Any,
                     slots: Slots | None = None) -> dict[str, Any]:
        self._seq += 1
        entry = {"seq": self._seq, "token": token, "job": job, "data": data,
                 "slots": slots or []}
        self._entries.setdefault(name, []).append(entry)
        return entry

    async def entries(self, name: str) -> list[dict[str, Any]]:
        return list(self._entries.get(name, []))


class SqliteLedger:
    def __init__(self, path: str) -> None:
        self.path = path
        conn = self._connect()
        try:
            conn.execute("CREATE TABLE IF NOT EXISTS ledger_entries ("
                         " seq INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL,"
                         " token INTEGER NOT NULL, job TEXT NOT NULL, data TEXT NOT NULL,"
                         " slots TEXT NOT NULL DEFAULT '[]')")
            columns = {row[1] for row in conn.execute("PRAGMA table_info(ledger_entries)")}
            if "slots" not in columns:  # a file written before entries recorded slots
                conn.execute("ALTER TABLE ledger_entries ADD COLUMN slots TEXT NOT NULL "
                             "DEFAULT '[]'")
        finally:
            conn.close()

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30, isolation_level=None)

    def _append(self, name: str, token: int, job: str, data: Any,
                slots: Slots) -> dict[str, Any]:
        conn = self._connect()
        try:
            cur = conn.execute(
                "INSERT INTO ledger_entries (name, token, job, data, slots) "
                "VALUES (?, ?, ?, ?, ?)", (name, token, job, json.dumps(data), json.dumps(slots)))
            return {"seq": cur.lastrowid, "token": token, "job": job, "data": data,
                    "slots": slots}
        finally:
            conn.close()

    def _append_admitted(self, name: str, fenced: Fenced, data: Any) -> Response:
        """Insert the entry and gate it in one transaction (``BEGIN IMMEDIATE``:
        writers queue on SQLite's write lock): on its resource, then on each of its
        slots. A stale token (the entry's or a slot's), a key conflict or any
        failure rolls the insert back with the marks and the key."""
        token, job, slots = fenced.headers.token, fenced.headers.job, _slots(fenced)
        conn = self._connect()
        try:
            with immediate_transaction(conn):
                cur = conn.execute(
                    "INSERT INTO ledger_entries (name, token, job, data, slots) "
                    "VALUES (?, ?, ?, ?, ?)",
                    (name, token, job, json.dumps(data), json.dumps(slots)))
                response = JSONResponse({"resource": name, "seq": cur.lastrowid, "token": token,
                                         "job": job, "data": data, "slots": slots},
                                        status_code=201)
                decision = admit(conn, fenced.effect(response.status_code, bytes(response.body),
                                                     response.raw_headers))
                if decision.duplicate:  # applied before (by another process): answer as then
                    conn.execute("ROLLBACK")
                    status, headers, body = replayed(decision.response)
                    return Response(body, status, headers={
                        k.decode("latin-1"): v.decode("latin-1") for k, v in headers})
                for effect in fenced.slot_effects():  # a stale slot raises: rolled back
                    admit(conn, effect)
            return response
        finally:
            conn.close()

    async def append_admitted(self, name: str, fenced: Fenced, data: Any) -> Response:
        return await asyncio.to_thread(self._append_admitted, name, fenced, data)

    def _entries(self, name: str) -> list[dict[str, Any]]:
        conn = self._connect()
        try:
            rows = conn.execute("SELECT seq, token, job, data, slots FROM ledger_entries "
                                "WHERE name = ? ORDER BY seq", (name,)).fetchall()
        finally:
            conn.close()
        return [{"seq": s, "token": t, "job": j, "data": json.loads(d), "slots": json.loads(sl)}
                for s, t, j, d, sl in rows]

    async def append(self, name: str, token: int, job: str, data: Any,
                     slots: Slots | None = None) -> dict[str, Any]:
        return await asyncio.to_thread(self._append, name, token, job, data, slots or [])

    async def entries(self, name: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self._entries, name)


def create_app(db: str | None = None, gate: TokenGate | None = None) -> ASGIApp:
    """The ledger behind :class:`FencingMiddleware`.

    ``db``: SQLite file for ledger and gate (``None``: both in memory).
    ``gate``: override the gate (e.g. an ``EtcdGate``).
    """
    ledger: MemoryLedger | SqliteLedger = SqliteLedger(db) if db else MemoryLedger()
    # The ledger gates its own inserts when the gate lives in the same SQLite file.
    one_transaction = isinstance(ledger, SqliteLedger) and gate is None
    if gate is None:
        gate = SqliteGate(db) if db else MemoryGate()

    async def append(request: Request) -> Response:
        name = request.path_params["name"]
        try:
            data = await request.json()
        except ValueError:
            return JSONResponse({"error": "invalid", "message": "body must be JSON"}, 400)
        fenced = request.scope.get(SCOPE_KEY)
        if one_transaction and isinstance(ledger, SqliteLedger) and isinstance(fenced, Fenced):
            try:
                return await ledger.append_admitted(name, fenced, data)
            except (StaleFenceError, InvalidInputError) as exc:  # nothing was applied
                return JSONResponse(exc.to_dict(), exc.http_status)
            except sqlite3.Error as exc:  # rolled back: entry, mark and key alike
                log.error("ledger append on %r failed and was rolled back: %s", name, exc)
                return JSONResponse({"error": "unavailable", "applied": False,
                                     "message": f"the ledger could not apply the entry ({exc}); "
                                                "nothing was applied; retry the same request"},
                                    503)
        # The middleware validated these headers before the app ran, and records the
        # marks (the entry's and its slots') once this answers 2xx.
        token = int(request.headers[HEADER_TOKEN])
        slots = _slots(fenced if isinstance(fenced, Fenced) else None)
        entry = await ledger.append(name, token, request.headers[HEADER_JOB], data, slots)
        return JSONResponse({"resource": name, **entry}, status_code=201)

    async def read(request: Request) -> JSONResponse:
        name = request.path_params["name"]
        assert gate is not None
        return JSONResponse({"resource": name,
                             "highestToken": await gate.highest("ledger/" + name),
                             "entries": await ledger.entries(name)})

    async def fence_mark(request: Request) -> JSONResponse:
        resource = request.path_params["resource"]
        assert gate is not None
        try:
            check_resource(resource)
        except InvalidInputError as exc:
            return JSONResponse(exc.to_dict(), exc.http_status)
        return JSONResponse({"resource": resource, "highestToken": await gate.highest(resource)})

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True})

    app = Starlette(routes=[
        Route("/resources/{name}", append, methods=["POST"]),
        Route("/resources/{name}", read, methods=["GET"]),
        Route("/fences/{resource:path}", fence_mark, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
    ])
    return FencingMiddleware(app, gate, resource_for, app_admits=one_transaction)
