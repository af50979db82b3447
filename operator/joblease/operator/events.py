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

from joblease.records import JobState, Phase, Tenure, TenureEnd


@dataclass(frozen=True)
class JobEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str
    #: for a tenure's end (``Expired``): the token of the tenure that ended
    token: int | None = None


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
            "without a result: its lease expired or it released the job", token=old.token))
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


def refine_ends(events: list[JobEvent], tenures: tuple[Tenure, ...]) -> list[JobEvent]:
    """Each ``Expired`` Event told apart by the job's history (``tenures``, read
    at or after the end): a tenure that reads ``released`` gives a Normal
    ``Released`` Event instead (its holder gave the job back: nothing to look
    at), ``revoked`` a Warning ``Revoked`` one, ``expired`` stays ``Expired``
    with the history's wording. Without a history (``historyLimit`` 0, or the
    tenure older than the ones read) the watch alone cannot tell a release from
    an expiry, and the Event says so."""
    by_token = {t.token: t for t in tenures}
    refined = []
    for event in events:
        tenure = by_token.get(event.token) if event.token is not None else None
        if event.reason != "Expired" or tenure is None or tenure.end is TenureEnd.OPEN:
            refined.append(event)
            continue
        who = f"holder {tenure.owner} (generation {tenure.generation}, token {tenure.token})"
        if tenure.end is TenureEnd.RELEASED:
            refined.append(JobEvent("Normal", "Released", f"{who} released the job",
                                    token=tenure.token))
        elif tenure.end is TenureEnd.REVOKED:
            refined.append(JobEvent(
                "Warning", "Revoked", f"{who}: the claim committed while its outcome was "
                "unknown and was revoked when it was settled; the attempt is used",
                token=tenure.token))
        elif tenure.end is TenureEnd.EXPIRED:
            refined.append(JobEvent(
                "Warning", "Expired", f"{who} lost the job: its etcd lease ended (its TTL ran "
                "out or it was revoked) with no completion or release", token=tenure.token))
        else:  # completed: not an end that needs attention (the Completed Event says it)
            continue
    return refined
