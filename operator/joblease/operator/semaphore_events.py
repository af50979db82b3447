"""Kubernetes Events of a JobSemaphore, derived from two consecutive statuses.

The semaphore mirror refreshes a JobSemaphore's status on a timer
(:mod:`joblease.operator.semaphore_mirror`), so these Events say what changed
between two statuses it wrote, not every grant etcd made: a slot granted and
freed within one refresh interval is in neither status and gets no Event, and a
grant beyond the first ``MAX_HOLDERS_SHOWN`` holders is not listed. What etcd
decided is the status and the semaphore's keys; Events, as for JobLeases, are
informational and best effort (docs/semaphores.md, "Events").

The previous status is the one the API server holds (not a memory of the
operator's), so an operator restart does not report the same grants again.

- ``SlotGranted``: a holder whose token no holder of the previous status had.
- ``Saturated``: the ``Saturated`` condition turned True (every slot live).
- ``HasRoom``: it turned False again.

All are ``Normal``: a full semaphore is the limit doing its work; a semaphore
saturated for too long is what the ``JobSemaphoreSaturated`` alert is for.
Repeats aggregate into one Event with a ``count``
(:class:`~joblease.operator.event_recorder.EventRecorder`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from joblease.operator.events import JobEvent

__all__ = ["derive_semaphore_events"]


def _saturated(status: Mapping[str, Any]) -> str | None:
    for c in status.get("conditions") or []:
        if isinstance(c, Mapping) and c.get("type") == "Saturated":
            return str(c.get("status"))
    return None


def _tokens(status: Mapping[str, Any]) -> set[Any]:
    return {h.get("token") for h in status.get("holders") or [] if isinstance(h, Mapping)}


def derive_semaphore_events(previous: Mapping[str, Any] | None,
                            status: Mapping[str, Any]) -> list[JobEvent]:
    """The Events for writing ``status`` over ``previous`` (module docstring):
    grants by slot, then the saturation change."""
    previous = previous or {}
    known = _tokens(previous)
    events = [
        JobEvent("Normal", "SlotGranted",
                 f"slot {h.get('slot')} granted to {h.get('holder')} (owner "
                 f"{h.get('owner')}, token {h.get('token')})", token=h.get("token"))
        for h in sorted((h for h in status.get("holders") or [] if isinstance(h, Mapping)),
                        key=lambda h: (h.get("token") or 0))
        if h.get("token") not in known]
    before, after = _saturated(previous), _saturated(status)
    if after != before:
        counts = (f"{status.get('live', 0)} of {status.get('limit', 0)} slot(s) live, "
                  f"{status.get('waiters', 0)} waiting")
        if after == "True":
            events.append(JobEvent("Normal", "Saturated", f"every slot is held: {counts}"))
        elif after == "False" and before == "True":
            events.append(JobEvent("Normal", "HasRoom", f"a slot is free again: {counts}"))
    return events
