"""Per-namespace etcd credentials for the namespaces that have JobLeases (opt-in).

With ``--tenant-credentials`` (``JOBLEASE_TENANT_CREDENTIALS=1``) the operator,
connected to etcd as ``root``, gives every namespace in which it sees a
JobLease its own etcd user and role (:mod:`joblease.tenancy`: read/write on
``<root>/<namespace>/`` only) and stores the credentials in the Secret
``joblease-etcd-credentials`` of that namespace. Sidecars mount it
(``JOBLEASE_ETCD_USERNAME`` from ``username``, the ``password`` key as the
file named by ``JOBLEASE_ETCD_PASSWORD_FILE``). When the last JobLease of the
namespace is deleted (after its keys were unregistered), the user and role
are removed and the Secret is deleted.

Idempotent: :meth:`TenantManager.ensure` passes the Secret's password to
``ensure_namespace_tenant``; when etcd accepts it nothing is written to etcd,
and the Secret is written only when its content differs. So restarts, resume
handlers and the periodic resync converge without rotating anything.

Rotation: annotate the Secret ``joblease.io/rotate=true`` (or call
:meth:`TenantManager.rotate`). The next reconcile of the namespace (a new
JobLease, an operator restart, or the resync every ``--tenant-resync-interval``
seconds) sets a new random password, writes it into the Secret and removes
the annotation. Running pods keep the old one until they are restarted
(docs/security.md, "Password rotation").

Only ``get``/``update``/``delete`` of this one Secret name (and ``create`` of
Secrets) are needed: the operator never lists or watches Secrets.

Secrets are never logged: log lines name the namespace, the etcd user and
what was done, never the password or the Secret's data.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import datetime as dt
import logging
from typing import Any

from joblease import tenancy
from joblease.errors import JobLeaseError
from joblease.etcd_store import EtcdStore
from joblease.operator.kube import ConflictError, KubeApi

log = logging.getLogger(__name__)

SECRET_NAME = "joblease-etcd-credentials"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "joblease-operator"
TENANT_LABEL = "joblease.io/tenant-credentials"
LABELS = {MANAGED_BY_LABEL: MANAGED_BY, TENANT_LABEL: "true"}
#: Set to "true" on the Secret to ask for a new password.
ROTATE_ANNOTATION = "joblease.io/rotate"
#: Written by the operator when it rotated the password (RFC 3339, UTC).
ROTATED_AT_ANNOTATION = "joblease.io/rotated-at"
DEFAULT_RESYNC_INTERVAL = 60.0
#: Attempts at a Secret write that lost a race (409) before giving up for this round.
WRITE_ATTEMPTS = 4


class ForeignSecretError(Exception):
    """A Secret of our name exists but is not managed by the operator: left alone."""


def managed(secret: dict[str, Any] | None) -> bool:
    labels = ((secret or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(MANAGED_BY_LABEL) == MANAGED_BY and labels.get(TENANT_LABEL) == "true")


def decode_data(secret: dict[str, Any] | None) -> dict[str, str]:
    """The Secret's ``data``, base64-decoded (keys that do not decode are dropped)."""
    out: dict[str, str] = {}
    for key, value in ((secret or {}).get("data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode()
        except (binascii.Error, UnicodeDecodeError, TypeError):
            continue
    return out


def encode_data(data: dict[str, str]) -> dict[str, str]:
    return {k: base64.b64encode(v.encode()).decode() for k, v in sorted(data.items())}


def rotation_requested(secret: dict[str, Any] | None) -> bool:
    annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
    return str(annotations.get(ROTATE_ANNOTATION, "")).strip().lower() == "true"


def live_jobleases(items: list[dict[str, Any]], *, excluding: str | None = None) -> list[str]:
    """Names of the JobLeases that are not being deleted (and not ``excluding``)."""
    return sorted(o["metadata"]["name"] for o in items
                  if not o["metadata"].get("deletionTimestamp")
                  and o["metadata"]["name"] != excluding)


class TenantManager:
    """Ensures, rotates and removes namespace tenants and their Secrets.

    One lock per namespace serialises the operations on that namespace, so a
    removal (last JobLease deleted) and an ensure (a new JobLease) cannot
    interleave: whichever runs second sees the other's result.
    """

    def __init__(self, store: EtcdStore, root_prefix: str, kube: KubeApi, *,
                 resync_interval: float = DEFAULT_RESYNC_INTERVAL) -> None:
        self.store = store
        self.root_prefix = root_prefix
        self.kube = kube
        self.resync_interval = resync_interval
        self.known: set[str] = set()  # namespaces this process ensured and did not remove
        self._locks: dict[str, asyncio.Lock] = {}

    def _lock(self, namespace: str) -> asyncio.Lock:
        return self._locks.setdefault(namespace, asyncio.Lock())

    # -- the operations ----------------------------------------------------------------------

    async def ensure(self, namespace: str) -> str:
        """Make the namespace's tenant and Secret agree; returns what was done
        (``created``, ``updated``, ``rotated`` or ``unchanged``)."""
        async with self._lock(namespace):
            outcome = await self._ensure(namespace, rotate=False)
            self.known.add(namespace)
            return outcome

    async def rotate(self, namespace: str) -> str:
        """Give the namespace's tenant a new random password and store it."""
        async with self._lock(namespace):
            outcome = await self._ensure(namespace, rotate=True)
            self.known.add(namespace)
            return outcome

    async def remove_if_unused(self, namespace: str, *, deleting: str | None = None) -> bool:
        """Remove the tenant and its Secret if no JobLease of the namespace is left
        (``deleting``: the one whose deletion is being handled). True if removed."""
        async with self._lock(namespace):
            remaining = live_jobleases(await self.kube.list_jobleases(namespace),
                                       excluding=deleting)
            if remaining:
                return False
            await self._remove(namespace)
            return True

    async def remove(self, namespace: str) -> None:
        """Remove the tenant and its Secret unconditionally."""
        async with self._lock(namespace):
            await self._remove(namespace)

    async def resync(self) -> None:
        """Re-ensure every namespace this process manages (heals a deleted or edited
        Secret, performs requested rotations); errors are logged, not raised."""
        for namespace in sorted(self.known):
            try:
                async with self._lock(namespace):
                    if namespace in self.known:  # not removed while we waited
                        await self._ensure(namespace, rotate=False)
            except Exception as exc:
                log.warning("tenant credentials of namespace %s: resync failed: %s",
                            namespace, _safe(exc))

    async def run(self) -> None:
        """Call :meth:`resync` every ``resync_interval`` seconds, forever."""
        if self.resync_interval <= 0:
            await asyncio.Event().wait()
        while True:
            await asyncio.sleep(self.resync_interval)
            await self.resync()

    # -- internals ---------------------------------------------------------------------------

    async def _ensure(self, namespace: str, *, rotate: bool) -> str:
        for attempt in range(WRITE_ATTEMPTS):
            secret = await self.kube.get_secret(namespace, SECRET_NAME)
            if secret is not None and not managed(secret):
                raise ForeignSecretError(
                    f"Secret {namespace}/{SECRET_NAME} exists but is not labelled "
                    f"{MANAGED_BY_LABEL}={MANAGED_BY}, {TENANT_LABEL}=true; not overwriting it")
            rotating = rotate or rotation_requested(secret)
            stored = decode_data(secret).get("password") or None
            creds = await self._etcd_ensure(namespace, stored, rotating)
            try:
                wrote = await self._write_secret(namespace, secret, creds, rotated=rotating)
            except ConflictError:
                # Someone else wrote (or created) the Secret since we read it: start
                # over from its new content; etcd keeps the password if the Secret has it.
                if attempt == WRITE_ATTEMPTS - 1:
                    raise
                continue
            outcome = ("created" if secret is None else "rotated" if rotating
                       else "updated" if wrote else "unchanged")
            if outcome != "unchanged":
                log.info("tenant credentials of namespace %s: %s (etcd user %s, Secret %s)",
                         namespace, outcome, creds.username, SECRET_NAME)
            else:
                log.debug("tenant credentials of namespace %s: unchanged", namespace)
            return outcome
        raise AssertionError("unreachable")

    async def _etcd_ensure(self, namespace: str, stored: str | None, rotate: bool
                           ) -> tenancy.TenantCredentials:
        if rotate:
            creds = await tenancy.ensure_namespace_tenant(self.store, self.root_prefix,
                                                          namespace, password=stored)
            if creds.password == stored:  # kept the old one: now replace it
                creds = await tenancy.rotate_tenant_password(self.store, self.root_prefix,
                                                             namespace)
            return creds
        return await tenancy.ensure_namespace_tenant(self.store, self.root_prefix, namespace,
                                                     password=stored)

    async def _write_secret(self, namespace: str, secret: dict[str, Any] | None,
                            creds: tenancy.TenantCredentials, *, rotated: bool) -> bool:
        """Create or replace the Secret if its content differs; True if written."""
        data = creds.secret_data()
        if secret is None:
            body: dict[str, Any] = {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": SECRET_NAME, "namespace": namespace,
                             "labels": dict(LABELS)},
                "data": encode_data(data)}
            if rotated:
                body["metadata"]["annotations"] = {ROTATED_AT_ANNOTATION: _now()}
            await self.kube.create_secret(namespace, body)
            return True
        meta = dict(secret.get("metadata") or {})
        labels = {**(meta.get("labels") or {}), **LABELS}
        annotations = dict(meta.get("annotations") or {})
        annotations.pop(ROTATE_ANNOTATION, None)
        if rotated:
            annotations[ROTATED_AT_ANNOTATION] = _now()
        if (decode_data(secret) == data and labels == (meta.get("labels") or {})
                and annotations == (meta.get("annotations") or {})
                and secret.get("type", "Opaque") == "Opaque"):
            return False
        body = {"apiVersion": "v1", "kind": "Secret", "type": secret.get("type", "Opaque"),
                "metadata": {**{k: v for k, v in meta.items() if k != "managedFields"},
                             "labels": labels, "annotations": annotations},
                "data": encode_data(data)}
        await self.kube.replace_secret(namespace, SECRET_NAME, body)
        return True

    async def _remove(self, namespace: str) -> None:
        removed = await tenancy.remove_namespace_tenant(self.store, namespace)
        secret = await self.kube.get_secret(namespace, SECRET_NAME)
        kept = "absent"
        if secret is not None and managed(secret):
            deleted = await self.kube.delete_secret(namespace, SECRET_NAME,
                                                    uid=secret["metadata"]["uid"])
            kept = "deleted" if deleted else "absent"
        elif secret is not None:
            kept = f"left in place (not labelled {MANAGED_BY_LABEL}={MANAGED_BY})"
        self.known.discard(namespace)
        log.info("tenant credentials of namespace %s: removed (etcd user %s %s, Secret %s %s)",
                 namespace, tenancy.TENANT_PREFIX + namespace,
                 "deleted" if removed else "was absent", SECRET_NAME, kept)


async def warn_if_auth_disabled(store: EtcdStore) -> None:
    """Tenant users only isolate anything when etcd auth is on: say so if it is not."""
    try:
        enabled = await tenancy.EtcdAuthAdmin(store).auth_enabled()
    except JobLeaseError as exc:
        log.warning("tenant credentials: cannot read etcd's auth status: %s", _safe(exc))
        return
    if not enabled:
        log.warning("tenant credentials are on but etcd auth is disabled: the per-namespace "
                    "users are created, yet etcd does not enforce them")


async def supervise(manager: TenantManager) -> None:
    """:meth:`TenantManager.run`, restarted after an unexpected error (never raises
    except on cancellation), so a resync bug cannot stop the operator."""
    while True:
        try:
            await manager.run()
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("tenant credentials resync loop failed; restarting it")
            await asyncio.sleep(max(manager.resync_interval, 1.0))


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _safe(exc: BaseException) -> str:
    """An error's text for a log line (errors here never carry Secret data)."""
    return f"{type(exc).__name__}: {exc}"

