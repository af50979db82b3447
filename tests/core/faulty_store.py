"""The real etcd store with faults injected at exact steps of the protocol.

A TCP proxy (tests/core/proxy.py) loses traffic at some moment; these tests
need the fault at one particular step instead: an answer lost after a claim
committed, a copy of a claim that lands just before the revoke that settles
it, a keep-alive answer that is slow to come back. So the store the client
talks to wraps a real :class:`EtcdStore` (a real etcd behind it) and lets a
test replace single calls. Only the fault is fake: every request that is
forwarded is a real etcd request.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

from joblease.errors import StoreUnavailableError
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.store import Compare, Delete, KeepAlive, KeyValue, Put, TxnOp, TxnResult, WatchBatch

TxnHook = Callable[[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]], Awaitable[TxnResult]]


def is_claim(success: Sequence[TxnOp]) -> bool:
    """A claim transaction: it puts a holder key."""
    return any(isinstance(op, Put) and op.key.endswith(b"/holder") for op in success)


def is_unregister(success: Sequence[TxnOp]) -> bool:
    """An unregister transaction: it deletes a job's prefix."""
    return any(isinstance(op, Delete) and op.prefix for op in success)


class FaultyStore:
    """Forwards to ``inner`` unless a test set a hook or a failure flag.

    - ``on_txn``: replaces ``txn`` (it may forward to ``inner.txn`` and raise);
    - ``on_revoke``: replaces ``revoke``;
    - ``fail_reads`` / ``fail_revokes``: those calls raise StoreUnavailableError;
    - ``reply_gate``: while set, each keep-alive is forwarded to etcd but its
      answer is held until the gate opens (``reply_held`` is set meanwhile);
      an answer held past the renew's timeout is reported as a timeout.
    """

    def __init__(self, config: EtcdConfig) -> None:
        self.inner = EtcdStore(config)
        self.on_txn: TxnHook | None = None
        self.on_revoke: Callable[[int], Awaitable[None]] | None = None
        self.fail_reads = False
        self.fail_revokes = False
        self.reply_gate: asyncio.Event | None = None
        self.reply_held = asyncio.Event()
        self.granted: list[int] = []
        self.revoked: list[int] = []

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        if self.on_txn is not None:
            return await self.on_txn(compares, success, failure)
        return await self.inner.txn(compares, success, failure)

    async def get(self, key: bytes, *, prefix: bool = False, revision: int = 0,
                  keys_only: bool = False) -> tuple[int, list[KeyValue]]:
        if self.fail_reads:
            raise StoreUnavailableError("test: etcd unreachable for reads")
        return await self.inner.get(key, prefix=prefix, revision=revision, keys_only=keys_only)

    async def grant(self, ttl: int) -> tuple[int, int]:
        lease_id, granted = await self.inner.grant(ttl)
        self.granted.append(lease_id)
        return lease_id, granted

    async def revoke(self, lease_id: int) -> None:
        if self.fail_revokes:
            raise StoreUnavailableError("test: etcd unreachable for revokes")
        if self.on_revoke is not None:
            await self.on_revoke(lease_id)
        else:
            await self.inner.revoke(lease_id)
        self.revoked.append(lease_id)

    async def time_to_live(self, lease_id: int) -> int:
        return await self.inner.time_to_live(lease_id)

    def keep_alive(self, lease_id: int) -> KeepAlive:
        return _GatedKeepAlive(self, self.inner.keep_alive(lease_id))

    def watch(self, key: bytes, *, prefix: bool, start_revision: int
              ) -> AsyncIterator[WatchBatch]:
        return self.inner.watch(key, prefix=prefix, start_revision=start_revision)

    async def close(self) -> None:
        await self.inner.close()


class _GatedKeepAlive:
    def __init__(self, store: FaultyStore, inner: KeepAlive) -> None:
        self.store, self.inner = store, inner

    async def renew(self, timeout: float) -> int:
        sent = time.monotonic()
        ttl = await self.inner.renew(timeout)  # etcd has renewed the lease
        gate = self.store.reply_gate
        if gate is None:
            return ttl
        self.store.reply_held.set()
        try:
            left = timeout - (time.monotonic() - sent) - 0.02
            await asyncio.wait_for(gate.wait(), max(0.0, left))
        except TimeoutError:
            raise StoreUnavailableError("test: the keep-alive answer came too late") from None
        finally:
            self.store.reply_held.clear()
        return ttl

    async def close(self) -> None:
        await self.inner.close()
