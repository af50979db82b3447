"""The ``joblease_sidecar_state`` gauge has one series per sidecar phase and
reads 1 for exactly the current one.

Its label values once were a hand-kept copy of the phase names, which can
drift (a ``"stopped"`` label while the phase is ``"stopping"`` reads 0 for
every series while stopping). Nothing is faked: the real metrics object,
rendered in Prometheus' text format and parsed back.
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from joblease.sidecar.metrics import SidecarMetrics
from joblease.sidecar.state import Phase


def _states(metrics: SidecarMetrics) -> dict[str, float]:
    for family in text_string_to_metric_families(metrics.render(0.0).decode()):
        if family.name == "joblease_sidecar_state":
            return {s.labels["state"]: s.value for s in family.samples}
    raise AssertionError("no joblease_sidecar_state in /metrics")


def test_state_gauge_reads_one_for_exactly_the_current_phase() -> None:
    metrics = SidecarMetrics()
    assert _states(metrics) == {p.value: (1.0 if p is Phase.CLAIMING else 0.0) for p in Phase}
    for phase in Phase:
        metrics.set_state(phase)
        states = _states(metrics)
        assert set(states) == {p.value for p in Phase}
        assert states[phase.value] == 1.0, phase
        assert sum(states.values()) == 1.0, states
