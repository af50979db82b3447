"""The sidecar's HTTP API (Starlette), served in-process on the lease's event loop.

Every handler asks the runner for the phase *at the moment of the request*,
so a lost lease is answered with 409 from the instant it is known to be
lost. Input is checked completely (auth, method, size, JSON, token type,
result size) before the runner -- and so etcd -- is touched: a bad request
changes nothing.

Two apps: the full API for the loopback listener, and a probe-only app
(``/healthz``, ``/readyz``, ``/metrics``) for the pod-IP listener that
kubelet's probes reach.

The lease API is rate limited (a token bucket, ``SidecarConfig.rate_limit``
requests per second, bursts up to one second's worth): a runaway or hostile
worker gets 429 before the bearer check, so it can neither hammer etcd
through the sidecar nor guess the bearer token quickly. The probe endpoints
are not limited (kubelet must always get an answer).
"""

from __future__ import annotations

import hmac
import json
import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from joblease.errors import JobLeaseError
from joblease.records import CheckpointRecord, ResultRecord
from joblease.sidecar.state import (
    Answer,
    NothingToRelease,
    Phase,
    Released,
    Stale,
    Unsettled,
)

if TYPE_CHECKING:
    from joblease.sidecar.runner import SidecarRunner

Handler = Callable[[Request], Awaitable[Response]]

#: Routes accept every method so a wrong one gets our JSON 405, not a bare text one.
_ALL = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]

#: JSON envelope allowance on top of the result limit (the token, the keys).
_ENVELOPE_BYTES = 4096


class BadRequest(Exception):
    def __init__(self, status: int, error: str, message: str) -> None:
        super().__init__(message)
        self.status, self.error, self.message = status, error, message

    def response(self) -> JSONResponse:
        return JSONResponse({"error": self.error, "message": self.message}, self.status)


class RateLimiter:
    """A token bucket: ``rate`` requests per second, bursts of up to ``burst``.

    The sidecar serves on one event loop, so no lock is needed.
    """

    def __init__(self, rate: float, burst: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not rate > 0 or math.isinf(rate):
            raise ValueError(f"rate must be a positive finite number, got {rate!r}")
        self.rate = rate
        self.burst = max(1.0, rate if burst is None else burst)
        self._clock = clock
        self._tokens = self.burst
        self._last = clock()

    def take(self) -> float:
        """0.0 if the request may go ahead, else the seconds until it could."""
        now = self._clock()
        self._tokens = min(self.burst, self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1.0:
            self._tokens -= 1.0
            return 0.0
        return (1.0 - self._tokens) / self.rate


class Outcome:
    """An HTTP answer: a status and a JSON body."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body


def render(answer: Answer) -> Outcome:
    """An operation's answer as HTTP (docs/sidecar.md): records 200; stale 409;
    unsettled 503 ``unknown``; a domain error with its own status and body
    (``http_status``, ``to_dict()``: 413 for a result too large, 503 for etcd
    unavailable, ...)."""
    if isinstance(answer, ResultRecord | CheckpointRecord):
        return Outcome(200, answer.to_dict())
    if isinstance(answer, Released):
        return Outcome(200, {"state": "released", "token": answer.token})
    if isinstance(answer, Stale):
        return Outcome(409, {"error": "stale", "message": answer.message, "token": answer.token,
                             "currentToken": answer.current_token,
                             "state": answer.state.value})
    if isinstance(answer, Unsettled):
        return Outcome(503, {
            "error": "unknown", "state": answer.state.value,
            "message": f"the lease ended while the completion under token {answer.token} "
                       "was in flight and etcd cannot say yet whether it committed; "
                       "retry the same request"})
    if isinstance(answer, NothingToRelease):
        # Not "stale" (which would name this very token as the current one).
        return Outcome(409, {"error": "completed", "token": answer.token,
                             "state": answer.state.value, "result": answer.result.to_dict(),
                             "message": f"the job was completed under token {answer.token}; "
                                        "there is nothing to release"})
    assert isinstance(answer, JobLeaseError), answer
    return Outcome(answer.http_status, answer.to_dict())


def lease_view(runner: SidecarRunner) -> Outcome:
    """``GET /v1/lease``: 200 only while the lease is held."""
    phase = runner.current()
    cfg = runner.config
    base: dict[str, Any] = {"state": phase.value, "job": str(cfg.job), "owner": cfg.owner}
    lease = runner.lease
    if phase is Phase.HELD and lease is not None:
        return Outcome(200, {**base, "token": lease.token, "generation": lease.generation,
                             "ttl": lease.ttl,
                             "remainingSeconds": round(lease.remaining(), 3),
                             "checkpoint": lease.checkpoint_dict()})
    if phase is Phase.CLAIMING:
        return Outcome(503, base)
    if phase is Phase.COMPLETING:
        return Outcome(409, {"error": "completing", **base,
                             "message": "the lease ended while a completion was in flight; "
                                        "the job's result decides whether it completed"})
    if phase is Phase.LOST:
        return Outcome(409, {"error": "lost", **base,
                             "message": f"the lease was lost: {runner.lost_reason}"})
    if phase is Phase.COMPLETED and runner.completed_before_claim:
        r = runner.result
        by = f" by {r.owner} under token {r.token}" if r is not None else ""
        return Outcome(409, {"error": "completed", **base,
                             "message": f"the job was already completed{by}; "
                                        "nothing to do",
                             "result": r.to_dict() if r else None, "exitCode": 0})
    if phase is Phase.COMPLETED:
        return Outcome(409, {"error": "completed", **base,
                             "message": "the job is completed",
                             "result": runner.result.to_dict() if runner.result else None})
    if phase is Phase.FAILED and runner.failure is not None:
        return Outcome(409, {**runner.failure, **base})
    if phase is Phase.RELEASED:
        return Outcome(409, {"error": "released", **base,
                             "message": "the lease was released"})
    return Outcome(503, base)


def _reply(outcome: Outcome) -> JSONResponse:
    return JSONResponse(outcome.body, outcome.status)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


async def _read_body(request: Request, limit: int) -> bytes:
    """The body, refusing anything over ``limit`` without reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, "too_large", f"request body of {declared} bytes exceeds the "
                                           f"limit of {limit} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, "too_large", f"request body exceeds the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes) -> dict[str, Any]:
    try:
        obj = json.loads(body, parse_constant=_reject_constant)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise BadRequest(400, "invalid", f"request body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise BadRequest(400, "invalid", "request body must be a JSON object")
    return obj


def _token(obj: dict[str, Any]) -> int:
    if "token" not in obj:
        raise BadRequest(400, "invalid", "missing \"token\": send the token from GET /v1/lease")
    token = obj["token"]
    if isinstance(token, bool) or not isinstance(token, int):
        raise BadRequest(400, "invalid",
                         f"\"token\" must be an integer, got {type(token).__name__}")
    if not 0 < token < 2**63:
        raise BadRequest(400, "invalid", "\"token\" must be a positive 64-bit integer")
    return token


def _result(obj: dict[str, Any], limit: int, key: str = "result", what: str = "result") -> Any:
    result = obj.get(key)
    size = len(json.dumps(result, separators=(",", ":"), sort_keys=True).encode())
    if size > limit:
        raise BadRequest(413, "too_large",
                         f"{what} too large: {size} bytes of JSON, the limit is {limit} bytes")
    return result


def _guard(runner: SidecarRunner, methods: tuple[str, ...], handler: Handler,
           *, auth: bool, limiter: RateLimiter | None = None) -> Handler:
    """Rate limit, bearer check (constant time), then method check, in that order, as JSON."""
    expected = runner.config.api_token

    async def guarded(request: Request) -> Response:
        if limiter is not None:
            wait = limiter.take()
            if wait > 0:
                return JSONResponse(
                    {"error": "rate_limited",
                     "message": f"more than {limiter.rate:g} requests per second; "
                                f"retry in {wait:.2f} s"},
                    429, headers={"Retry-After": str(max(1, math.ceil(wait)))})
        if auth and expected is not None:
            header = request.headers.get("authorization", "")
            scheme, _, given = header.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    given.strip().encode(), expected.encode()):
                return JSONResponse(
                    {"error": "unauthorized", "message": "missing or wrong bearer token"},
                    401, headers={"WWW-Authenticate": "Bearer"})
        if request.method not in methods:
            return JSONResponse(
                {"error": "method_not_allowed",
                 "message": f"{request.method} not allowed; use {', '.join(methods)}"},
                405, headers={"Allow": ", ".join(methods)})
        try:
            return await handler(request)
        except BadRequest as exc:
            return exc.response()

    return guarded


def _probe_routes(runner: SidecarRunner) -> list[Route]:
    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "state": runner.current().value})

    async def readyz(request: Request) -> Response:
        ready = runner.ready()
        return JSONResponse({"ready": ready, "state": runner.phase.value},
                            200 if ready else 503)

    async def metrics(request: Request) -> Response:
        body = runner.metrics.render(runner.remaining())
        return Response(body, media_type=runner.metrics.content_type)

    get = ("GET", "HEAD")
    return [
        Route("/healthz", _guard(runner, get, healthz, auth=False), methods=_ALL),
        Route("/readyz", _guard(runner, get, readyz, auth=False), methods=_ALL),
        Route("/metrics", _guard(runner, get, metrics, auth=False), methods=_ALL),
    ]


def build_app(runner: SidecarRunner) -> Starlette:
    """The loopback API: lease, complete, checkpoint, release, plus the probe endpoints.

    ``/v1/*`` is limited to ``config.rate_limit`` requests/s (``None``: unlimited).
    """
    cfg = runner.config
    body_limit = cfg.max_result_bytes + _ENVELOPE_BYTES
    limiter = RateLimiter(cfg.rate_limit) if cfg.rate_limit is not None else None

    async def lease(request: Request) -> Response:
        return _reply(lease_view(runner))

    async def complete(request: Request) -> Response:
        obj = _parse(await _read_body(request, body_limit))
        token = _token(obj)
        result = _result(obj, cfg.max_result_bytes)
        return _reply(render(await runner.complete(token, result)))

    async def checkpoint(request: Request) -> Response:
        obj = _parse(await _read_body(request, body_limit))
        token = _token(obj)
        if "data" not in obj:
            raise BadRequest(400, "invalid", "missing \"data\": the checkpoint as JSON")
        data = _result(obj, cfg.max_result_bytes, key="data", what="checkpoint")
        return _reply(render(await runner.checkpoint(token, data)))

    async def release(request: Request) -> Response:
        obj = _parse(await _read_body(request, _ENVELOPE_BYTES))
        return _reply(render(await runner.release(_token(obj))))

    routes = [
        Route("/v1/lease", _guard(runner, ("GET", "HEAD"), lease, auth=True, limiter=limiter),
              methods=_ALL),
        Route("/v1/complete", _guard(runner, ("POST",), complete, auth=True, limiter=limiter),
              methods=_ALL),
        Route("/v1/release", _guard(runner, ("POST",), release, auth=True, limiter=limiter),
              methods=_ALL),
        Route("/v1/checkpoint", _guard(runner, ("POST",), checkpoint, auth=True,
                                       limiter=limiter), methods=_ALL),
        *_probe_routes(runner),
    ]
    return Starlette(routes=routes)


def build_probe_app(runner: SidecarRunner) -> Starlette:
    """Only what kubelet and Prometheus need; never the token."""
    return Starlette(routes=_probe_routes(runner))
