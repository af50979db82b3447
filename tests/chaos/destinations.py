"""Destinations that call a fencing gate directly, with no middleware in front.

The example ledger (``joblease.fencing.destination``) puts
``FencingMiddleware`` in front of its gate, and the middleware's own
pre-check (``highest()`` before ``admit()``) refuses most stale tokens before
the gate decides anything: a gate whose ``admit`` accepted stale tokens would
go unnoticed there. These destinations ask the gate alone:

* ``direct-memory``: a :class:`~joblease.fencing.gate.MemoryGate` (the
  ledger's gate type) inside the runner's process, over HTTP;
* ``direct-sqlite``: a :class:`~joblease.fencing.sql.SqliteGate` (one
  ``BEGIN IMMEDIATE`` transaction per ``admit``) on its own SQLite file, the
  same way;
* the etcd gate (:class:`~joblease.fencing.etcd_gate.EtcdGate`) needs no
  server: the workers call it themselves, with their effect as the
  transaction's own put (see ``workload.py``).

``POST /direct/<gate>/<name>`` (headers ``Joblease-Job``, ``Joblease-Token``,
``Joblease-Idempotency-Key``; body ``{"generation", "worker"}``) admits the
effect at resource ``direct-<gate>/<name>`` and, unless the gate says
duplicate, appends it to that resource's entries under one lock per resource
(so "gate said yes" and "entry appended" are one step; nothing else orders
them). ``GET /direct/<gate>/<name>`` lists the entries in commit order.
The entries live in memory: this server runs for the whole run and is never
restarted by the nemesis.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from joblease.errors import InvalidInputError
from joblease.fencing.gate import Effect, MemoryGate, StaleFenceError, TokenGate
from joblease.fencing.http import HEADER_IDEMPOTENCY_KEY, HEADER_JOB, HEADER_TOKEN
from joblease.fencing.sql import SqliteGate

GATES = ("memory", "sqlite")


def direct_app(sqlite_path: Path) -> Starlette:
    gates: dict[str, TokenGate] = {"memory": MemoryGate(),
                                   "sqlite": SqliteGate(str(sqlite_path))}
    entries: dict[str, list[dict[str, Any]]] = defaultdict(list)
    locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
    seq = itertools.count(1)

    async def admit(request: Request) -> JSONResponse:
        gate_name, name = request.path_params["gate"], request.path_params["name"]
        if gate_name not in gates:
            return JSONResponse({"error": "not-found"}, status_code=404)
        resource = f"direct-{gate_name}/{name}"
        try:
            token = int(request.headers[HEADER_TOKEN])
            key = request.headers[HEADER_IDEMPOTENCY_KEY]
            job = request.headers[HEADER_JOB]
            body = await request.json()
            effect = Effect(resource, token, key, response="ok")
        except (KeyError, ValueError, InvalidInputError) as exc:
            return JSONResponse({"error": "invalid", "message": str(exc)}, status_code=400)
        async with locks[resource]:
            try:
                decision = await gates[gate_name].admit(effect)
            except StaleFenceError as exc:
                return JSONResponse({"error": "stale", **exc.details()}, status_code=409)
            if decision.duplicate:
                return JSONResponse({"duplicate": True})
            n = next(seq)
            entries[resource].append({"seq": n, "token": token, "key": key, "job": job,
                                      "generation": body.get("generation"),
                                      "worker": body.get("worker")})
        return JSONResponse({"seq": n, "duplicate": False}, status_code=201)

    async def listing(request: Request) -> JSONResponse:
        resource = f"direct-{request.path_params['gate']}/{request.path_params['name']}"
        return JSONResponse({"entries": entries.get(resource, [])})

    return Starlette(routes=[
        Route("/direct/{gate}/{name}", admit, methods=["POST"]),
        Route("/direct/{gate}/{name}", listing, methods=["GET"]),
    ])


class Dispatch:
    """One server for two apps: ``/direct/...`` to the direct destinations, the rest
    to the example ledger (so the nemesis's destination delays hit both)."""

    def __init__(self, ledger: ASGIApp, direct: ASGIApp) -> None:
        self.ledger, self.direct = ledger, direct

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and str(scope.get("path", "")).startswith("/direct/"):
            await self.direct(scope, receive, send)
        else:
            await self.ledger(scope, receive, send)
