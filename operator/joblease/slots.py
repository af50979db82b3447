"""Semaphore slots taken in a claim's own transaction (docs/semaphores.md).

A semaphore of limit K has slot keys ``S/slots/000000`` .. ``S/slots/<K-1>``.
A claim that needs ``w`` slots of it reads the semaphore (spec, live slots,
waiters: one read-only transaction for all its semaphores), picks ``w`` free
indexes below the limit, and adds to its claim transaction, per semaphore:

    mod(S/spec) == the revision read          (the limit it planned with)
    create(S/slots/<i>) == 0  for each pick   (still free)
    no key in [S/slots/<K>, end of S/slots/)  (nobody above a lowered limit)
    no key in S/waiters/                      (nobody waits: do not jump the line)
      or: every waiter's create revision >= the ticket's  (we are first in line)

and puts the picked slot keys bound to the claim's etcd lease. So a slot is
live exactly while its claim is (completion and release delete it in their
transactions; expiry and loss delete it with the lease), at most K slot keys
exist below the limit and none above it once a lowered limit has drained:
live slots never exceed the limit at any revision. This module plans and
explains; the client sends the transaction.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field

from joblease.errors import (
    InvalidInputError,
    SemaphoreFullError,
    SemaphoreNotFoundError,
)
from joblease.keys import KeySpace, SemaphoreKeys, SemaphoreRef
from joblease.records import SemaphoreSpec, SemaphoreUse
from joblease.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Put,
    TxnOp,
    TxnResult,
)

#: The largest limit a semaphore may have (slot keys are per slot).
MAX_LIMIT = 10_000
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


@dataclass(frozen=True)
class SemaphoreState:
    """One semaphore as read at one revision."""

    ref: SemaphoreRef
    keys: SemaphoreKeys
    spec_revision: int
    limit: int
    slots: Mapping[int, KeyValue]  # live slots by index
    waiters: list[KeyValue]  # oldest first
    #: the indexes below the limit with no live slot, when kept by whoever made
    #: the state (a watched view keeps them; None: listed from ``slots`` when needed)
    free: AbstractSet[int] | None = field(default=None, compare=False)

    @property
    def live(self) -> int:
        return len(self.slots)


def reads(keys: SemaphoreKeys) -> list[Get]:
    """What :func:`parse` needs of one semaphore, for a read-only transaction."""
    return [Get(keys.spec), Get(keys.slots, prefix=True),
            Get(keys.waiters, prefix=True, oldest_first=True)]


def parse(ref: SemaphoreRef, keys: SemaphoreKeys, r: TxnResult, at: int) -> SemaphoreState:
    """The state from the three responses of :func:`reads` starting at ``at``."""
    spec_kv = r.kv(at)
    if spec_kv is None:
        raise SemaphoreNotFoundError(str(ref))
    spec = SemaphoreSpec.decode(spec_kv.value)
    slots = {keys.slot_index(kv.key): kv for kv in r.kvs(at + 1)}
    return SemaphoreState(ref, keys, spec_kv.mod_revision, spec.limit, slots, r.kvs(at + 2))


@dataclass(frozen=True)
class SlotGrant:
    """Slots of one semaphore held by a claim; ``token`` is their create revision
    (the claim's commit revision), which fenced destinations gate on."""

    semaphore: SemaphoreRef
    indexes: tuple[int, ...]
    token: int
    keys: tuple[bytes, ...]
    #: the deletes of ``keys`` (kept per slot: :class:`SlotOps`); none: built from ``keys``
    deletes: tuple[Delete, ...] = field(default=(), compare=False, repr=False)
    #: the semaphore's key prefix (none: a grant read back, found by its keys)
    prefix: bytes = field(default=b"", compare=False, repr=False)

    def frees(self) -> tuple[Delete, ...]:
        """What frees these slots, in a completion's or release's transaction."""
        return self.deletes or tuple(map(Delete, self.keys))

    def to_dict(self) -> dict[str, object]:
        return {"semaphore": str(self.semaphore), "slots": list(self.indexes),
                "token": self.token}


@dataclass(frozen=True)
class Ticket:
    """A place in line: waiter keys put in one transaction (so at one create
    revision in every semaphore the claim waits for: no two waiters can be
    ahead of each other in different semaphores, hence no deadlock)."""

    revision: int
    keys: tuple[bytes, ...]


class SlotOps:
    """The compares and deletes of one semaphore that every claim of it sends,
    built once (and so turned into a protobuf once, by the store): each is a
    pure function of the semaphore's prefix and of the argument it is kept by
    (the spec revision, the limit, the index), so a semaphore re-created or
    given a new limit gets new ones, never an old one."""

    __slots__ = ("_above", "_deletes", "_free", "_granted", "_spec", "keys", "no_waiters")

    def __init__(self, keys: SemaphoreKeys) -> None:
        self.keys = keys
        #: nobody waits: no key in ``S/waiters/``
        self.no_waiters = Compare(keys.waiters, "create", "==", 0, range_end=keys.waiters_end)
        self._spec: Compare | None = None  # the latest spec revision's
        self._above: tuple[int, Compare] | None = None  # the latest limit's
        self._free: dict[int, Compare] = {}
        self._deletes: dict[int, Delete] = {}
        #: a one-slot grant's keys and deletes, by index (the common weight)
        self._granted: dict[int, tuple[tuple[bytes, ...], tuple[Delete, ...]]] = {}

    def spec_unchanged(self, revision: int) -> Compare:
        """``mod(S/spec) == revision``: the limit planned with is still in force."""
        c = self._spec
        if c is None or c.value != revision:
            c = self._spec = Compare(self.keys.spec, "mod", "==", revision)
        return c

    def none_above(self, limit: int) -> Compare:
        """No slot key at or above ``limit`` (in ``[S/slots/<limit>, end of S/slots/)``)."""
        kept = self._above
        if kept is None or kept[0] != limit:
            kept = self._above = (limit, Compare(self.keys.slot(limit), "create", "==", 0,
                                                 range_end=self.keys.slots_end))
        return kept[1]

    def free(self, index: int) -> Compare:
        """``create(S/slots/<index>) == 0``: the slot is still free."""
        c = self._free.get(index)
        if c is None:
            c = Compare(self.keys.slot(index), "create", "==", 0)
            if len(self._free) < MAX_LIMIT:
                self._free[index] = c
        return c

    def delete(self, index: int) -> Delete:
        """The delete of slot ``index`` that frees it (completion, release)."""
        d = self._deletes.get(index)
        if d is None:
            d = Delete(self.keys.slot(index))
            if len(self._deletes) < MAX_LIMIT:
                self._deletes[index] = d
        return d

    def granted(self, indexes: tuple[int, ...]) -> tuple[tuple[bytes, ...], tuple[Delete, ...]]:
        """The slot keys of a grant of ``indexes``, and their deletes."""
        if len(indexes) == 1:
            kept = self._granted.get(indexes[0])
            if kept is None:
                kept = ((self.keys.slot(indexes[0]),), (self.delete(indexes[0]),))
                if len(self._granted) < MAX_LIMIT:
                    self._granted[indexes[0]] = kept
            return kept
        return (tuple(self.keys.slot(i) for i in indexes),
                tuple(self.delete(i) for i in indexes))


#: ``SlotOps`` by semaphore prefix (at most ``_OPS_KEPT``: then started afresh)
_ops: dict[bytes, SlotOps] = {}
_OPS_KEPT = 1024


def slot_ops(keys: SemaphoreKeys) -> SlotOps:
    """The kept compares and deletes of the semaphore at ``keys``."""
    ops = _ops.get(keys.prefix)
    if ops is None:
        if len(_ops) >= _OPS_KEPT:
            _ops.clear()
        ops = _ops[keys.prefix] = SlotOps(keys)
    return ops


@dataclass(frozen=True)
class SlotPlan:
    """The slots a claim will take and the compares that make taking them safe."""

    picks: tuple[tuple[SemaphoreState, tuple[int, ...]], ...]
    ticket: Ticket | None

    def compares(self) -> list[Compare]:
        out: list[Compare] = []
        for state, indexes in self.picks:
            k = state.keys
            ops = slot_ops(k)
            out.append(ops.spec_unchanged(state.spec_revision))
            out += [ops.free(i) for i in indexes]
            out.append(ops.none_above(state.limit))
            if self.ticket is None:
                out.append(ops.no_waiters)
            else:
                out.append(Compare(k.waiters, "create", ">", self.ticket.revision - 1,
                                   range_end=k.waiters_end))
        return out

    def writes(self, lease_id: int, value: bytes) -> list[TxnOp]:
        """The puts of the picked slots (``value``: the claim's encoded
        :class:`SlotRecord`) and the deletes of the ticket's waiter keys."""
        ops: list[TxnOp] = [Put(state.keys.slot(i), value, lease=lease_id)
                            for state, indexes in self.picks for i in indexes]
        if self.ticket is not None:
            ops += [Delete(key) for key in self.ticket.keys]
        return ops

    def grants(self, token: int) -> tuple[SlotGrant, ...]:
        out = []
        for state, indexes in self.picks:
            keys, deletes = slot_ops(state.keys).granted(indexes)
            out.append(SlotGrant(state.ref, indexes, token, keys, deletes, state.keys.prefix))
        return tuple(out)


def check_uses(uses: Sequence[SemaphoreUse]) -> None:
    """Semaphore names are Kubernetes names; weights at least 1; each named once."""
    names = [u.name for u in uses]
    for name in names:
        if not (isinstance(name, str) and 0 < len(name) <= 253
                and _DNS_SUBDOMAIN.fullmatch(name)):
            raise InvalidInputError(f"invalid semaphore name {name!r}: must be a DNS subdomain "
                                    "(lowercase letters, digits, '-' and '.')")
    if len(names) != len(set(names)):
        raise InvalidInputError(f"a semaphore is named twice in {names}")
    for u in uses:
        if isinstance(u.weight, bool) or not isinstance(u.weight, int) or u.weight < 1:
            raise InvalidInputError(f"invalid weight {u.weight!r} for semaphore {u.name!r}: "
                                    "an integer >= 1")


def plan(job: str, states: Sequence[tuple[SemaphoreState, int]], ticket: Ticket | None,
         reserved: Mapping[bytes, set[int]] | None = None) -> SlotPlan:
    """The slots to take for ``job`` (``(state, weight)`` per semaphore), or
    :class:`SemaphoreFullError` naming the first semaphore without room (or
    with someone ahead in line); a weight above a limit is refused as bad input.

    Free indexes are picked at random, avoiding ``reserved`` (the indexes this
    client's claims in flight picked, by semaphore prefix) when it can: many
    claimers reading the same free slots would all pick the lowest and
    collide."""
    picks = []
    for state, weight in states:
        if weight > state.limit:
            raise InvalidInputError(
                f"{job} needs {weight} slots of semaphore {state.ref}, whose limit is "
                f"{state.limit}: it could never be granted")
        waiters = state.waiters  # oldest first: someone is ahead iff the oldest is
        ahead = bool(waiters) and (ticket is None
                                   or waiters[0].create_revision < ticket.revision)
        slots, limit = state.slots, state.limit
        # no slot at or above the limit (a lowered one), so every live slot is below it
        if ahead or (slots and max(slots) >= limit) or limit - len(slots) < weight:
            raise SemaphoreFullError(str(state.ref), job, state.limit, state.live,
                                     len(waiters), weight)
        taken = reserved.get(state.keys.prefix) if reserved else None
        picks.append((state, _pick(slots, limit, weight, taken, state.free)))
    return SlotPlan(tuple(picks), ticket)


#: random tries at a free slot before listing them (one slot: the common weight)
_PROBES = 4


def _pick(slots: Mapping[int, KeyValue], limit: int, weight: int, taken: set[int] | None,
          free_kept: AbstractSet[int] | None = None) -> tuple[int, ...]:
    """``weight`` free indexes below ``limit`` (there are enough), at random,
    avoiding ``taken`` when there are enough others; ``free_kept``: the free
    indexes, if the caller keeps them (else they are listed from ``slots``)."""
    if weight == 1 and (limit - len(slots)) * 4 >= limit:
        # at least a quarter free: a few random tries before listing the free
        # ones (as fair as a choice among the free indexes not taken, without
        # building that list; a float's floor: randrange's checks cost more)
        for _ in range(_PROBES):
            i = int(random.random() * limit)
            if i not in slots and (not taken or i not in taken):
                return (i,)
    # fewer than a quarter free (the usual case of a busy semaphore): the kept
    # ones cost what they number, listing them from the slots what the limit is
    free = list(free_kept) if free_kept is not None else [
        i for i in range(limit) if i not in slots]
    preferred = [i for i in free if i not in taken] if taken else free
    pool = preferred if len(preferred) >= weight else free
    chosen = [random.choice(pool)] if weight == 1 else random.sample(pool, weight)
    return tuple(sorted(chosen))


def semaphore_refs(keys: KeySpace, namespace: str, uses: Sequence[SemaphoreUse]
                   ) -> list[tuple[SemaphoreRef, SemaphoreKeys, int]]:
    """``(ref, keys, weight)`` for each use, in name order (a stable order for reads)."""
    out = []
    for u in sorted(uses):
        ref = SemaphoreRef(namespace, u.name)
        out.append((ref, keys.semaphore(ref), u.weight))
    return out
