"""Leader election among operator replicas, through etcd (the store the operator serves).

One key per election, ``<root>\\0operator/leader/<name>``, is the leadership:
whoever created it (a transaction "create only if absent", bound to an etcd
lease of ``ttl`` seconds) leads; the create revision is its **term**, a
fencing token like a job's (strictly larger for every new leader). The lease
is a :class:`~joblease.session.Session`, the same keep-alive loop and local
safety deadline a worker's claim uses, so a leader's view of its own
leadership ends *before* etcd can expire the key and elect another
(``deadline = send time of the last keep-alive + TTL - margin``).

The term fences the leader's etcd writes: :meth:`Leadership.guard` is the
condition "the key still has my term", which the operator's registration and
unregistration carry (``guard=``), so etcd refuses them once another replica
may lead, however late they arrive.

Why etcd and not a ``coordination.k8s.io`` Lease (see docs/operator.md): the
operator cannot do anything useful without etcd (registration and the mirror
are etcd reads and writes), so a replica cut off from etcd must step down, and
one elected through etcd does so by construction; etcd expires the key on its
own clock (no comparison of wall clocks between replicas, which a Lease's
``renewTime`` needs); and no extra RBAC. A JobLease itself is not used as the
election: a job counts attempts and ends (``maxAttempts``, completion), a
leadership is claimed again for ever.

A replica that loses leadership (safety deadline passed, keep-alive refused,
key deleted or replaced) sees :meth:`Leadership.wait_lost` return; it is never
leader again in this process (loss is sticky, as for a session): the
operator stops its leader-only parts and exits, and its restart stands by.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from joblease import validation
from joblease.errors import JobLeaseError, StoreUnavailableError
from joblease.session import Session
from joblease.store import Compare, Delete, Get, KeyValue, Put, Store

log = logging.getLogger(__name__)

#: Default seconds of the leader's etcd lease: a dead leader is replaced within it.
DEFAULT_TTL = 10
#: Bounds of that TTL: etcd's minimum lease, and an hour (a dead leader replaced
#: only after longer than that is an outage, not a setting).
MIN_TTL, MAX_TTL = validation.MIN_TTL_SECONDS, 3600
#: Seconds between attempts while etcd cannot be reached.
RETRY_DELAY = 1.0


def election_key(root: str, name: str) -> bytes:
    """The leader key of election ``name`` under the key root ``root``.

    Beside the jobs' prefix (``<root>/``), not under it: the mirror watches that
    prefix and every key under it must belong to a JobLease.
    """
    return f"/{root.strip('/')}\0operator/leader/{check_name(name)}".encode()


def check_name(name: str) -> str:
    """``name`` if it can name an election, else ValueError saying why."""
    if not name or len(name) > 253 or any(c in name for c in "\0/") or not name.isprintable():
        raise ValueError(f"invalid election name {name!r}: 1-253 printable characters, "
                         "no '/'")
    return name


@dataclass(frozen=True)
class Leader:
    """Who leads election ``key`` now (from one read), or None fields if nobody."""

    identity: str | None
    term: int  # create revision of the key (0: no leader)
    lease_id: int


class Leadership:
    """This replica leads; ``term`` is its fencing token. Lost once, lost for good."""

    def __init__(self, election: Election, session: Session[object], term: int) -> None:
        self.election = election
        self.session = session
        self.term = term
        self.acquired_at = time.monotonic()
        self._lost = asyncio.Event()
        self.lost_reason: str | None = None
        session.on_loss(lambda reason: self._lose(f"etcd lease lost: {reason}"))
        self._watch = asyncio.create_task(self._watch_key(), name="joblease-election-watch")

    @property
    def alive(self) -> bool:
        """True while this replica may act as leader (checks the safety deadline now)."""
        return self.session.alive and self.lost_reason is None

    def guard(self) -> tuple[Compare, ...]:
        """What every etcd write of this leader requires: the leader key still
        exists with this term as its create revision (deleted, expired or
        replaced by another candidate's: the write is refused, ``FencedError``)."""
        return (Compare(self.election.key, "create", "==", self.term),)

    def fenced(self, why: str) -> None:
        """etcd refused a write fenced by :meth:`guard`: leadership is lost (for good)."""
        self._lose(f"a write fenced by the term was refused: {why}")

    def _lose(self, reason: str, *, expected: bool = False) -> None:
        if self.lost_reason is None:
            self.lost_reason = reason
            log.log(logging.INFO if expected else logging.WARNING,
                    "leadership of %s (term %d) %s", self.election.name, self.term,
                    reason if expected else f"lost: {reason}")
            self._lost.set()

    async def wait_lost(self) -> str:
        await self._lost.wait()
        assert self.lost_reason is not None
        return self.lost_reason

    async def _watch_key(self) -> None:
        """Lose at once if the key goes or is replaced (an admin's delete, a revoked
        lease): the keep-alive would notice only at its next round."""
        store, key = self.election.store, self.election.key
        try:
            async for batch in store.watch(key, prefix=False, start_revision=self.term + 1):
                for event in batch.events:
                    if event.kind == "delete" or event.kv.create_revision != self.term:
                        self._lose("the leader key was deleted or replaced")
                        return
        except JobLeaseError as exc:
            # The keep-alive and the safety deadline still guard the leadership.
            log.info("watch of the leader key ended: %s", exc)

    async def resign(self) -> None:
        """Give leadership back: revoking the lease deletes the key, so a standby takes
        over at once instead of after the TTL. Best effort (if etcd is unreachable
        the key expires with the lease)."""
        # A session lost on its own has already tried to revoke (and if etcd is out of
        # reach, trying again would only hold up the exit by its request timeouts).
        revoke = self.session.lost_reason is None
        self._lose("resigned", expected=True)
        self._watch.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._watch
        await self.session.close(revoke=revoke)


class Election:
    """Campaign for the key of election ``name``; see the module docstring."""

    def __init__(self, store: Store, root: str, name: str, identity: str, *,
                 ttl: int = DEFAULT_TTL, stable_identity: bool = False,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``stable_identity``: ``identity`` names one pod (not one process), so a key
        with it is this pod's own earlier process, which has exited: replaced at once
        instead of waiting out its lease. Never with identities two live processes share."""
        self.store = store
        self.name = name
        self.key = election_key(root, name)
        self.identity = identity
        self.stable_identity = stable_identity
        self.ttl = validation.ttl(ttl)
        self._clock = clock

    async def leader(self) -> Leader:
        """Who leads now (a linearizable read)."""
        _, kvs = await self.store.get(self.key)
        if not kvs:
            return Leader(None, 0, 0)
        kv = kvs[0]
        return Leader(kv.value.decode(errors="replace"), kv.create_revision, kv.lease)

    async def campaign(self) -> Leadership:
        """Wait until this replica leads; return its :class:`Leadership`.

        Stand-by is one etcd watch on the key: when the leader resigns (or its
        lease expires) the key's deletion arrives and this replica tries to
        create it at once. The lease is granted before the attempt and kept
        alive while waiting, so the try is one transaction; an attempt whose
        outcome is unknown is settled by the key's lease being ours.
        """
        session: Session[object] | None = None
        try:
            while True:
                try:
                    if session is None or not session.alive:
                        if session is not None:
                            await session.close(revoke=True)
                        session = await Session[object](self.store, self.ttl).start()
                    result = await self.store.txn(
                        [Compare(self.key, "create", "==", 0)],
                        [Put(self.key, self.identity.encode(), lease=session.lease_id)],
                        [Get(self.key)])
                    if result.succeeded:
                        term = result.revision
                    else:
                        kv = result.kv(0)
                        if kv is None:
                            continue  # deleted between the compare and the read: try again
                        if kv.lease == session.lease_id:
                            term = kv.create_revision  # an earlier try of ours committed
                        elif self.stable_identity and kv.value == self.identity.encode():
                            # Our own previous incarnation (a restarted container of the
                            # same pod: the old one has exited): its key would only block
                            # us until its lease expires. Delete exactly that key, retry.
                            await self.store.txn(
                                [Compare(self.key, "create", "==", kv.create_revision)],
                                [Delete(self.key)])
                            log.info("election %s: removed the key of a previous %s "
                                     "(term %d)", self.name, self.identity, kv.create_revision)
                            continue
                        else:
                            await self._wait_vacant(session, result.revision, kv)
                            continue
                except StoreUnavailableError as exc:  # includes an unknown outcome
                    log.info("election %s: etcd unavailable (%s); retrying", self.name, exc)
                    await asyncio.sleep(RETRY_DELAY)
                    continue
                if not session.alive:
                    continue  # won, but too late to trust it; the key goes with the lease
                log.info("election %s: %s is the leader (term %d)", self.name, self.identity,
                         term)
                leadership, session = Leadership(self, session, term), None
                return leadership
        finally:
            if session is not None:  # cancelled (or failed) while standing by
                await session.close(revoke=True)

    async def _wait_vacant(self, session: Session[object], revision: int, kv: KeyValue) -> None:
        """Until the key seen at ``revision`` is deleted (or our session is lost,
        which needs a new lease before the next try)."""
        log.info("election %s: standing by (leader %s, term %d)", self.name,
                 kv.value.decode(errors="replace"), kv.create_revision)

        async def deleted() -> None:
            async for batch in self.store.watch(self.key, prefix=False,
                                                start_revision=revision + 1):
                if any(e.kind == "delete" for e in batch.events):
                    return

        waits = [asyncio.create_task(deleted()), asyncio.create_task(session.wait_lost())]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # a watch refused for good (permissions) is raised
        finally:
            for task in waits:
                task.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
