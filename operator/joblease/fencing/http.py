"""Fencing over HTTP: headers on the worker's requests, a gate in front of the destination.

Client side: every effect request carries three headers --
``Joblease-Job`` (``ns/name``), ``Joblease-Token`` (the claim's fencing
token) and, to deduplicate retries, ``Joblease-Idempotency-Key`` (see
:func:`~joblease.fencing.gate.idempotency_key`) -- and, when the claim holds
semaphore slots, ``Joblease-Slot`` (``ns/name/index=token``, comma-separated,
one per slot held). :func:`fencing_headers` builds them; :class:`FencingAuth`
attaches them to every request of an ``httpx`` client.

Server side: :class:`FencingMiddleware` wraps any ASGI app. For a fenced
request (``resource_for(scope)`` names a resource) it

1. refuses bad headers with 400 ``{"error":"invalid",...}`` -- the app does not run;
2. replays a known idempotency key with the first response (status, body)
   -- the app does not run again;
3. refuses a token below the resource's mark with 409 ``{"error":"stale",
   "resource", "token", "highestToken", "message"}`` -- the app does not run;
   the same for each slot named by ``Joblease-Slot``, on its own resource
   (:func:`~joblease.fencing.gate.slot_resource`): a write is admitted only
   if the item's (job's) fence and every slot's fence admit it;
4. runs the app and, if it answered 2xx, records the token as the resource's
   new mark (and each slot token as its slot's) and the response under the
   idempotency key.

Steps 2-4 run under an ``asyncio.Lock`` per resource (the request's and its
slots', taken in sorted order), held across the app call, so within one
process no two requests on one resource interleave between check and
record: a request that passes step 3 commits before any later one is
checked. Non-2xx answers are not recorded (nothing was applied, the request
may be retried with the same key).

What this does *not* make atomic: the app's own storage and the gate are
separate. With :class:`~joblease.fencing.gate.MemoryGate` in one process the
lock is enough. With several replicas sharing an etcd or SQL gate, the
middleware is a pre-check only: the destination must also call the gate in
the same transaction as its write (:meth:`EtcdGate.admit(effect, puts)
<joblease.fencing.etcd_gate.EtcdGate.admit>`, :func:`joblease.fencing.sql.admit`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, MutableMapping
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from joblease.errors import InvalidInputError
from joblease.fencing.gate import (
    MAX_TOKEN,
    Decision,
    Effect,
    MemoryGate,
    StaleFenceError,
    TokenGate,
    check_key,
    check_resource,
    idempotency_key,
    slot_resource,
)
from joblease.lease import Lease

log = logging.getLogger(__name__)

HEADER_JOB = "Joblease-Job"
HEADER_TOKEN = "Joblease-Token"
HEADER_IDEMPOTENCY_KEY = "Joblease-Idempotency-Key"
#: The semaphore slots a claim holds, each with its token: ``ns/name/index=token``,
#: comma-separated (docs/semaphores.md, "Fencing on a slot").
HEADER_SLOT = "Joblease-Slot"
#: Slot fences one request may carry: a claim's weight is at most its semaphore's
#: limit, but a write gated on more slots than this is a client bug, not a plan.
MAX_SLOT_FENCES = 64
#: Set on responses replayed for a duplicate idempotency key.
HEADER_REPLAYED = "Joblease-Replayed"

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_DIGITS = re.compile(r"[+-]?[0-9]+")  # used with fullmatch
_MAX_JOB_LENGTH = 63 + 1 + 253
# ns/name/index=token: Kubernetes names (lowercase, digits, "-" and "."), an index
# below the largest limit (10000)
_NAME = r"[a-z0-9](?:[-a-z0-9.]{0,251}[a-z0-9])?"
_SLOT_FENCE = re.compile(rf"({_NAME})/({_NAME})/(0|[1-9][0-9]{{0,3}})=(.*)")
# Response headers worth replaying; the server adds its own framing headers.
_REPLAYED_HEADERS = frozenset({b"content-type", b"location", b"etag"})


# -- client side --------------------------------------------------------------------------------

def slot_header(lease: Lease) -> str | None:
    """``Joblease-Slot``'s value for the slots ``lease`` holds (``None``: it holds none)."""
    fences = [f"{grant.semaphore}/{index}={grant.token}" for grant in lease.slots
              for index in grant.indexes]
    return ", ".join(fences) if fences else None


def fencing_headers(lease: Lease, step: str = "") -> dict[str, str]:
    """The headers that carry ``lease``'s token (and an idempotency key for
    ``(job, generation, token, step)``, and its slots' tokens when it holds
    semaphore slots) to a fenced destination."""
    headers = {
        HEADER_JOB: str(lease.job),
        HEADER_TOKEN: str(lease.token),
        HEADER_IDEMPOTENCY_KEY: idempotency_key(lease.job, lease.generation, step,
                                                token=lease.token),
    }
    slots = slot_header(lease)
    if slots is not None:
        headers[HEADER_SLOT] = slots
    return headers


class FencingAuth(httpx.Auth):
    """Attach the fencing headers of ``lease`` to every request of an httpx client.

    ``httpx.AsyncClient(auth=FencingAuth(lease))``. An idempotency key is set
    only when ``step`` is given (one key per distinct effect!) and the request
    does not carry one already. With ``require_valid`` (the default) a
    request is refused locally (:class:`~joblease.errors.LeaseLostError`)
    once the lease is no longer valid: past its safety deadline a worker
    produces no effects (invariant ``conservative-deadline``); the destination's gate is
    the authority either way.
    """

    requires_request_body = False
    requires_response_body = False

    def __init__(self, lease: Lease, step: str | None = None, *,
                 require_valid: bool = True) -> None:
        self.lease = lease
        self.step = step
        self.require_valid = require_valid

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self.require_valid:
            self.lease.ensure_valid()
        request.headers[HEADER_JOB] = str(self.lease.job)
        request.headers[HEADER_TOKEN] = str(self.lease.token)
        slots = slot_header(self.lease)
        if slots is not None:
            request.headers[HEADER_SLOT] = slots
        if self.step is not None and HEADER_IDEMPOTENCY_KEY not in request.headers:
            request.headers[HEADER_IDEMPOTENCY_KEY] = idempotency_key(
                self.lease.job, self.lease.generation, self.step, token=self.lease.token)
        yield request


# -- server side --------------------------------------------------------------------------------

@dataclass(frozen=True)
class SlotFence:
    """One semaphore slot a request is gated on (from ``Joblease-Slot``)."""

    semaphore: str  # ns/name
    index: int
    token: int

    @property
    def resource(self) -> str:
        return slot_resource(self.semaphore, self.index)


@dataclass(frozen=True)
class FenceHeaders:
    """The validated fencing headers of one request."""

    job: str
    token: int
    idempotency_key: str | None
    slots: tuple[SlotFence, ...] = ()

    def fences(self, resource: str) -> list[tuple[str, int]]:
        """``(resource, token)`` of every fence the request must pass: ``resource``
        (the request's own) first, then its slots'."""
        return [(resource, self.token), *((s.resource, s.token) for s in self.slots)]


#: ASGI scope key under which the middleware hands a fenced request's
#: :class:`Fenced` to the app: what it checked (the fences, to record with the
#: effect), and the handle of apps that admit in their own transaction.
SCOPE_KEY = "joblease.fence"


@dataclass(frozen=True)
class Fenced:
    """What the middleware checked for one fenced request: the app's handle
    for gating its write in its own transaction (see ``app_admits``)."""

    resource: str
    headers: FenceHeaders

    def effect(self, status: int, body: bytes,
               headers: list[tuple[bytes, bytes]] | None = None) -> Effect:
        """The gate's :class:`~joblease.fencing.gate.Effect` for this request, with
        the response the app is about to send recorded for duplicates."""
        return Effect(self.resource, self.headers.token, self.headers.idempotency_key,
                      _Captured(status, list(headers or []), body).encode())

    def slot_effects(self) -> list[Effect]:
        """One :class:`~joblease.fencing.gate.Effect` per slot the request is gated on
        (no idempotency key: the request's own effect carries it). Admit them in the
        same transaction as :meth:`effect`'s, after it."""
        return [Effect(s.resource, s.token) for s in self.headers.slots]


def replayed(response: str) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
    """A recorded response (``Decision.response``) as status, headers (with
    ``Joblease-Replayed: true``) and body, for an app that found a duplicate."""
    first = _Captured.decode(response)
    headers = [(k, v) for k, v in first.headers or [] if k.lower() != b"content-length"]
    return first.status, [*headers, (HEADER_REPLAYED.lower().encode(), b"true")], first.body


def _shown(value: str) -> str:
    return repr(value if len(value) <= 40 else value[:40] + "...")


def parse_token(value: str | None, what: str = HEADER_TOKEN) -> int:
    """A ``Joblease-Token`` value, or :class:`InvalidInputError` saying exactly what is wrong."""
    if value is None:
        raise InvalidInputError(f"missing {what} header: a fenced request must carry "
                                "the fencing token of the worker's lease")
    text = value.strip()
    if not _DIGITS.fullmatch(text):
        raise InvalidInputError(f"invalid {what} {_shown(value)}: must be a decimal "
                                "integer")
    if text.startswith("-"):
        raise InvalidInputError(f"invalid {what} {_shown(value)}: must not be "
                                "negative")
    if len(text.lstrip("+0")) > 19 or int(text) > MAX_TOKEN:
        raise InvalidInputError(f"invalid {what} {_shown(value)}: exceeds the "
                                f"largest token {MAX_TOKEN} (2**63-1)")
    token = int(text)
    if token == 0:
        raise InvalidInputError(f"invalid {what} 0: tokens are etcd revisions and "
                                "start at 1")
    return token


def parse_slot_fences(values: list[str]) -> tuple[SlotFence, ...]:
    """The ``Joblease-Slot`` header's fences (each value a comma-separated list of
    ``ns/name/index=token``; the header may be repeated), or
    :class:`InvalidInputError` naming the bad entry."""
    entries = [entry for value in values for entry in value.split(",")]
    if len(entries) > MAX_SLOT_FENCES:  # before parsing any: bounded work per request
        raise InvalidInputError(f"{HEADER_SLOT} names {len(entries)} slots: at most "
                                f"{MAX_SLOT_FENCES} on one request")
    fences: list[SlotFence] = []
    seen: set[str] = set()
    for entry in entries:
        text = entry.strip()
        found = _SLOT_FENCE.fullmatch(text)
        if found is None:
            raise InvalidInputError(
                f"invalid {HEADER_SLOT} entry {_shown(text)}: must be "
                "namespace/semaphore/index=token (an index below 10000), entries "
                "separated by commas")
        ns, name, index, token = found.groups()
        fence = SlotFence(f"{ns}/{name}", int(index),
                          parse_token(token, f"{HEADER_SLOT} token of {ns}/{name}/{index}"))
        if fence.resource in seen:
            raise InvalidInputError(f"{HEADER_SLOT} names slot {ns}/{name}/{index} twice: "
                                    "name each slot once")
        seen.add(fence.resource)
        fences.append(fence)
    return tuple(fences)


def parse_fence_headers(headers: list[tuple[bytes, bytes]]) -> FenceHeaders:
    """Validate the three fencing headers of an ASGI request."""
    found: dict[str, list[str]] = {}
    wanted = {HEADER_JOB.lower(), HEADER_TOKEN.lower(), HEADER_IDEMPOTENCY_KEY.lower(),
              HEADER_SLOT.lower()}
    for raw_name, raw_value in headers:
        name = raw_name.decode("latin-1").lower()
        if name in wanted:
            found.setdefault(name, []).append(raw_value.decode("latin-1"))
    for name, values in found.items():
        if len(values) > 1 and name != HEADER_SLOT.lower():  # a list header may repeat
            raise InvalidInputError(f"header {name} given {len(values)} times: give it once")

    def one(header: str) -> str | None:
        values = found.get(header.lower())
        return values[0] if values else None

    job = one(HEADER_JOB)
    if job is None or not job.strip():
        raise InvalidInputError(f"missing {HEADER_JOB} header: a fenced request must name "
                                "its job as namespace/name")
    job = job.strip()
    if len(job) > _MAX_JOB_LENGTH or not job.isprintable() or not job.isascii():
        raise InvalidInputError(f"invalid {HEADER_JOB} {_shown(job)}: must be namespace/name")
    token = parse_token(one(HEADER_TOKEN))
    key = one(HEADER_IDEMPOTENCY_KEY)
    if key is not None:
        key = check_key(key.strip())
    return FenceHeaders(job, token, key, parse_slot_fences(found.get(HEADER_SLOT.lower(), [])))


def route_path(scope: Scope) -> str:
    """The path the app routes on: ``scope["path"]`` without ``scope["root_path"]``.

    Behind a path prefix (``uvicorn --root-path /api``, a mount) the ASGI
    server puts the prefix in both ``path`` and ``root_path``, and Starlette
    routes on what is left (``starlette._utils.get_route_path``, Starlette
    0.33 and later, 1.x included). A fence that looked at ``path`` itself
    would not recognise the routes it guards, and stale or header-less
    requests would reach the app. This is the same rule: strip ``root_path``
    only when ``path`` starts with it at a segment boundary.
    """
    path = str(scope.get("path", "/"))
    root_path = str(scope.get("root_path", "") or "")
    if not root_path or not path.startswith(root_path):
        return path
    if path == root_path:
        return ""
    if path[len(root_path)] == "/":
        return path[len(root_path):]
    return path


def default_resource_for(scope: Scope) -> str | None:
    """Fence every non-safe request, one resource per route path."""
    if scope.get("method", "GET") in _SAFE_METHODS:
        return None
    return route_path(scope) or "/"


async def _send_json(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body, separators=(",", ":")).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


@dataclass
class _Captured:
    status: int = 0
    headers: list[tuple[bytes, bytes]] | None = None
    body: bytes = b""

    def encode(self) -> str:
        headers = [[k.decode("latin-1"), v.decode("latin-1")] for k, v in self.headers or []
                   if k.lower() in _REPLAYED_HEADERS]
        return json.dumps({"status": self.status, "headers": headers,
                           "body": base64.b64encode(self.body).decode()},
                          separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> _Captured:
        obj = json.loads(text)
        return cls(int(obj["status"]),
                   [(k.encode("latin-1"), v.encode("latin-1")) for k, v in obj["headers"]],
                   base64.b64decode(obj["body"]))

    async def send_to(self, send: Send, extra: list[tuple[bytes, bytes]]) -> None:
        headers = [(k, v) for k, v in self.headers or [] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(self.body)).encode()))
        await send({"type": "http.response.start", "status": self.status,
                    "headers": headers + extra})
        await send({"type": "http.response.body", "body": self.body})


class FencingMiddleware:
    """ASGI middleware: fence requests on ``resource_for(scope)`` with ``gate``.

    ``gate`` defaults to a fresh :class:`MemoryGate`; pass an
    :class:`~joblease.fencing.etcd_gate.EtcdGate`, a
    :class:`~joblease.fencing.sql.SqliteGate` or a
    :class:`~joblease.fencing.sql.PostgresGate` for a mark that survives
    restarts. ``resource_for`` returns ``None`` for requests that are not
    fenced (default: safe methods); fenced responses are buffered.

    ``app_admits``: the app gates its own write, in the same transaction
    (:func:`joblease.fencing.sql.admit`, ``EtcdGate.admit(effect, puts)``),
    using the :class:`Fenced` the middleware puts in ``scope[SCOPE_KEY]``
    (``Fenced.effect`` builds the effect, recording the response it will
    send). The middleware then still refuses bad headers, replays known keys
    and refuses stale tokens before the app runs, but records nothing after
    it: the effect, the mark and the key commit together or not at all.
    """

    def __init__(self, app: ASGIApp, gate: TokenGate | None = None,
                 resource_for: Callable[[Scope], str | None] | None = None, *,
                 app_admits: bool = False) -> None:
        self.app = app
        self.gate: TokenGate = gate if gate is not None else MemoryGate()
        self.resource_for = resource_for or default_resource_for
        self.app_admits = app_admits
        self._locks: dict[str, tuple[asyncio.Lock, int]] = {}

    @asynccontextmanager
    async def _exclusive(self, resource: str) -> AsyncIterator[None]:
        lock, users = self._locks.get(resource, (asyncio.Lock(), 0))
        self._locks[resource] = (lock, users + 1)
        try:
            async with lock:
                yield
        finally:
            lock, users = self._locks[resource]
            if users == 1:
                del self._locks[resource]
            else:
                self._locks[resource] = (lock, users - 1)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        resource = self.resource_for(scope)
        if resource is None:
            await self.app(scope, receive, send)
            return
        try:
            check_resource(resource)
            fence = parse_fence_headers(list(scope.get("headers", [])))
        except InvalidInputError as exc:
            await _send_json(send, 400, exc.to_dict())
            return
        try:
            async with AsyncExitStack() as stack:
                # every resource the request is gated on, in one order (no deadlock)
                for name in sorted({r for r, _ in fence.fences(resource)}):
                    await stack.enter_async_context(self._exclusive(name))
                await self._fenced(resource, fence, scope, receive, send)
        except (StaleFenceError, InvalidInputError) as exc:
            await _send_json(send, exc.http_status, exc.to_dict())

    async def _fenced(self, resource: str, fence: FenceHeaders, scope: Scope,
                      receive: Receive, send: Send) -> None:
        key = fence.idempotency_key
        if key is not None:
            first = await self.gate.recall(key)
            if first is not None:
                await self._replay(resource, fence, first, send)
                return
        for fenced_on, token in fence.fences(resource):
            highest = await self.gate.highest(fenced_on)
            if token < highest:
                raise StaleFenceError(fenced_on, token, highest)
        scope[SCOPE_KEY] = Fenced(resource, fence)
        if self.app_admits:
            await self.app(scope, receive, send)
            return
        captured = _Captured()

        async def capture(message: Message) -> None:
            if message["type"] == "http.response.start":
                captured.status = int(message["status"])
                captured.headers = list(message.get("headers", []))
            elif message["type"] == "http.response.body":
                captured.body += bytes(message.get("body", b""))

        await self.app(scope, receive, capture)
        if 200 <= captured.status < 300:
            try:
                decision = await self.gate.admit(
                    Effect(resource, fence.token, key, captured.encode()))
                if not decision.duplicate:
                    for slot in fence.slots:
                        await self.gate.admit(Effect(slot.resource, slot.token))
            except StaleFenceError as exc:
                # Only possible when another process shares the gate: the app has
                # already applied the effect. Say so, to the log and to the client:
                # the usual "nothing was applied" of a 409 would be false here.
                log.error("gate refused token %d on %r after the app applied the effect: "
                          "the gate is shared with another process; make the effect and "
                          "the gate one transaction", exc.token, exc.resource)
                await _send_json(send, 409, {
                    **exc.to_dict(), "applied": True,
                    "message": f"token {exc.token} is stale for resource {exc.resource!r} "
                               f"(highest token {exc.highest_token}), but the app had "
                               "already applied the effect when the gate refused it"})
                return
            except Exception as exc:
                # The effect is applied; whether the gate recorded it is unknown. A
                # retry with the same key could apply it again: say so, never "not applied".
                log.error("the app applied the effect on %r but the gate could not record "
                          "it: %s", resource, exc, exc_info=True)
                await _send_json(send, 500, {
                    "error": getattr(exc, "reason", "unknown"), "applied": True,
                    "resource": resource, "token": fence.token,
                    "message": "the app applied the effect but the gate could not record "
                               f"it ({exc}); a retry with the same idempotency key may "
                               "apply it again"})
                return
            if decision.duplicate:  # a concurrent replica applied the same key first
                log.error("idempotency key %r on %r was recorded by another process while "
                          "the app applied it here: the effect was applied twice; make the "
                          "effect and the gate one transaction", key, resource)
                await self._replay(resource, fence, decision, send)
                return
        await captured.send_to(send, [])

    async def _replay(self, resource: str, fence: FenceHeaders, first: Decision,
                      send: Send) -> None:
        if (first.resource, first.token) != (resource, fence.token):
            raise InvalidInputError(
                f"idempotency key {fence.idempotency_key!r} was first used for resource "
                f"{first.resource!r} with token {first.token}; it cannot be reused for "
                f"resource {resource!r} with token {fence.token}")
        await _Captured.decode(first.response).send_to(send, [(HEADER_REPLAYED.lower().encode(),
                                                               b"true")])
