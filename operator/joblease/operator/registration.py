"""JobLease spec -> etcd registration, and its removal when the resource goes.

Registration is idempotent (``JobLeaseClient.register`` writes only when the
stored spec differs), so create, resume after an operator restart and spec
updates all call the same function. Deletion is guarded by the
``joblease.io/finalizer`` finalizer: the resource disappears only after its
etcd keys are gone, so a live holder learns at its next check that it lost
(its holder key no longer exists) instead of holding an orphan forever.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.errors import InvalidInputError
from joblease.keys import JobRef
from joblease.records import JobSpec, SemaphoreUse
from joblease.slots import check_uses
from joblease.store import Compare

GROUP = "joblease.io"
VERSION = "v1alpha1"
PLURAL = "jobleases"
KIND = "JobLease"
FINALIZER = "joblease.io/finalizer"
#: The CRD's default, repeated for specs that reach us without defaulting.
DEFAULT_MAX_ATTEMPTS = 3


def job_ref(namespace: str | None, name: str | None) -> JobRef:
    if not namespace or not name:
        raise InvalidInputError("a JobLease needs a namespace and a name")
    return validation.job_ref(JobRef(namespace, name))


def spec_from_resource(spec: Mapping[str, Any] | None) -> JobSpec:
    """The registration a JobLease's ``spec`` asks for, or :class:`InvalidInputError`.

    The CRD's schema refuses most bad input at the API server already; these
    checks are the same limits the protocol enforces (e.g. the 64 KiB JSON
    size and 64-level nesting of ``parameters``, which OpenAPI cannot
    express: docs/protocol.md#stored-values).
    """
    spec = spec or {}
    ttl = validation.ttl(spec.get("leaseDurationSeconds"))
    max_attempts = validation.max_attempts(spec.get("maxAttempts", DEFAULT_MAX_ATTEMPTS))
    parameters = spec.get("parameters") or {}
    if not isinstance(parameters, Mapping):
        raise InvalidInputError("invalid parameters: must be an object")
    parameters = dict(parameters)
    validation.json_payload(parameters, "parameters", validation.MAX_PARAMETERS_BYTES)
    # the CRD's default, repeated for specs that reach us without defaulting
    history_limit = validation.history_limit(
        spec.get("historyLimit", validation.DEFAULT_HISTORY_LIMIT))
    return JobSpec(lease_duration_seconds=ttl, max_attempts=max_attempts, parameters=parameters,
                   semaphores=semaphore_uses(spec.get("semaphores")),
                   history_limit=history_limit)


def semaphore_uses(value: Any) -> tuple[SemaphoreUse, ...]:
    """A resource's ``spec.semaphores`` (``[{name, weight}]``), checked as the
    protocol checks it (docs/semaphores.md), in name order."""
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(u, Mapping) for u in value):
        raise InvalidInputError("invalid semaphores: must be a list of {name, weight}")
    uses = [SemaphoreUse(u.get("name"), u.get("weight", 1)) for u in value]
    check_uses(uses)
    return tuple(sorted(uses))


def spec_matches(resource_spec: Mapping[str, Any] | None, registered: JobSpec | None) -> bool:
    """True when etcd's registration is what ``resource_spec`` asks for."""
    if registered is None:
        return False
    try:
        return spec_from_resource(resource_spec) == registered
    except InvalidInputError:
        return False


async def register(client: JobLeaseClient, namespace: str | None, name: str | None,
                   spec: Mapping[str, Any] | None, *,
                   guard: Sequence[Compare] = ()) -> tuple[JobRef, int]:
    """Register (or re-register) the job; returns it and the etcd revision.

    ``guard``: the elected operator's term (``Leadership.guard()``); a deposed
    leader's write is refused with ``FencedError``. Empty without an election."""
    job = job_ref(namespace, name)
    revision = await client.register(job, spec_from_resource(spec), guard=guard)
    return job, revision


async def unregister(client: JobLeaseClient, namespace: str | None, name: str | None, *,
                     guard: Sequence[Compare] = ()) -> int:
    """Remove every etcd key of the job (idempotent); returns the etcd revision.
    ``guard`` as for :func:`register`."""
    return await client.unregister(job_ref(namespace, name), guard=guard)
