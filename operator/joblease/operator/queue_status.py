"""A queue's counts -> JobQueue ``status``: pure functions, no I/O.

The status is built from one :class:`~joblease.queue.QueueCounts`, i.e. from
one read-only etcd transaction (``etcdRevision``), so its counts add up; it is
never replaced by counts read at an older revision (:func:`should_apply`).
Nothing in it is per item: its size does not grow with the queue.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from joblease.operator.status import _condition, rfc3339
from joblease.queue import QueueCounts
from joblease.records import QueueSpec

CONDITION_TYPES = ("Registered", "Suspended", "Idle", "HasFailedItems")

#: Estimates that change with time alone: a status differing only in these (and in
#: etcdRevision) is not worth a write.
ESTIMATED_FIELDS = ("oldestPendingAgeSeconds", "countTime", "etcdRevision")

#: Shortest interval between two reads that the completion rate is computed over.
MIN_RATE_INTERVAL = 1.0


def should_apply(previous_status: Mapping[str, Any] | None, revision: int) -> bool:
    """True only when counts read at ``revision`` are not older than what the status
    mirrors (equal: the same counts, written again only to update an estimate)."""
    return revision >= int((previous_status or {}).get("etcdRevision") or 0)


def _parse_time(text: Any) -> dt.datetime | None:
    if not isinstance(text, str):
        return None
    try:
        return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC)
    except ValueError:
        return None


def completions_per_minute(previous_status: Mapping[str, Any], completed: int,
                           now: dt.datetime) -> float:
    """From the change of ``completed`` since the previous status's ``countTime``
    (the status itself is the memory: nothing per queue is kept in the operator,
    and a restarted operator continues). 0 when there is nothing to compare with."""
    before = _parse_time(previous_status.get("countTime"))
    prev_completed = previous_status.get("completed")
    if before is None or not isinstance(prev_completed, int):
        return 0.0
    elapsed = (now - before).total_seconds()
    if elapsed < MIN_RATE_INTERVAL:
        return float(previous_status.get("completionsPerMinute") or 0.0)
    return round(max(0, completed - prev_completed) * 60.0 / elapsed, 3)


def status_from_counts(counts: QueueCounts | None, revision: int, spec: QueueSpec | None,
                       observed_generation: int, previous_status: Mapping[str, Any] | None,
                       now: dt.datetime) -> dict[str, Any]:
    """The complete ``status`` (it replaces the previous one); ``counts`` None:
    etcd has no such queue at ``revision`` (e.g. before the operator created it)."""
    previous = previous_status or {}
    stamp = rfc3339(now)
    prev_conditions = {str(c.get("type")): c for c in previous.get("conditions") or []
                       if isinstance(c, Mapping)}
    if observed_generation <= 0:
        observed_generation = int(previous.get("observedGeneration") or 0)

    def cond(type_: str, true: bool | None, reason: str, message: str) -> dict[str, Any]:
        return _condition(prev_conditions, type_, true, reason, message, observed_generation,
                          stamp)

    status: dict[str, Any] = {"etcdRevision": revision, "countTime": stamp}
    if observed_generation > 0:
        status["observedGeneration"] = observed_generation
    if counts is None:
        why = "no queue in etcd"
        status.update(pending=0, held=0, completed=0, failed=0, total=0,
                      completionsPerMinute=0.0)
        status["conditions"] = [cond("Registered", False, "NotRegistered", why),
                                cond("Suspended", None, "NotRegistered", why),
                                cond("Idle", None, "NotRegistered", why),
                                cond("HasFailedItems", False, "NotRegistered", why)]
        return status
    status.update(pending=counts.pending, held=counts.held, completed=counts.completed,
                  failed=counts.failed, total=counts.total,
                  completionsPerMinute=completions_per_minute(previous, counts.completed, now))
    if counts.oldest_pending_age is not None:
        status["oldestPendingAgeSeconds"] = round(counts.oldest_pending_age, 3)
    suspended = bool(spec and spec.suspend)
    busy = counts.pending + counts.held
    if busy:
        idle = cond("Idle", False, "Working" if counts.held else "Pending",
                    f"{counts.pending} pending, {counts.held} held")
    else:
        idle = cond("Idle", True, "Drained" if counts.total else "Empty",
                    f"every one of {counts.total} item(s) finished" if counts.total
                    else "no item enqueued")
    status["conditions"] = [
        cond("Registered", True, "Registered", "the queue exists in etcd"),
        cond("Suspended", suspended, "Suspended" if suspended else "Claimable",
             "no item is claimed while suspended; holders keep their leases" if suspended
             else "items are claimed"),
        idle,
        cond("HasFailedItems", counts.failed > 0, "ItemsFailed" if counts.failed else "NoneFailed",
             f"{counts.failed} item(s) used their attempts without a result "
             "(a retry puts one back in the queue)" if counts.failed else "no item failed"),
    ]
    return status


def same_facts(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """True when two statuses differ only in estimates that change with time alone."""
    def facts(s: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (s or {}).items() if k not in ESTIMATED_FIELDS}
    return facts(a) == facts(b)
