"""The fencing gate in etcd: check, effect and new mark in ONE transaction.

Keys under ``<root>`` (default ``/joblease-fence/v1``):

- ``<root>/mark/<resource>``  the resource's high-water mark (decimal token);
- ``<root>/key/<idempotency key>``  the first outcome of that key (JSON).

:meth:`EtcdGate.admit` reads both keys, decides, and commits

    if  mod(mark) == the mod revision it read       (nobody moved the mark since)
    and version(record) == 0                        (the key was never applied)
    then put mark = token, put record, put the caller's effect keys

so the effect keys are written if and only if the token was not stale at the
revision they commit at. A failed compare means a concurrent writer got
there first: it reads again and decides again (with a little jittered
backoff), until ``timeout``.

Ambiguous outcomes (invariant ``read-back``, docs/protocol.md) are never retried blindly: after
:class:`~joblease.errors.OutcomeUnknownError` the gate reads the record back.
Each attempt writes a unique nonce into the record, so "my transaction
committed" is told apart from "a concurrent duplicate committed". If the
record is absent, the lost transaction can no longer commit once the mark's
mod revision moves, and the next attempt is conditioned on the mark it reads
now; whichever of the two commits, the record (written by both) shows it.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import Sequence

from joblease.errors import OutcomeUnknownError, StoreUnavailableError
from joblease.fencing.gate import (
    Decision,
    Effect,
    IdempotencyKeyConflictError,
    StaleFenceError,
    check_key,
    check_resource,
)
from joblease.store import Compare, Get, KeyValue, Put, Store

DEFAULT_FENCE_ROOT = "/joblease-fence/v1"


class EtcdGate:
    """A :class:`~joblease.fencing.gate.TokenGate` whose state lives in etcd.

    Durable and shared: every replica of a destination that uses the same
    etcd and root sees one mark per resource. Put the destination's own
    effect into ``admit(..., puts=[...])`` to make effect and gate atomic.
    """

    def __init__(self, store: Store, root: str = DEFAULT_FENCE_ROOT, *,
                 timeout: float = 30.0) -> None:
        self.store = store
        self.root = "/" + root.strip("/")
        self.timeout = timeout

    def mark_key(self, resource: str) -> bytes:
        return f"{self.root}/mark/{check_resource(resource)}".encode()

    def record_key(self, idempotency_key: str) -> bytes:
        return f"{self.root}/key/{check_key(idempotency_key)}".encode()

    async def admit(self, effect: Effect, puts: Sequence[Put] = ()) -> Decision:
        """Apply ``puts`` with the effect's mark and record, or refuse it.

        Returns the decision (``duplicate=True``: nothing was written now);
        raises :class:`StaleFenceError` (nothing written),
        :class:`IdempotencyKeyConflictError`, or ``OutcomeUnknownError`` when
        even the read-back could not settle the outcome.
        """
        mark_key = self.mark_key(effect.resource)
        record_key = (self.record_key(effect.idempotency_key)
                      if effect.idempotency_key is not None else None)
        nonce = uuid.uuid4().hex
        record = json.dumps({"resource": effect.resource, "token": effect.token,
                             "response": effect.response, "nonce": nonce},
                            separators=(",", ":")).encode()
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        reads: list[Get] = [Get(mark_key)] + ([Get(record_key)] if record_key else [])
        while True:
            r = await self.store.txn([], reads)
            mark_kv = r.kv(0)
            record_kv = r.kv(1) if record_key else None
            if record_kv is not None:
                return self._replay(effect, record_kv, mark_kv, nonce)
            mark = int(mark_kv.value) if mark_kv is not None else 0
            if effect.token < mark:
                raise StaleFenceError(effect.resource, effect.token, mark)
            compares = [Compare(mark_key, "mod", "==", mark_kv.mod_revision if mark_kv else 0)]
            success: list[Put] = [Put(mark_key, str(effect.token).encode())]
            if record_key is not None:
                compares.append(Compare(record_key, "version", "==", 0))
                success.append(Put(record_key, record))
            success.extend(puts)
            try:
                done = await self.store.txn(compares, success)
            except OutcomeUnknownError:
                if record_key is None:
                    # Without a record nothing tells whether the write landed.
                    raise
                if await self._committed(record_key, nonce, deadline):
                    return Decision(effect.resource, effect.token, effect.token,
                                    effect.idempotency_key, False, effect.response)
                continue  # the next read decides again; the lost one cannot commit after it
            if done.succeeded:
                return Decision(effect.resource, effect.token, effect.token,
                                effect.idempotency_key, False, effect.response)
            if time.monotonic() > deadline:
                raise StoreUnavailableError(
                    f"fence on {effect.resource!r} did not settle within {self.timeout}s "
                    "of contention")
            await asyncio.sleep(random.uniform(0, delay))
            delay = min(0.1, delay * 2)

    async def _committed(self, record_key: bytes, nonce: str, deadline: float) -> bool:
        """Read the record back until etcd answers: did *our* attempt commit?"""
        pause = 0.05
        while True:
            try:
                _, kvs = await self.store.get(record_key)
            except StoreUnavailableError:
                if time.monotonic() > deadline:
                    raise OutcomeUnknownError(
                        f"fence record {record_key!r} could not be read back") from None
                await asyncio.sleep(pause)
                pause = min(1.0, pause * 2)
                continue
            return bool(kvs) and json.loads(kvs[0].value).get("nonce") == nonce

    def _replay(self, effect: Effect, record_kv: KeyValue, mark_kv: KeyValue | None,
                nonce: str) -> Decision:
        first = json.loads(record_kv.value)
        resource, token = str(first["resource"]), int(first["token"])
        assert effect.idempotency_key is not None
        if (resource, token) != (effect.resource, effect.token):
            raise IdempotencyKeyConflictError(effect.idempotency_key, effect.resource,
                                              effect.token, resource, token)
        mark = int(mark_kv.value) if mark_kv is not None else 0
        return Decision(resource, token, mark, effect.idempotency_key,
                        first.get("nonce") != nonce, str(first.get("response", "")))

    async def recall(self, idempotency_key: str) -> Decision | None:
        _, kvs = await self.store.get(self.record_key(idempotency_key))
        if not kvs:
            return None
        first = json.loads(kvs[0].value)
        resource = str(first["resource"])
        return Decision(resource, int(first["token"]), await self.highest(resource),
                        idempotency_key, True, str(first.get("response", "")))

    async def highest(self, resource: str) -> int:
        _, kvs = await self.store.get(self.mark_key(resource))
        return int(kvs[0].value) if kvs else 0
