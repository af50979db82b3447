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

**Following a namespace label** (``namespace_label``, the chart's default: the
injection webhook's ``joblease.io/inject=enabled``): the namespaces carrying the
label have tenants, whether or not they have JobLeases yet; removing the label
or deleting the namespace removes the tenant (at once on the namespace's watch
event, at the latest on the next resync, which also removes the tenant users of
namespaces that lost the label while no operator ran).

**Rotation without downtime**: each namespace has two etcd users
(:func:`joblease.tenancy.tenant_users`). A rotation gives the *other* user a new
password and points the Secret at it, annotating the Secret with the user left
behind and when it is revoked (``joblease.io/retiring-user``,
``joblease.io/retire-after``: now + ``rotation_grace``, longer than the kubelet
takes to refresh a mounted Secret). Sidecars re-read the mounted username and
password when etcd refuses their token, so they move over within that grace;
the first resync after it deletes the retiring user.

**Transport material**: ``tls_files`` (the chart's worker client certificate, one
that names no etcd user) is copied into each Secret next to the credentials, so
a sidecar mounts one Secret; the operator's own full-access certificate never
leaves the release namespace.

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
import os
from collections.abc import Callable
from typing import Any

from joblease import tenancy
from joblease.errors import InvalidInputError, JobLeaseError, PermissionDeniedError
from joblease.etcd_store import EtcdConfig, EtcdStore
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
#: During a rotation: the user the Secret named before, and when it is deleted.
RETIRING_USER_ANNOTATION = "joblease.io/retiring-user"
RETIRE_AFTER_ANNOTATION = "joblease.io/retire-after"
#: Seconds both users of a rotation work: longer than the kubelet's refresh of a
#: mounted Secret (its sync period plus its cache TTL, one minute each by default).
DEFAULT_ROTATION_GRACE = 150.0
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
                 resync_interval: float = DEFAULT_RESYNC_INTERVAL,
                 namespace_label: str | None = None,
                 tls_files: dict[str, str] | None = None,
                 rotation_grace: float = DEFAULT_ROTATION_GRACE,
                 served: Callable[[str], bool] = lambda _: True) -> None:
        self.store = store
        self.root_prefix = root_prefix
        self.kube = kube
        self.resync_interval = resync_interval
        #: ``key=value``: tenants follow this namespace label (None: JobLeases).
        self.namespace_label = namespace_label
        self.tls_files = dict(tls_files or {})
        self.rotation_grace = rotation_grace
        self.served = served
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

    def labelled(self, labels: dict[str, str] | None) -> bool:
        """Whether a namespace with ``labels`` opted in (label mode only)."""
        if self.namespace_label is None:
            return False
        key, _, value = self.namespace_label.partition("=")
        return (labels or {}).get(key) == value

    async def follow_namespace(self, namespace: str, labels: dict[str, str] | None, *,
                               deleted: bool) -> str:
        """Label mode: ensure or remove the tenant of ``namespace`` as its labels say."""
        if not self.served(namespace):
            return "not served"
        if deleted or not self.labelled(labels):
            async with self._lock(namespace):
                if namespace not in self.known:
                    # (a tenant left from before this process is the resync's: it
                    # compares etcd's tenant users with the labelled namespaces)
                    return "absent"
                await self._remove(namespace)
            return "removed"
        return await self.ensure(namespace)

    async def resync(self) -> None:
        """Re-ensure every namespace this process manages (heals a deleted or edited
        Secret, performs requested rotations and due revocations); in label mode,
        first the labelled namespaces are listed and tenants of any other namespace
        removed. Errors are logged, not raised."""
        if self.namespace_label is not None:
            try:
                await self._follow_labels()
            except Exception as exc:
                log.warning("tenant credentials: listing namespaces labelled %s failed: %s",
                            self.namespace_label, _safe(exc))
        for namespace in sorted(self.known):
            try:
                async with self._lock(namespace):
                    if namespace in self.known:  # not removed while we waited
                        await self._ensure(namespace, rotate=False)
            except Exception as exc:
                log.warning("tenant credentials of namespace %s: resync failed: %s",
                            namespace, _safe(exc))

    async def _follow_labels(self) -> None:
        assert self.namespace_label is not None
        wanted = {ns for ns in await self.kube.list_namespaces(self.namespace_label)
                  if self.served(ns)}
        present = {ns for ns in await tenancy.tenant_namespaces(self.store) if self.served(ns)}
        for namespace in sorted(wanted - self.known):
            self.known.add(namespace)  # ensured by the loop over known that follows
        for namespace in sorted((present | self.known) - wanted):
            try:
                async with self._lock(namespace):
                    await self._remove(namespace)
            except Exception as exc:
                log.warning("tenant credentials of namespace %s: removal failed: %s",
                            namespace, _safe(exc))

    async def run(self) -> None:
        """Call :meth:`resync` every ``resync_interval`` seconds, forever."""
        if self.namespace_label is not None:
            await self.resync()  # at once: namespaces that opted in or out meanwhile
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
            data = decode_data(secret)
            stored = data.get("password") or None
            user = data.get("username")
            if user not in tenancy.tenant_users(namespace):
                user = None
            notes = dict(((secret or {}).get("metadata") or {}).get("annotations") or {})
            retiring = notes.get(RETIRING_USER_ANNOTATION)
            if retiring not in tenancy.tenant_users(namespace) or retiring == user:
                retiring = None
            # one rotation at a time: a request during one waits for its revocation
            rotating = (rotate or rotation_requested(secret)) and retiring is None
            creds = await tenancy.ensure_namespace_tenant(
                self.store, self.root_prefix, namespace, password=stored, username=user)
            retire: tuple[str, str] | None = None
            if rotating and secret is not None and creds.password == stored:
                new = await tenancy.rotate_to_other_user(self.store, self.root_prefix,
                                                         namespace, creds.username)
                retire = (creds.username, _now(self.rotation_grace))
                creds = new
            elif retiring is not None:
                if _due(notes.get(RETIRE_AFTER_ANNOTATION)):
                    await tenancy.revoke_tenant_user(self.store, namespace, retiring)
                    log.info("tenant credentials of namespace %s: retired etcd user %s",
                             namespace, retiring)
                else:
                    retire = (retiring, str(notes.get(RETIRE_AFTER_ANNOTATION)))
            else:
                # no rotation under way: the namespace's other user must not exist
                other = [u for u in tenancy.tenant_users(namespace) if u != creds.username]
                await tenancy.revoke_tenant_user(self.store, namespace, other[0])
            try:
                wrote = await self._write_secret(namespace, secret, creds,
                                                 rotated=rotating,
                                                 retire=retire)
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

    async def _write_secret(self, namespace: str, secret: dict[str, Any] | None,
                            creds: tenancy.TenantCredentials, *, rotated: bool,
                            retire: tuple[str, str] | None) -> bool:
        """Create or replace the Secret if its content differs; True if written.
        ``retire``: (user, when) of a rotation under way, kept in annotations."""
        data = {**creds.secret_data(), **self.tls_files}
        if secret is None:
            body: dict[str, Any] = {
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": SECRET_NAME, "namespace": namespace,
                             "labels": dict(LABELS)},
                "data": encode_data(data)}
            await self.kube.create_secret(namespace, body)
            return True
        meta = dict(secret.get("metadata") or {})
        labels = {**(meta.get("labels") or {}), **LABELS}
        annotations = dict(meta.get("annotations") or {})
        annotations.pop(ROTATE_ANNOTATION, None)
        annotations.pop(RETIRING_USER_ANNOTATION, None)
        annotations.pop(RETIRE_AFTER_ANNOTATION, None)
        if retire is not None:
            annotations[RETIRING_USER_ANNOTATION], annotations[RETIRE_AFTER_ANNOTATION] = retire
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


#: The transport files a tenant Secret carries for its sidecars (the chart's worker
#: client certificate: it names no etcd user, so it grants nothing with auth on).
TLS_KEYS = ("ca.crt", "tls.crt", "tls.key")


def read_tls_dir(directory: str) -> dict[str, str]:
    """``TLS_KEYS`` read from ``directory`` (a mounted Secret), for the tenant Secrets."""
    files: dict[str, str] = {}
    for key in TLS_KEYS:
        try:
            with open(os.path.join(directory, key), encoding="utf-8") as f:
                files[key] = f.read()
        except OSError as exc:
            raise InvalidInputError(f"tenant TLS directory {directory}: cannot read {key}: "
                                    f"{exc.strerror}") from None
    return files


async def turn_auth_on(config: EtcdConfig) -> None:
    """Turn etcd auth on, with ``config``'s user as ``root`` and its password, if it is
    off (the chart's bundled etcd starts without auth; etcd has no flag for it).

    The status is read as ``root`` first: once auth is on, a request without a token
    over mutual TLS is the certificate's CN user, which does not exist (the chart's
    certificates name no etcd user), so only root can ask. etcd answers root's
    authentication with "authentication is not enabled" while it is off; then the
    switch goes over a connection without credentials, which etcd allows only then.
    A wrong root password while auth is on raises ``PermissionDeniedError``.
    """
    assert config.username and config.password
    if config.username != tenancy.ROOT_USER:
        raise InvalidInputError(f"enabling etcd auth needs the user {tenancy.ROOT_USER!r}, "
                                f"not {config.username!r}")
    if await _auth_on_as_root(config):
        return
    try:
        async with EtcdStore(config.with_(username=None, password=None)) as plain:
            if await tenancy.EtcdAuthAdmin(plain).auth_enabled():
                return  # another replica was quicker
            await tenancy.enable_auth(plain, config.password)
    except PermissionDeniedError:
        # Replicas of a fresh install start together: another one turned auth on
        # between our check and one of our steps, which etcd then refuses to the
        # connection without credentials. Root can tell (a wrong password raises).
        if await _auth_on_as_root(config):
            log.info("etcd auth was turned on by another replica meanwhile")
            return
        raise
    log.info("etcd auth turned on (user %s)", config.username)


async def _auth_on_as_root(config: EtcdConfig) -> bool:
    """Whether etcd auth is on, asked as ``config``'s root (False while it is off)."""
    try:
        async with EtcdStore(config) as as_root:
            return await tenancy.EtcdAuthAdmin(as_root).auth_enabled()
    except JobLeaseError as exc:
        if "authentication is not enabled" not in str(exc):
            raise
        return False


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


def _now(later: float = 0.0) -> str:
    """Now (plus ``later`` seconds), RFC 3339 UTC to the second."""
    at = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=later)
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


def _due(when: str | None) -> bool:
    """Whether the RFC 3339 time ``when`` has passed (an unreadable one has)."""
    try:
        at = dt.datetime.strptime(str(when), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return True
    return dt.datetime.now(dt.UTC) >= at


def _safe(exc: BaseException) -> str:
    """An error's text for a log line (errors here never carry Secret data)."""
    return f"{type(exc).__name__}: {exc}"

