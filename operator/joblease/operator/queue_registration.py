"""JobQueue spec -> etcd queue (``Queues.create``), and its deletion when the resource goes.

The JobQueue twin of :mod:`joblease.operator.registration`: ``Queues.create`` is
idempotent (it writes only when the stored spec differs, and re-enqueueing the
shard items is a no-op), so create, resume after an operator restart and spec
updates all call the same function; the ``joblease.io/finalizer`` finalizer
keeps the resource until ``Queues.delete`` removed every key of the queue.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.errors import InvalidInputError, QueueNotFoundError
from joblease.keys import JobRef, QueueRef
from joblease.operator.registration import semaphore_uses
from joblease.queue import Queues
from joblease.records import QueueSpec
from joblease.store import Compare

QUEUE_PLURAL = "jobqueues"
QUEUE_KIND = "JobQueue"
#: The CRD's default, repeated for specs that reach us without defaulting.
DEFAULT_MAX_ATTEMPTS = 3
MAX_SHARDS = 100_000


def queue_ref(namespace: str | None, name: str | None) -> QueueRef:
    if not namespace or not name:
        raise InvalidInputError("a JobQueue needs a namespace and a name")
    validation.job_ref(JobRef(namespace, name))
    return QueueRef(namespace, name)


def spec_from_resource(spec: Mapping[str, Any] | None) -> QueueSpec:
    """The queue a JobQueue's ``spec`` asks for, or :class:`InvalidInputError`.

    The CRD's schema refuses bad input at the API server already; these are the
    same limits, for specs that reach us some other way (a CRD edited by hand)."""
    spec = spec or {}
    ttl = validation.ttl(spec.get("leaseDurationSeconds"))
    max_attempts = validation.max_attempts(spec.get("maxAttempts", DEFAULT_MAX_ATTEMPTS))
    suspend = spec.get("suspend", False)
    if not isinstance(suspend, bool):
        raise InvalidInputError(f"invalid suspend {suspend!r}: true or false")
    shards = spec.get("shards", 0)
    if isinstance(shards, bool) or not isinstance(shards, int) or not 0 <= shards <= MAX_SHARDS:
        raise InvalidInputError(f"invalid shards {shards!r}: an integer 0..{MAX_SHARDS}")
    history_limit = validation.history_limit(
        spec.get("historyLimit", validation.DEFAULT_QUEUE_HISTORY_LIMIT),
        validation.MAX_QUEUE_HISTORY_LIMIT)
    return QueueSpec(lease_duration_seconds=ttl, max_attempts=max_attempts, suspend=suspend,
                     shards=shards, semaphores=semaphore_uses(spec.get("semaphores")),
                     history_limit=history_limit)


def retention_of(spec: Mapping[str, Any] | None) -> int | None:
    """``spec.ttlSecondsAfterFinished``: how long finished items are kept (None: forever)."""
    value = (spec or {}).get("ttlSecondsAfterFinished")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"invalid ttlSecondsAfterFinished {value!r}: seconds >= 0")
    return value


def spec_matches(resource_spec: Mapping[str, Any] | None, stored: QueueSpec | None) -> bool:
    """True when etcd's queue spec is what ``resource_spec`` asks for."""
    if stored is None:
        return False
    try:
        return spec_from_resource(resource_spec) == stored
    except InvalidInputError:
        return False


async def register(client: JobLeaseClient, namespace: str | None, name: str | None,
                   spec: Mapping[str, Any] | None, *,
                   guard: Sequence[Compare] = ()) -> tuple[QueueRef, int]:
    """Create (or update) the queue in etcd; returns it and the etcd revision.
    ``guard``: the elected operator's term, as for JobLease registration."""
    queue = queue_ref(namespace, name)
    revision = await Queues(client).create(queue, spec_from_resource(spec), guard=guard)
    return queue, revision


async def unregister(client: JobLeaseClient, namespace: str | None, name: str | None, *,
                     guard: Sequence[Compare] = ()) -> int | None:
    """Delete the queue and every item (idempotent); the etcd revision, or None
    if there was no queue any more."""
    try:
        return await Queues(client).delete(queue_ref(namespace, name), guard=guard)
    except QueueNotFoundError:
        return None
