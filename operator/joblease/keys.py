"""Where a job's state lives in etcd.

Every job owns the prefix ``<root>/<namespace>/<name>/`` (root defaults to
``/joblease/v1``). Under it:

- ``spec``    registration written by the operator (or ``joblease register``);
- ``holder``  bound to an etcd lease: its existence means "owned and unexpired";
              its create revision is the fencing token;
- ``claims``  put once per successful claim: its ``version`` is the generation
              (and the attempts used);
- ``result``  written once, by the completion transaction;
- ``checkpoint`` the last progress checkpoint, written only by the holder
              (same compares as renew); kept after completion, deleted with
              the job on unregister.

A job's tenure history (docs/protocol.md, "Tenure history") lives beside its
prefix, under ``<root>/<namespace>/_history/<name>/``: one ``<generation>``
key per claim (zero-padded, so key order is claim order) and, under it,
``/end``, ``/checkpoints`` and ``/refused``. Outside the job's prefix, so
reading a job, listing and watching jobs (which skip ``_`` segments) cost what
they cost without it; unregister deletes both.

A queue owns ``<root>/<namespace>/_queues/<queue>/`` (no JobLease can be named
``_queues``): its ``spec`` and one sub-prefix per field of its items
(``items/``, ``pending/``, ``held/``, ``claims/``, ``results/``,
``checkpoints/``, ``failed/``), so each count is one count-only range. An item
is a job of its queue: :class:`ItemKeys` has the fields of :class:`JobKeys`
(docs/queues.md, "Key layout"), and its tenure history lives under the
queue's ``history/<id>/`` (the same layout as a job's history, so it goes
with the item's prune and the queue's delete; no count reads it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from joblease.store import prefix_end

DEFAULT_ROOT = "/joblease/v1"
#: The namespace of a job named without one (``name`` rather than ``ns/name``).
DEFAULT_NAMESPACE = "default"


@dataclass(frozen=True, slots=True, order=True)
class JobRef:
    """A job's identity: the Kubernetes namespace and name of its JobLease."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str, default_namespace: str = DEFAULT_NAMESPACE) -> JobRef:
        """``ns/name`` or ``name`` (in ``default_namespace``)."""
        if "/" in text:
            ns, _, name = text.partition("/")
            return cls(ns, name)
        return cls(default_namespace, text)


@dataclass(frozen=True)
class JobKeys:
    """The etcd keys of one job."""

    prefix: bytes

    @property
    def spec(self) -> bytes:
        return self.prefix + b"spec"

    @property
    def holder(self) -> bytes:
        return self.prefix + b"holder"

    @property
    def claims(self) -> bytes:
        return self.prefix + b"claims"

    @property
    def result(self) -> bytes:
        return self.prefix + b"result"

    @property
    def checkpoint(self) -> bytes:
        return self.prefix + b"checkpoint"

    @property
    def completion_deletes(self) -> tuple[bytes, ...]:
        """What the completion transaction deletes besides writing the result."""
        return (self.holder,)

    @functools.cached_property
    def history(self) -> HistoryKeys:
        """The job's tenure history: ``<root>/<ns>/_history/<name>/``."""
        base, _, name = self.prefix[:-1].rpartition(b"/")
        return HistoryKeys(base + b"/" + HISTORY_SEGMENT.encode() + b"/" + name + b"/")


#: The path segment under a namespace that holds its jobs' tenure histories.
HISTORY_SEGMENT = "_history"
#: Generations in tenure keys are zero-padded to this many digits, so that key
#: order is claim order (10^12 claims of one job).
GENERATION_DIGITS = 12


@dataclass(frozen=True)
class HistoryKeys:
    """``<root>/<ns>/_history/<name>/``: one key per tenure, ``<generation>``,
    with ``<generation>/end``, ``/checkpoints`` and ``/refused`` under it."""

    prefix: bytes

    def tenure(self, generation: int) -> bytes:
        # b"%0*d": str(generation).zfill(GENERATION_DIGITS), without the str round trip
        return self.prefix + b"%0*d" % (GENERATION_DIGITS, generation)

    def end(self, generation: int) -> bytes:
        return self.tenure(generation) + b"/end"

    def checkpoints(self, generation: int) -> bytes:
        return self.tenure(generation) + b"/checkpoints"

    def refused(self, generation: int) -> bytes:
        return self.tenure(generation) + b"/refused"

    def parse(self, key: bytes) -> tuple[int, str] | None:
        """``(generation, "" | "end" | "checkpoints" | "refused")`` for a key of this history."""
        if not key.startswith(self.prefix):
            return None
        gen, _, field = key[len(self.prefix):].decode(errors="replace").partition("/")
        if len(gen) != GENERATION_DIGITS or not gen.isdigit():
            return None
        return int(gen), field


#: The path segment under a namespace that holds its queues.
QUEUES_SEGMENT = "_queues"
#: The path segment under a namespace that holds its semaphores.
SEMAPHORES_SEGMENT = "_semaphores"
#: Slot indexes are zero-padded so that key order is index order.
SLOT_DIGITS = 6


@dataclass(frozen=True, order=True)
class SemaphoreRef:
    """A semaphore's identity: the namespace and name of its JobSemaphore."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


#: slot keys kept per semaphore's keys (a limit is at most 10,000: slots.MAX_LIMIT)
_SLOT_KEYS_KEPT = 10_001


@dataclass(frozen=True)
class SemaphoreKeys:
    """``<root>/<ns>/_semaphores/<name>/``: ``spec``, ``slots/<index>``, ``waiters/<id>``
    (docs/semaphores.md, "Key layout")."""

    prefix: bytes

    # cached: a claim taking slots builds its compares from these every time
    @functools.cached_property
    def spec(self) -> bytes:
        return self.prefix + b"spec"

    @functools.cached_property
    def slots(self) -> bytes:
        return self.prefix + b"slots/"

    @functools.cached_property
    def slots_end(self) -> bytes:
        """The end of the ``slots/`` range (for "no key at or above the limit")."""
        return prefix_end(self.slots)

    # Slot keys are built three times per claim that takes a slot (compares,
    # puts, grants) and parsed back at every change the semaphore's view
    # applies: kept per index, a pure function of the prefix (never stale).
    @functools.cached_property
    def _slot_keys(self) -> dict[int, bytes]:
        return {}

    @functools.cached_property
    def _slot_indexes(self) -> dict[bytes, int]:
        return {}

    def slot(self, index: int) -> bytes:
        key = self._slot_keys.get(index)
        if key is None:
            key = self.slots + str(index).zfill(SLOT_DIGITS).encode()
            if len(self._slot_keys) < _SLOT_KEYS_KEPT:
                self._slot_keys[index] = key
                self._slot_indexes[key] = index
        return key

    def slot_index(self, key: bytes) -> int:
        index = self._slot_indexes.get(key)
        return int(key[len(self.slots):]) if index is None else index

    @functools.cached_property
    def waiters(self) -> bytes:
        return self.prefix + b"waiters/"

    @functools.cached_property
    def waiters_end(self) -> bytes:
        return prefix_end(self.waiters)

    def waiter(self, ticket: str) -> bytes:
        return self.waiters + ticket.encode()


@dataclass(frozen=True, order=True)
class QueueRef:
    """A queue's identity: the Kubernetes namespace and name of its JobQueue."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def parse(cls, text: str, default_namespace: str = DEFAULT_NAMESPACE) -> QueueRef:
        ref = JobRef.parse(text, default_namespace)
        return cls(ref.namespace, ref.name)


@dataclass(frozen=True, order=True)
class ItemRef:
    """One item of a queue; an item is a job of its queue."""

    queue: QueueRef
    id: str

    @property
    def namespace(self) -> str:
        return self.queue.namespace

    def __str__(self) -> str:
        return f"{self.queue}/{self.id}"


@dataclass(frozen=True)
class QueueKeys:
    """The etcd keys of one queue: ``prefix`` is ``<root>/<ns>/_queues/<queue>/``."""

    prefix: bytes

    @property
    def spec(self) -> bytes:
        return self.prefix + b"spec"

    def field_prefix(self, field: str) -> bytes:
        """``items/``, ``pending/``, ``held/``, ``claims/``, ``results/``,
        ``checkpoints/``, ``failed/`` or ``history/`` under the queue."""
        return self.prefix + field.encode() + b"/"

    def item(self, item_id: str) -> ItemKeys:
        return ItemKeys(self, item_id)


@dataclass(frozen=True)
class ItemKeys:
    """The keys of one item: a job's fields, each under its queue's sub-prefix,
    plus the item record and its pending key."""

    queue: QueueKeys
    id: str

    def _key(self, field: str) -> bytes:
        return self.queue.field_prefix(field) + self.id.encode()

    @property
    def spec(self) -> bytes:
        """The queue's spec: what a claim of the item compares, like a job's spec."""
        return self.queue.spec

    @property
    def item(self) -> bytes:
        return self._key("items")

    @property
    def pending(self) -> bytes:
        return self._key("pending")

    @property
    def holder(self) -> bytes:
        return self._key("held")

    @property
    def claims(self) -> bytes:
        return self._key("claims")

    @property
    def result(self) -> bytes:
        return self._key("results")

    @property
    def checkpoint(self) -> bytes:
        return self._key("checkpoints")

    @property
    def failed(self) -> bytes:
        return self._key("failed")

    @property
    def completion_deletes(self) -> tuple[bytes, ...]:
        """A completed item leaves the queue's pending set in the same transaction."""
        return (self.holder, self.pending)

    @functools.cached_property
    def history(self) -> HistoryKeys:
        """The item's tenure history: ``<queue prefix>history/<id>/`` (docs/history.md)."""
        return HistoryKeys(self.queue.field_prefix("history") + self.id.encode() + b"/")

    def fields(self) -> dict[str, bytes]:
        """Every key of the item by the name of the job field it stands for."""
        return {"spec": self.spec, "item": self.item, "pending": self.pending,
                "holder": self.holder, "claims": self.claims, "result": self.result,
                "checkpoint": self.checkpoint, "failed": self.failed}


@dataclass(frozen=True)
class KeySpace:
    """Maps jobs to keys and keys back to jobs, under one configurable root."""

    root: str = DEFAULT_ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", "/" + self.root.strip("/"))

    def job(self, ref: JobRef) -> JobKeys:
        return JobKeys(f"{self.root}/{ref.namespace}/{ref.name}/".encode())

    def queue(self, ref: QueueRef) -> QueueKeys:
        return QueueKeys(f"{self.root}/{ref.namespace}/{QUEUES_SEGMENT}/{ref.name}/".encode())

    def semaphore(self, ref: SemaphoreRef) -> SemaphoreKeys:
        return SemaphoreKeys(
            f"{self.root}/{ref.namespace}/{SEMAPHORES_SEGMENT}/{ref.name}/".encode())

    def queues_prefix(self, namespace: str) -> bytes:
        """Every queue of one namespace."""
        return f"{self.root}/{namespace}/{QUEUES_SEGMENT}/".encode()

    def namespace_prefix(self, namespace: str | None = None) -> bytes:
        """All jobs (``None``) or all jobs of one namespace."""
        if namespace is None:
            return f"{self.root}/".encode()
        return f"{self.root}/{namespace}/".encode()

    def parse(self, key: bytes) -> tuple[JobRef, str] | None:
        """``(job, field)`` for a key under the root, else ``None``."""
        text = key.decode(errors="replace")
        if not text.startswith(self.root + "/"):
            return None
        parts = text[len(self.root) + 1 :].split("/")
        if len(parts) != 3:
            return None
        return JobRef(parts[0], parts[1]), parts[2]

    def parse_history(self, key: bytes) -> JobRef | None:
        """The job whose tenure history ``key`` belongs to
        (``<root>/<ns>/_history/<name>/<generation>[/<field>]``), else ``None``."""
        text = key.decode(errors="replace")
        if not text.startswith(self.root + "/"):
            return None
        parts = text[len(self.root) + 1 :].split("/")
        if len(parts) not in (4, 5) or parts[1] != HISTORY_SEGMENT:
            return None
        return JobRef(parts[0], parts[2])
