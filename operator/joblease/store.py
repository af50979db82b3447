"""The small store interface the protocol is written against.

It is the subset of etcd v3 the protocol needs: multi-key transactions with
compares on version / create / mod revision / value / lease, leases with a
keep-alive stream, linearizable reads and watches that resume from a revision.
:mod:`joblease.etcd_store` implements it over gRPC; another client could be
swapped in behind the same interface.

Write methods never retry a request whose outcome is unknown: they raise
:class:`~joblease.errors.OutcomeUnknownError` and the caller reads back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, TypeVar

from joblease.errors import StoreUnavailableError

T = TypeVar("T")

Target = Literal["version", "create", "mod", "value", "lease"]
Op = Literal["==", "!=", "<", ">"]


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int
    lease: int


@dataclass(frozen=True)
class Compare:
    """``target(key) op value``; a missing key has version/create/mod 0.

    With ``range_end``, every key in ``[key, range_end)`` must satisfy it, and
    an empty range compares as one missing key (etcd's rule): so
    ``Compare(a, "create", "==", 0, range_end=b)`` holds iff no key is in the range.
    """

    key: bytes
    target: Target
    op: Op
    value: int | bytes
    range_end: bytes = b""


@dataclass(frozen=True)
class Put:
    key: bytes
    value: bytes
    lease: int = 0


@dataclass(frozen=True)
class Get:
    """A range read. ``count_only`` answers the number of keys (an ``int``
    response) instead of them; ``limit`` (0: none) with ``oldest_first`` reads
    the keys of the range with the lowest create revisions."""

    key: bytes
    prefix: bool = False
    limit: int = 0
    oldest_first: bool = False
    keys_only: bool = False
    count_only: bool = False


@dataclass(frozen=True)
class Delete:
    """Delete ``key``; with ``prefix``, every key under it; with ``end``, every
    key in ``[key, end)`` (a tenure history's "older than the last N")."""

    key: bytes
    prefix: bool = False
    end: bytes = b""


@dataclass(frozen=True)
class Txn:
    """A transaction nested in a branch of another (etcd >= 3.3's ``request_txn``):
    its compares are evaluated, in the same atomic transaction, only if that
    branch runs. Its response is a :class:`TxnResult` (use the outer one's revision).

    What it is for: a write that already uses both branches of its own
    transaction (register: ``if spec == value then get else put``) made
    conditional on more, e.g. the operator's leadership term: the outer
    transaction's compares are the extra conditions, this one its own."""

    compares: tuple[Compare, ...]
    success: tuple[TxnOp, ...]
    failure: tuple[TxnOp, ...] = ()


TxnOp = Put | Get | Delete | Txn


@dataclass(frozen=True)
class TxnResult:
    """``responses[i]`` is the list of KVs for a Get (its count for a
    ``count_only`` one), the deleted count for a Delete, ``None`` for a Put
    and a :class:`TxnResult` for a nested :class:`Txn`, in the order of the
    branch that ran."""

    succeeded: bool
    revision: int
    responses: list[list[KeyValue] | int | TxnResult | None]

    def kvs(self, index: int) -> list[KeyValue]:
        value = self.responses[index]
        assert isinstance(value, list), f"response {index} is not a Get"
        return value

    def count(self, index: int) -> int:
        value = self.responses[index]
        assert isinstance(value, int), f"response {index} is not a count"
        return value

    def kv(self, index: int) -> KeyValue | None:
        found = self.kvs(index)
        return found[0] if found else None

    def nested(self, index: int) -> TxnResult:
        value = self.responses[index]
        assert isinstance(value, TxnResult), f"response {index} is not a nested Txn"
        return value


@dataclass(frozen=True)
class WatchEvent:
    kind: Literal["put", "delete"]
    kv: KeyValue  # for a delete: key and mod_revision (the deletion's) only


@dataclass(frozen=True)
class WatchBatch:
    """Events committed at or before ``revision``; empty on progress notifications."""

    revision: int
    events: list[WatchEvent]


class KeepAlive(Protocol):
    """A persistent keep-alive stream for one etcd lease."""

    async def renew(self, timeout: float) -> int:
        """Send one keep-alive; return the TTL etcd reset the lease to (<= 0: expired)."""
        ...

    async def close(self) -> None: ...


class Store(Protocol):
    async def txn(
        self, compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult: ...

    async def get(
        self, key: bytes, *, prefix: bool = False, revision: int = 0, keys_only: bool = False,
        end: bytes = b"", limit: int = 0
    ) -> tuple[int, list[KeyValue]]:
        """Linearizable read; returns (store revision, kvs). ``end``: the range
        ``[key, end)`` instead (``prefix`` ignored); ``limit`` (0: none): at most
        that many keys, the lowest first. ``revision`` (0: now): read as of it
        (:class:`CompactedError` once compacted); the returned revision is the
        store's current one either way."""
        ...

    async def grant(self, ttl: int) -> tuple[int, int]:
        """Grant a lease: (lease id, granted TTL)."""
        ...

    async def revoke(self, lease_id: int) -> None: ...

    async def time_to_live(self, lease_id: int) -> int:
        """Remaining TTL in seconds as etcd reports it; -1 if expired or unknown."""
        ...

    def keep_alive(self, lease_id: int) -> KeepAlive: ...

    def watch(self, key: bytes, *, prefix: bool, start_revision: int) -> AsyncIterator[WatchBatch]:
        """Events from ``start_revision``; raises CompactedError if it was compacted."""
        ...

    async def close(self) -> None: ...


def leaf_ops(ops: Sequence[TxnOp]) -> list[TxnOp]:
    """``ops`` with each nested :class:`Txn` replaced by the ops of both its branches,
    recursively: every Put, Get and Delete the transaction may run."""
    return [leaf for op in ops
            for leaf in (leaf_ops((*op.success, *op.failure)) if isinstance(op, Txn) else [op])]


def describe(compares: Sequence[Compare]) -> str:
    """``create(key) == 7 and ...``, for messages (keys shown as printable text)."""
    def text(key: bytes) -> str:
        return key.decode(errors="replace").replace("\0", "\\0")
    return " and ".join(
        f"{c.target}({text(c.key)}) {c.op} "
        f"{c.value.decode(errors='replace') if isinstance(c.value, bytes) else c.value}"
        for c in compares)


def prefix_end(prefix: bytes) -> bytes:
    """The range end that selects every key starting with ``prefix`` (etcd convention)."""
    b = bytearray(prefix)
    for i in range(len(b) - 1, -1, -1):
        if b[i] < 0xFF:
            b[i] += 1
            return bytes(b[: i + 1])
    return b"\0"


async def retry_unavailable(fn: Callable[[], Awaitable[T]], timeout: float) -> T:
    """``fn`` (a read, or a write safe to repeat) retried while etcd is unavailable,
    for up to ``timeout`` seconds; then the last StoreUnavailableError is raised."""
    deadline = time.monotonic() + timeout
    delay = 0.05
    while True:
        try:
            return await fn()
        except StoreUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(delay)
            delay = min(1.0, delay * 2)
