"""JobSemaphore spec -> etcd semaphore (``Semaphores.create``), and its deletion.

The JobSemaphore twin of :mod:`joblease.operator.queue_registration`:
``Semaphores.create`` is idempotent (it writes only when the stored limit
differs), so create, resume after an operator restart and a changed limit all
call the same function; the ``joblease.io/finalizer`` finalizer keeps the
resource until ``Semaphores.delete`` removed every key of the semaphore.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.errors import InvalidInputError, SemaphoreNotFoundError
from joblease.keys import JobRef, SemaphoreRef
from joblease.semaphore import Semaphores
from joblease.slots import MAX_LIMIT
from joblease.store import Compare

SEMAPHORE_PLURAL = "jobsemaphores"
SEMAPHORE_KIND = "JobSemaphore"


def semaphore_ref(namespace: str | None, name: str | None) -> SemaphoreRef:
    if not namespace or not name:
        raise InvalidInputError("a JobSemaphore needs a namespace and a name")
    validation.job_ref(JobRef(namespace, name))
    return SemaphoreRef(namespace, name)


def limit_from_resource(spec: Mapping[str, Any] | None) -> int:
    """The limit a JobSemaphore's ``spec`` asks for, or :class:`InvalidInputError`
    (the CRD's schema refuses these at the API server already; the same check for
    specs that reach us some other way)."""
    limit = (spec or {}).get("limit")
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidInputError(f"invalid limit {limit!r}: an integer 1..{MAX_LIMIT}")
    return limit


def spec_matches(resource_spec: Mapping[str, Any] | None, stored_limit: int | None) -> bool:
    """True when etcd's limit is what ``resource_spec`` asks for."""
    try:
        return stored_limit is not None and limit_from_resource(resource_spec) == stored_limit
    except InvalidInputError:
        return False


async def register(client: JobLeaseClient, namespace: str | None, name: str | None,
                   spec: Mapping[str, Any] | None, *,
                   guard: Sequence[Compare] = ()) -> tuple[SemaphoreRef, int]:
    """Create the semaphore in etcd or change its limit; returns it and the etcd
    revision. ``guard``: the elected operator's term, as for JobLease registration."""
    ref = semaphore_ref(namespace, name)
    revision = await Semaphores(client).create(ref, limit_from_resource(spec), guard=guard)
    return ref, revision


async def unregister(client: JobLeaseClient, namespace: str | None, name: str | None, *,
                     guard: Sequence[Compare] = ()) -> int | None:
    """Delete the semaphore's spec, slots and waiters (idempotent); the etcd
    revision, or None if there was no semaphore any more."""
    try:
        return await Semaphores(client).delete(semaphore_ref(namespace, name), guard=guard)
    except SemaphoreNotFoundError:
        return None
