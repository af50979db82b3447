"""Fault injection between the protocol and a real etcd.

:class:`FaultyStore` wraps a real :class:`~joblease.etcd_store.EtcdStore`;
a test sets one of its hooks to make a chosen request fail, or its answer
late, the way a network or a busy etcd would. Everything else goes to etcd
unchanged. (Faked: only the failure itself; etcd and the data are real.)
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from joblease.etcd_store import EtcdStore
from joblease.store import Compare, KeepAlive, TxnOp, TxnResult, WatchBatch

TxnHook = Callable[[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]], Awaitable[None]]
RenewHook = Callable[[KeepAlive, float], Awaitable[int]]
WatchHook = Callable[[bytes, int], AsyncIterator[WatchBatch]]


class FaultyStore:
    """A real etcd store whose requests a test can intercept.

    ``before_txn`` runs before every transaction and may raise (the request
    is then never sent). ``renew`` replaces a keep-alive: it gets the real
    stream and the timeout, and decides when (and whether) to ask etcd.
    ``watch`` replaces the next watch call (consumed once). ``sent_renewals``
    records ``(monotonic time sent, monotonic time answered, ttl)`` of each
    keep-alive, ``grants`` ``(monotonic time sent, granted ttl)`` of each lease grant.
    """

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        self.before_txn: TxnHook | None = None
        self.renew_hook: RenewHook | None = None
        self.watch_hooks: list[WatchHook] = []
        self.watch_batches: list[WatchBatch] = []
        self.sent_renewals: list[tuple[float, float, int]] = []
        self.grants: list[tuple[float, int]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        if self.before_txn is not None:
            await self.before_txn(compares, success, failure)
        return await self.inner.txn(compares, success, failure)

    async def grant(self, ttl: int) -> tuple[int, int]:
        sent = time.monotonic()
        lease_id, granted = await self.inner.grant(ttl)
        self.grants.append((sent, granted))
        return lease_id, granted

    def keep_alive(self, lease_id: int) -> KeepAlive:
        return _HookedKeepAlive(self, self.inner.keep_alive(lease_id))

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int
                    ) -> AsyncIterator[WatchBatch]:
        source = (self.watch_hooks.pop(0)(key, start_revision) if self.watch_hooks
                  else self.inner.watch(key, prefix=prefix, start_revision=start_revision))
        async for batch in source:
            self.watch_batches.append(batch)
            yield batch

    async def close(self) -> None:
        await self.inner.close()


class _HookedKeepAlive:
    def __init__(self, store: FaultyStore, inner: KeepAlive) -> None:
        self._store = store
        self._inner = inner

    async def renew(self, timeout: float) -> int:
        sent = time.monotonic()
        hook = self._store.renew_hook
        ttl = await (hook(self._inner, timeout) if hook is not None
                     else self._inner.renew(timeout))
        self._store.sent_renewals.append((sent, time.monotonic(), ttl))
        return ttl

    async def close(self) -> None:
        await self._inner.close()
