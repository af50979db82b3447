"""kopf handlers: thin adapters from resource lifecycle to :mod:`registration`.

Each handler turns kopf's arguments into a plain call and maps our errors to
kopf's retry semantics: invalid input is permanent (kopf posts a Warning
Event and does not retry), an unreachable etcd is temporary (retried with a
delay; on delete the finalizer stays until the keys are really gone).
The status is never written here: the mirror is its single writer.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import kopf

from joblease.client import JobLeaseClient
from joblease.errors import FencedError, InvalidInputError, JobLeaseError, StoreUnavailableError
from joblease.operator import queue_registration, registration, semaphore_registration
from joblease.operator.election import Leadership
from joblease.operator.kube import KubeApiError, kopf_session
from joblease.operator.mirror import Mirror
from joblease.operator.periodic_mirror import PeriodicMirror
from joblease.operator.queue_mirror import QueueMirror
from joblease.operator.queue_registration import QUEUE_PLURAL, queue_ref
from joblease.operator.registration import GROUP, PLURAL, VERSION
from joblease.operator.semaphore_mirror import SemaphoreMirror
from joblease.operator.semaphore_registration import SEMAPHORE_PLURAL, semaphore_ref
from joblease.operator.tenants import ForeignSecretError, TenantManager
from joblease.store import Compare

#: Seconds before kopf retries a handler that could not reach etcd.
RETRY_DELAY = 5.0


def _kopf_error(exc: JobLeaseError, kind: str = "JobLease") -> Exception:
    if isinstance(exc, FencedError):
        return kopf.TemporaryError(f"not the leader any more: {exc}", delay=RETRY_DELAY)
    if isinstance(exc, StoreUnavailableError):
        return kopf.TemporaryError(f"etcd unavailable: {exc}", delay=RETRY_DELAY)
    if isinstance(exc, InvalidInputError):
        return kopf.PermanentError(f"invalid {kind}: {exc}")
    return kopf.TemporaryError(str(exc), delay=RETRY_DELAY)


#: Seconds before retrying when a foreign Secret blocks the tenant credentials.
FOREIGN_SECRET_DELAY = 60.0


def _tenant_error(exc: Exception) -> Exception:
    if isinstance(exc, JobLeaseError):
        return _kopf_error(exc)
    if isinstance(exc, ForeignSecretError):
        return kopf.TemporaryError(str(exc), delay=FOREIGN_SECRET_DELAY)
    return kopf.TemporaryError(f"Kubernetes API: {exc}", delay=RETRY_DELAY)


def build_registry(client: JobLeaseClient, mirror: Mirror,
                   login: Callable[[], kopf.ConnectionInfo],
                   tenants: TenantManager | None = None,
                   leadership: Leadership | None = None,
                   queue_mirror: QueueMirror | None = None,
                   semaphore_mirror: SemaphoreMirror | None = None) -> kopf.OperatorRegistry:
    """A fresh kopf registry whose handlers close over this operator's parts.

    ``tenants``: per-namespace etcd credentials (``--tenant-credentials``), or None.
    ``leadership``: this replica's elected term, or None (``--no-leader-election``).
    With it, every registration and unregistration is fenced by the term
    (``Leadership.guard()``): etcd refuses it once another replica may lead, and
    such a refusal (``FencedError``) ends the leadership, so the process steps
    down (``run_operator``: exit 3) instead of retrying.
    ``queue_mirror``: with it, JobQueues are served too (:func:`_mirrored_handlers`).
    ``semaphore_mirror``: with it, JobSemaphores are served too (:func:`_mirrored_handlers`).
    """
    registry = kopf.OperatorRegistry()
    resource = (GROUP, VERSION, PLURAL)
    guard = leadership.guard() if leadership is not None else ()

    def fenced(exc: JobLeaseError) -> None:
        if isinstance(exc, FencedError) and leadership is not None:
            leadership.fenced(str(exc))

    @kopf.on.login(id="login", registry=registry)
    async def authenticate(**_: Any) -> kopf.AiohttpSession:
        """The same credentials the mirror's API client uses, in a session with a
        bounded number of requests in flight (:func:`kube.kopf_session`)."""
        return kopf_session(login())

    async def _register(namespace: str | None, name: str, spec: Any, logger: Any) -> None:
        try:
            job, revision = await registration.register(client, namespace, name, dict(spec),
                                                        guard=guard)
        except JobLeaseError as exc:
            fenced(exc)
            raise _kopf_error(exc) from exc
        logger.info("registered %s in etcd (revision %d)", job, revision)
        mirror.refresh(job)

    @kopf.on.create(*resource, id="register", registry=registry)
    async def register_on_create(namespace: str | None, name: str, spec: Any, logger: Any,
                                 **_: Any) -> None:
        await _register(namespace, name, spec, logger)

    @kopf.on.resume(*resource, id="register", registry=registry)
    async def register_on_resume(namespace: str | None, name: str, spec: Any, logger: Any,
                                 **_: Any) -> None:
        """After an operator restart: idempotent, writes only if etcd differs."""
        await _register(namespace, name, spec, logger)

    @kopf.on.update(*resource, id="register", field="spec",
                    registry=registry)
    async def register_on_update(namespace: str | None, name: str, spec: Any, logger: Any,
                                 **_: Any) -> None:
        await _register(namespace, name, spec, logger)

    @kopf.on.delete(*resource, id="unregister", registry=registry)
    async def unregister_on_delete(namespace: str | None, name: str, logger: Any, **_: Any) -> None:
        """Remove the etcd keys; kopf releases the finalizer only after this succeeds."""
        try:
            revision = await registration.unregister(client, namespace, name, guard=guard)
        except JobLeaseError as exc:
            fenced(exc)
            raise _kopf_error(exc) from exc
        logger.info("removed %s/%s from etcd (revision %d)", namespace, name, revision)
        if tenants is not None and tenants.namespace_label is None and namespace:
            # After the keys are gone: if this was the namespace's last JobLease, its
            # etcd user, role and Secret go too (the finalizer waits for that).
            try:
                if await tenants.remove_if_unused(namespace, deleting=name):
                    logger.info("last JobLease of %s deleted: etcd tenant credentials removed",
                                namespace)
            except (JobLeaseError, KubeApiError) as exc:
                raise _tenant_error(exc) from exc

    if queue_mirror is not None:
        _mirrored_handlers(registry, QUEUES, client, queue_mirror, guard, fenced)
    if semaphore_mirror is not None:
        _mirrored_handlers(registry, SEMAPHORES, client, semaphore_mirror, guard, fenced)

    if tenants is not None and tenants.namespace_label is not None:
        follower = tenants

        @kopf.on.event("", "v1", "namespaces", id="tenant-namespace", registry=registry)
        async def tenant_follows_namespace(name: str, type: str | None, labels: Any,
                                           meta: Any, logger: Any, **_: Any) -> None:
            """The label on or off (or the namespace gone): the tenant follows at once;
            failures are left to the resync, which lists the labelled namespaces."""
            deleted = type == "DELETED" or bool(meta.get("deletionTimestamp"))
            try:
                outcome = await follower.follow_namespace(name, dict(labels or {}),
                                                          deleted=deleted)
            except (JobLeaseError, KubeApiError, ForeignSecretError) as exc:
                logger.warning("etcd tenant credentials of namespace %s: %s (retried by the "
                               "resync)", name, exc)
                return
            if outcome not in ("absent", "unchanged", "not served"):
                logger.info("etcd tenant credentials of namespace %s: %s", name, outcome)

    elif tenants is not None:
        manager = tenants

        async def _ensure_tenant(namespace: str | None, logger: Any) -> None:
            if not namespace:
                return
            try:
                outcome = await manager.ensure(namespace)
            except (JobLeaseError, KubeApiError, ForeignSecretError) as exc:
                raise _tenant_error(exc) from exc
            logger.info("etcd tenant credentials of namespace %s: %s", namespace, outcome)

        # A separate handler id: a failure here is retried on its own and does not
        # hold back the registration.
        @kopf.on.create(*resource, id="tenant", registry=registry)
        async def tenant_on_create(namespace: str | None, logger: Any, **_: Any) -> None:
            await _ensure_tenant(namespace, logger)

        @kopf.on.resume(*resource, id="tenant", registry=registry)
        async def tenant_on_resume(namespace: str | None, logger: Any, **_: Any) -> None:
            await _ensure_tenant(namespace, logger)

    return registry


@dataclass(frozen=True)
class _MirroredKind:
    """A kind the operator registers in etcd and mirrors on a timer (JobQueue,
    JobSemaphore): its plural, its noun (handler ids, logs), its registration."""

    plural: str
    kind: str
    noun: str
    register: Callable[..., Awaitable[tuple[Any, int]]]
    unregister: Callable[..., Awaitable[int | None]]
    ref: Callable[[str | None, str | None], Any]


QUEUES = _MirroredKind(QUEUE_PLURAL, "JobQueue", "queue", queue_registration.register,
                       queue_registration.unregister, queue_ref)
SEMAPHORES = _MirroredKind(SEMAPHORE_PLURAL, "JobSemaphore", "semaphore",
                           semaphore_registration.register, semaphore_registration.unregister,
                           semaphore_ref)


def _mirrored_handlers(registry: kopf.OperatorRegistry, kind: _MirroredKind,
                       client: JobLeaseClient, mirror: PeriodicMirror[Any, Any],
                       guard: Sequence[Compare], fenced: Callable[[JobLeaseError], None]
                       ) -> None:
    """create/resume/update -> the kind's registration in etcd (fenced by the same term
    as JobLease registration), then a status refresh; delete -> its unregistration
    before kopf releases the finalizer (a JobSemaphore's holders keep their jobs:
    docs/semaphores.md). Handler ids ``register-<noun>``, ``delete-<noun>``."""
    resource = (GROUP, VERSION, kind.plural)

    async def register(namespace: str | None, name: str, spec: Any, logger: Any) -> None:
        try:
            ref, revision = await kind.register(client, namespace, name, dict(spec),
                                                guard=guard)
        except JobLeaseError as exc:
            fenced(exc)
            raise _kopf_error(exc, kind.kind) from exc
        logger.info("%s %s in etcd (revision %d)", kind.noun, ref, revision)
        mirror.track(ref)

    @kopf.on.create(*resource, id=f"register-{kind.noun}", registry=registry)
    async def on_create(namespace: str | None, name: str, spec: Any, logger: Any,
                        **_: Any) -> None:
        await register(namespace, name, spec, logger)

    @kopf.on.resume(*resource, id=f"register-{kind.noun}", registry=registry)
    async def on_resume(namespace: str | None, name: str, spec: Any, logger: Any,
                        **_: Any) -> None:
        """After an operator restart: idempotent, writes only if etcd differs."""
        await register(namespace, name, spec, logger)

    @kopf.on.update(*resource, id=f"register-{kind.noun}", field="spec", registry=registry)
    async def on_update(namespace: str | None, name: str, spec: Any, logger: Any,
                        **_: Any) -> None:
        await register(namespace, name, spec, logger)

    @kopf.on.delete(*resource, id=f"delete-{kind.noun}", registry=registry)
    async def on_delete(namespace: str | None, name: str, logger: Any, **_: Any) -> None:
        """Remove the keys; kopf releases the finalizer only after this succeeds."""
        try:
            revision = await kind.unregister(client, namespace, name, guard=guard)
        except JobLeaseError as exc:
            fenced(exc)
            raise _kopf_error(exc, kind.kind) from exc
        try:
            mirror.untrack(kind.ref(namespace, name))
        except JobLeaseError:
            pass  # a name no resource of the kind can have was never tracked
        logger.info("removed %s %s/%s from etcd (%s)", kind.noun, namespace, name,
                    "already gone" if revision is None else f"revision {revision}")
