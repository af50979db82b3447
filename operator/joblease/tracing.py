"""Opt-in OpenTelemetry traces of tenures (docs/tracing.md).

A *tenure* is one claim until its end (completed, released, expired, lost,
revoked). With tracing on, each tenure is one span (``joblease.tenure``) and
each completion or checkpoint under it a child span; the tenure's W3C trace
context (``traceparent``) is handed to the worker so its own spans join the
tenure's trace.

Tracing is telemetry, never part of safety: a span that cannot be exported is
dropped by the SDK's batch processor, and nothing here can fail or delay a
claim, renewal, completion or release.

It is off unless the standard OpenTelemetry environment asks for it
(``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, or
``OTEL_TRACES_EXPORTER=otlp|console``; ``OTEL_TRACES_EXPORTER=none`` or
``OTEL_SDK_DISABLED=true`` turn it off), and the OpenTelemetry SDK (the
``joblease[otel]`` extra) is imported only then: without it, or with tracing
off, every tenure shares one do-nothing :data:`NO_TENURE`.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

log = logging.getLogger(__name__)

SPAN_TENURE = "joblease.tenure"
SPAN_COMPLETE = "joblease.complete"
SPAN_CHECKPOINT = "joblease.checkpoint"

#: How a tenure ended (attribute ``joblease.end_cause``), the names the tenure
#: history uses too. A worker cannot tell ``unregistered`` from another loss
#: (its holder key is simply gone), so its spans say ``lost`` then.
END_CAUSES = ("completed", "released", "expired", "lost", "revoked", "unregistered")

#: The service name spans carry when ``OTEL_SERVICE_NAME`` is not set.
DEFAULT_SERVICE_NAME = "joblease"

_ON_EXPORTERS = {"otlp", "console"}


def enabled_by(env: Mapping[str, str]) -> bool:
    """Whether the standard OpenTelemetry variables in ``env`` ask for traces."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    exporters.discard("")
    if exporters:
        return bool(exporters & _ON_EXPORTERS)
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def end_cause(state: str, reason: str | None) -> str:
    """The end cause of a tenure from its handle's final state and loss reason."""
    if state in ("completed", "released"):
        return state
    why = reason or ""
    if "session closed" in why:
        return "revoked"  # the owner closed its client, which revokes its etcd lease
    if "deadline" in why or "lease expired" in why:
        return "expired"  # the lease ran out (not "holder key deleted (expired, ...)")
    return "lost"


class Tenure:
    """The trace of one tenure. This base class records nothing: it is
    :data:`NO_TENURE`, what every tenure gets while tracing is off."""

    #: the tenure span's W3C trace context (``00-<trace id>-<span id>-01``),
    #: None while tracing is off
    traceparent: str | None = None

    @contextlib.contextmanager
    def child(self, name: str) -> Iterator[Span | None]:
        """A child span of the tenure for the ``with`` body (None: not recording)."""
        yield None

    def end(self, cause: str, reason: str | None = None) -> None:
        """End the tenure span with ``cause`` (once; later calls are ignored)."""


NO_TENURE = Tenure()


class _RecordedTenure(Tenure):
    def __init__(self, tracer: Tracer, span: Span, attributes: dict[str, Any]) -> None:
        self._tracer = tracer
        self._span = span
        self._attributes = attributes
        self._open_children = 0
        self._ended = False
        self._end_pending = False
        ctx = span.get_span_context()
        self.traceparent = f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}"

    @contextlib.contextmanager
    def child(self, name: str) -> Iterator[Span | None]:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode

        span = _quietly(lambda: self._tracer.start_span(
            name, context=trace.set_span_in_context(self._span), attributes=self._attributes))
        if span is None:
            yield None
            return
        self._open_children += 1
        try:
            yield span
        except BaseException as exc:
            outcome = str(getattr(exc, "reason", None) or type(exc).__name__)
            message = str(exc)[:200]
            _quietly(lambda: (span.set_attribute("joblease.outcome", outcome),
                              span.set_status(Status(StatusCode.ERROR, message))))
            raise
        else:
            _quietly(lambda: span.set_attribute("joblease.outcome", "ok"))
        finally:
            _quietly(span.end)
            self._open_children -= 1
            if self._end_pending and self._open_children == 0:
                _quietly(self._span.end)  # the tenure ended inside this child: after it

    def end(self, cause: str, reason: str | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        _quietly(lambda: self._span.set_attribute("joblease.end_cause", cause))
        if reason:
            _quietly(lambda: self._span.set_attribute("joblease.end_reason", reason))
        if self._open_children:
            self._end_pending = True  # e.g. the completion that ended it is still open
        else:
            _quietly(self._span.end)


def _quietly(call: Callable[[], T]) -> T | None:
    """``call()``, or None if the OpenTelemetry SDK raised: a span must never
    turn a committed claim or completion into an exception (the claim's
    holder would then be left without a handle)."""
    try:
        return call()
    except Exception:
        log.debug("tracing call failed; the span is incomplete", exc_info=True)
        return None


class _Tracing:
    """The tracer the tenures use, and the provider to flush and shut down."""

    def __init__(self, tracer: Tracer, provider: TracerProvider | None) -> None:
        self.tracer = tracer
        self.provider = provider


_lock = threading.Lock()
_current: _Tracing | None = None
_configured = False


def configure(env: Mapping[str, str] | None = None) -> bool:
    """(Re)read the OpenTelemetry environment (``os.environ`` by default) and
    return whether tenures are traced from now on. Called on the first tenure;
    call it yourself to change the setting in a running process (tests do).

    An application that has installed its own global OpenTelemetry tracer
    provider gets its spans there; otherwise joblease makes a private one with
    a batching OTLP/HTTP exporter (flushed at exit).
    """
    global _current, _configured
    with _lock:
        old, _current, _configured = _current, _setup(os.environ if env is None else env), True
    if old is not None and old.provider is not None:
        old.provider.shutdown()
    return _current is not None


def _setup(env: Mapping[str, str]) -> _Tracing | None:
    if not enabled_by(env):
        return None
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        log.warning("OpenTelemetry tracing was asked for, but its SDK is not installed "
                    "(pip install 'joblease[otel]'); no spans are exported")
        return None
    if not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):
        return _Tracing(trace.get_tracer("joblease"), None)  # the application's own
    service = env.get("OTEL_SERVICE_NAME") or DEFAULT_SERVICE_NAME
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",")}
    if "console" in exporters:
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    if "otlp" in exporters or not exporters - {""}:
        exporter: SpanExporter = _otlp_exporter(env)
        provider.add_span_processor(BatchSpanProcessor(exporter))
    return _Tracing(provider.get_tracer("joblease"), provider)


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    """OTLP over HTTP (protobuf). The endpoint variables are the standard ones:
    ``..._TRACES_ENDPOINT`` is used as given, ``OTEL_EXPORTER_OTLP_ENDPOINT``
    gets ``/v1/traces`` appended."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    if not endpoint and env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = env["OTEL_EXPORTER_OTLP_ENDPOINT"].rstrip("/") + "/v1/traces"
    return OTLPSpanExporter(endpoint=endpoint or None)


def prepare() -> None:
    """Read the environment now if it has not been read yet (``JobLeaseClient()``
    calls it): with tracing on, importing the SDK takes a few hundred ms,
    better paid at start-up than inside the first claim, whose lease is
    already counting down."""
    if not _configured:
        configure()


def _tracing() -> _Tracing | None:
    prepare()
    return _current


def flush(timeout: float = 5.0) -> bool:
    """Export the spans ended so far (best effort); True if all were sent."""
    current = _current
    if current is None or current.provider is None:
        return True
    return bool(current.provider.force_flush(int(timeout * 1000)))


def start_tenure(job: object, namespace: str, owner: str, claim_id: str, token: int,
                 generation: int) -> Tenure:
    """The trace of a tenure that has just begun (:data:`NO_TENURE` while off).

    Its parent is the caller's current span, if it has one, so a claim made
    inside an application's span joins that trace."""
    current = _tracing()
    if current is None:
        return NO_TENURE
    attributes: dict[str, Any] = {
        "joblease.job": str(job), "joblease.namespace": namespace,
        "joblease.holder": owner, "joblease.claim_id": claim_id,
        "joblease.token": token, "joblease.generation": generation,
    }
    tenure = _quietly(lambda: _RecordedTenure(
        current.tracer, current.tracer.start_span(SPAN_TENURE, attributes=attributes),
        attributes))
    return NO_TENURE if tenure is None else tenure


class Traced(Protocol):
    """What :func:`child_span` decorates a method of: an object with a tenure."""

    @property
    def trace(self) -> Tenure: ...


S = TypeVar("S", bound=Traced)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")


def child_span(name: str) -> Callable[[Callable[Concatenate[S, P], Awaitable[R]]],
                                      Callable[Concatenate[S, P], Awaitable[R]]]:
    """Run the decorated async method inside a child span ``name`` of its
    object's tenure; outcome ``ok`` or the error's reason (``stale``, ...)."""
    def decorate(fn: Callable[Concatenate[S, P], Awaitable[R]]
                 ) -> Callable[Concatenate[S, P], Awaitable[R]]:
        # Not itself a coroutine function: untraced (the common case, and every
        # completion's), the call returns ``fn``'s own awaitable, with no extra
        # coroutine level to create and to resume at each of its awaits.
        @functools.wraps(fn)
        def traced(self: S, /, *args: P.args, **kwargs: P.kwargs) -> Awaitable[R]:
            tenure = self.trace
            if tenure is NO_TENURE:
                return fn(self, *args, **kwargs)
            return _in_child(tenure, name, fn, self, *args, **kwargs)
        return traced
    return decorate


async def _in_child(tenure: Tenure, name: str, fn: Callable[Concatenate[S, P], Awaitable[R]],
                    self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
    """``fn`` awaited inside the child span ``name`` of ``tenure`` (the span
    starts when the call is first awaited, as an ``async def`` body does)."""
    with tenure.child(name):
        return await fn(self, *args, **kwargs)


def worker_env(tenure: Tenure) -> dict[str, str]:
    """The variables that hand a tenure's trace context to a worker process
    (W3C ``TRACEPARENT``, read by OpenTelemetry's environment propagators);
    empty while tracing is off."""
    return {} if tenure.traceparent is None else {"TRACEPARENT": tenure.traceparent}
