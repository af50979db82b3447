"""``joblease run`` hands its tenure's trace context to the command
(``TRACEPARENT``): the command's own span, started from it with the
OpenTelemetry SDK's standard propagator, is a child of the tenure span, and
both arrive at a real OTLP/HTTP receiver."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from joblease import EtcdConfig, tracing
from tests.support.cli import jl
from tests.support.otlp_receiver import OtlpReceiver

WORKER = """
import os
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.propagate import extract
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

service = os.environ["OTEL_SERVICE_NAME"]
provider = TracerProvider(resource=Resource.create({"service.name": service}))
provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
parent = extract({"traceparent": os.environ["TRACEPARENT"]})
with provider.get_tracer("worker").start_as_current_span("worker.step", context=parent):
    pass
provider.shutdown()
print('{"done": true}')
"""


def test_the_commands_span_from_traceparent_is_a_child_of_the_tenure_span(
    etcd_config: EtcdConfig, otlp_receiver: OtlpReceiver, service: str, tmp_path: Path,
) -> None:
    jl(etcd_config, "register", "traced", "--ttl", "5")
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    env = {**os.environ, **otlp_receiver.env(service),
           "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    done = subprocess.run(
        [sys.executable, "-m", "joblease.cli", "run", "traced", "--owner", "pod-r", "--",
         sys.executable, str(worker)], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr

    spans = otlp_receiver.wait_for(
        "the tenure, its completion and the worker's span",
        lambda got: {s.name for s in got} >= {tracing.SPAN_TENURE, tracing.SPAN_COMPLETE,
                                              "worker.step"}, service)
    (tenure,) = [s for s in spans if s.name == tracing.SPAN_TENURE]
    (step,) = [s for s in spans if s.name == "worker.step"]
    (completion,) = [s for s in spans if s.name == tracing.SPAN_COMPLETE]
    assert tenure.attributes["joblease.job"] == "default/traced"
    assert tenure.attributes["joblease.holder"] == "pod-r"
    assert tenure.attributes["joblease.end_cause"] == "completed"
    for child in (step, completion):
        assert (child.trace_id, child.parent_span_id) == (tenure.trace_id, tenure.span_id)


def test_without_tracing_the_command_gets_no_traceparent(
    etcd_config: EtcdConfig, tmp_path: Path,
) -> None:
    jl(etcd_config, "register", "plain", "--ttl", "5")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.pop("TRACEPARENT", None)
    env.update(JOBLEASE_ETCD_ENDPOINTS=",".join(etcd_config.endpoints),
               JOBLEASE_ROOT=etcd_config.root)
    done = subprocess.run(
        [sys.executable, "-m", "joblease.cli", "run", "plain", "--owner", "pod-p", "--",
         "sh", "-c", 'echo "{\\"traceparent\\": \\"${TRACEPARENT:-unset}\\"}"'],
        env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == '{"traceparent": "unset"}'
