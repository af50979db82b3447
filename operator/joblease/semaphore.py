"""Semaphores: fenced concurrency limits (docs/semaphores.md).

A semaphore is a limit and nothing else; the slots are taken by the claims
of the jobs and queue items whose specs name it, in their own transactions
(:mod:`joblease.slots`). This module creates, changes, inspects and deletes
semaphores.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.errors import (
    FencedError,
    InvalidInputError,
    OutcomeUnknownError,
    SemaphoreNotFoundError,
)
from joblease.keys import JobRef, SemaphoreKeys, SemaphoreRef
from joblease.records import SemaphoreSpec, SlotRecord, WaiterRecord
from joblease.slots import MAX_LIMIT, parse, reads
from joblease.store import Compare, Get, Put, Txn, describe

#: Holders listed in a semaphore's state (its status shows at most this many).
MAX_HOLDERS_SHOWN = 100


@dataclass(frozen=True)
class SlotHolder:
    index: int
    holder: str  # the job or item
    owner: str
    token: int  # the slot's create revision: what fenced destinations gate on
    lease_id: int


@dataclass(frozen=True)
class SemaphoreStatus:
    """A semaphore at one revision: its limit, live slots and waiters."""

    semaphore: SemaphoreRef
    revision: int
    limit: int
    live: int
    holders: list[SlotHolder]  # by index, at most MAX_HOLDERS_SHOWN
    waiters: int
    oldest_waiter: str | None  # the claim first in line

    def to_dict(self) -> dict[str, Any]:
        return {"semaphore": str(self.semaphore), "revision": self.revision,
                "limit": self.limit, "live": self.live, "waiters": self.waiters,
                "oldestWaiter": self.oldest_waiter,
                "holders": [{"slot": h.index, "holder": h.holder, "owner": h.owner,
                             "token": h.token, "leaseId": h.lease_id} for h in self.holders]}


class Semaphores:
    """Semaphores on a :class:`JobLeaseClient` (its etcd and key root)."""

    def __init__(self, client: JobLeaseClient) -> None:
        self.client = client
        self.store = client.store

    def keys(self, ref: SemaphoreRef) -> SemaphoreKeys:
        validation.job_ref(JobRef(ref.namespace, ref.name))
        return self.client.keys.semaphore(ref)

    async def create(self, ref: SemaphoreRef, limit: int, *,
                     guard: Sequence[Compare] = ()) -> int:
        """Create ``ref`` with ``limit`` slots, or change its limit (idempotent).

        Raising the limit lets waiting claims in at once (their watches see
        the change); lowering it revokes nobody: no slot is granted until the
        live ones are below the new limit and none is above it.

        ``guard``: extra conditions the write requires, as for
        :meth:`joblease.queue.Queues.create` (the operator passes its leadership
        term); if one fails nothing is written and :class:`FencedError` is
        raised (``written=None`` after an unknown outcome: a first copy may
        have committed)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
            raise InvalidInputError(f"invalid limit {limit!r}: an integer 1..{MAX_LIMIT}")
        keys = self.keys(ref)
        value = SemaphoreSpec(limit).encode()
        # Nested under the guard: the write itself uses both branches (compare the
        # value, put it when it differs), so the guard cannot join its compares.
        inner = Txn((Compare(keys.spec, "value", "==", value),), (Get(keys.spec),),
                    (Put(keys.spec, value),))
        unknown = False
        for attempt in range(5):
            try:
                if not guard:
                    r = await self.store.txn(list(inner.compares), list(inner.success),
                                             list(inner.failure))
                    return r.revision
                r = await self.store.txn(guard, [inner], [])
            except OutcomeUnknownError:  # a repeat after a commit is a read
                if attempt == 4:
                    raise
                unknown = True
                await asyncio.sleep(0.1 * 2**attempt)
                continue
            if r.succeeded:
                return r.revision
            raise FencedError(f"create of semaphore {ref}", describe(guard),
                              written=None if unknown else False)
        raise AssertionError("unreachable")

    async def status(self, ref: SemaphoreRef) -> SemaphoreStatus:
        """Limit, holders and waiters at one revision."""
        keys = self.keys(ref)
        r = await self.client.retry_read(lambda: self.store.txn([], reads(keys)))
        state = parse(ref, keys, r, 0)
        holders = []
        for index in sorted(state.slots)[:MAX_HOLDERS_SHOWN]:
            kv = state.slots[index]
            record = SlotRecord.decode(kv.value)
            holders.append(SlotHolder(index, record.holder, record.owner, kv.create_revision,
                                      kv.lease))
        oldest = (WaiterRecord.decode(state.waiters[0].value).holder if state.waiters
                  else None)
        return SemaphoreStatus(ref, r.revision, state.limit, state.live, holders,
                               len(state.waiters), oldest)

    async def delete(self, ref: SemaphoreRef, *, guard: Sequence[Compare] = ()) -> int:
        """Delete the semaphore's spec, slots and waiters. Claims that hold
        slots keep their jobs; claims that need the semaphore are refused
        (:class:`SemaphoreNotFoundError`) until it exists again.

        ``guard``: extra conditions the delete requires (the conditional delete
        nested in it, as :meth:`joblease.queue.Queues.delete`); if one fails
        nothing is deleted and :class:`FencedError` is raised."""
        keys = self.keys(ref)
        return await self.client.delete_registered(
            keys.spec, keys.prefix, f"semaphore {ref}",
            lambda: SemaphoreNotFoundError(str(ref)), guard=guard)
