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
from dataclasses import dataclass

from joblease.errors import OutcomeUnknownError, StoreUnavailableError
from joblease.fencing.gate import (
    MAX_TOKEN,
    Decision,
    Effect,
    IdempotencyKeyConflictError,
    StaleFenceError,
    check_key,
    check_resource,
)
from joblease.records import decoding
from joblease.store import Compare, Get, KeyValue, Put, Store

DEFAULT_FENCE_ROOT = "/joblease-fence/v1"


@dataclass(frozen=True)
class FenceRecord:
    """The first outcome of an idempotency key, as stored under ``<root>/key/``."""

    resource: str
    token: int
    response: str
    nonce: str

    def encode(self) -> bytes:
        return json.dumps({"resource": self.resource, "token": self.token,
                           "response": self.response, "nonce": self.nonce},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, data: bytes) -> FenceRecord:
        """Anything else under the gate's root (another writer, a bad restore) is a
        :class:`~joblease.errors.CorruptRecordError`, never a stray ``KeyError``."""
        with decoding("fence"):
            obj = json.loads(data)
            if not isinstance(obj, dict):
                raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
            resource, token = obj["resource"], obj["token"]
            response, nonce = obj.get("response", ""), obj.get("nonce", "")
            if not isinstance(resource, str) or not all(
                    isinstance(v, str) for v in (response, nonce)):
                raise TypeError("'resource', 'response' and 'nonce' must be strings")
            return cls(resource, _token(token), response, nonce)


def decode_mark(data: bytes) -> int:
    """A resource's high-water mark: a decimal token (written by :meth:`EtcdGate.admit`)."""
    with decoding("fence mark"):
        text = data.decode("ascii")
        if not text.isdigit():
            raise ValueError(f"not a decimal token: {text[:40]!r}")
        return _token(int(text))


def _token(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TOKEN:
        raise ValueError(f"not a token: {value!r}")
    return value


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
        record = FenceRecord(effect.resource, effect.token, effect.response, nonce).encode()
        deadline = time.monotonic() + self.timeout
        delay = 0.002
        reads: list[Get] = [Get(mark_key)] + ([Get(record_key)] if record_key else [])
        while True:
            r = await self.store.txn([], reads)
            mark_kv = r.kv(0)
            record_kv = r.kv(1) if record_key else None
            if record_kv is not None:
                return self._replay(effect, record_kv, mark_kv, nonce)
            mark = decode_mark(mark_kv.value) if mark_kv is not None else 0
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
            return bool(kvs) and FenceRecord.decode(kvs[0].value).nonce == nonce

    def _replay(self, effect: Effect, record_kv: KeyValue, mark_kv: KeyValue | None,
                nonce: str) -> Decision:
        first = FenceRecord.decode(record_kv.value)
        assert effect.idempotency_key is not None
        if (first.resource, first.token) != (effect.resource, effect.token):
            raise IdempotencyKeyConflictError(effect.idempotency_key, effect.resource,
                                              effect.token, first.resource, first.token)
        mark = decode_mark(mark_kv.value) if mark_kv is not None else 0
        return Decision(first.resource, first.token, mark, effect.idempotency_key,
                        first.nonce != nonce, first.response)

    async def recall(self, idempotency_key: str) -> Decision | None:
        _, kvs = await self.store.get(self.record_key(idempotency_key))
        if not kvs:
            return None
        first = FenceRecord.decode(kvs[0].value)
        return Decision(first.resource, first.token, await self.highest(first.resource),
                        idempotency_key, True, first.response)

    async def highest(self, resource: str) -> int:
        _, kvs = await self.store.get(self.mark_key(resource))
        return decode_mark(kvs[0].value) if kvs else 0
