"""Destination-side fencing for external effects (invariant
``effects-carry-token``, docs/protocol.md).

A lease stops its holder from *completing* a job once it is stale; it cannot
stop a request the holder already sent. Destinations therefore check the
token themselves: each resource keeps the highest token it has accepted and
refuses anything older, and each idempotency key is applied at most once.

- :mod:`joblease.fencing.gate` -- the rule, its records and errors, and
  :class:`MemoryGate` (the reference, in memory);
- :mod:`joblease.fencing.etcd_gate` -- :class:`EtcdGate`: check, effect and
  mark in one etcd transaction;
- :mod:`joblease.fencing.sql` -- the same inside the caller's SQL
  transaction (PostgreSQL, SQLite);
- :mod:`joblease.fencing.guarded` -- :func:`guarded_put`: the holder's own
  etcd writes, committed only while it still holds the job;
- :mod:`joblease.fencing.http` -- headers for workers (:func:`fencing_headers`,
  :class:`FencingAuth` for httpx) and :class:`FencingMiddleware` for ASGI
  destinations.

See docs/fencing.md for what each backend guarantees and what fencing cannot do.
"""

from joblease.fencing.etcd_gate import EtcdGate
from joblease.fencing.gate import (
    Decision,
    Effect,
    IdempotencyKeyConflictError,
    MemoryGate,
    StaleFenceError,
    TokenGate,
    idempotency_key,
)
from joblease.fencing.guarded import guarded_put
from joblease.fencing.http import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_JOB,
    HEADER_TOKEN,
    FencingAuth,
    FencingMiddleware,
    fencing_headers,
)
from joblease.fencing.sql import PostgresGate, SqliteGate, admit, admit_async, ensure_schema

__all__ = [
    "HEADER_IDEMPOTENCY_KEY",
    "HEADER_JOB",
    "HEADER_TOKEN",
    "Decision",
    "Effect",
    "EtcdGate",
    "FencingAuth",
    "FencingMiddleware",
    "IdempotencyKeyConflictError",
    "MemoryGate",
    "PostgresGate",
    "SqliteGate",
    "StaleFenceError",
    "TokenGate",
    "admit",
    "admit_async",
    "ensure_schema",
    "fencing_headers",
    "guarded_put",
    "idempotency_key",
]
