"""CronJob slots: a Job created for a queue-mode CronJob → the item its pods claim.

A CronJob's run is a *slot*, named by its scheduled time. Two Jobs for the same
slot (``concurrencyPolicy: Allow`` with a run slower than the schedule, a
controller that restarts and creates the Job again, a manual re-run) must not
both do the work: so the slot is an item of the queue, created by the first pod
that claims it (``JOBLEASE_ITEM_CREATE``) and completed once; a later Job's pod
finds it completed and ends ``Succeeded`` without working, like a completed
JobLease.

The scheduled time is on the Job (``batch.kubernetes.io/cronjob-scheduled-timestamp``,
set by the CronJob controller), not on its pods, and a pod's downward API sees
only the pod. So the webhook also mutates Jobs on CREATE whose pod template is
annotated ``joblease.io/queue``: :func:`plan_job` copies the slot into the
template as ``joblease.io/item`` (in UTC: the id alphabet has no ``+``) and
``joblease.io/item-create: "true"``; the pod webhook
(:mod:`joblease.operator.injection`) then passes them to the sidecar.

A Job owned by a CronJob but without the scheduled time was made by hand
(``kubectl create job --from=cronjob/x``): it runs the CronJob's **last slot**
(``status.lastScheduleTime``, looked up by the webhook), with a warning saying so;
if that slot completed, the Job succeeds without working. A CronJob never
scheduled yet, or one that cannot be read, refuses the Job with a message naming
the annotation that chooses a slot explicitly: guessing would risk running a slot
twice or not at all.

What is left alone: a template that names ``joblease.io/item`` itself, one that
drains (``joblease.io/exit-when-empty: "true"``: a CronJob that empties the queue
on each run), and every Job not created from a CronJob.

Pure functions, no I/O, like :mod:`joblease.operator.injection`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from joblease.operator.injection import (
    COMPLETION_INDEX_ANNOTATION,
    EXIT_WHEN_EMPTY_ANNOTATION,
    ITEM_ANNOTATION,
    ITEM_CREATE_ANNOTATION,
    QUEUE_ANNOTATION,
    Injection,
    InjectionRefused,
    escape_pointer,
    parse_options,
)

#: Set on a Job by the CronJob controller: the slot's scheduled time (RFC 3339, in the
#: CronJob's time zone).
SCHEDULED_ANNOTATION = "batch.kubernetes.io/cronjob-scheduled-timestamp"


class UnknownCronJob:
    """The CronJob lookup failed (an API error, a timeout): its last slot is unknown."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def template_annotations(job: Mapping[str, Any]) -> dict[str, str]:
    template = (job.get("spec") or {}).get("template") or {}
    return dict((template.get("metadata") or {}).get("annotations") or {})


def wants_slot(job: Mapping[str, Any]) -> bool:
    """The Job's pods are queue-mode pods (the only Jobs :func:`plan_job` touches)."""
    return QUEUE_ANNOTATION in template_annotations(job)


def cronjob_owner(job: Mapping[str, Any]) -> str | None:
    """The owning CronJob's name, if the slot must be looked up there: a queue-mode Job
    owned by a CronJob, without the scheduled time and without an item of its own."""
    notes = template_annotations(job)
    meta = job.get("metadata") or {}
    if (QUEUE_ANNOTATION not in notes or ITEM_ANNOTATION in notes
            or notes.get(EXIT_WHEN_EMPTY_ANNOTATION) == "true"
            or SCHEDULED_ANNOTATION in (meta.get("annotations") or {})):
        return None
    return _owner(meta)


def _owner(meta: Mapping[str, Any]) -> str | None:
    for ref in meta.get("ownerReferences") or []:
        if ref.get("kind") == "CronJob" and str(ref.get("apiVersion", "")).startswith("batch/"):
            return str(ref.get("name", ""))
    return None


def slot_id(timestamp: str) -> str:
    """The item id of a slot: its time in UTC, ``YYYY-MM-DDTHH:MM:SSZ``. The same instant
    always gives the same id (a CronJob with a ``timeZone`` writes ``+01:00`` offsets;
    the ``lastScheduleTime`` of a manual run is in UTC)."""
    try:
        when = dt.datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        raise InjectionRefused(
            f"annotation {SCHEDULED_ANNOTATION}: {timestamp!r} is not an RFC 3339 time") from None
    if when.tzinfo is None:
        raise InjectionRefused(
            f"annotation {SCHEDULED_ANNOTATION}: {timestamp!r} has no time zone offset")
    return when.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def plan_job(job: Mapping[str, Any], *,
             last_schedule: str | UnknownCronJob | None = None) -> Injection:
    """The patch that names the Job's slot in its pod template (see the module docstring).

    ``last_schedule``: for a Job that :func:`cronjob_owner` names a CronJob for, that
    CronJob's ``status.lastScheduleTime`` (None: never scheduled, or no such CronJob;
    :class:`UnknownCronJob`: the lookup failed)."""
    notes = template_annotations(job)
    if QUEUE_ANNOTATION not in notes:
        return Injection([], [])
    meta = job.get("metadata") or {}
    spec = job.get("spec") or {}
    name = meta.get("name") or (meta.get("generateName", "") + "*")
    indexed = spec.get("completionMode") == "Indexed"
    # the template's annotations are the pods' own: refuse a bad one here, once, rather
    # than on each of the pods the Job controller would keep trying to create (checked
    # as the pods will carry them: an Indexed Job's pods get their index)
    parse_options({**notes, COMPLETION_INDEX_ANNOTATION: "0"} if indexed and
                  ITEM_ANNOTATION not in notes else notes)
    if ITEM_ANNOTATION in notes:
        if indexed:
            raise InjectionRefused(
                f"Job {name}: annotation {ITEM_ANNOTATION} in the template of an Indexed Job: "
                "each pod claims its completion index, and every pod would claim "
                f"{notes[ITEM_ANNOTATION]!r} instead; drop one of them")
        return Injection([], [])  # the user chose the item
    if notes.get(EXIT_WHEN_EMPTY_ANNOTATION) == "true":
        return Injection([], [])  # a run that drains the queue: no slot
    scheduled = (meta.get("annotations") or {}).get(SCHEDULED_ANNOTATION)
    owner = _owner(meta)
    warnings: list[str] = []
    if indexed and (scheduled is not None or owner is not None):
        raise InjectionRefused(
            f"Job {name}: an Indexed Job created by CronJob {owner or '?'}: its pods' items "
            "would be both the slot and their completion indexes; use completionMode "
            f"NonIndexed for a slot, or {EXIT_WHEN_EMPTY_ANNOTATION}: \"true\" (without "
            "Indexed) to drain the queue on each run")
    if scheduled is not None:
        item = slot_id(scheduled)
    elif owner is None:
        return Injection([], [])  # not a CronJob's: Indexed, or draining
    elif isinstance(last_schedule, UnknownCronJob):
        raise InjectionRefused(
            f"Job {name} was created from CronJob {owner} by hand (no {SCHEDULED_ANNOTATION}): "
            f"its slot would be the CronJob's last one, but the CronJob cannot be read "
            f"({last_schedule.reason}); try again, or name the slot: annotation "
            f"{ITEM_ANNOTATION} in the Job's pod template")
    elif last_schedule is None:
        raise InjectionRefused(
            f"Job {name} was created from CronJob {owner} by hand (no {SCHEDULED_ANNOTATION}) "
            "and the CronJob has no slot to take (it does not exist, or has no "
            "status.lastScheduleTime yet): name the item to "
            f"claim with annotation {ITEM_ANNOTATION} in the Job's pod template (kubectl "
            f"create job --from=cronjob/{owner} --dry-run=client -o yaml, add it, kubectl "
            f"create -f), or {EXIT_WHEN_EMPTY_ANNOTATION}: \"true\" to drain the queue")
    else:
        item = slot_id(last_schedule)
        warnings.append(
            f"Job {name} was created from CronJob {owner} by hand: it runs the CronJob's last "
            f"slot {item} (status.lastScheduleTime) as item {item} of queue "
            f"{notes[QUEUE_ANNOTATION]}; if that slot completed, the Job succeeds without "
            f"working. To run another slot, set annotation {ITEM_ANNOTATION} in the Job's "
            "pod template")
    # the template has annotations: it names joblease.io/queue
    base = "/spec/template/metadata/annotations/"
    ops = [{"op": "add", "path": base + escape_pointer(ITEM_ANNOTATION), "value": item},
           {"op": "add", "path": base + escape_pointer(ITEM_CREATE_ANNOTATION), "value": "true"}]
    return Injection(ops, warnings)
