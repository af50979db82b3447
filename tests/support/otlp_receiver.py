"""A real OTLP/HTTP trace receiver, run as its own process on a free loopback port.

Not the OpenTelemetry Collector: building otelcol from its Go modules was not
attempted on these shared 2-core machines (see docs/tracing.md, "How it is
tested"). Instead this receiver decodes what arrives on ``POST /v1/traces`` with
the official OTLP messages (``opentelemetry-proto``'s
``ExportTraceServiceRequest``), in both encodings OTLP/HTTP defines: binary
protobuf (``application/x-protobuf``, what the Python SDK sends) and JSON
(``application/json``, what the Go sidecar's exporter sends; trace and span ids
as hex, as the OTLP spec says). A body that does not decode gets HTTP 400, as
from a collector, so an exporter that sends malformed OTLP fails the tests.

Each span received is appended as one JSON line to the output file (ids in hex,
attributes as a plain dict); :class:`OtlpReceiver` starts the process and reads
the file. Run directly: ``python -m tests.support.otlp_receiver PORT FILE``.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from joblease.embedded import free_port
from tests.support.waiting import wait_until


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int
    status_code: int

    @classmethod
    def from_json(cls, line: str) -> ReceivedSpan:
        return cls(**json.loads(line))


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return [_value(v) for v in any_value.array_value.values]
    return getattr(any_value, kind)


def _hex_ids_to_base64(obj: Any) -> Any:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping expects base64."""
    if isinstance(obj, dict):
        return {k: (base64.b64encode(bytes.fromhex(v)).decode()
                    if k in ("traceId", "spanId", "parentSpanId") and isinstance(v, str)
                    else _hex_ids_to_base64(v)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_hex_ids_to_base64(v) for v in obj]
    return obj


def decode(body: bytes, content_type: str) -> list[ReceivedSpan]:
    """The spans of one OTLP/HTTP export request; ValueError if it is not one."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    request = ExportTraceServiceRequest()
    try:
        if content_type.startswith("application/json"):
            json_format.Parse(json.dumps(_hex_ids_to_base64(json.loads(body))), request)
        elif content_type.startswith("application/x-protobuf"):
            request.ParseFromString(body)
        else:
            raise ValueError(f"unsupported content type {content_type!r}")
    except (DecodeError, json_format.ParseError, json.JSONDecodeError) as exc:
        raise ValueError(f"not an OTLP export request: {exc}") from exc
    spans = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if len(span.trace_id) != 16 or len(span.span_id) != 8:
                    raise ValueError(f"span {span.name!r} has malformed ids")
                spans.append(ReceivedSpan(
                    service=str(resource.get("service.name", "")), name=span.name,
                    trace_id=span.trace_id.hex(), span_id=span.span_id.hex(),
                    parent_span_id=span.parent_span_id.hex(),
                    attributes={a.key: _value(a.value) for a in span.attributes},
                    start_ns=span.start_time_unix_nano, end_ns=span.end_time_unix_nano,
                    status_code=span.status.code))
    return spans


def serve(port: int, out: Path) -> None:
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            content_type = self.headers.get("Content-Type", "")
            if self.path != "/v1/traces":
                self.send_error(404)
                return
            try:
                spans = decode(body, content_type)
            except ValueError as exc:
                self.send_error(400, str(exc))
                return
            with lock, out.open("a") as f:
                for span in spans:
                    f.write(json.dumps(span.__dict__) + "\n")
            answer = b"{}" if content_type.startswith("application/json") else b""
            self.send_response(200)
            self.send_header("Content-Type", content_type.split(";")[0])
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    out.touch()
    server.serve_forever()


class OtlpReceiver:
    """The receiver process; ``endpoint`` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""

    def __init__(self, directory: Path) -> None:
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.out = directory / "spans.jsonl"
        self.log = directory / "receiver.log"
        root = Path(__file__).resolve().parents[2]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.support.otlp_receiver", str(self.port),
                 str(self.out)], cwd=root, stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": os.pathsep.join(
                    [str(root / "operator"), str(root), os.environ.get("PYTHONPATH", "")])})

        def started() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"OTLP receiver did not start: {self.log.read_text()}")
            return self.out.exists()

        try:
            wait_until(started, timeout=20, what="the OTLP receiver's spans file")
        except AssertionError as exc:
            raise RuntimeError(f"OTLP receiver did not start ({exc}): "
                               f"{self.log.read_text()}") from None

    def env(self, service: str) -> dict[str, str]:
        return {"OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint, "OTEL_SERVICE_NAME": service}

    def spans(self) -> list[ReceivedSpan]:
        return [ReceivedSpan.from_json(line) for line in self.out.read_text().splitlines()]

    def spans_of(self, service: str) -> Iterator[ReceivedSpan]:
        return (s for s in self.spans() if s.service == service)

    def wait_for(self, what: str, predicate: Callable[[list[ReceivedSpan]], bool],
                 service: str, timeout: float = 15.0) -> list[ReceivedSpan]:
        """The service's spans once ``predicate`` holds for them."""
        spans: list[ReceivedSpan] = []

        def holds() -> bool:
            spans[:] = self.spans_of(service)
            return predicate(spans)

        try:
            wait_until(holds, timeout=timeout, what=what, interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}; got {spans}") from None
        return spans

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


if __name__ == "__main__":
    serve(int(sys.argv[1]), Path(sys.argv[2]))
