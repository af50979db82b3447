"""A semaphore's state -> JobSemaphore ``status``: pure functions, no I/O.

The status is built from one :class:`~joblease.semaphore.SemaphoreStatus`, i.e.
from one read-only etcd transaction (``etcdRevision``), so its limit, holders and
waiters belong together; it is never replaced by a state read at an older
revision (``queue_status.should_apply``, the same rule). At most
``MAX_HOLDERS_SHOWN`` holders are listed, so its size is bounded by the limit.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import Any

from joblease.operator.queue_status import should_apply
from joblease.operator.status import _condition, rfc3339
from joblease.semaphore import SemaphoreStatus

__all__ = ["CONDITION_TYPES", "same_facts", "should_apply", "status_from_semaphore"]

CONDITION_TYPES = ("Registered", "Saturated")


def status_from_semaphore(state: SemaphoreStatus | None, revision: int, observed_generation: int,
                          previous_status: Mapping[str, Any] | None,
                          now: dt.datetime) -> dict[str, Any]:
    """The complete ``status`` (it replaces the previous one); ``state`` None:
    etcd has no such semaphore at ``revision`` (e.g. before the operator created it)."""
    previous = previous_status or {}
    stamp = rfc3339(now)
    prev_conditions = {str(c.get("type")): c for c in previous.get("conditions") or []
                       if isinstance(c, Mapping)}
    if observed_generation <= 0:
        observed_generation = int(previous.get("observedGeneration") or 0)

    def cond(type_: str, true: bool | None, reason: str, message: str) -> dict[str, Any]:
        return _condition(prev_conditions, type_, true, reason, message, observed_generation,
                          stamp)

    status: dict[str, Any] = {"etcdRevision": revision}
    if observed_generation > 0:
        status["observedGeneration"] = observed_generation
    if state is None:
        why = "no semaphore in etcd"
        status.update(limit=0, live=0, waiters=0, holders=[])
        status["conditions"] = [cond("Registered", False, "NotRegistered", why),
                                cond("Saturated", None, "NotRegistered", why)]
        return status
    status.update(limit=state.limit, live=state.live, waiters=state.waiters,
                  holders=[{"slot": h.index, "holder": h.holder, "owner": h.owner,
                            "token": h.token} for h in state.holders])
    saturated = state.live >= state.limit
    status["conditions"] = [
        cond("Registered", True, "Registered", "the semaphore exists in etcd"),
        cond("Saturated", saturated, "Full" if saturated else "HasRoom",
             f"{state.live} of {state.limit} slot(s) live, {state.waiters} waiting"),
    ]
    return status


def same_facts(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """True when two statuses differ only in ``etcdRevision`` (a revision that moved
    for other keys is not worth a write)."""
    def facts(s: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (s or {}).items() if k != "etcdRevision"}
    return facts(a) == facts(b)
