"""Typed errors. Each says what happened and maps to one exit code and one HTTP status.

The same error object is what the library raises, what the CLI turns into an
exit code and what the sidecar turns into an HTTP response, so "stale" means
the same thing everywhere: your token is no longer the job's current one.
"""

from __future__ import annotations

from typing import Any


class JobLeaseError(Exception):
    """Base class. ``reason`` is a stable machine-readable word."""

    reason = "error"
    exit_code = 1
    http_status = 500

    def details(self) -> dict[str, Any]:
        """Structured fields for JSON output (CLI ``--output json``, sidecar bodies)."""
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {"error": self.reason, "message": str(self), **self.details()}


class InvalidInputError(JobLeaseError, ValueError):
    """Input refused before anything was written (bad name, TTL, oversized payload...)."""

    reason = "invalid"
    exit_code = 2
    http_status = 400


class PayloadTooLargeError(InvalidInputError):
    """A result or checkpoint over its size limit: bad input like any other
    (same reason and exit code), but one a worker sends as a request body
    (the sidecar's ``/v1/complete``, ``/v1/checkpoint``), so HTTP answers 413.
    Other oversized input (a registration's parameters) stays a plain 400."""

    http_status = 413


class NotRegisteredError(JobLeaseError, LookupError):
    """The job has no registration record in etcd."""

    reason = "not_found"
    exit_code = 3
    http_status = 404

    def __init__(self, job: str) -> None:
        super().__init__(f"job {job} is not registered")
        self.job = job

    def details(self) -> dict[str, Any]:
        return {"job": self.job}


class QueueNotFoundError(NotRegisteredError):
    """The queue has no spec in etcd."""

    def __init__(self, queue: str) -> None:
        JobLeaseError.__init__(self, f"queue {queue} does not exist")
        self.job = self.queue = queue

    def details(self) -> dict[str, Any]:
        return {"queue": self.queue}


class ItemNotFoundError(NotRegisteredError):
    """The queue has no item with that id."""

    def __init__(self, item: str) -> None:
        JobLeaseError.__init__(self, f"item {item} was never enqueued (or its queue was deleted)")
        self.job = self.item = item

    def details(self) -> dict[str, Any]:
        return {"item": self.item}


class HeldError(JobLeaseError):
    """Someone else holds a live lease on the job."""

    reason = "held"
    exit_code = 4
    http_status = 409

    def __init__(self, job: str, owner: str, token: int, generation: int,
                 revision: int = 0) -> None:
        super().__init__(
            f"job {job} is held by {owner!r} (generation {generation}, token {token})"
        )
        self.job, self.owner, self.token, self.generation = job, owner, token, generation
        #: the store revision at which the holder was seen (0: unknown); a waiter
        #: watches the holder key from the next one (JobLeaseClient.wait_for_holder_change)
        self.revision = revision

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "owner": self.owner, "token": self.token,
                "generation": self.generation}


class AlreadyCompletedError(JobLeaseError):
    """The job already has a result; it will not be claimed or completed again."""

    reason = "completed"
    exit_code = 5
    http_status = 409

    def __init__(self, job: str, owner: str, token: int, generation: int) -> None:
        super().__init__(
            f"job {job} was already completed by {owner!r} (generation {generation}, token {token})"
        )
        self.job, self.owner, self.token, self.generation = job, owner, token, generation

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "owner": self.owner, "token": self.token,
                "generation": self.generation}


class AttemptsExhaustedError(JobLeaseError):
    """The job was claimed ``maxAttempts`` times without completing: it has failed."""

    reason = "exhausted"
    exit_code = 6
    http_status = 409

    def __init__(self, job: str, attempts: int, max_attempts: int) -> None:
        super().__init__(f"job {job} has used {attempts} of {max_attempts} attempts")
        self.job, self.attempts, self.max_attempts = job, attempts, max_attempts

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "attempts": self.attempts, "maxAttempts": self.max_attempts}


class StaleTokenError(JobLeaseError):
    """The store refused an operation because the caller's token is no longer current.

    ``current_token`` is the token of whoever holds (or completed) the job now,
    or ``None`` when nobody does.
    """

    reason = "stale"
    exit_code = 7
    http_status = 409

    def __init__(
        self,
        job: str,
        token: int,
        current_token: int | None,
        current_owner: str | None = None,
        detail: str = "",
    ) -> None:
        now = (
            f"current token is {current_token} held by {current_owner!r}"
            if current_token is not None
            else "nobody holds the job now"
        )
        super().__init__(
            f"stale token for job {job}: your token {token} is no longer current; {now}"
            + (f" ({detail})" if detail else "")
        )
        self.job, self.token = job, token
        self.current_token, self.current_owner = current_token, current_owner

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "token": self.token, "currentToken": self.current_token,
                "currentOwner": self.current_owner}


class LeaseLostError(JobLeaseError):
    """The local handle knows it no longer holds the lease; it refuses to act on it."""

    reason = "lost"
    exit_code = 8
    http_status = 409

    def __init__(self, job: str, token: int, why: str) -> None:
        super().__init__(f"lease on job {job} with token {token} is lost: {why}")
        self.job, self.token, self.why = job, token, why

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "token": self.token, "why": self.why}


class WaitSessionLostError(JobLeaseError):
    """A claim that waits for a held job gave up: the waiter's own etcd session
    ended while it waited (etcd unreachable for a TTL, the process paused), so
    it does not claim later as though it had been waiting all along."""

    reason = "wait_session_lost"
    exit_code = 9
    http_status = 503

    def __init__(self, job: str, why: str) -> None:
        super().__init__(f"gave up waiting for job {job}: the waiter's session was lost ({why})")
        self.job, self.why = job, why

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "why": self.why}


class FencedError(JobLeaseError):
    """A write made conditional on a *guard* (extra compares the caller passed,
    e.g. the operator's "the leader key still has my term") was refused
    because the guard no longer holds.

    ``written`` says what is known of this call's own write: ``False``,
    nothing of it was written (etcd evaluated the guard and the write in one
    transaction); ``None``, an earlier copy's answer was lost and the state
    read back cannot tell whether that copy committed while the guard still
    held (``detail`` says what was read). A copy still in flight cannot
    commit later unless the guard holds again (a term never does: create
    revisions only grow).
    """

    reason = "fenced"
    exit_code = 15
    http_status = 409

    def __init__(self, what: str, guard: str, *, written: bool | None = False,
                 detail: str = "") -> None:
        done = ("nothing of it was written" if written is False else
                "an earlier copy's answer was lost, and it may have committed while the "
                "guard still held")
        super().__init__(f"{what} refused: the guard ({guard}) no longer holds; {done}"
                         + (f" ({detail})" if detail else ""))
        self.what, self.guard, self.written, self.detail = what, guard, written, detail

    def details(self) -> dict[str, Any]:
        return {"what": self.what, "guard": self.guard, "written": self.written}


class StoreUnavailableError(JobLeaseError):
    """etcd could not be reached; nothing was written."""

    reason = "unavailable"
    exit_code = 10
    http_status = 503


class OutcomeUnknownError(StoreUnavailableError):
    """A write was sent but its outcome is unknown (timeout or dropped connection).

    Raised by the store layer; the protocol resolves it by reading back
    (invariant ``read-back``, docs/protocol.md#read-back) and surfaces it only
    when read-back failed too.
    """

    reason = "unknown"
    exit_code = 11


class PermissionDeniedError(JobLeaseError):
    """etcd refused the credentials or the key range (auth/RBAC)."""

    reason = "forbidden"
    exit_code = 12
    http_status = 403


class CorruptRecordError(JobLeaseError):
    """A value stored under a job's prefix cannot be decoded (not JSON, wrong shape).

    Tenants can write their own prefix, so a malformed value is input like any
    other: it is reported for that one job and never stops readers of other jobs.
    """

    reason = "corrupt"
    exit_code = 14
    http_status = 500

    def __init__(self, record: str, why: str) -> None:
        super().__init__(f"stored {record} record cannot be decoded: {why}")
        self.record, self.why = record, why

    def details(self) -> dict[str, Any]:
        return {"record": self.record, "why": self.why}


class ItemRecordMissingError(CorruptRecordError):
    """A queue item is pending but its item record (the payload) is gone: a
    state joblease never writes (enqueue writes both keys in one transaction,
    deletion removes both), left by a hand-made write. Its claim is refused
    before anything is written."""

    def __init__(self, item: str, record_key: str) -> None:
        super().__init__(
            f"item {item}",
            f"it is pending but its record {record_key!r} is missing, a state joblease never "
            f"writes: not claimed; enqueue the item again, or delete its pending key")


class CompactedError(JobLeaseError):
    """A watch asked for revisions etcd has compacted away; resync from a snapshot."""

    reason = "compacted"
    exit_code = 13

    def __init__(self, compact_revision: int) -> None:
        super().__init__(f"revision compacted (compact revision {compact_revision})")
        self.compact_revision = compact_revision


class LeaseNotFoundError(JobLeaseError):
    """etcd no longer knows the lease (it expired or was revoked)."""

    reason = "lease_not_found"


class ClaimOutcomeUnknownError(OutcomeUnknownError):
    """A claim was sent, its answer was lost, and reading back could not settle it.

    Unlike :class:`StoreUnavailableError` this does *not* mean "nothing was
    written": the claim may have committed and used an attempt. What it does
    promise is that no holder of it outlives the error unnoticed: before
    raising, the client stopped renewing the etcd lease the claim was bound
    to and revoked it (``lease_revoked``), or, when etcd could not be reached
    for that either, left it to expire within its TTL (``ttl`` seconds).
    """

    reason = "unknown"
    exit_code = 11
    http_status = 503

    def __init__(self, job: str, claim_id: str, lease_id: int, *, lease_revoked: bool,
                 ttl: int, why: str) -> None:
        ended = (f"its etcd lease {lease_id:x} was revoked, so no holder of it remains"
                 if lease_revoked else
                 f"its etcd lease {lease_id:x} is no longer renewed and expires within "
                 f"its TTL ({ttl}s)")
        super().__init__(f"claim of {job} (claim id {claim_id}) has an unknown outcome: "
                         f"it may have committed and used an attempt ({why}); {ended}")
        self.job, self.claim_id, self.lease_id = job, claim_id, lease_id
        self.lease_revoked, self.ttl, self.why = lease_revoked, ttl, why

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "claimId": self.claim_id, "leaseId": self.lease_id,
                "leaseRevoked": self.lease_revoked, "ttl": self.ttl, "why": self.why}


class ClaimRevokedError(AttemptsExhaustedError):
    """Our own claim committed and used the job's last attempt, but the client
    ended it (revoked its etcd lease) while settling an unknown outcome.

    It arrives while the client could not yet see that the claim had
    committed; revoking is what makes "not claimed" final for any copy still in
    flight, and here a copy got in first. Nobody could act under ``token``;
    the job is nevertheless out of attempts, which this error says plainly
    rather than reporting an anonymous exhaustion.
    """

    def __init__(self, job: str, token: int, generation: int, max_attempts: int) -> None:
        JobLeaseError.__init__(
            self, f"job {job} has used {generation} of {max_attempts} attempts: the last one "
            f"was this client's own claim (token {token}), which committed while its unknown "
            f"outcome was being settled and was ended by revoking its etcd lease before "
            f"anyone could use it")
        self.job, self.attempts, self.max_attempts = job, generation, max_attempts
        self.token, self.generation = token, generation

    def details(self) -> dict[str, Any]:
        return {**super().details(), "token": self.token, "generation": self.generation,
                "revokedWhileSettling": True}


class ConflictError(JobLeaseError):
    """An enqueue named an item id already stored with another payload: ids are
    the caller's idempotency keys, so the batch is refused and nothing of it is
    written (docs/queues.md, "Enqueue")."""

    reason = "conflict"
    exit_code = 16
    http_status = 409

    def __init__(self, queue: str, item: str) -> None:
        super().__init__(f"item {item!r} of queue {queue} is already enqueued with another "
                         "payload; re-enqueueing an id must repeat its payload (nothing of "
                         "this batch was written)")
        self.queue, self.item = queue, item

    def details(self) -> dict[str, Any]:
        return {"queue": self.queue, "item": self.item}


class QueueSuspendedError(JobLeaseError):
    """The queue's spec says ``suspend: true``: no item is claimed until it is resumed."""

    reason = "suspended"
    exit_code = 17
    http_status = 409

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue} is suspended: no item is claimed until it is resumed")
        self.queue = queue

    def details(self) -> dict[str, Any]:
        return {"queue": self.queue}


class SemaphoreNotFoundError(NotRegisteredError):
    """A claim needs slots of a semaphore that has no spec in etcd."""

    def __init__(self, semaphore: str) -> None:
        JobLeaseError.__init__(self, f"semaphore {semaphore} does not exist")
        self.job = self.semaphore = semaphore

    def details(self) -> dict[str, Any]:
        return {"semaphore": self.semaphore}


class SemaphoreFullError(JobLeaseError):
    """No room: the semaphore's live slots (or the claims waiting ahead) leave
    fewer free slots than the claim needs. Nothing was written."""

    reason = "full"
    exit_code = 18
    http_status = 409

    def __init__(self, semaphore: str, job: str, limit: int, live: int, waiters: int,
                 weight: int) -> None:
        super().__init__(f"semaphore {semaphore} has no room for {job} ({weight} slot(s)): "
                         f"{live} of {limit} slots live, {waiters} claim(s) waiting")
        self.semaphore, self.job, self.limit = semaphore, job, limit
        self.live, self.waiters, self.weight = live, waiters, weight
        self.revision = 0  # the read's revision, to wait from
        #: planned from the client's watched views instead: each view and its
        #: change count then, to wait for the next change from (joblease.slot_view)
        self.marks: tuple[tuple[Any, int], ...] = ()

    def details(self) -> dict[str, Any]:
        return {"semaphore": self.semaphore, "job": self.job, "limit": self.limit,
                "live": self.live, "waiters": self.waiters, "weight": self.weight}
