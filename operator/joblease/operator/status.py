"""etcd state -> JobLease ``status``: pure functions, no I/O.

The status is a mirror of what etcd decided. Two rules make it trustworthy:

- it is built from one :class:`~joblease.records.JobState`, i.e. from one
  consistent etcd revision (``etcdRevision``), never stitched from several;
- it never moves backwards: :func:`should_apply` accepts a state only when its
  revision is strictly newer than the one the current status was built from.

Conditions follow ``metav1.Condition``: keyed by ``type``, ``lastTransitionTime``
changes only when ``status`` flips, ``observedGeneration`` is the
``metadata.generation`` whose spec etcd holds.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Mapping
from typing import Any

from joblease.records import JobState, Phase, Tenure
from joblease.validation import MAX_OWNER_LENGTH

#: Bytes of result (and of checkpoint) JSON copied into the status; the full
#: values stay in etcd.
DEFAULT_RESULT_LIMIT = 4096

CONDITION_TYPES = ("Registered", "Claimed", "Completed", "Failed", "Corrupt")

#: The API server's limit on a condition's message (metav1.Condition).
CONDITION_MESSAGE_LIMIT = 32768

#: Tenures in ``status.recentTenures``: the history's newest, a short form of
#: ``joblease history`` (which stays the authority: every field, every tenure kept).
RECENT_TENURES = 3

#: Fields that are estimates computed when the status is written, not facts from etcd.
ESTIMATED_FIELDS = ("renewTime", "leaseExpiryTime")


def rfc3339(moment: dt.datetime | float) -> str:
    """Kubernetes' ``date-time`` format (UTC, whole seconds, ``Z``)."""
    if isinstance(moment, float | int):
        moment = dt.datetime.fromtimestamp(moment, dt.UTC)
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def bounded_result(result: Any, limit: int = DEFAULT_RESULT_LIMIT) -> tuple[dict[str, Any], bool]:
    """The result as a status object, at most ``limit`` bytes of JSON.

    The CRD types ``status.result`` as an object, so a non-object result is
    wrapped as ``{"value": ...}``. Above the limit the status carries
    ``{"preview": "<first bytes of the JSON>"}`` and ``truncated`` is True;
    the complete result is always in etcd (``joblease get``).
    """
    wrapped: dict[str, Any] = result if isinstance(result, dict) else {"value": result}
    text = json.dumps(wrapped, separators=(",", ":"), sort_keys=True)
    data = text.encode()
    if len(data) <= limit:
        return wrapped, False
    preview = data[:limit].decode("utf-8", errors="ignore")  # never split a character
    return {"preview": preview}, True


def should_apply(previous_status: Mapping[str, Any] | None, state: JobState) -> bool:
    """True only when ``state`` is strictly newer than what the status mirrors."""
    current = int((previous_status or {}).get("etcdRevision") or 0)
    return state.revision > current


def _condition(previous: Mapping[str, Mapping[str, Any]], type_: str, true: bool | None,
               reason: str, message: str, observed_generation: int, now: str) -> dict[str, Any]:
    """One condition; ``true`` None means ``Unknown``."""
    status = "Unknown" if true is None else "True" if true else "False"
    before = previous.get(type_)
    changed = before is None or before.get("status") != status
    transition = now if changed or not before else str(before.get("lastTransitionTime") or now)
    cond: dict[str, Any] = {"type": type_, "status": status, "reason": reason,
                            "message": message, "lastTransitionTime": transition}
    if observed_generation > 0:
        cond["observedGeneration"] = observed_generation
    return cond


def conditions_for(state: JobState, observed_generation: int,
                   previous_conditions: list[Mapping[str, Any]] | None,
                   now: str) -> list[dict[str, Any]]:
    """The five conditions, in a fixed order, keeping unchanged transition times.

    A job etcd does not know (``NotRegistered``) is neither claimable nor failed.
    A job with an undecodable record (``Corrupt``) says so in ``Corrupt``; what
    its records would mean is ``Unknown`` (the fields that did decode are not
    enough to say whether it is held, completed or failed).
    """
    prev = {str(c.get("type")): c for c in previous_conditions or [] if isinstance(c, Mapping)}
    spec, holder, result = state.spec, state.holder, state.result
    phase = state.phase

    def cond(type_: str, true: bool | None, reason: str, message: str) -> dict[str, Any]:
        return _condition(prev, type_, true, reason, message, observed_generation, now)

    if state.corrupt is not None:
        corrupt = cond("Corrupt", True, "UndecodableRecord",
                       f"{state.corrupt} (fix or delete the value in etcd; the status "
                       "follows again with the next change)"[:CONDITION_MESSAGE_LIMIT])
        if spec is not None:
            registered = cond("Registered", True, "Registered",
                              f"registered in etcd at revision {state.spec_revision}")
        elif state.spec_revision > 0:
            registered = cond("Registered", None, "Corrupt",
                              f"a registration exists in etcd (revision {state.spec_revision}) "
                              "but cannot be decoded")
        else:
            registered = cond("Registered", False, "NotRegistered", "no registration in etcd")
        unknown = "a stored record of this job cannot be decoded; see the Corrupt condition"
        return [registered, cond("Claimed", None, "Corrupt", unknown),
                cond("Completed", None, "Corrupt", unknown),
                cond("Failed", None, "Corrupt", unknown), corrupt]

    corrupt = cond("Corrupt", False, "RecordsDecoded", "every stored record decodes")
    if phase is Phase.NOT_REGISTERED:
        why = "no registration in etcd: not claimable"
        return [cond("Registered", False, "NotRegistered", "no registration in etcd"),
                cond("Claimed", False, "NotRegistered", why),
                cond("Completed", False, "NotRegistered", why),
                cond("Failed", False, "NotRegistered", why), corrupt]
    registered = cond("Registered", True, "Registered",
                      f"registered in etcd at revision {state.spec_revision}")
    if holder is not None:
        claimed = cond("Claimed", True, "Held",
                       f"held by {holder.owner} (generation {holder.generation}, "
                       f"token {holder.token})")
    elif result is not None:
        claimed = cond("Claimed", False, "Completed", "completed; no longer claimable")
    elif phase is Phase.FAILED:
        claimed = cond("Claimed", False, "AttemptsExhausted", "no attempts left")
    else:
        claimed = cond("Claimed", False, "Unowned",
                       "claimable" if state.generation == 0
                       else f"claimable again after {state.generation} attempt(s)")
    if result is not None:
        completed = cond("Completed", True, "ResultAccepted",
                         f"completed by {result.owner} with token {result.token} "
                         f"(generation {result.generation})")
    else:
        completed = cond("Completed", False, "NoResult", "no result yet")
    if phase is Phase.FAILED and spec is not None:
        failed = cond("Failed", True, "AttemptsExhausted",
                      f"{state.generation} of {spec.max_attempts} attempts used without a result")
    else:
        failed = cond("Failed", False, "AttemptsLeft" if result is None else "Completed",
                      "attempts left" if result is None else "completed")
    return [registered, claimed, completed, failed, corrupt]


def status_from_state(
    state: JobState,
    observed_generation: int,
    previous_status: Mapping[str, Any] | None,
    now: dt.datetime,
    *,
    lease_remaining: int | None = None,
    result_limit: int = DEFAULT_RESULT_LIMIT,
) -> dict[str, Any]:
    """The complete ``status`` for ``state`` (it replaces the previous one).

    ``observed_generation``: the ``metadata.generation`` whose spec equals the
    registration etcd holds (0: unknown, the field is omitted).
    ``lease_remaining``: the holder's etcd lease TTL left, as etcd reports it
    (``store.time_to_live``); when given, ``leaseExpiryTime`` and ``renewTime``
    are estimated from it (for humans: expiry is decided by etcd alone).
    """
    previous = previous_status or {}
    stamp = rfc3339(now)
    status: dict[str, Any] = {
        "phase": state.phase.value,
        "holderIdentity": "",
        "generation": state.generation,
        "attempts": state.attempts,
        "etcdRevision": state.revision,
    }
    token = state.token
    if token is not None:
        status["fencingToken"] = token
    holder = state.holder
    if holder is not None:
        status["holderIdentity"] = holder.owner
        if holder.claimed_at > 0:
            status["claimTime"] = rfc3339(holder.claimed_at)
        if lease_remaining is not None and lease_remaining >= 0:
            status["leaseExpiryTime"] = rfc3339(now + dt.timedelta(seconds=lease_remaining))
            if state.spec is not None:
                since = max(0, state.spec.lease_duration_seconds - lease_remaining)
                status["renewTime"] = rfc3339(now - dt.timedelta(seconds=since))
    result = state.result
    if result is not None:
        status["result"], status["resultTruncated"] = bounded_result(result.result, result_limit)
        status["completedBy"] = result.owner  # holderIdentity is empty from now on
        if result.completed_at > 0:
            status["completionTime"] = rfc3339(result.completed_at)
    checkpoint = state.checkpoint
    if checkpoint is not None:
        data, truncated = bounded_result(checkpoint.data, result_limit)
        status["checkpoint"] = {
            "data": data, "dataTruncated": truncated, "owner": checkpoint.owner,
            "generation": checkpoint.generation, "fencingToken": checkpoint.token,
            "etcdRevision": checkpoint.revision,
        }
        if checkpoint.checkpointed_at > 0:
            status["checkpoint"]["checkpointTime"] = rfc3339(checkpoint.checkpointed_at)
    if observed_generation > 0:
        status["observedGeneration"] = observed_generation
    elif previous.get("observedGeneration"):
        status["observedGeneration"] = int(previous["observedGeneration"])
    prev_conditions = previous.get("conditions")
    status["conditions"] = conditions_for(
        state, int(status.get("observedGeneration") or 0),
        prev_conditions if isinstance(prev_conditions, list) else None, stamp)
    return status


def same_facts(a: Mapping[str, Any] | None, b: Mapping[str, Any] | None) -> bool:
    """True when two statuses differ only in ``etcdRevision`` and estimates:
    writing ``b`` over ``a`` would tell a reader nothing new."""
    ignored = ("etcdRevision", *ESTIMATED_FIELDS)
    def facts(s: Mapping[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in (s or {}).items() if k not in ignored}
    return facts(a) == facts(b)


def observed_generation_for(resource_generation: int, resource_spec_matches: bool,
                            previous_status: Mapping[str, Any] | None) -> int:
    """``metadata.generation`` when etcd holds that spec, else what the status said."""
    if resource_spec_matches:
        return resource_generation
    return int((previous_status or {}).get("observedGeneration") or 0)


def recent_tenures_status(tenures: tuple[Tenure, ...]) -> list[dict[str, Any]]:
    """``status.recentTenures``: the last :data:`RECENT_TENURES` of ``tenures``
    (as :func:`joblease.history.tenures_from` read them), newest first, each
    ``holder`` at most :data:`~joblease.validation.MAX_OWNER_LENGTH` characters
    (a claim never has a longer owner; a value written into etcd by hand may)."""
    entries = []
    for t in reversed(tenures[-RECENT_TENURES:]):
        entry: dict[str, Any] = {"generation": t.generation, "token": t.token,
                                 "holder": t.owner[:MAX_OWNER_LENGTH], "end": t.end.value,
                                 "checkpoints": t.checkpoints,
                                 "refusedCompletions": t.refused_completions}
        if t.claimed_at > 0:
            entry["claimedAt"] = rfc3339(t.claimed_at)
        if t.ended_at is not None and t.ended_at > 0:
            entry["endedAt"] = rfc3339(t.ended_at)
        entries.append(entry)
    return entries


def history_changed(previous_status: Mapping[str, Any], status: Mapping[str, Any],
                    state: JobState) -> bool:
    """Whether ``status.recentTenures`` must be read again for ``state``: the
    job changed since ``previous_status`` (a claim, a completion, a release, an
    expiry, a checkpoint: every tenure change but one comes with a change of the
    job's own keys), its history changed alone since (``state.history_revision``:
    a refused completion counted, a ``revoked`` mark), or the short form is
    missing. Not for a resync or a refresh of an unchanged job."""
    if not isinstance(previous_status.get("recentTenures"), list):
        return True
    if state.history_revision > int(previous_status.get("etcdRevision") or 0):
        return True
    rest = {k: v for k, v in previous_status.items() if k != "recentTenures"}
    return not same_facts(rest, status)
