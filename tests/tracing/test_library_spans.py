"""The library's spans, as a real OTLP/HTTP receiver gets them: one per tenure
with its job, namespace, generation, token, holder and end cause, and its
completions and checkpoints as children of it."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, tracing
from joblease.errors import StaleTokenError
from joblease.lease import LeaseState
from joblease.store import Delete
from tests.support.otlp_receiver import OtlpReceiver, ReceivedSpan


def by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


async def test_tenure_span_carries_the_claim_and_its_children_are_the_completion_and_checkpoints(
    client: JobLeaseClient, traced: OtlpReceiver, service: str,
) -> None:
    job = JobRef("team-a", "nightly")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    first = await client.claim(job, "pod-1")
    await first.release()
    lease = await client.claim(job, "pod-2")
    assert lease.trace.traceparent is not None
    await lease.checkpoint({"step": 1})
    await lease.checkpoint({"step": 2})
    await lease.complete({"rows": 3})
    assert tracing.flush()

    spans = traced.wait_for("two tenures, two checkpoints and a completion",
                            lambda got: len(got) >= 5, service)
    tenures = {s.attributes["joblease.holder"]: s for s in by_name(spans, tracing.SPAN_TENURE)}
    assert set(tenures) == {"pod-1", "pod-2"}
    released, completed = tenures["pod-1"], tenures["pod-2"]
    assert released.attributes["joblease.end_cause"] == "released"
    assert completed.attributes == {
        "joblease.job": "team-a/nightly", "joblease.namespace": "team-a",
        "joblease.holder": "pod-2", "joblease.claim_id": lease.claim_id,
        "joblease.token": lease.token, "joblease.generation": 2,
        "joblease.end_cause": "completed"}
    assert released.attributes["joblease.token"] < lease.token
    assert completed.parent_span_id == "" and released.trace_id != completed.trace_id
    assert lease.trace.traceparent.startswith(f"00-{completed.trace_id}-{completed.span_id}-")

    children = by_name(spans, tracing.SPAN_CHECKPOINT) + by_name(spans, tracing.SPAN_COMPLETE)
    assert [s.name for s in sorted(children, key=lambda s: s.start_ns)] == [
        tracing.SPAN_CHECKPOINT, tracing.SPAN_CHECKPOINT, tracing.SPAN_COMPLETE]
    for child in children:
        assert (child.trace_id, child.parent_span_id) == (completed.trace_id, completed.span_id)
        assert child.attributes["joblease.token"] == lease.token
        assert child.attributes["joblease.outcome"] == "ok"
        assert completed.start_ns <= child.start_ns <= child.end_ns <= completed.end_ns


async def test_a_stale_completion_is_an_error_span_under_a_lost_tenure(
    client: JobLeaseClient, traced: OtlpReceiver, service: str,
) -> None:
    """Worker A's tenure ends lost when B took the job; A's refused completion is
    a child of A's tenure with outcome ``stale``."""
    job = JobRef("team-a", "seed")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    a = await client.claim(job, "worker-a")
    # B takes the job over as an expiry would let it: A's holder key is gone
    # (deleted here rather than waiting out a TTL) and B claims the next generation.
    await client.store.txn([], [Delete(client.keys.job(job).holder)], [])
    b = await client.claim(job, "worker-b")
    with pytest.raises(StaleTokenError):
        await a.complete({"late": True})
    await b.complete()
    assert tracing.flush()

    spans = traced.wait_for("A's and B's tenures and both completions",
                            lambda got: len(got) >= 4, service)
    tenures = {s.attributes["joblease.holder"]: s for s in by_name(spans, tracing.SPAN_TENURE)}
    assert tenures["worker-a"].attributes["joblease.end_cause"] == "lost"
    assert "worker-b" in tenures["worker-a"].attributes["joblease.end_reason"]
    assert tenures["worker-b"].attributes["joblease.end_cause"] == "completed"
    assert tenures["worker-b"].attributes["joblease.generation"] == (
        tenures["worker-a"].attributes["joblease.generation"] + 1)
    refused = [s for s in by_name(spans, tracing.SPAN_COMPLETE)
               if s.parent_span_id == tenures["worker-a"].span_id]
    assert [s.attributes["joblease.outcome"] for s in refused] == ["stale"]
    assert refused[0].status_code == 2  # STATUS_CODE_ERROR


async def test_closing_the_client_ends_its_tenures_as_revoked(
    etcd_config: EtcdConfig, traced: OtlpReceiver, service: str,
) -> None:
    job = JobRef("team-a", "closed")
    async with JobLeaseClient(etcd_config) as owner:
        await owner.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
        await owner.claim(job, "pod-c")
    assert tracing.flush()
    (tenure,) = traced.wait_for("the closed client's tenure", bool, service)
    assert tenure.attributes["joblease.end_cause"] == "revoked"


async def test_a_lease_etcd_ended_ends_its_tenure_as_expired(
    client: JobLeaseClient, traced: OtlpReceiver, service: str,
) -> None:
    """The etcd lease ends under the holder (revoked here, where a real expiry
    would take the TTL and a paused worker): its next keep-alive hears the
    lease is gone, and the tenure ends ``expired``."""
    job = JobRef("team-a", "expiring")
    await client.register(job, JobSpec(lease_duration_seconds=3, max_attempts=0))
    lease = await client.claim(job, "pod-e")
    await client.store.revoke(lease.lease_id)
    assert await asyncio.wait_for(lease.wait_done(), timeout=15) is LeaseState.LOST
    assert tracing.flush()
    (tenure,) = traced.wait_for("the expired tenure", bool, service)
    assert tenure.attributes["joblease.end_cause"] == "expired"
    assert "expired" in tenure.attributes["joblease.end_reason"]


async def test_a_failing_tracer_never_fails_a_claim_or_completion(
    client: JobLeaseClient, traced: OtlpReceiver, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The SDK raising (faked: a real one does not fail on demand) costs the
    spans, never the claim: the claim has committed by then, and an exception
    would leave its holder without a handle."""
    current = tracing._tracing()
    assert current is not None

    def broken(*args: object, **kwargs: object) -> None:
        raise RuntimeError("tracer broken")

    first, second = JobRef("team-a", "broken-1"), JobRef("team-a", "broken-2")
    for job in (first, second):
        await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    traced_lease = await client.claim(first, "pod-x")  # its tenure span is recorded
    assert traced_lease.trace is not tracing.NO_TENURE
    monkeypatch.setattr(current.tracer, "start_span", broken)
    await traced_lease.checkpoint({"step": 1})  # its child spans cannot start
    assert (await traced_lease.complete({"ok": 1})).result == {"ok": 1}
    lease = await client.claim(second, "pod-x")  # nor can a tenure span
    assert lease.trace is tracing.NO_TENURE
    await lease.checkpoint({"step": 1})
    assert (await lease.complete({"ok": 2})).result == {"ok": 2}


@pytest.mark.parametrize(("state", "reason", "cause"), [
    ("completed", None, "completed"),
    ("released", None, "released"),
    ("lost", "etcd lease lost: no keep-alive succeeded before the safety deadline", "expired"),
    ("lost", "etcd lease lost: etcd reports the lease expired (or it was revoked)", "expired"),
    ("lost", "safety deadline passed", "expired"),
    ("lost", "etcd lease lost: session closed", "revoked"),
    ("lost", "job now held by 'b' with token 19", "lost"),
    ("lost", "holder key deleted (expired, released or job unregistered)", "lost"),
])
def test_end_cause_names_how_the_handle_ended(state: str, reason: str | None,
                                              cause: str) -> None:
    assert tracing.end_cause(state, reason) == cause
    assert cause in tracing.END_CAUSES


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_SERVICE_NAME": "x"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c"}, False),
])
def test_the_standard_variables_turn_tracing_on_and_off(env: dict[str, str], on: bool) -> None:
    assert tracing.enabled_by(env) is on


async def test_nothing_is_exported_when_the_environment_turns_tracing_off(
    client: JobLeaseClient, otlp_receiver: OtlpReceiver, service: str,
) -> None:
    """An endpoint with ``OTEL_TRACES_EXPORTER=none``: tenures get the shared
    do-nothing trace and the receiver gets nothing for this service, even
    after a later traced tenure's spans (sent after ours would be) arrived."""
    assert not tracing.configure({**otlp_receiver.env(service), "OTEL_TRACES_EXPORTER": "none"})
    job = JobRef("team-a", "quiet")
    await client.register(job, JobSpec(lease_duration_seconds=10, max_attempts=0))
    lease = await client.claim(job, "pod-q")
    assert lease.trace is tracing.NO_TENURE and lease.trace.traceparent is None
    await lease.checkpoint({"step": 1})
    await lease.complete()

    marker = f"{service}-marker"
    try:
        assert tracing.configure(otlp_receiver.env(marker))
        other = JobRef("team-a", "marker")
        await client.register(other, JobSpec(lease_duration_seconds=10, max_attempts=0))
        await (await client.claim(other, "pod-m")).release()
        assert tracing.flush()
        otlp_receiver.wait_for("the marker tenure", bool, marker)
    finally:
        tracing.configure({})
    assert list(otlp_receiver.spans_of(service)) == []


def test_untraced_library_never_imports_opentelemetry() -> None:
    """With no OpenTelemetry variables, the core and ``joblease run`` import no
    OpenTelemetry module and a tenure costs one shared object."""
    code = ("import os, sys\n"
            "for k in [k for k in os.environ if k.startswith('OTEL_')]: del os.environ[k]\n"
            "import joblease.cli, joblease.run, joblease.lease\n"
            "from joblease import tracing\n"
            "t = tracing.start_tenure('ns/j', 'ns', 'o', 'c', 1, 1)\n"
            "assert t is tracing.NO_TENURE, t\n"
            "assert not [m for m in sys.modules if m.startswith('opentelemetry')]\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
