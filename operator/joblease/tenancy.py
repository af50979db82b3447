"""Per-namespace etcd users and roles (opt-in multi-tenancy; docs/security.md).

With etcd auth enabled, each Kubernetes namespace can get its own etcd user,
``joblease-ns-<namespace>``, bound to one role of the same name that may read
and write exactly the key range ``<root>/<namespace>/`` (a prefix range) and
nothing else. A sidecar (or the CLI) running with those credentials can work
on its namespace's jobs only: any request touching another namespace's keys
is refused by etcd itself (``PermissionDeniedError``) and writes nothing.

Core layer: etcd only, no Kubernetes. The operator calls these functions
with a *root* (admin) connection and stores the returned
:class:`TenantCredentials` in a Secret per namespace:

    creds = await ensure_namespace_tenant(admin, root, ns, password=existing_or_None)
    secret.stringData = creds.secret_data()          # username, password, keyPrefix
    ...
    await remove_namespace_tenant(admin, ns)          # when the namespace opts out

Every function is idempotent: re-running it converges on the same state, and
``ensure_namespace_tenant`` with the password it returned before writes
nothing when everything is already in place.

Lease permissions, as etcd (3.5 and 3.6) checks them with auth on:
``LeaseGrant`` and ``LeaseKeepAlive`` need no key permission (any client);
a put bound to a lease, and ``LeaseRevoke``, need write permission on *every*
key already attached to that lease; ``LeaseTimeToLive`` with ``keys=true``
needs read permission on every attached key. joblease binds only the
namespace's own holder keys to a tenant's leases, so the tenant role is enough.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from joblease import validation
from joblease._etcdpb import auth_pb2, rpc_pb2
from joblease.errors import InvalidInputError, JobLeaseError, OutcomeUnknownError
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.keys import JobRef, KeySpace
from joblease.store import prefix_end

T = TypeVar("T")

#: Prefix of every tenant user and role name.
TENANT_PREFIX = "joblease-ns-"
ROOT_USER = "root"
ROOT_ROLE = "root"
#: Bytes of randomness in a generated password (URL-safe base64: 43 characters).
PASSWORD_BYTES = 32


@dataclass(frozen=True)
class TenantCredentials:
    """What a namespace's workloads need to reach etcd as their tenant user.

    ``password`` is kept out of ``repr`` (and so out of logs of the object).
    """

    namespace: str
    username: str
    password: str = field(repr=False)
    role: str
    key_prefix: str

    def secret_data(self) -> dict[str, str]:
        """The Secret's ``stringData``. Mount ``password`` as a file and point
        ``JOBLEASE_ETCD_PASSWORD_FILE`` at it; set ``JOBLEASE_ETCD_USERNAME``
        from ``username``."""
        return {"username": self.username, "password": self.password,
                "keyPrefix": self.key_prefix}

    def etcd_config(self, base: EtcdConfig) -> EtcdConfig:
        """``base`` (endpoints, TLS, root) with this tenant's user and password."""
        return base.with_(username=self.username, password=self.password)


@dataclass(frozen=True)
class TenantStatus:
    """What etcd currently has for a namespace (see :func:`tenant_status`)."""

    namespace: str
    user_exists: bool
    role_exists: bool
    user_roles: tuple[str, ...]
    permissions: tuple[tuple[str, bytes, bytes], ...]  # (READ|WRITE|READWRITE, key, range_end)

    def in_place(self, root_prefix: str) -> bool:
        """True when user, role, binding and the one permission are exactly as wanted."""
        key, end = tenant_key_range(root_prefix, self.namespace)
        role = tenant_name(self.namespace)
        return (self.user_exists and self.role_exists and self.user_roles == (role,)
                and self.permissions == (("READWRITE", key, end),))


def tenant_name(namespace: str) -> str:
    """``joblease-ns-<namespace>``: the etcd user and role of a namespace."""
    _check_namespace(namespace)
    return TENANT_PREFIX + namespace


#: Suffix of a namespace's second (rotation) user. A namespace is a DNS label, which
#: has no '.', so ``joblease-ns-a.next`` can never be another namespace's user.
ALTERNATE_SUFFIX = ".next"


def tenant_users(namespace: str) -> tuple[str, str]:
    """The namespace's two etcd users, both bound to its one role: credentials are
    rotated by moving the Secret from one to the other (a grace period in which both
    work), then deleting the one left behind (:func:`rotate_to_other_user`)."""
    name = tenant_name(namespace)
    return name, name + ALTERNATE_SUFFIX


def tenant_namespace_of(username: str) -> str | None:
    """The namespace whose tenant user ``username`` is, or None (not a tenant user)."""
    if not username.startswith(TENANT_PREFIX):
        return None
    namespace = username[len(TENANT_PREFIX):].removesuffix(ALTERNATE_SUFFIX)
    try:
        _check_namespace(namespace)
    except InvalidInputError:
        return None
    return namespace


def tenant_key_range(root_prefix: str, namespace: str) -> tuple[bytes, bytes]:
    """``(key, range_end)`` of the namespace's prefix ``<root>/<namespace>/``."""
    _check_namespace(namespace)
    key = KeySpace(root_prefix).namespace_prefix(namespace)
    return key, prefix_end(key)


def generate_password() -> str:
    return secrets.token_urlsafe(PASSWORD_BYTES)


def _check_namespace(namespace: str) -> None:
    # A DNS label cannot contain '/', so the prefix can never cover another namespace.
    validation.job_ref(JobRef(namespace, "x"))


class EtcdAuthAdmin:
    """The etcd Auth API calls joblease needs, over an :class:`EtcdStore`.

    Uses the store's connection, failover and credentials (``root`` for
    everything but :meth:`authenticate`); errors come back as joblease errors,
    with the etcd message in the text. Mutations go through raft: an unknown
    outcome raises :class:`OutcomeUnknownError`; callers here only repeat
    idempotent ones.
    """

    def __init__(self, store: EtcdStore) -> None:
        self.store = store

    async def _call(self, method: str, request: Any, *, write: bool = True,
                    authenticate: bool = True) -> Any:
        return await self.store.auth_call(method, request, write=write,
                                          authenticate=authenticate)

    # -- status and switches -----------------------------------------------------------------

    async def auth_enabled(self) -> bool:
        resp = await self._call("AuthStatus", rpc_pb2.AuthStatusRequest(), write=False)
        return bool(resp.enabled)

    async def auth_enable(self) -> None:
        await self._call("AuthEnable", rpc_pb2.AuthEnableRequest())

    async def auth_disable(self) -> None:
        await self._call("AuthDisable", rpc_pb2.AuthDisableRequest())

    async def authenticate(self, username: str, password: str) -> bool:
        """Whether etcd accepts ``username``/``password`` (no token is kept)."""
        try:
            await self._call("Authenticate", rpc_pb2.AuthenticateRequest(
                name=username, password=password), write=False, authenticate=False)
        except JobLeaseError as exc:
            if _etcd_says(exc, "authentication failed", "invalid user ID or password"):
                return False
            raise
        return True

    # -- users -------------------------------------------------------------------------------

    async def user_add(self, name: str, password: str) -> bool:
        """Create the user; False if it already existed (password untouched)."""
        try:
            await self._call("UserAdd", rpc_pb2.AuthUserAddRequest(
                name=name, password=password,
                options=auth_pb2.UserAddOptions(no_password=False)))
        except JobLeaseError as exc:
            if _etcd_says(exc, "user name already exists"):
                return False
            raise
        return True

    async def user_roles(self, name: str) -> tuple[str, ...] | None:
        """The user's roles, or None if there is no such user."""
        try:
            resp = await self._call("UserGet", rpc_pb2.AuthUserGetRequest(name=name),
                                    write=False)
        except JobLeaseError as exc:
            if _etcd_says(exc, "user name not found"):
                return None
            raise
        return tuple(sorted(resp.roles))

    async def user_change_password(self, name: str, password: str) -> None:
        await self._call("UserChangePassword", rpc_pb2.AuthUserChangePasswordRequest(
            name=name, password=password))

    async def user_grant_role(self, name: str, role: str) -> None:
        await self._call("UserGrantRole", rpc_pb2.AuthUserGrantRoleRequest(user=name, role=role))

    async def user_revoke_role(self, name: str, role: str) -> None:
        await self._call("UserRevokeRole", rpc_pb2.AuthUserRevokeRoleRequest(name=name,
                                                                             role=role))

    async def user_list(self) -> tuple[str, ...]:
        resp = await self._call("UserList", rpc_pb2.AuthUserListRequest(), write=False)
        return tuple(sorted(resp.users))

    async def user_delete(self, name: str) -> bool:
        try:
            await self._call("UserDelete", rpc_pb2.AuthUserDeleteRequest(name=name))
        except JobLeaseError as exc:
            if _etcd_says(exc, "user name not found"):
                return False
            raise
        return True

    # -- roles -------------------------------------------------------------------------------

    async def role_add(self, name: str) -> bool:
        try:
            await self._call("RoleAdd", rpc_pb2.AuthRoleAddRequest(name=name))
        except JobLeaseError as exc:
            if _etcd_says(exc, "role name already exists"):
                return False
            raise
        return True

    async def role_permissions(self, name: str) -> tuple[tuple[str, bytes, bytes], ...] | None:
        """``(type, key, range_end)`` of each permission, or None if no such role."""
        try:
            resp = await self._call("RoleGet", rpc_pb2.AuthRoleGetRequest(role=name),
                                    write=False)
        except JobLeaseError as exc:
            if _etcd_says(exc, "role name not found"):
                return None
            raise
        names = {auth_pb2.Permission.READ: "READ", auth_pb2.Permission.WRITE: "WRITE",
                 auth_pb2.Permission.READWRITE: "READWRITE"}
        return tuple(sorted((names[p.permType], bytes(p.key), bytes(p.range_end))
                            for p in resp.perm))

    async def role_grant_readwrite(self, name: str, key: bytes, range_end: bytes) -> None:
        await self._call("RoleGrantPermission", rpc_pb2.AuthRoleGrantPermissionRequest(
            name=name, perm=auth_pb2.Permission(permType=auth_pb2.Permission.READWRITE,
                                                key=key, range_end=range_end)))

    async def role_revoke(self, name: str, key: bytes, range_end: bytes) -> None:
        try:
            await self._call("RoleRevokePermission", rpc_pb2.AuthRoleRevokePermissionRequest(
                role=name, key=key, range_end=range_end))
        except JobLeaseError as exc:
            if not _etcd_says(exc, "permission is not granted"):
                raise

    async def role_delete(self, name: str) -> bool:
        try:
            await self._call("RoleDelete", rpc_pb2.AuthRoleDeleteRequest(role=name))
        except JobLeaseError as exc:
            if _etcd_says(exc, "role name not found"):
                return False
            raise
        return True


def _etcd_says(exc: BaseException, *phrases: str) -> bool:
    text = str(exc)
    cause = exc.__cause__
    if cause is not None and hasattr(cause, "details"):
        text += " " + str(cause.details() or "")
    return any(p in text for p in phrases)


async def _idempotent(fn: Callable[[], Awaitable[T]], attempts: int = 4) -> T:
    """Repeat an idempotent auth step whose outcome was unknown."""
    for attempt in range(attempts):
        try:
            return await fn()
        except OutcomeUnknownError:
            if attempt == attempts - 1:
                raise
            await asyncio.sleep(0.1 * 2 ** attempt)
    raise AssertionError("unreachable")


# -- the functions the operator (and ops tooling, and the tests) call --------------------------


async def enable_auth(store: EtcdStore, root_password: str) -> None:
    """Create ``root`` (user with the ``root`` role) and turn etcd auth on.

    ``store`` must be able to administer etcd: a connection without
    credentials while auth is still off. Idempotent: if auth is already on,
    nothing happens (the root password is not changed).
    """
    if not root_password:
        raise InvalidInputError("the root password must not be empty")
    admin = EtcdAuthAdmin(store)
    if await admin.auth_enabled():
        return
    await _idempotent(lambda: admin.role_add(ROOT_ROLE))
    if not await _idempotent(lambda: admin.user_add(ROOT_USER, root_password)):
        await _idempotent(lambda: admin.user_change_password(ROOT_USER, root_password))
    await _idempotent(lambda: admin.user_grant_role(ROOT_USER, ROOT_ROLE))
    await _idempotent(admin.auth_enable)


async def tenant_status(store: EtcdStore, namespace: str) -> TenantStatus:
    """What etcd has for ``namespace``'s user and role (read only)."""
    admin = EtcdAuthAdmin(store)
    name = tenant_name(namespace)
    roles = await admin.user_roles(name)
    perms = await admin.role_permissions(name)
    return TenantStatus(namespace=namespace, user_exists=roles is not None,
                        role_exists=perms is not None, user_roles=roles or (),
                        permissions=perms or ())


async def ensure_namespace_tenant(store: EtcdStore, root_prefix: str, namespace: str, *,
                                  password: str | None = None,
                                  username: str | None = None) -> TenantCredentials:
    """Make sure ``namespace`` has its etcd user and role; return the credentials.

    The role ``joblease-ns-<namespace>`` gets READWRITE on exactly the prefix
    ``<root_prefix>/<namespace>/``; any other permission it has is revoked.
    The user of the same name gets that role and only that role.

    ``password``: the password the caller already stored (e.g. in the
    namespace's Secret). If the user exists and accepts it, the password is
    kept and -- when the role is in place too -- nothing is written. If it
    is ``None`` (no Secret yet) or etcd does not accept it, the user gets a
    new random password (for an existing user, that is a rotation: sessions
    using the old one must re-read the Secret).

    ``store`` must be connected as ``root`` (or without credentials while
    auth is off).

    ``username``: which of the namespace's two users (:func:`tenant_users`) the
    caller's Secret names; default the first. The other user is left alone.
    """
    name = tenant_name(namespace)
    user = username or name
    if user not in tenant_users(namespace):
        raise InvalidInputError(f"{user!r} is not a tenant user of namespace {namespace!r} "
                                f"(one of {', '.join(tenant_users(namespace))})")
    key, end = tenant_key_range(root_prefix, namespace)
    admin = EtcdAuthAdmin(store)

    # The role and its single permission first, so the user never holds a wider one.
    await _idempotent(lambda: admin.role_add(name))
    perms = await admin.role_permissions(name) or ()
    for kind, k, e in perms:
        if (kind, k, e) != ("READWRITE", key, end):
            await _idempotent(functools.partial(admin.role_revoke, name, k, e))
    if ("READWRITE", key, end) not in perms:
        await _idempotent(lambda: admin.role_grant_readwrite(name, key, end))

    roles = await admin.user_roles(user)
    if roles is None:
        new = password or generate_password()
        if not await _idempotent(lambda: admin.user_add(user, new)):
            # created concurrently (or an unknown outcome that did commit): set ours
            await _idempotent(lambda: admin.user_change_password(user, new))
        password, roles = new, ()
    elif password is None or not await admin.authenticate(user, password):
        password = generate_password()
        await _idempotent(functools.partial(admin.user_change_password, user, password))
    for other in roles:
        if other != name:
            await _idempotent(functools.partial(admin.user_revoke_role, user, other))
    if name not in roles:
        await _idempotent(lambda: admin.user_grant_role(user, name))
    return TenantCredentials(namespace=namespace, username=user, password=password,
                             role=name, key_prefix=key.decode())


async def rotate_to_other_user(store: EtcdStore, root_prefix: str, namespace: str,
                               current: str) -> TenantCredentials:
    """Credentials of the namespace's *other* user (:func:`tenant_users`), with a new
    random password; ``current`` keeps working. Rotation without downtime: hand the
    new credentials to every sidecar (the Secret), wait longer than they take to see
    it, then :func:`revoke_tenant_user` ``current``."""
    first, second = tenant_users(namespace)
    if current not in (first, second):
        raise InvalidInputError(f"{current!r} is not a tenant user of namespace {namespace!r}")
    other = second if current == first else first
    admin = EtcdAuthAdmin(store)
    if await admin.user_roles(other) is not None:
        # a leftover of an interrupted rotation: a fresh password all the same
        await _idempotent(functools.partial(admin.user_change_password, other,
                                            generate_password()))
    return await ensure_namespace_tenant(store, root_prefix, namespace, username=other,
                                         password=None)


async def revoke_tenant_user(store: EtcdStore, namespace: str, username: str) -> bool:
    """Delete one of the namespace's users (the role stays); True if it existed.
    etcd invalidates its tokens at once: its next request is refused."""
    if username not in tenant_users(namespace):
        raise InvalidInputError(f"{username!r} is not a tenant user of namespace {namespace!r}")
    admin = EtcdAuthAdmin(store)
    if await admin.user_roles(username) is None:  # a read: the steady state writes nothing
        return False
    return await _idempotent(lambda: admin.user_delete(username))


async def tenant_namespaces(store: EtcdStore) -> tuple[str, ...]:
    """The namespaces that have a tenant user in etcd (root only: ``UserList``)."""
    users = await EtcdAuthAdmin(store).user_list()
    return tuple(sorted({ns for u in users if (ns := tenant_namespace_of(u)) is not None}))


async def rotate_tenant_password(store: EtcdStore, root_prefix: str, namespace: str, *,
                                 password: str | None = None) -> TenantCredentials:
    """Give the namespace's user a new (random, or the given) password.

    etcd invalidates every *simple* token of the user at once (``--auth-token
    simple``, the default): the next request of a session that authenticated
    with the old password is refused, and re-authenticating with it fails
    (``PermissionDeniedError``). JWT tokens (``--auth-token jwt``) stay valid
    until they expire. Keep-alive streams already open are not re-checked by
    etcd; the holder re-check that follows each keep-alive is.
    """
    name = tenant_name(namespace)
    key, _ = tenant_key_range(root_prefix, namespace)
    admin = EtcdAuthAdmin(store)
    if await admin.user_roles(name) is None:
        raise InvalidInputError(f"namespace {namespace!r} has no etcd tenant user {name!r}")
    new = password or generate_password()
    await _idempotent(lambda: admin.user_change_password(name, new))
    return TenantCredentials(namespace=namespace, username=name, password=new, role=name,
                             key_prefix=key.decode())


async def remove_namespace_tenant(store: EtcdStore, namespace: str) -> bool:
    """Delete the namespace's user and role; True if anything existed.

    Deleting the user invalidates its tokens; deleting the role removes its
    permission at once for anyone still holding a token. The namespace's
    keys are left alone (the operator's finalizers own them).
    """
    name = tenant_name(namespace)
    admin = EtcdAuthAdmin(store)
    users = [await _idempotent(functools.partial(admin.user_delete, u))
             for u in tenant_users(namespace)]
    role = await _idempotent(lambda: admin.role_delete(name))
    return any(users) or role
