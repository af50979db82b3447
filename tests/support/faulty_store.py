"""The real etcd store with faults injected at exact steps of the protocol.

A TCP proxy (``tests/support/proxy.py``) loses or slows traffic at some
moment; many tests need the fault at one particular step instead: an answer
lost after a claim committed, a copy of a claim that lands just before the
revoke that settles it, a keep-alive answer that is slow to come back, the
completion's reply lost but not the keep-alive's (gRPC multiplexes every call
on one connection, so a proxy cannot tell them apart). So the store the client
talks to wraps a real :class:`~joblease.etcd_store.EtcdStore` (a real etcd
behind it) and a test switches single faults on. Only the fault is fake:
every request that is forwarded is a real etcd request, and the data is real.

The ``is_*`` functions classify a transaction by the operations the client
sends, so a hook can pick the one request it is about.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

from joblease.errors import OutcomeUnknownError, StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.store import (
    Compare,
    Delete,
    KeepAlive,
    KeyValue,
    Put,
    TxnOp,
    TxnResult,
    WatchBatch,
    leaf_ops,  # a guarded write nests the unguarded one
)

TxnHook = Callable[[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]], Awaitable[TxnResult]]
BeforeTxnHook = Callable[[Sequence[Compare], Sequence[TxnOp], Sequence[TxnOp]], Awaitable[None]]
RenewHook = Callable[[KeepAlive, float], Awaitable[int]]
WatchHook = Callable[[bytes, int], AsyncIterator[WatchBatch]]


# -- what a transaction is ------------------------------------------------------------------


def is_claim(success: Sequence[TxnOp]) -> bool:
    """A claim: it puts a holder key under an etcd lease."""
    return any(isinstance(op, Put) and op.key.endswith(b"/holder") and op.lease
               for op in success)


def is_item_claim(success: Sequence[TxnOp]) -> bool:
    """A queue item's claim: it puts a ``held/`` key under an etcd lease."""
    return any(isinstance(op, Put) and b"/held/" in op.key and op.lease for op in success)


def is_unregister(success: Sequence[TxnOp]) -> bool:
    """An unregister (guarded or not): it deletes a job's prefix."""
    return any(isinstance(op, Delete) and op.prefix for op in leaf_ops(success))


def is_guarded_register(success: Sequence[TxnOp]) -> bool:
    """A guarded register: its success branch nests ``if spec == value get else put``."""
    return any(isinstance(op, Put) and op.key.endswith(b"/spec") for op in leaf_ops(success))


def is_completion(success: Sequence[TxnOp]) -> bool:
    """A completion: it puts a result key."""
    return any(isinstance(op, Put) and op.key.endswith(b"/result") for op in success)


def is_release(success: Sequence[TxnOp]) -> bool:
    """A release: it deletes the holder key and writes nothing else but, for a
    job that keeps a history, its tenure's end."""
    return (bool(success) and isinstance(success[0], Delete) and success[0].key.endswith(b"/holder")
            and all(isinstance(op, Put) and op.key.endswith(b"/end") for op in success[1:]))


def is_holder_check(compares: Sequence[Compare], success: Sequence[TxnOp]) -> bool:
    """A holder re-check: it compares a holder's create revision and writes nothing."""
    return not success and any(c.key.endswith(b"/holder") and c.target == "create"
                               for c in compares)


# -- the store ------------------------------------------------------------------------------


class FaultyStore:
    """Forwards every call to ``inner`` unless a test set a hook or a fault flag.

    Hooks (each ``None`` when unset):

    - ``before_txn``: runs before every transaction and may raise (the request
      is then never sent);
    - ``on_txn``: replaces ``txn`` (it may forward to ``inner.txn`` and raise);
    - ``on_revoke``: replaces ``revoke``;
    - ``renew_hook``: replaces a keep-alive: it gets the real stream and the
      timeout, and decides when (and whether) to ask etcd;
    - ``watch_hooks``: each replaces one watch call, in order (consumed once);
    - ``reply_gate``: while set, each keep-alive is forwarded to etcd but its
      answer is held until the gate opens (``reply_held`` is set meanwhile);
      an answer held past the renew's timeout is reported as a timeout.

    Fault flags:

    - ``unreachable``: transactions, reads, grants and keep-alives fail with
      StoreUnavailableError before reaching etcd (revokes, lease look-ups and
      watches still go through);
    - ``fail_reads`` / ``fail_revokes``: those calls raise StoreUnavailableError;
    - ``hold_completion_reply`` / ``hold_release_reply``: the reply of a
      committed completion / release is held until this event is set;
    - ``lose_completion_reply``: the completion commits, then etcd becomes
      unreachable (``unreachable`` is set) and its reply is lost;
    - ``claim_reply_after_deadline``: a committed claim's reply arrives only
      after the safety deadline of the last granted lease, and no keep-alive
      gets through meanwhile;
    - ``claim_lease_gone_before_reply``: the next claim commits, its etcd lease
      is revoked before the reply, and the reply is lost.

    Records: ``granted`` (the lease ids granted), ``grants`` ((monotonic time
    sent, granted TTL) of each grant), ``revoked`` (the lease ids revoked),
    ``sent_renewals`` ((monotonic time sent, monotonic time answered, TTL) of
    each keep-alive answered), ``watch_batches`` (every batch a watch passed
    on); events ``completion_committed``, ``release_committed`` and
    ``recheck_after_commit`` (a holder re-check found the holder gone after a
    completion or release committed).
    """

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        self.before_txn: BeforeTxnHook | None = None
        self.on_txn: TxnHook | None = None
        self.on_revoke: Callable[[int], Awaitable[None]] | None = None
        self.renew_hook: RenewHook | None = None
        self.watch_hooks: list[WatchHook] = []
        self.reply_gate: asyncio.Event | None = None
        self.reply_held = asyncio.Event()

        self.unreachable = False
        self.fail_reads = False
        self.fail_revokes = False
        self.hold_completion_reply: asyncio.Event | None = None
        self.hold_release_reply: asyncio.Event | None = None
        self.lose_completion_reply = False
        self.claim_reply_after_deadline = False
        self.claim_lease_gone_before_reply = False

        self.granted: list[int] = []
        self.grants: list[tuple[float, int]] = []
        self.revoked: list[int] = []
        self.sent_renewals: list[tuple[float, float, int]] = []
        self.watch_batches: list[WatchBatch] = []
        self.completion_committed = asyncio.Event()
        self.release_committed = asyncio.Event()
        self.recheck_after_commit = asyncio.Event()

    def _check(self, what: str) -> None:
        if self.unreachable:
            raise StoreUnavailableError(f"injected: etcd unreachable ({what})")

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        self._check("txn")
        if self.before_txn is not None:
            await self.before_txn(compares, success, failure)
        if self.on_txn is not None:
            r = await self.on_txn(compares, success, failure)
        else:
            r = await self.inner.txn(compares, success, failure)
        await self._after_commit(compares, success, r)
        return r

    async def _after_commit(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                            r: TxnResult) -> None:
        """The reply faults: etcd has answered ``r``; the client has not seen it yet."""
        if is_completion(success) and r.succeeded:
            self.completion_committed.set()
            if self.lose_completion_reply:
                self.unreachable = True
                raise OutcomeUnknownError("injected: the completion's reply was lost")
            if self.hold_completion_reply is not None:
                await self.hold_completion_reply.wait()
        elif is_release(success) and r.succeeded:
            self.release_committed.set()
            if self.hold_release_reply is not None:
                await self.hold_release_reply.wait()
        elif is_claim(success) and r.succeeded and self.claim_lease_gone_before_reply:
            self.claim_lease_gone_before_reply = False
            lease_id = next(op.lease for op in success if isinstance(op, Put) and op.lease)
            await self.inner.revoke(lease_id)  # as if it expired before the reply came
            raise OutcomeUnknownError("injected: the claim's reply was lost")
        elif is_claim(success) and r.succeeded and self.claim_reply_after_deadline:
            assert self.grants, "no lease was granted before the claim"
            sent, ttl = self.grants[-1]
            self.unreachable = True  # keep-alives fail: the deadline is not pushed back
            await asyncio.sleep(max(0.0, sent + ttl + 0.2 - time.monotonic()))  # the slow reply
            self.unreachable = False
        elif (is_holder_check(compares, success) and not r.succeeded
              and (self.completion_committed.is_set() or self.release_committed.is_set())):
            self.recheck_after_commit.set()

    async def get(self, key: bytes, *, prefix: bool = False, revision: int = 0,
                  keys_only: bool = False, end: bytes = b"", limit: int = 0
                  ) -> tuple[int, list[KeyValue]]:
        self._check("get")
        if self.fail_reads:
            raise StoreUnavailableError("test: etcd unreachable for reads")
        return await self.inner.get(key, prefix=prefix, revision=revision, keys_only=keys_only,
                                    end=end, limit=limit)

    async def grant(self, ttl: int) -> tuple[int, int]:
        self._check("grant")
        sent = time.monotonic()
        lease_id, granted = await self.inner.grant(ttl)
        self.granted.append(lease_id)
        self.grants.append((sent, granted))
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
        return FaultyKeepAlive(self, self.inner.keep_alive(lease_id))

    async def watch(self, key: bytes, *, prefix: bool, start_revision: int
                    ) -> AsyncIterator[WatchBatch]:
        source = (self.watch_hooks.pop(0)(key, start_revision) if self.watch_hooks
                  else self.inner.watch(key, prefix=prefix, start_revision=start_revision))
        try:
            async for batch in source:
                self.watch_batches.append(batch)
                yield batch
        finally:  # closing this watch closes etcd's at once, not when it is collected
            aclose = getattr(source, "aclose", None)
            if aclose is not None:
                await aclose()

    async def close(self) -> None:
        await self.inner.close()


class FaultyKeepAlive:
    """A lease's real keep-alive stream with its store's keep-alive faults."""

    def __init__(self, store: FaultyStore, inner: KeepAlive) -> None:
        self.store, self.inner = store, inner

    async def renew(self, timeout: float) -> int:
        store = self.store
        if store.unreachable:
            raise StoreUnavailableError("injected: etcd unreachable (keep-alive)")
        sent = time.monotonic()
        hook = store.renew_hook
        ttl = await (hook(self.inner, timeout) if hook is not None
                     else self.inner.renew(timeout))  # etcd has renewed the lease
        gate = store.reply_gate
        if gate is not None:
            store.reply_held.set()
            try:
                left = timeout - (time.monotonic() - sent) - 0.02
                await asyncio.wait_for(gate.wait(), max(0.0, left))
            except TimeoutError:
                raise StoreUnavailableError(
                    "test: the keep-alive answer came too late") from None
            finally:
                store.reply_held.clear()
        store.sent_renewals.append((sent, time.monotonic(), ttl))
        return ttl

    async def close(self) -> None:
        await self.inner.close()


def delay_the_first_claim_until_the_revoke(
        store: FaultyStore, is_this: Callable[[Sequence[TxnOp]], bool] = is_claim,
) -> dict[str, Any]:
    """The first claim transaction (``is_this``: a job's by default) is held back
    (its sender told "outcome unknown") and lands just before the next lease
    revoke applies, as a delayed copy of a request would. Sets ``store``'s
    ``on_txn`` and ``on_revoke``; returns what happened: ``request``, then
    ``landed`` (its result)."""
    delayed: dict[str, Any] = {}
    one_at_a_time = asyncio.Lock()

    async def hold_the_claim_back(
        compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp]
    ) -> TxnResult:
        if is_this(success) and "request" not in delayed:
            delayed["request"] = (compares, success, failure)
            raise OutcomeUnknownError("test: sent; the copy is still on its way")
        return await store.inner.txn(compares, success, failure)

    async def copy_lands_just_before_the_revoke(lease_id: int) -> None:
        async with one_at_a_time:  # the copy lands before any revoke applies
            if "request" in delayed and "landed" not in delayed:
                delayed["landed"] = await store.inner.txn(*delayed["request"])
            await store.inner.revoke(lease_id)

    store.on_txn = hold_the_claim_back
    store.on_revoke = copy_lands_just_before_the_revoke
    return delayed
