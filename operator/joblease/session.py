"""An etcd lease kept alive on one stream, with a local safety deadline.

Like etcd's Go ``concurrency.Session``: a client binds the holder keys it
creates to a few shared etcd leases per TTL (joblease.session_pool: at most 8
claims a lease), so a claim costs no extra round trip for a lease grant.

Expiry is decided by etcd (invariant ``etcd-decides-expiry``, docs/protocol.md).
Locally the session only keeps a
*safety deadline* on the monotonic clock: ``time a keep-alive was sent +
the TTL etcd reset the lease to - margin``. Measuring from the send (not the
answer) means the deadline can only be early, never late, whatever the
network delay; the monotonic clock keeps running while the process is paused
(SIGSTOP) and ignores wall-clock steps, so a paused worker wakes up past its
deadline and knows it. Past the deadline, handles report themselves lost.

Loss is sticky: once the deadline has passed (whoever notices first, the
keep-alive loop or a reader of ``alive``), a keep-alive answered later does
not revive the session, even one sent before the deadline. A lost session
revokes its etcd lease (best effort), so the jobs its handles held become
claimable at once instead of staying held by a lease nobody trusts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from joblease import validation
from joblease.errors import JobLeaseError, LeaseNotFoundError, StoreUnavailableError
from joblease.store import Store

log = logging.getLogger(__name__)

LossCallback = Callable[[str], None]
#: What a session re-checks after each keep-alive (the client's: its Lease handles).
HolderT = TypeVar("HolderT")


def default_margin(ttl: int) -> float:
    """Safety margin subtracted from the deadline: 20% of the TTL, capped at 2 s."""
    return min(2.0, 0.2 * ttl)


class Session(Generic[HolderT]):
    """One etcd lease (``lease_id``) of ``ttl`` seconds and its keep-alive loop; the
    handles bound to it (``HolderT``) are re-checked by ``check_holders`` after each
    successful keep-alive."""

    def __init__(
        self,
        store: Store,
        ttl: int,
        *,
        margin: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        check_holders: Callable[[list[HolderT]], Awaitable[None]] | None = None,
        revoke_on_loss: bool = True,
    ) -> None:
        self.store = store
        self.ttl = ttl
        self.margin = default_margin(ttl) if margin is None else validation.margin(margin, ttl)
        self.lease_id = 0
        self.deadline = 0.0
        self.lost_reason: str | None = None
        #: monotonic time the last successful keep-alive (or the grant) was sent
        self.last_renewal = 0.0
        self._clock = clock
        self._task: asyncio.Task[None] | None = None
        #: insertion-ordered; a dict so a finished handle's removal is O(1), not a
        #: scan of every handle the session holds (once per completion)
        self._listeners: dict[LossCallback, None] = {}
        self._holders: set[HolderT] = set()
        self._check_holders = check_holders
        self._lost = asyncio.Event()
        self._closing = False
        #: revoke the etcd lease as soon as the session is lost (``False``: leave it
        #: to whoever stops the work first; ``joblease run`` stops its command first)
        self.revoke_on_loss = revoke_on_loss

    @property
    def interval(self) -> float:
        """Keep-alive period: a third of the TTL, as etcd's own clients do."""
        return self.ttl / 3

    @property
    def alive(self) -> bool:
        """True until the safety deadline passes or the session is lost; never again after."""
        if self.lost_reason is None and self._clock() >= self.deadline:
            self._expire()
        return self.lost_reason is None

    def remaining(self) -> float:
        """Seconds of local safety left (0 once lost; expires the session, as
        :attr:`alive` does, once its deadline has passed). One clock read."""
        if self.lost_reason is None:
            left = self.deadline - self._clock()
            if left > 0:
                return left
            self._expire()
        return 0.0

    def _expire(self) -> None:
        self.lose("no keep-alive succeeded before the safety deadline")

    async def start(self) -> Session[HolderT]:
        sent = self._clock()
        self.lease_id, granted = await self.store.grant(self.ttl)
        self.deadline = sent + granted - self.margin
        self.last_renewal = sent
        self._task = asyncio.create_task(self._run(), name=f"joblease-keepalive-{self.lease_id:x}")
        return self

    def on_loss(self, callback: LossCallback) -> None:
        self._listeners[callback] = None
        if self.lost_reason is not None:
            callback(self.lost_reason)

    def remove_on_loss(self, callback: LossCallback) -> None:
        self._listeners.pop(callback, None)

    def attach(self, holder: HolderT) -> None:
        """Re-check ``holder`` after each successful keep-alive (see ``check_holders``)."""
        self._holders.add(holder)

    def detach(self, holder: HolderT) -> None:
        self._holders.discard(holder)

    @property
    def holders(self) -> int:
        """How many handles are attached (held and not yet finished)."""
        return len(self._holders)

    async def wait_lost(self) -> str:
        await self._lost.wait()
        assert self.lost_reason is not None
        return self.lost_reason

    def lose(self, reason: str, *, expected: bool = False) -> None:
        if self.lost_reason is not None:
            return
        self.lost_reason = reason
        log.log(logging.DEBUG if expected else logging.WARNING, "etcd lease %x lost: %s",
                self.lease_id, reason)
        self._lost.set()
        for callback in list(self._listeners):
            callback(reason)

    async def _run(self) -> None:
        stream = self.store.keep_alive(self.lease_id)
        try:
            while self.alive:
                # Sleep until the next keep-alive is due; wake at once if the
                # session is lost meanwhile (a reader saw the deadline pass).
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._lost.wait(),
                        timeout=min(self.interval, max(0.0, self.deadline - self._clock())))
                if not self.alive:
                    break  # lost, or woke up late (paused, starved): nothing counts now
                sent = self._clock()
                try:
                    # No point waiting past the deadline: an answer after it is ignored.
                    ttl = await stream.renew(timeout=min(self.interval, self.deadline - sent))
                except (StoreUnavailableError, LeaseNotFoundError) as exc:
                    log.info("keep-alive for lease %x failed: %s", self.lease_id, exc)
                    continue
                except JobLeaseError as exc:
                    self.lose(f"keep-alive refused: {exc}")
                    break
                if not self.alive:
                    # Answered after the deadline (sent before it): loss is final,
                    # whatever etcd did with this keep-alive.
                    break
                if ttl <= 0:
                    self.lose("etcd reports the lease expired (or it was revoked)")
                    break
                self.deadline = max(self.deadline, sent + ttl - self.margin)
                self.last_renewal = sent
                if self._check_holders is not None and self._holders:
                    try:
                        await self._check_holders(list(self._holders))
                    except Exception:  # the keep-alive must outlive a failed re-check
                        log.exception("holder re-check for lease %x failed", self.lease_id)
        finally:
            await stream.close()
        if self.lost_reason is not None and not self._closing and self.revoke_on_loss:
            await self._revoke()

    async def _revoke(self) -> None:
        """Give back what a lost session still holds in etcd (best effort: if etcd
        cannot be reached, nothing renews the lease and etcd expires it)."""
        if not self.lease_id:
            return
        try:
            await self.store.revoke(self.lease_id)
        except JobLeaseError as exc:
            log.info("revoking lost etcd lease %x failed (it expires by itself): %s",
                     self.lease_id, exc)

    async def close(self, *, revoke: bool = True) -> None:
        """Stop renewing; with ``revoke``, give the held jobs back at once."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        self.lose("session closed", expected=True)
        if revoke and self.lease_id:
            with contextlib.suppress(JobLeaseError):
                await self.store.revoke(self.lease_id)
