"""Kubernetes Events derived from two consecutive states of one job.

The mirror sees every state its etcd watch delivers, in revision order, and
calls :func:`derive_events` with the previous and the new one. Events are
informational and best effort (Kubernetes may drop or aggregate them); the
status is what to rely on. Right after a (re)start the operator has no
previous state, so the first state of each job produces no lifecycle event,
except ``Failed`` (and ``Corrupt``): a job that can never run again is reported
by every operator process that sees it.

A refused (stale) completion writes nothing to etcd, so the mirror cannot see
it; the worker gets :class:`~joblease.errors.StaleTokenError` and the sidecar
reports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from joblease.records import JobState, Phase


@dataclass(frozen=True)
class JobEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def derive_events(before: JobState | None, after: JobState) -> list[JobEvent]:
    """``Claimed`` (new token), ``Expired`` (holder vanished without a result),
    ``Completed`` and ``Failed`` (attempts exhausted), in that order. ``Failed``
    also for the first state seen after a (re)start, when the job is out of
    attempts: a worker pod refused for that reason writes nothing to etcd, so
    the JobLease's Event is what explains it on the Kubernetes side.

    ``Corrupt`` (Warning) when a stored record of the job cannot be decoded:
    posted when the job becomes corrupt or its problem changes, and also for the
    first state seen after a (re)start, so a restarted operator reports it again.
    No lifecycle event is derived from or to a corrupt state: an undecodable
    holder is not an expiry, and its repair is not a claim.
    """
    if after.corrupt is not None:
        if before is not None and before.corrupt == after.corrupt:
            return []
        return [JobEvent("Warning", "Corrupt",
                         f"{after.corrupt}; the job's status shows phase Corrupt until the "
                         "value is fixed or removed in etcd")]
    if before is None:
        # No history (a restart): only a job that cannot run any more is reported
        # again, so a JobLease out of attempts carries a Failed Event from the
        # running operator (the worker pods it refuses write nothing to etcd).
        return [_failed(after)] if after.registered and after.phase is Phase.FAILED else []
    if before.corrupt is not None or not after.registered:
        return []
    events: list[JobEvent] = []
    old, new = before.holder, after.holder
    if old is not None and (new is None or new.token != old.token) and after.result is None:
        events.append(JobEvent(
            "Warning", "Expired",
            f"holder {old.owner} (generation {old.generation}, token {old.token}) vanished "
            "without a result: its lease expired or it released the job"))
    if new is not None and (old is None or new.token != old.token):
        events.append(JobEvent(
            "Normal", "Claimed",
            f"claimed by {new.owner}: generation {new.generation}, fencing token {new.token}"))
    if after.result is not None and before.result is None:
        r = after.result
        events.append(JobEvent(
            "Normal", "Completed",
            f"completed by {r.owner} with token {r.token} (generation {r.generation})"))
    if after.phase is Phase.FAILED and before.phase is not Phase.FAILED:
        events.append(_failed(after))
    return events


def _failed(state: JobState) -> JobEvent:
    max_attempts = state.spec.max_attempts if state.spec else 0
    return JobEvent("Warning", "Failed",
                    f"all {max_attempts} attempts used without a result ({state.generation} "
                    "claims); every further claim is refused")
