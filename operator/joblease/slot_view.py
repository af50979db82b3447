"""A semaphore's keys kept current by a watch, for planning and waiting without reads.

Like an informer: one read of ``S/`` and a watch from the revision after it,
per semaphore a client's claims use (docs/semaphores.md, "The claim" and
"Waiting"). The view is a hint and never a decision: every slot is taken by
a claim transaction whose compares etcd evaluates, so a plan from a view
that is behind is refused and planned again from a read, never granted.

Two things make it worth having on the hot path:

- **This client's own writes are applied at once.** A claim that took slots,
  a completion or release that freed them, a ticket put or deleted: each is
  applied with the revision it committed at, as soon as its answer arrives,
  instead of when the watch delivers it. Without that, a claimer planning
  right after another's completion still sees the freed slot taken (and reads
  etcd), or picks a slot this client just took (and is refused). Each key
  keeps the revision of what the view last applied to it (its mod revision,
  or the revision a delete of ours committed at), and an older change of that
  key is ignored whichever path brings it, so applying early can never move
  the view backwards.
- **Waiting is on the view, not on a new watch per wait.** A waiter that is
  told "full" waits until the view applies a change that can make room (a
  slot or a waiter deleted, the spec changed): a wake-up costs no round trip,
  and only the claim first in line then sends a transaction. A watch created
  from a past revision, as a per-wait watch is, is delivered by etcd's
  catch-up loop, which runs every 100 ms; this watch was created once, is
  synced, and delivers each change as it commits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from types import MappingProxyType

from joblease.background import until_first
from joblease.errors import CorruptRecordError, JobLeaseError
from joblease.keys import SemaphoreKeys, SemaphoreRef
from joblease.records import SemaphoreSpec
from joblease.slots import SemaphoreState
from joblease.store import Get, KeyValue, Store


class SemaphoreView:
    """One semaphore's spec, live slots and waiters as the watch (and this
    client's own committed writes) have them."""

    def __init__(self, store: Store, ref: SemaphoreRef, keys: SemaphoreKeys) -> None:
        self.ref, self.keys = ref, keys
        self._store = store
        self._spec: KeyValue | None = None
        self._limit: int | None = None  # decoded once per spec change (None: corrupt)
        self._slots: dict[int, KeyValue] = {}
        #: the indexes below the limit without a live slot (kept with ``_slots``,
        #: so a pick on a busy semaphore does not list them: slots.SemaphoreState.free)
        self._free: set[int] = set()
        self._waiters: dict[bytes, KeyValue] = {}
        #: keys this client deleted before the watch delivered the delete: the
        #: revision of that delete (a put of the key at or below it is older)
        self._deleted: dict[bytes, int] = {}
        #: how far the watch has delivered
        self.revision = 0
        #: bumped by every applied change that can make room: what waiters wait for
        self.changes = 0
        #: the revision of the latest such change
        self.freed_revision = 0
        self.broken = False
        #: the state ``state()`` last built (its slots are the live mapping):
        #: dropped at every change of the spec or of the waiters
        self._state: SemaphoreState | None = None
        #: set at the next change that can make room (made when first asked for)
        self._changed: asyncio.Event | None = None
        self._ready = asyncio.Event()
        self._task = asyncio.ensure_future(self._follow())

    # -- applying changes ---------------------------------------------------------------

    def _current(self, key: bytes) -> KeyValue | None:
        if key == self.keys.spec:
            return self._spec
        if key.startswith(self.keys.slots):
            index = self._index(key)
            return None if index is None else self._slots.get(index)
        return self._waiters.get(key)

    def _index(self, key: bytes) -> int | None:
        try:
            return self.keys.slot_index(key)
        except ValueError:  # not a slot key of ours (tenants can write under S/)
            return None

    def _newer_put(self, key: bytes, current: KeyValue | None, revision: int) -> bool:
        """Whether a put of ``key`` at mod ``revision`` is newer than what is applied."""
        if current is not None and current.mod_revision >= revision:
            return False  # this or a newer value is applied already
        deleted = self._deleted.get(key)
        if deleted is not None:
            if revision <= deleted:
                return False  # older than our delete of it
            del self._deleted[key]
        return True

    def _newer_delete(self, key: bytes, current: KeyValue | None, revision: int,
                      ours: bool) -> bool:
        """Whether a delete of ``key`` at ``revision`` removes what is applied
        (``ours``: recorded, so that an older put the watch brings is ignored)."""
        if current is not None and current.mod_revision > revision:
            return False  # a newer put is applied already
        deleted = self._deleted.get(key)
        if deleted is not None:
            if revision < deleted:
                return False  # older than our delete of it
            del self._deleted[key]
            if revision == deleted:
                return False  # the watch delivers our own delete: caught up
        if ours:
            # until the watch has passed it: a put it brings meanwhile is older
            self._deleted[key] = revision
        return current is not None

    def _put(self, kv: KeyValue) -> None:
        key = kv.key
        if key.startswith(self.keys.slots):
            index = self._index(key)
            if index is not None:
                self._put_slot(index, kv)
            return
        if not self._newer_put(key, self._current(key), kv.mod_revision):
            return
        if key == self.keys.spec:
            self._spec, self._state = kv, None
            try:
                limit = SemaphoreSpec.decode(kv.value).limit
            except CorruptRecordError:
                self._limit = None  # state() says None: a read reports the error
            else:
                if limit != self._limit:
                    self._limit = limit
                    self._free = set(range(limit)).difference(self._slots)
            self._room(kv.mod_revision)
        elif key.startswith(self.keys.waiters):
            self._waiters[key], self._state = kv, None

    def _put_slot(self, index: int, kv: KeyValue) -> None:
        if self._newer_put(kv.key, self._slots.get(index), kv.mod_revision):
            self._slots[index] = kv
            self._free.discard(index)

    def _delete(self, key: bytes, revision: int, *, ours: bool) -> None:
        if key.startswith(self.keys.slots):
            index = self._index(key)
            if index is not None:
                self._delete_slot(index, key, revision, ours)
            return
        if not self._newer_delete(key, self._current(key), revision, ours):
            return
        if key == self.keys.spec:
            self._spec, self._limit, self._state = None, None, None
        else:
            self._waiters.pop(key, None)
            self._state = None
        self._room(revision)

    def _delete_slot(self, index: int, key: bytes, revision: int, ours: bool) -> None:
        if self._newer_delete(key, self._slots.get(index), revision, ours):
            del self._slots[index]
            if self._limit is not None and index < self._limit:
                self._free.add(index)
            self._room(revision)

    def _room(self, revision: int) -> None:
        """Something that can make room changed: wake the waiters."""
        self.changes += 1
        self.freed_revision = max(self.freed_revision, revision)
        changed = self._changed
        if changed is not None:  # someone may wait on it; the next one is made when asked
            changed.set()
            self._changed = None

    @property
    def ready(self) -> bool:
        """Whether the first read is in (or the view broke): :meth:`state` would not wait."""
        return self._ready.is_set()

    def _behind(self, revision: int) -> bool:
        """Whether a transaction of ours at ``revision`` is for the view to apply:
        its first read is in and the watch has not brought that revision yet."""
        return self._ready.is_set() and not self.broken and revision > self.revision

    def applied(self, revision: int, puts: Sequence[tuple[bytes, bytes, int]] = (),
                deletes: Sequence[bytes] = ()) -> None:
        """This client's transaction committed at ``revision``: it put ``(key,
        value, lease)`` (created there) and deleted ``deletes``. Ignored until
        the first read is in, and if the watch has got that far (they bring it)."""
        if not self._behind(revision):
            return  # the watch has delivered it (and maybe newer changes) already
        for key, value, lease in puts:
            if key.startswith(self.keys.prefix):
                self._put(KeyValue(key, value, revision, revision, 1, lease))
        for key in deletes:
            if key.startswith(self.keys.prefix):
                self._delete(key, revision, ours=True)

    def took(self, revision: int, indexes: Sequence[int], value: bytes, lease: int) -> None:
        """:meth:`applied` for a claim of ours that put slots ``indexes`` (``value``,
        bound to ``lease``), without finding the slots from their keys."""
        if self._behind(revision):
            slot = self.keys.slot
            for i in indexes:
                self._put_slot(i, KeyValue(slot(i), value, revision, revision, 1, lease))

    def freed(self, revision: int, indexes: Sequence[int]) -> None:
        """:meth:`applied` for a completion or release of ours that deleted slots ``indexes``."""
        if self._behind(revision):
            slot = self.keys.slot
            for i in indexes:
                self._delete_slot(i, slot(i), revision, True)

    async def _follow(self) -> None:
        try:
            r = await self._store.txn([], [Get(self.keys.prefix, prefix=True)])
            for kv in r.kvs(0):
                self._put(kv)
            self.revision = r.revision
            self._ready.set()
            async for batch in self._store.watch(self.keys.prefix, prefix=True,
                                                 start_revision=r.revision + 1):
                for e in batch.events:
                    if e.kind == "put":
                        self._put(e.kv)
                    else:  # a delete event's mod revision is the delete's
                        self._delete(e.kv.key, e.kv.mod_revision, ours=False)
                self.revision = max(self.revision, batch.revision)
                # every event up to a response's revision has been delivered
                # (etcd's watch order), so older puts can no longer come
                if self._deleted:
                    for key in [k for k, rev in self._deleted.items() if rev <= self.revision]:
                        del self._deleted[key]
        except JobLeaseError:
            pass  # the watch ended (compacted, etcd away): claims fall back to reads
        finally:
            self.broken = True
            self._ready.set()
            if self._changed is not None:
                self._changed.set()  # waiters re-plan (from a read) at once
                self._changed = None

    # -- reading and waiting ------------------------------------------------------------

    async def state(self, timeout: float = 2.0) -> SemaphoreState | None:
        """The semaphore as the view has it, or None (not ready in time, broken,
        or no spec: the caller reads etcd, which says exactly what is wrong).

        ``slots`` is the view's own mapping, read-only and kept current: plan
        from it before the next ``await``."""
        if not self._ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout)
        return self.state_now()

    def state_now(self) -> SemaphoreState | None:
        """:meth:`state` without waiting for the first read (None until it is in)."""
        if self.broken or self._spec is None or self._limit is None:
            return None
        if self._state is None:
            waiters = sorted(self._waiters.values(), key=lambda kv: kv.create_revision)
            self._state = SemaphoreState(self.ref, self.keys, self._spec.mod_revision,
                                         self._limit, MappingProxyType(self._slots), waiters,
                                         self._free)
        return self._state

    def changed_since(self, mark: int | None, revision: int) -> bool:
        """Whether room may have been made since ``mark`` (a value of
        :attr:`changes` taken with a state) or, without a mark, since etcd's
        ``revision`` (a read's); a broken view always says yes."""
        if self.broken:
            return True
        return self.changes > mark if mark is not None else self.freed_revision > revision

    def next_change(self) -> asyncio.Event:
        """Set at the next change that can make room (or when the view breaks).
        Take it before yielding to the loop: a change applied in between would
        set the one before it, and a waiter holding a later one would miss it."""
        if self._changed is None:
            self._changed = asyncio.Event()
            if self.broken:
                self._changed.set()
        return self._changed

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)


async def wait_for_room(views: Sequence[tuple[SemaphoreView, int | None]], revision: int,
                        timeout: float) -> None:
    """Until one of ``views`` changed since its mark (or since ``revision``),
    at most ``timeout`` seconds."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not any(view.changed_since(mark, revision) for view, mark in views):
        left = deadline - loop.time()
        if left <= 0:
            return
        await until_first([view.next_change().wait() for view, _ in views], left)
