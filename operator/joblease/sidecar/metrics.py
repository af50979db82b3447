"""Prometheus metrics of one sidecar (``joblease_sidecar_*``).

A private registry, not the process-global one: the sidecar exports only its
own series, and tests can run several in one interpreter. No per-object labels
(job names, owners, tokens): one sidecar serves one job, and a label per token
would grow without bound. ``state`` uses a fixed label set.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from joblease.sidecar.state import Phase

#: The ``state`` label's values: every phase, from the enum itself so they cannot drift.
STATES = tuple(phase.value for phase in Phase)


class SidecarMetrics:
    """The counters and gauges; the runner updates them, ``/metrics`` renders them."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.claims = Counter("joblease_sidecar_claims", "Successful claims of the job.",
                              registry=self.registry)
        self.claim_attempts = Counter("joblease_sidecar_claim_attempts",
                                      "Claim attempts, refused ones included.",
                                      registry=self.registry)
        self.losses = Counter("joblease_sidecar_losses", "Leases lost while held.",
                              registry=self.registry)
        self.completions = Counter("joblease_sidecar_completions",
                                   "Completions the store accepted.", registry=self.registry)
        self.stale_rejections = Counter(
            "joblease_sidecar_stale_rejections",
            "Completions or releases refused because the token was not current.",
            registry=self.registry)
        self.remaining = Gauge("joblease_sidecar_lease_remaining_seconds",
                               "Local safety time left on the lease (0 unless held).",
                               registry=self.registry)
        self.state = Gauge("joblease_sidecar_state", "1 for the sidecar's current state.",
                           ["state"], registry=self.registry)
        self.set_state(Phase.CLAIMING)

    def set_state(self, phase: Phase) -> None:
        for s in STATES:
            self.state.labels(state=s).set(1 if s == phase.value else 0)

    def render(self, remaining: float) -> bytes:
        self.remaining.set(remaining)
        return generate_latest(self.registry)
