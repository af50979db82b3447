"""The etcd leases a client's claims are bound to: per TTL, the open sessions that
take new claims (each shared by up to :attr:`SessionPool.holders_per_session`
claims of that TTL), and the sessions retired from that role.

Why a pool: a session is an etcd lease plus its keep-alive loop; one per claim
would cost a grant and a keep-alive stream per job. Why a bound per session:
with etcd auth on, etcd checks a non-root user's write permission on **every key
already attached to a lease** at each put bound to it (``checkLeasePuts`` in
etcd's ``apply_auth.go``; docs/security.md), so one lease shared by all of a
busy client's holders makes each claim cost etcd a check per claim in flight
(0.7 us each: 45 us of etcd CPU a claim at 64 in flight, docs/benchmarks.md,
"The session lease's keys"). With at most 8 per session that is at most 8
checks, for one more lease and keep-alive per 8 claims held. Why retiring: a session with
less than :attr:`SessionPool.min_session_left` of local safety takes no new claim
(its handle could be lost at once if the keep-alive in flight answers late), but
it is not ended either: the answer may be on its way, and the jobs it holds keep
it until its own deadline. A retired session is renewed as before and closed once
it has no holders or its deadline has passed. Idle sessions beyond
:attr:`SessionPool.idle_sessions` are closed (revoked), so a long-lived client
keeps a bounded number.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, OrderedDict, defaultdict

from joblease.background import BackgroundTasks
from joblease.errors import JobLeaseError, LeaseNotFoundError
from joblease.lease import Lease
from joblease.session import Session
from joblease.store import Store, retry_unavailable

log = logging.getLogger("joblease.client")


class SessionPool:
    """The sessions of one client (module docstring)."""

    #: At most this many sessions without holders are kept open for reuse.
    idle_sessions = 4
    #: A session with less local safety left than this takes no new claim.
    min_session_left = 0.5
    #: A session with this many claims held or in flight takes no new one (the
    #: next goes to another open session of its TTL, or a new one; module docstring).
    holders_per_session = 8

    def __init__(self, store: Store, background: BackgroundTasks, *, margin: float | None,
                 revoke_on_loss: bool, revoke_timeout: float) -> None:
        self.store = store
        self._background = background
        self._margin = margin
        self._revoke_on_loss = revoke_on_loss
        self._revoke_timeout = revoke_timeout
        #: per TTL, the open session a new claim tries first: the one picked last
        #: (TTLs least recently used first)
        self._current: OrderedDict[int, Session[Lease]] = OrderedDict()
        #: per TTL, every open session: each takes new claims while it has room
        self._open: dict[int, list[Session[Lease]]] = {}
        #: replaced sessions, renewed until their holders finish or their deadline passes
        self._retired: set[Session[Lease]] = set()
        #: claims in flight per session: such a session is never closed as idle
        self._claiming: Counter[Session[Lease]] = Counter()
        self._locks: defaultdict[int, asyncio.Lock] = defaultdict(asyncio.Lock)
        #: claims left until :meth:`_sweep` looks at every session again
        self._until_sweep = self._SWEEP_EVERY

    def _usable(self, session: Session[Lease] | None) -> bool:
        # remaining() is 0 once the session is lost (and expires it at its deadline)
        return (session is not None and session.remaining() >= self.min_session_left
                and session.lost_reason is None)

    def _has_room(self, session: Session[Lease]) -> bool:
        return session.holders + self._claiming[session] < self.holders_per_session

    def ready(self, ttl: int) -> Session[Lease] | None:
        """:meth:`for_claim` when it needs no await: an open session of ``ttl``
        that is usable and has room (the one picked last first), else None."""
        session = self._current.get(ttl)
        if session is None or not self._has_room(session) or not self._usable(session):
            session = self._open_with_room(ttl)
            if session is None:
                return None
            self._current[ttl] = session
        self._current.move_to_end(ttl)
        self._sweep(keep=session, now=False)
        return session

    def _open_with_room(self, ttl: int) -> Session[Lease] | None:
        """An open session of ``ttl`` that is usable and has room (the oldest first);
        one with room that is no longer usable is retired on the way (it keeps its
        holders; one without room is retired when it has room again)."""
        found, unusable = None, []
        for session in self._open.get(ttl, ()):
            if self._has_room(session):  # before _usable: that reads the clock
                if self._usable(session):
                    found = session
                    break
                unusable.append(session)
        for session in unusable:
            self._retire(session)
        return found

    def _retire(self, session: Session[Lease]) -> None:
        """``session`` takes no new claim; it is renewed until its holders finish."""
        self._forget(session)
        self._retired.add(session)

    async def for_claim(self, ttl: int) -> Session[Lease]:
        """The session a new claim of ``ttl`` seconds is bound to: an open one with
        room, else a new one (open ones no longer usable are retired)."""
        session = self.ready(ttl)
        if session is not None:
            return session
        async with self._locks[ttl]:
            # another claim may have started one while this one waited
            session = self._open_with_room(ttl)
            if session is None:
                session = await Session[Lease](self.store, ttl, margin=self._margin,
                                               check_holders=Lease.check_all,
                                               revoke_on_loss=self._revoke_on_loss).start()
                self._open.setdefault(ttl, []).append(session)
            self._current[ttl] = session
        self._current.move_to_end(ttl)
        self._sweep(keep=session)
        return session

    async def guard(self, ttl: int) -> Session[Lease]:
        """A session of its own for a waiter's keys (tickets): not shared, not pooled;
        the caller closes it."""
        return await Session[Lease](self.store, ttl, margin=self._margin).start()

    def using(self, session: Session[Lease]) -> _Using:
        """While a claim is in flight on ``session``, it is never closed as idle."""
        return _Using(self._claiming, session)

    def _sweep(self, keep: Session[Lease], *, now: bool = True) -> None:
        """Close sessions nobody needs: retired ones without holders or past their
        deadline, open ones that are dead and idle, and idle ones beyond
        ``idle_sessions`` (least recently used TTL first). Never ``keep`` or one a
        claim is using. Not ``now`` (a claim on the session it used last): only
        every ``_SWEEP_EVERY``-th time, so that claims spread over several open
        sessions do not each look at all of them."""
        if not self._retired and sum(map(len, self._open.values())) <= 1:
            return  # only ``keep`` (the common case: one TTL, few claims): nothing to close
        if not now:
            self._until_sweep -= 1
            if self._until_sweep > 0:
                return
        self._until_sweep = self._SWEEP_EVERY

        def idle(s: Session[Lease]) -> bool:
            return s.holders == 0 and self._claiming[s] == 0 and s is not keep

        for s in list(self._retired):
            if s is not keep and self._claiming[s] == 0 and (s.holders == 0 or not s.alive):
                self.drop(s, "retired and no longer needed", expected=True)
        idle_open = [s for s in self._by_recency() if idle(s)]
        for s in idle_open:
            if not s.alive:
                self.drop(s, "dead and idle", expected=True)
        idle_open = [s for s in idle_open if s.alive]
        for s in idle_open[:max(0, len(idle_open) - self.idle_sessions)]:
            self.drop(s, "idle", expected=True)

    #: see :meth:`_sweep`
    _SWEEP_EVERY = 32

    def _by_recency(self) -> list[Session[Lease]]:
        """Every open session, those of the TTL used least recently first, and of
        one TTL the one picked last at the end."""
        ttls = [ttl for ttl in self._open if ttl not in self._current] + list(self._current)
        out = []
        for ttl in ttls:
            last = self._current.get(ttl)
            out += [s for s in self._open.get(ttl, ()) if s is not last]
            if last is not None:
                out.append(last)
        return out

    def _forget(self, session: Session[Lease]) -> None:
        if self._current.get(session.ttl) is session:
            del self._current[session.ttl]
        sessions = self._open.get(session.ttl)
        if sessions is not None and session in sessions:
            sessions.remove(session)
            if not sessions:
                del self._open[session.ttl]
        self._retired.discard(session)

    def drop(self, session: Session[Lease], reason: str, *, expected: bool = False) -> None:
        """Stop using ``session``: its handles are lost; its etcd lease is revoked
        in the background so the jobs it held become claimable at once."""
        self._forget(session)
        session.lose(reason, expected=expected)
        self._background.spawn(session.close(revoke=True))

    async def end(self, session: Session[Lease], reason: str) -> bool:
        """Stop renewing ``session`` and revoke its etcd lease before going on.

        True once etcd confirmed the lease is gone (so nothing can still be
        bound to it); False if etcd could not be reached within the revoke
        timeout (capped at the TTL: an unrenewed lease expires by then anyway).
        """
        self._forget(session)
        session.lose(reason)
        await session.close(revoke=False)
        try:
            await retry_unavailable(lambda: self.store.revoke(session.lease_id),
                                    min(self._revoke_timeout, float(session.ttl)))
        except LeaseNotFoundError:
            return True
        except JobLeaseError as exc:
            log.warning("could not revoke etcd lease %x: %s; it expires within %ds",
                        session.lease_id, exc, session.ttl)
            return False
        return True

    async def close(self, *, revoke: bool) -> None:
        """Close every session, open and retired."""
        sessions = [s for open_ in self._open.values() for s in open_] + [*self._retired]
        self._current, self._open, self._retired = OrderedDict(), {}, set()
        for s in sessions:
            await s.close(revoke=revoke)


class _Using:
    """Counts a claim in flight on a session (a plain class: this is on every
    claim's path, and a generator-based context manager costs several times more)."""

    __slots__ = ("_counts", "_session")

    def __init__(self, counts: Counter[Session[Lease]], session: Session[Lease]) -> None:
        self._counts, self._session = counts, session

    def __enter__(self) -> None:
        self._counts[self._session] += 1

    def __exit__(self, *exc: object) -> None:
        self._counts[self._session] -= 1
        if self._counts[self._session] <= 0:
            del self._counts[self._session]
