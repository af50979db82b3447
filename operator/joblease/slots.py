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
from dataclasses import dataclass

from joblease.errors import (
    InvalidInputError,
    SemaphoreFullError,
    SemaphoreNotFoundError,
)
from joblease.keys import KeySpace, SemaphoreKeys, SemaphoreRef
from joblease.records import SemaphoreSpec, SemaphoreUse, SlotRecord
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


@dataclass(frozen=True)
class SlotPlan:
    """The slots a claim will take and the compares that make taking them safe."""

    picks: tuple[tuple[SemaphoreState, tuple[int, ...]], ...]
    ticket: Ticket | None

    def compares(self) -> list[Compare]:
        out: list[Compare] = []
        for state, indexes in self.picks:
            k = state.keys
            out.append(Compare(k.spec, "mod", "==", state.spec_revision))
            out += [Compare(k.slot(i), "create", "==", 0) for i in indexes]
            out.append(Compare(k.slot(state.limit), "create", "==", 0, range_end=k.slots_end))
            if self.ticket is None:
                out.append(Compare(k.waiters, "create", "==", 0, range_end=k.waiters_end))
            else:
                out.append(Compare(k.waiters, "create", ">", self.ticket.revision - 1,
                                   range_end=k.waiters_end))
        return out

    def writes(self, lease_id: int, record: SlotRecord) -> list[TxnOp]:
        value = record.encode()
        ops: list[TxnOp] = [Put(state.keys.slot(i), value, lease=lease_id)
                            for state, indexes in self.picks for i in indexes]
        if self.ticket is not None:
            ops += [Delete(key) for key in self.ticket.keys]
        return ops

    def grants(self, token: int) -> tuple[SlotGrant, ...]:
        return tuple(SlotGrant(state.ref, indexes, token,
                               tuple(state.keys.slot(i) for i in indexes))
                     for state, indexes in self.picks)


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
        ahead = [w for w in state.waiters
                 if ticket is None or w.create_revision < ticket.revision]
        slots, limit = state.slots, state.limit
        free = [i for i in range(limit) if i not in slots]
        if ahead or len(free) < weight or any(i >= limit for i in slots):
            raise SemaphoreFullError(str(state.ref), job, state.limit, state.live,
                                     len(state.waiters), weight)
        taken = (reserved or {}).get(state.keys.prefix)
        preferred = [i for i in free if i not in taken] if taken else free
        pool = preferred if len(preferred) >= weight else free
        # one slot (the common weight): a choice, a fifth of a sample's cost
        chosen = [random.choice(pool)] if weight == 1 else random.sample(pool, weight)
        picks.append((state, tuple(sorted(chosen))))
    return SlotPlan(tuple(picks), ticket)


def semaphore_refs(keys: KeySpace, namespace: str, uses: Sequence[SemaphoreUse]
                   ) -> list[tuple[SemaphoreRef, SemaphoreKeys, int]]:
    """``(ref, keys, weight)`` for each use, in name order (a stable order for reads)."""
    out = []
    for u in sorted(uses):
        ref = SemaphoreRef(namespace, u.name)
        out.append((ref, keys.semaphore(ref), u.weight))
    return out
