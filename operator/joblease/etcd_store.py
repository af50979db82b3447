"""The :class:`~joblease.store.Store` over etcd's v3 gRPC API (``grpc.aio``).

Why our own thin client: see docs/etcd-client.md. In short, the Python etcd
clients either are unmaintained (python-etcd3), cannot speak TLS or more than
one endpoint (aetcd 1.0.0), or retry transactions whose outcome is unknown
(etcd3aio 0.3.0). The protocol must never re-send a write blindly, so retries
live here, explicitly: reads fail over between endpoints, writes are retried
only when the request provably never reached a server.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio

from joblease import etcd_wire
from joblease._etcdpb import kv_pb2, rpc_pb2, rpc_pb2_grpc
from joblease.envvars import read_list, read_str, split_list
from joblease.errors import (
    CompactedError,
    InvalidInputError,
    JobLeaseError,
    LeaseNotFoundError,
    OutcomeUnknownError,
    PermissionDeniedError,
    StoreUnavailableError,
)
from joblease.keys import DEFAULT_ROOT
from joblease.store import (
    Compare,
    Delete,
    Get,
    KeyValue,
    Txn,
    TxnOp,
    TxnResult,
    WatchBatch,
    WatchEvent,
    leaf_ops,
    prefix_end,
)

log = logging.getLogger(__name__)

# Messages gRPC gives when a request never left the client: safe to send elsewhere.
_NOT_SENT_HINTS = ("failed to connect", "connection refused", "no address", "dns resolution")
# etcd's answers to a request carrying an auth token it no longer accepts (a simple
# token dies with the etcd process that issued it; an auth change makes old tokens
# "old"). Either way the request was refused before it was applied, so the client
# gets a fresh token and sends it again, as etcd's Go client does.
_CREDENTIALS_REFUSED = ("authentication failed", "user name is empty", "user name not found")
_STALE_TOKEN_HINTS = ("invalid auth token", "revision of auth store is old")


def _stale_token(details: str) -> bool:
    return any(h in details for h in _STALE_TOKEN_HINTS)


#: Where a local etcd listens unless told otherwise (etcd's own default client URL).
DEFAULT_ENDPOINT = "127.0.0.1:2379"

#: Environment variables of the plain string settings: attribute -> variable.
_ENV_STRINGS = {
    "ca_file": "JOBLEASE_ETCD_CA_FILE",
    "cert_file": "JOBLEASE_ETCD_CERT_FILE",
    "key_file": "JOBLEASE_ETCD_KEY_FILE",
    "server_name": "JOBLEASE_ETCD_SERVER_NAME",
    "username": "JOBLEASE_ETCD_USERNAME",
}


def parse_endpoints(text: str) -> tuple[str, ...]:
    """``a:2379, https://b:2379`` -> ``("a:2379", "https://b:2379")``."""
    return split_list(text)


def read_password_file(path: str) -> str:
    """A mounted Secret's value, without the trailing newline editors add."""
    with open(path) as f:
        return f.read().strip()


@dataclass(frozen=True)
class EtcdConfig:
    """How to reach etcd. TLS, mutual TLS and auth are configuration, not code.

    ``endpoints``: ``host:port`` or ``http(s)://host:port``; an ``https``
    scheme, or any TLS file, switches to TLS. The defaults here are the only
    ones: :meth:`from_env` and the CLI's flags fall back to them.
    """

    endpoints: tuple[str, ...] = (DEFAULT_ENDPOINT,)
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    server_name: str | None = None  # TLS name override, e.g. when dialling by IP
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    request_timeout: float = 5.0
    root: str = DEFAULT_ROOT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> EtcdConfig:
        """``JOBLEASE_ETCD_ENDPOINTS`` (comma separated), ``JOBLEASE_ETCD_CA_FILE``,
        ``..._CERT_FILE``, ``..._KEY_FILE``, ``..._SERVER_NAME``, ``..._USERNAME`` or
        ``..._USERNAME_FILE``, ``..._PASSWORD`` or ``..._PASSWORD_FILE`` (mounted Secrets),
        ``JOBLEASE_ROOT``.

        ``overrides`` (flags) win over the environment when not ``None``; what
        neither sets keeps the dataclass default."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        # joblease.envvars' readers: an empty variable counts as unset, as everywhere.
        endpoints = read_list(env, "JOBLEASE_ETCD_ENDPOINTS")
        if endpoints is not None:
            values["endpoints"] = endpoints
        for attr, variable in (*_ENV_STRINGS.items(), ("root", "JOBLEASE_ROOT")):
            text = read_str(env, variable)
            if text is not None:
                values[attr] = text
        # a mounted Secret's username (the injected sidecar's tenant credentials), as
        # the Go sidecar reads it; JOBLEASE_ETCD_USERNAME wins when both are set
        username_file = read_str(env, "JOBLEASE_ETCD_USERNAME_FILE")
        if "username" not in values and username_file is not None:
            username = read_password_file(username_file)
            if username:
                values["username"] = username
        password = read_str(env, "JOBLEASE_ETCD_PASSWORD")
        password_file = read_str(env, "JOBLEASE_ETCD_PASSWORD_FILE")
        if password is None and password_file is not None:
            password = read_password_file(password_file) or None
        if password is not None:
            values["password"] = password
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    def with_(self, **changes: Any) -> EtcdConfig:
        """A copy with ``changes`` (the one copy-with-changes name of every config)."""
        return dataclasses.replace(self, **changes)

    @property
    def tls(self) -> bool:
        return bool(self.ca_file or self.cert_file or any(
            e.startswith("https://") for e in self.endpoints))


def _strip_scheme(endpoint: str) -> str:
    for scheme in ("http://", "https://", "unix://"):
        if endpoint.startswith(scheme):
            return endpoint[len(scheme):]
    return endpoint


def _kv(pb: Any) -> KeyValue:
    return KeyValue(bytes(pb.key), bytes(pb.value), pb.create_revision, pb.mod_revision,
                    pb.version, pb.lease)


def _writes(ops: Sequence[TxnOp]) -> bool:
    """True if any op (in any branch of a nested Txn) can write."""
    return any(not isinstance(op, Get) for op in leaf_ops(ops))


def _txn_result(success: Sequence[TxnOp], failure: Sequence[TxnOp], resp: Any) -> TxnResult:
    branch = success if resp.succeeded else failure
    return TxnResult(
        succeeded=resp.succeeded,
        revision=resp.header.revision,
        responses=[_response(op, r) for op, r in zip(branch, resp.responses, strict=True)],
    )


def _response(op: TxnOp, resp: Any) -> list[KeyValue] | int | TxnResult | None:
    if isinstance(op, Get):
        if op.count_only:
            return int(resp.response_range.count)
        return [_kv(kv) for kv in resp.response_range.kvs]
    if isinstance(op, Delete):
        return int(resp.response_delete_range.deleted)
    if isinstance(op, Txn):
        return _txn_result(op.success, op.failure, resp.response_txn)
    return None


class _Stubs:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.channel = channel
        self.kv = rpc_pb2_grpc.KVStub(channel)
        # Txn with the request already in its wire form (joblease.etcd_wire)
        self.txn = channel.unary_unary(
            "/etcdserverpb.KV/Txn", request_serializer=None,
            response_deserializer=rpc_pb2.TxnResponse.FromString, _registered_method=True)
        self.lease = rpc_pb2_grpc.LeaseStub(channel)
        self.watch = rpc_pb2_grpc.WatchStub(channel)
        self.auth = rpc_pb2_grpc.AuthStub(channel)
        self.maintenance = rpc_pb2_grpc.MaintenanceStub(channel)


class EtcdStore:
    """An asyncio etcd v3 client with explicit, outcome-aware retries."""

    def __init__(self, config: EtcdConfig) -> None:
        if not config.endpoints:
            raise InvalidInputError("at least one etcd endpoint is required")
        self.config = config
        self._endpoints = [_strip_scheme(e) for e in config.endpoints]
        self._stubs: dict[int, _Stubs] = {}
        self._current = 0
        self._token: str | None = None
        self._auth_lock = asyncio.Lock()
        self._credentials = self._channel_credentials()

    # -- connections -------------------------------------------------------------------------

    def _channel_credentials(self) -> grpc.ChannelCredentials | None:
        if not self.config.tls:
            return None

        def read(path: str | None) -> bytes | None:
            if path is None:
                return None
            with open(path, "rb") as f:
                return f.read()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.config.ca_file),
            private_key=read(self.config.key_file),
            certificate_chain=read(self.config.cert_file),
        )

    def _stub(self, index: int | None = None) -> _Stubs:
        i = self._current if index is None else index
        if i not in self._stubs:
            options: list[tuple[str, Any]] = [
                ("grpc.keepalive_time_ms", 10_000),
                ("grpc.keepalive_timeout_ms", 5_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.max_receive_message_length", 64 * 1024 * 1024),
                ("grpc.enable_retries", 0),  # retries are ours, and outcome-aware
                ("grpc.initial_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 1_000),
            ]
            target = self._endpoints[i]
            if self._credentials is not None:
                if self.config.server_name:
                    options.append(("grpc.ssl_target_name_override", self.config.server_name))
                channel = grpc.aio.secure_channel(target, self._credentials, options=options)
            else:
                channel = grpc.aio.insecure_channel(target, options=options)
            self._stubs[i] = _Stubs(channel)
        return self._stubs[i]

    def _fail_over(self) -> None:
        if len(self._endpoints) > 1:
            self._current = (self._current + 1) % len(self._endpoints)

    async def _metadata(self) -> tuple[tuple[str, str], ...]:
        if self.config.username is None:
            return ()
        if self._token is None:
            async with self._auth_lock:
                if self._token is None:
                    resp = await self._call_raw(
                        lambda s, md: s.auth.Authenticate(
                            rpc_pb2.AuthenticateRequest(
                                name=self.config.username, password=self.config.password or ""),
                            timeout=self.config.request_timeout),
                        write=False, authenticate=False)
                    self._token = resp.token
        assert self._token is not None
        return (("token", self._token),)

    def _token_rejected(self, metadata: Sequence[tuple[str, str]]) -> None:
        """Forget the token ``metadata`` carried (not a fresher one another call got)."""
        used = dict(metadata).get("token")
        if used is not None and used == self._token:
            self._token = None

    async def auth_call(self, method: str, request: Any, *, write: bool = True,
                        authenticate: bool = True) -> Any:
        """One call of etcd's Auth service (``method`` names the RPC, e.g. ``UserAdd``),
        with this store's failover, credentials and error mapping: the way
        :class:`joblease.tenancy.EtcdAuthAdmin` reaches the Auth API without reaching
        into the store. A mutation whose answer is lost raises OutcomeUnknownError."""
        timeout = self.config.request_timeout

        async def call(stubs: Any, metadata: Any) -> Any:
            return await getattr(stubs.auth, method)(request, timeout=timeout,
                                                     metadata=metadata)

        return await self._call_raw(call, write=write, authenticate=authenticate)

    async def _call_raw(self, fn: Any, *, write: bool, authenticate: bool = True) -> Any:
        """Run ``fn(stubs, metadata)`` with failover; map gRPC errors to ours.

        Reads are retried on another endpoint; writes only when the request
        provably never reached a server; otherwise OutcomeUnknownError.
        """
        attempts = max(2, 2 * len(self._endpoints))
        last: grpc.aio.AioRpcError | None = None
        for _ in range(attempts):
            metadata = await self._metadata() if authenticate else ()
            try:
                return await fn(self._stub(), metadata)
            except grpc.aio.AioRpcError as exc:
                last = exc
                code, details = exc.code(), (exc.details() or "")
                if authenticate and metadata and _stale_token(details):
                    self._token_rejected(metadata)  # refused before any apply
                    continue
                if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                            grpc.StatusCode.CANCELLED, grpc.StatusCode.UNKNOWN):
                    not_sent = code == grpc.StatusCode.UNAVAILABLE and any(
                        h in details.lower() for h in _NOT_SENT_HINTS)
                    self._fail_over()
                    if write and not not_sent:
                        raise OutcomeUnknownError(
                            f"etcd write outcome unknown ({code.name}: {details})") from exc
                    continue
                raise self._map_error(exc) from exc
        assert last is not None
        raise StoreUnavailableError(
            f"etcd unreachable at {', '.join(self._endpoints)}: "
            f"{last.code().name}: {last.details()}") from last

    @staticmethod
    def _map_error(exc: grpc.aio.AioRpcError) -> JobLeaseError:
        code, details = exc.code(), exc.details() or ""
        if code in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
            return PermissionDeniedError(f"etcd refused the request: {details}")
        if any(p in details for p in _CREDENTIALS_REFUSED):
            # etcd answers a wrong user/password, or no credentials while auth is
            # on, with INVALID_ARGUMENT; a client certificate whose CN is no user
            # (mutual TLS, no token: the chart's workers' certificate without its
            # password) with FAILED_PRECONDITION "user name not found". Credentials
            # problems (exit 12 / 403), not bad input (exit 2 / 400).
            return PermissionDeniedError(f"etcd refused the credentials: {details}")
        if "lease not found" in details:
            return LeaseNotFoundError(details)
        if "compacted" in details:
            return CompactedError(0)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            return InvalidInputError(f"etcd refused the request: {details}")
        return JobLeaseError(f"etcd error {code.name}: {details}")

    # -- Store -------------------------------------------------------------------------------

    async def txn(
        self, compares: Sequence[Compare], success: Sequence[TxnOp], failure: Sequence[TxnOp] = ()
    ) -> TxnResult:
        request = etcd_wire.txn_request(compares, success, failure)
        write = _writes((*success, *failure))
        timeout = self.config.request_timeout
        resp = await self._call_raw(
            lambda s, md: s.txn(request, timeout=timeout, metadata=md), write=write)
        return _txn_result(success, failure, resp)

    async def get(
        self, key: bytes, *, prefix: bool = False, revision: int = 0, keys_only: bool = False,
        end: bytes = b"", limit: int = 0
    ) -> tuple[int, list[KeyValue]]:
        request = rpc_pb2.RangeRequest(
            key=key, range_end=end or (prefix_end(key) if prefix else b""), revision=revision,
            keys_only=keys_only, limit=limit)
        timeout = self.config.request_timeout
        resp = await self._call_raw(
            lambda s, md: s.kv.Range(request, timeout=timeout, metadata=md), write=False)
        return resp.header.revision, [_kv(kv) for kv in resp.kvs]

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        timeout = self.config.request_timeout
        resp = await self._call_raw(lambda s, md: s.kv.Put(
            rpc_pb2.PutRequest(key=key, value=value, lease=lease), timeout=timeout, metadata=md),
            write=True)
        return int(resp.header.revision)

    async def grant(self, ttl: int) -> tuple[int, int]:
        timeout = self.config.request_timeout
        # A grant whose outcome is unknown leaks at most one unused lease, which
        # expires by itself: safe to treat as a read for retry purposes.
        resp = await self._call_raw(lambda s, md: s.lease.LeaseGrant(
            rpc_pb2.LeaseGrantRequest(TTL=ttl), timeout=timeout, metadata=md), write=False)
        if resp.error:
            raise JobLeaseError(f"etcd refused the lease grant: {resp.error}")
        return int(resp.ID), int(resp.TTL)

    async def revoke(self, lease_id: int) -> None:
        timeout = self.config.request_timeout
        try:
            await self._call_raw(lambda s, md: s.lease.LeaseRevoke(
                rpc_pb2.LeaseRevokeRequest(ID=lease_id), timeout=timeout, metadata=md),
                write=False)
        except LeaseNotFoundError:
            pass

    async def time_to_live(self, lease_id: int) -> int:
        timeout = self.config.request_timeout
        resp = await self._call_raw(lambda s, md: s.lease.LeaseTimeToLive(
            rpc_pb2.LeaseTimeToLiveRequest(ID=lease_id), timeout=timeout, metadata=md),
            write=False)
        return int(resp.TTL)

    async def compact(self, revision: int) -> None:
        timeout = self.config.request_timeout
        await self._call_raw(lambda s, md: s.kv.Compact(
            rpc_pb2.CompactionRequest(revision=revision, physical=True), timeout=timeout,
            metadata=md), write=False)

    async def status(self) -> dict[str, int]:
        """The answering member's status (leader id, revision, raft term)."""
        timeout = self.config.request_timeout
        resp = await self._call_raw(lambda s, md: s.maintenance.Status(
            rpc_pb2.StatusRequest(), timeout=timeout, metadata=md), write=False)
        return {"leader": int(resp.leader), "revision": int(resp.header.revision),
                "raftTerm": int(resp.raftTerm), "member": int(resp.header.member_id)}

    def keep_alive(self, lease_id: int) -> _KeepAliveStream:
        return _KeepAliveStream(self, lease_id)

    async def watch(
        self, key: bytes, *, prefix: bool, start_revision: int
    ) -> AsyncIterator[WatchBatch]:
        """Yield batches from ``start_revision`` on; reconnects (and fails over)
        on dropped streams, resuming after the last revision it delivered.

        A watch refused for a stale auth token (etcd restarted, simple tokens
        died with it) is re-created at once with a fresh token; other failures
        back off exponentially (50 ms doubling to 2 s), and the backoff is only
        reset by a stream that etcd accepted, so a refused watch never spins.
        """
        next_revision = start_revision
        failures = 0
        reauthenticated = False  # since the last stream etcd accepted
        while True:
            call: Any = None
            metadata: tuple[tuple[str, str], ...] = ()
            try:
                metadata = (*await self._metadata(), ("hasleader", "true"))
                stub = self._stub()
                call = stub.watch.Watch(metadata=metadata)
                await call.write(rpc_pb2.WatchRequest(create_request=rpc_pb2.WatchCreateRequest(
                    key=key, range_end=prefix_end(key) if prefix else b"",
                    start_revision=next_revision, progress_notify=True)))
                while True:
                    resp = await call.read()
                    if resp is grpc.aio.EOF:
                        raise StoreUnavailableError("watch stream closed")
                    if resp.compact_revision:
                        raise CompactedError(int(resp.compact_revision))
                    if resp.canceled:
                        raise _WatchRefused(resp.cancel_reason)
                    failures, reauthenticated = 0, False
                    if resp.created and not resp.events:
                        continue
                    events = [
                        WatchEvent("delete" if ev.type == kv_pb2.Event.DELETE else "put",
                                   _kv(ev.kv))
                        for ev in resp.events
                    ]
                    revision = int(resp.header.revision)
                    if events:
                        next_revision = max(e.kv.mod_revision for e in events) + 1
                    else:
                        next_revision = max(next_revision, revision + 1)
                    yield WatchBatch(revision, events)
            except (grpc.aio.AioRpcError, StoreUnavailableError, _WatchRefused) as exc:
                failures += 1
                details = (exc.details() or "") if isinstance(exc, grpc.aio.AioRpcError) \
                    else str(exc)
                if _stale_token(details) and self.config.username is not None:
                    self._token_rejected(metadata)
                    if not reauthenticated:
                        reauthenticated = True
                        log.info("etcd watch refused a stale auth token; re-authenticating")
                        continue  # at once: the next attempt carries a fresh token
                elif isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
                        grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                    raise self._map_error(exc) from exc
                elif isinstance(exc, _WatchRefused) and "permission denied" in details:
                    raise PermissionDeniedError(f"etcd refused the watch: {exc.args[0]}") from exc
                log.info("etcd watch interrupted (%s); resuming from revision %d",
                         exc, next_revision)
                self._fail_over()
                await asyncio.sleep(min(2.0, 0.05 * 2 ** min(failures, 6)))
            finally:
                if call is not None:
                    call.cancel()

    async def close(self) -> None:
        stubs, self._stubs = self._stubs, {}
        for s in stubs.values():
            await s.channel.close()

    async def __aenter__(self) -> EtcdStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class _WatchRefused(Exception):
    """etcd cancelled a watch (``cancel_reason`` says why)."""

    def __str__(self) -> str:
        return f"watch canceled: {self.args[0]}"


class _KeepAliveStream:
    """One persistent LeaseKeepAlive stream, reopened (on the next endpoint) when it breaks."""

    def __init__(self, store: EtcdStore, lease_id: int) -> None:
        self._store = store
        self._lease_id = lease_id
        self._call: Any = None
        self._metadata: tuple[tuple[str, str], ...] = ()  # what the open stream carries

    async def renew(self, timeout: float) -> int:
        """One keep-alive on the stream, (re)opened with the store's auth token.

        A stream refused for a stale auth token (etcd restarted) is reopened
        once, within ``timeout``, with a fresh token: a keep-alive refused that
        way never reached the lease, and giving up would lose every lease on
        an etcd restart.
        """
        try:
            async with asyncio.timeout(timeout):
                for attempt in (1, 2):
                    metadata: tuple[tuple[str, str], ...] = ()
                    try:
                        if self._call is None:
                            metadata = await self._store._metadata()
                            self._metadata = metadata
                            self._call = self._store._stub().lease.LeaseKeepAlive(
                                metadata=metadata)
                        await self._call.write(rpc_pb2.LeaseKeepAliveRequest(ID=self._lease_id))
                        resp = await self._call.read()
                        break
                    except grpc.aio.AioRpcError as exc:
                        if attempt == 1 and _stale_token(exc.details() or ""):
                            await self.close()
                            self._store._token_rejected(self._metadata)
                            continue
                        raise
        except (grpc.aio.AioRpcError, TimeoutError, asyncio.InvalidStateError) as exc:
            await self.close()
            self._store._fail_over()
            if isinstance(exc, grpc.aio.AioRpcError) and exc.code() in (
                    grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNAUTHENTICATED):
                raise self._store._map_error(exc) from exc
            raise StoreUnavailableError(f"keep-alive failed: {exc!r}") from exc
        if resp is grpc.aio.EOF:
            await self.close()
            raise StoreUnavailableError("keep-alive stream closed")
        return int(resp.TTL)

    async def close(self) -> None:
        call, self._call = self._call, None
        if call is not None:
            with contextlib.suppress(Exception):
                call.cancel()
