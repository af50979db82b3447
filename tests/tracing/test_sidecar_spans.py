"""The Go sidecar's spans, as a real OTLP/HTTP receiver gets them (JSON
encoding, from the sidecar's own exporter), and the trace context it serves
the worker in ``GET /v1/lease`` and token.json: the worker's span started from
it is a child of the tenure span."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from joblease import EtcdConfig, JobLeaseClient, tracing
from joblease.embedded import free_port
from tests.support.openapi_conformance import Conformance
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.sidecar_process import Env


@pytest.fixture
def env(tmp_path: Path, etcd_config: EtcdConfig, sidecar_argv: list[str]) -> Iterator[Env]:
    e = Env(tmp_path, etcd_config, sidecar_argv)
    yield e
    e.stop()


def worker_span(receiver: OtlpReceiver, service: str, traceparent: str) -> None:
    """What a worker does with the context: its own span, its own SDK and exporter."""
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")))
    with provider.get_tracer("worker").start_as_current_span(
            "worker.step", context=extract({"traceparent": traceparent})):
        pass
    provider.shutdown()


async def test_sidecar_tenure_and_operation_spans_and_the_workers_child_span(
    env: Env, client: JobLeaseClient, otlp_receiver: OtlpReceiver, service: str,
) -> None:
    await env.register(client, ttl=5)
    sidecar = await env.sidecar("s1", **otlp_receiver.env(service)).started()
    lease = await sidecar.held()
    token, traceparent = lease["token"], lease["traceparent"]
    Conformance().check("/v1/lease", "GET", await sidecar.request("GET", "/v1/lease"))
    assert traceparent.startswith("00-") and len(traceparent) == 55
    token_json = json.loads(sidecar.workdir.joinpath("token.json").read_text())
    assert token_json["traceparent"] == traceparent

    assert (await sidecar.metrics())["joblease_sidecar_spans_dropped_total"] == 0
    worker_span(otlp_receiver, service, traceparent)
    r = await sidecar.request("POST", "/v1/checkpoint", json={"token": token, "data": {"i": 1}})
    assert r.status_code == 200, r.text
    r = await sidecar.request("POST", "/v1/complete", json={"token": token - 1, "result": 0})
    assert r.status_code == 409, r.text  # a stale token: refused, and traced as such
    r = await sidecar.request("POST", "/v1/complete", json={"token": token, "result": {"ok": 1}})
    assert r.status_code == 200, r.text
    sidecar.signal(signal.SIGTERM)
    await sidecar.wait_exit(15)  # the exporter flushes on the way out

    spans = otlp_receiver.wait_for(
        "the sidecar's tenure, checkpoint and two completions, and the worker's span",
        lambda got: len(got) >= 5, service)
    (tenure,) = [s for s in spans if s.name == tracing.SPAN_TENURE]
    assert tenure.attributes == {
        "joblease.job": str(env.job), "joblease.namespace": env.job.namespace,
        "joblease.holder": lease["owner"], "joblease.claim_id": tenure.attributes[
            "joblease.claim_id"], "joblease.token": token,
        "joblease.generation": lease["generation"], "joblease.end_cause": "completed"}
    assert traceparent == f"00-{tenure.trace_id}-{tenure.span_id}-01"
    children = {s.name: [] for s in spans}
    for s in spans:
        if s is not tenure:
            assert (s.trace_id, s.parent_span_id) == (tenure.trace_id, tenure.span_id), s
            children[s.name].append(s.attributes.get("joblease.outcome"))
    assert children["worker.step"] == [None]
    assert children[tracing.SPAN_CHECKPOINT] == ["ok"]
    assert sorted(children[tracing.SPAN_COMPLETE]) == ["ok", "stale"]


async def test_untraced_sidecar_serves_no_trace_context(
    env: Env, client: JobLeaseClient,
) -> None:
    await env.register(client, ttl=5)
    sidecar = await env.sidecar("s1", OTEL_TRACES_EXPORTER="none",
                                OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{free_port()}"
                                ).started()
    lease = await sidecar.held()
    assert "traceparent" not in lease
    assert "joblease_sidecar_spans_dropped_total" not in await sidecar.metrics()
    assert "traceparent" not in json.loads(sidecar.workdir.joinpath("token.json").read_text())
