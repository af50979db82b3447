"""Typed records stored in etcd and the job state assembled from them.

Stored values are compact JSON. Wall-clock times in records are informational
only: no ownership decision ever reads them (expiry is decided by etcd).
"""

from __future__ import annotations

import enum
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from joblease import validation
from joblease.errors import CorruptRecordError
from joblease.keys import ItemRef, JobRef
from joblease.store import KeyValue


class Phase(enum.StrEnum):
    NOT_REGISTERED = "NotRegistered"  # etcd has no registration for the job
    PENDING = "Pending"  # registered, claimable
    CLAIMED = "Claimed"  # a live holder exists
    COMPLETED = "Completed"  # a result was accepted
    FAILED = "Failed"  # maxAttempts claims used without a result
    CORRUPT = "Corrupt"  # a stored record cannot be decoded (see JobState.corrupt)


@contextmanager
def decoding(record: str) -> Iterator[None]:
    """Turn any decode failure of a stored value into :class:`CorruptRecordError`.

    Stored data is input: a tenant can write anything under its own prefix, so
    a bad value must surface as the project's error for that record, never as a
    stray ``KeyError``/``TypeError`` that kills a reader of every job.
    """
    try:
        yield
    except CorruptRecordError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise CorruptRecordError(record, f"{type(exc).__name__}: {exc}") from exc


def _loads_object(data: bytes) -> dict[str, Any]:
    """A stored record's JSON object, refused (ValueError, so the record is
    ``Corrupt`` with that reason) where no writer may have put it: nested
    deeper than the record around a value of ``MAX_JSON_DEPTH``, or holding a
    lone surrogate, escaped (``\\ud800``) or raw, which no reader could
    answer with as UTF-8 (docs/protocol.md, "Stored values")."""
    record_depth = validation.MAX_JSON_DEPTH + 1
    if validation.json_text_depth(data) > record_depth:
        raise ValueError(f"a value in it is nested deeper than {validation.MAX_JSON_DEPTH} "
                         "levels of arrays and objects")
    obj = json.loads(data)
    if not isinstance(obj, dict):
        raise TypeError(f"expected a JSON object, got {type(obj).__name__}")
    if b"\\u" in data or b"\xed" in data:  # else no surrogate can be there
        problem = validation.json_value_problem(obj, record_depth)
        if problem is not None:
            raise ValueError(problem)
    return obj


def _within_limit(value: Any, data: bytes, what: str, limit: int) -> Any:
    """``value``, a result or checkpoint read back, unless its canonical
    encoding is over ``limit``: a stored value no writer may have written."""
    # Escaping at most sextuples a byte (a raw control character becomes
    # \u0001), so a record under a sixth of the limit cannot hold a value over it.
    if 6 * len(data) > limit:
        size = len(json.dumps(value, separators=(",", ":"), sort_keys=True).encode())
        if size > limit:
            raise ValueError(f"{what} is {size} bytes of JSON, the limit is {limit} bytes")
    return value


def _typed(obj: dict[str, Any], key: str, kind: Callable[[Any], Any], *types: type) -> Any:
    """``obj[key]`` converted by ``kind``, refusing values of the wrong JSON type."""
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, types):
        raise TypeError(f"{key!r} must be {' or '.join(t.__name__ for t in types)}")
    return kind(value)


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


#: A JSON string as ``json.dumps`` writes it (``ensure_ascii``): the claim path's
#: records are formatted from it directly, byte for byte what :func:`_dumps` gives
#: (tests/core/test_record_encoding.py compares them), without building a dict
#: and an encoder per record.
_string = json.encoder.encode_basestring_ascii


def _exact(value: Any, kind: type) -> bool:
    """``value`` is exactly a ``kind`` (not a bool for int, not a subclass): a
    type whose JSON text is its ``repr``, so the fast formats may write it."""
    return type(value) is kind


def new_claim_id() -> str:
    """A claim's unique id: a random version-4 UUID as 32 hex digits (what
    ``uuid.uuid4().hex`` gives and the Go sidecar writes, for a fifth of the cost)."""
    b = bytearray(os.urandom(16))
    b[6] = (b[6] & 0x0F) | 0x40
    b[8] = (b[8] & 0x3F) | 0x80
    return b.hex()


def encode_claim(owner: str, claim_id: str) -> bytes:
    """The ``claims`` key's value, put by every claim (its version is the
    generation): who claimed last, ``{"owner":...,"claimId":...}`` in that order."""
    if _exact(owner, str) and _exact(claim_id, str):
        return f'{{"owner":{_string(owner)},"claimId":{_string(claim_id)}}}'.encode()
    return json.dumps({"owner": owner, "claimId": claim_id}, separators=(",", ":")).encode()


@dataclass(frozen=True, slots=True, order=True)
class SemaphoreUse:
    """A claim's need: ``weight`` slots of the semaphore ``name`` (same namespace)."""

    name: str
    weight: int = 1

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight}

    @classmethod
    def from_json(cls, obj: Any) -> SemaphoreUse:
        if not isinstance(obj, dict):
            raise TypeError("a semaphore use must be an object")
        return cls(_typed(obj, "name", str, str),
                   _typed(obj, "weight", int, int) if "weight" in obj else 1)


def _uses(obj: dict[str, Any]) -> tuple[SemaphoreUse, ...]:
    uses = obj.get("semaphores") or []
    if not isinstance(uses, list):
        raise TypeError("'semaphores' must be a list")
    return tuple(SemaphoreUse.from_json(u) for u in uses)


@dataclass(frozen=True, slots=True)
class JobSpec:
    """The registration: what the operator copies from the JobLease's spec."""

    lease_duration_seconds: int
    max_attempts: int = 3
    parameters: dict[str, Any] = field(default_factory=dict)
    #: the semaphores every claim takes slots of, in the claim's transaction
    #: (docs/semaphores.md); written only when there are some, so a spec
    #: without them has the bytes it always had
    semaphores: tuple[SemaphoreUse, ...] = ()
    #: tenures kept in the job's history (docs/protocol.md, "Tenure history");
    #: 0: no history is written. Written only when > 0, so a spec without it
    #: has the bytes it always had (and its claims the transaction they had).
    history_limit: int = 0

    def encode(self) -> bytes:
        obj: dict[str, Any] = {
            "leaseDurationSeconds": self.lease_duration_seconds,
            "maxAttempts": self.max_attempts,
            "parameters": self.parameters,
        }
        if self.semaphores:
            obj["semaphores"] = [u.to_json() for u in self.semaphores]
        if self.history_limit:
            obj["historyLimit"] = self.history_limit
        return _dumps(obj)

    @classmethod
    def decode(cls, data: bytes) -> JobSpec:
        with decoding("spec"):
            obj = _loads_object(data)
            parameters = obj.get("parameters") or {}
            if not isinstance(parameters, dict):
                raise TypeError("'parameters' must be an object")
            return cls(
                lease_duration_seconds=_typed(obj, "leaseDurationSeconds", int, int),
                max_attempts=_typed(obj, "maxAttempts", int, int) if "maxAttempts" in obj else 0,
                parameters=dict(parameters),
                semaphores=_uses(obj),
                history_limit=(_typed(obj, "historyLimit", int, int)
                               if "historyLimit" in obj else 0),
            )


@dataclass(frozen=True, slots=True)
class Holder:
    """Who holds the job. ``token`` is the holder key's create revision."""

    owner: str
    claim_id: str
    token: int
    generation: int
    lease_id: int
    claimed_at: float  # informational wall clock of the claimer

    @staticmethod
    def encode_value(owner: str, claim_id: str, ttl: int, claimed_at: float) -> bytes:
        if (_exact(owner, str) and _exact(claim_id, str) and _exact(ttl, int)
                and _exact(claimed_at, float) and claimed_at - claimed_at == 0):  # finite
            # the sorted keys, as _dumps writes them (once per claim: formatted, not encoded)
            return (f'{{"claimId":{_string(claim_id)},"claimedAt":{claimed_at!r},'
                    f'"owner":{_string(owner)},"ttl":{ttl!r}}}').encode()
        return _dumps({"owner": owner, "claimId": claim_id, "ttl": ttl, "claimedAt": claimed_at})

    @staticmethod
    def decode_value(data: bytes) -> dict[str, Any]:
        """The holder key's JSON object, with ``owner`` and ``claimId`` checked to be strings."""
        with decoding("holder"):
            obj = _loads_object(data)
            _typed(obj, "owner", str, str)
            _typed(obj, "claimId", str, str)
            if "claimedAt" in obj:
                _typed(obj, "claimedAt", float, int, float)
            return obj


@dataclass(frozen=True, slots=True)
class ResultRecord:
    """The accepted completion, written once."""

    owner: str
    claim_id: str
    token: int
    generation: int
    result: Any
    completed_at: float  # informational wall clock of the completer
    revision: int = 0  # etcd revision at which the completion committed

    def encode(self, result_json: bytes | None = None) -> bytes:
        """The stored record. ``result_json``: ``result`` already encoded as
        :func:`joblease.validation.json_payload` encodes it (compact, sorted keys,
        as nested in the record), so a completion encodes its result once."""
        return ResultRecord.format(self.owner, self.claim_id, self.token, self.generation,
                                   self.result, result_json, self.completed_at)

    @staticmethod
    def format(owner: str, claim_id: str, token: int, generation: int, result: Any,
               result_json: bytes | None, completed_at: float) -> bytes:
        """:meth:`encode` of the record with these fields, without making it (a
        completion makes only the record it keeps: the one with its revision)."""
        if (result_json is not None and _exact(owner, str) and _exact(claim_id, str)
                and _exact(token, int) and _exact(generation, int)
                and _exact(completed_at, float)
                and completed_at - completed_at == 0):  # finite
            # the sorted keys, as _dumps writes them, with the result's JSON spliced in
            return (f'{{"claimId":{_string(claim_id)},"completedAt":{completed_at!r},'
                    f'"generation":{generation!r},"owner":{_string(owner)},'
                    f'"result":').encode() + result_json + f',"token":{token!r}}}'.encode()
        return _dumps({
            "owner": owner, "claimId": claim_id, "token": token,
            "generation": generation, "result": result, "completedAt": completed_at,
        })

    @classmethod
    def decode(cls, data: bytes, revision: int = 0) -> ResultRecord:
        with decoding("result"):
            obj = _loads_object(data)
            return cls(
                owner=_typed(obj, "owner", str, str), claim_id=_typed(obj, "claimId", str, str),
                token=_typed(obj, "token", int, int),
                generation=_typed(obj, "generation", int, int),
                result=_within_limit(obj.get("result"), data, "result",
                                     validation.MAX_RESULT_BYTES),
                completed_at=(_typed(obj, "completedAt", float, int, float)
                              if "completedAt" in obj else 0.0),
                revision=revision,
            )

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "claimId": self.claim_id, "token": self.token,
                "generation": self.generation, "result": self.result,
                "completedAt": self.completed_at, "revision": self.revision}


@dataclass(frozen=True, slots=True)
class CheckpointRecord:
    """The last progress checkpoint, written by the holder named here.

    A completed job keeps its last checkpoint; unregistering deletes it.
    """

    owner: str
    claim_id: str
    token: int
    generation: int
    data: Any
    checkpointed_at: float  # informational wall clock of the writer
    revision: int = 0  # etcd revision at which the checkpoint committed

    def encode(self) -> bytes:
        return _dumps({
            "owner": self.owner, "claimId": self.claim_id, "token": self.token,
            "generation": self.generation, "data": self.data,
            "checkpointedAt": self.checkpointed_at,
        })

    @classmethod
    def decode(cls, data: bytes, revision: int = 0) -> CheckpointRecord:
        with decoding("checkpoint"):
            obj = _loads_object(data)
            return cls(
                owner=_typed(obj, "owner", str, str), claim_id=_typed(obj, "claimId", str, str),
                token=_typed(obj, "token", int, int),
                generation=_typed(obj, "generation", int, int),
                data=_within_limit(obj.get("data"), data, "checkpoint",
                                   validation.MAX_CHECKPOINT_BYTES),
                checkpointed_at=(_typed(obj, "checkpointedAt", float, int, float)
                                 if "checkpointedAt" in obj else 0.0),
                revision=revision,
            )

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "claimId": self.claim_id, "token": self.token,
                "generation": self.generation, "data": self.data,
                "checkpointedAt": self.checkpointed_at, "revision": self.revision}


@dataclass(frozen=True, slots=True)
class JobState:
    """Everything etcd knows about one job, as of ``revision``."""

    job: JobRef
    revision: int  # the store revision this state was read at
    spec: JobSpec | None
    spec_revision: int  # mod revision of the spec key (0: not registered)
    holder: Holder | None
    generation: int  # claims so far (== attempts used)
    last_claim_owner: str | None
    result: ResultRecord | None
    mod_revision: int = 0  # newest mod revision among the job's keys
    # Why a stored record of this job could not be decoded (the undecodable
    # fields are left empty); None when every record decoded.
    corrupt: str | None = None
    #: The last checkpoint (kept after completion), or None.
    checkpoint: CheckpointRecord | None = None
    #: The newest revision at which the watch that produced this state saw the
    #: job's tenure history change (0: none seen, or not from a watch): the
    #: history lives outside the job's prefix, so a change of it alone (a refused
    #: completion counted) leaves every other field as it was.
    history_revision: int = 0

    @property
    def registered(self) -> bool:
        return self.spec is not None

    @property
    def attempts(self) -> int:
        return self.generation

    @property
    def phase(self) -> Phase:
        if self.corrupt is not None:
            return Phase.CORRUPT
        if self.spec is None:
            return Phase.NOT_REGISTERED
        if self.result is not None:
            return Phase.COMPLETED
        if self.holder is not None:
            return Phase.CLAIMED
        if self.spec is not None and 0 < self.spec.max_attempts <= self.generation:
            return Phase.FAILED
        return Phase.PENDING

    @property
    def token(self) -> int | None:
        """The current fencing token: the live holder's, else the completer's."""
        if self.holder is not None:
            return self.holder.token
        if self.result is not None:
            return self.result.token
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "job": str(self.job),
            "namespace": self.job.namespace,
            "name": self.job.name,
            "registered": self.registered,
            "phase": self.phase.value,
            "revision": self.revision,
            "modRevision": self.mod_revision,
            "leaseDurationSeconds": self.spec.lease_duration_seconds if self.spec else None,
            "maxAttempts": self.spec.max_attempts if self.spec else None,
            "parameters": self.spec.parameters if self.spec else None,
            "generation": self.generation,
            "attempts": self.attempts,
            "holder": None if self.holder is None else {
                "owner": self.holder.owner, "claimId": self.holder.claim_id,
                "token": self.holder.token, "generation": self.holder.generation,
                "leaseId": self.holder.lease_id, "claimedAt": self.holder.claimed_at,
            },
            "token": self.token,
            "result": None if self.result is None else self.result.to_dict(),
            "checkpoint": None if self.checkpoint is None else self.checkpoint.to_dict(),
            "corrupt": self.corrupt,
        }


# -- tenure history (docs/protocol.md, "Tenure history") -------------------------------------


class TenureEnd(enum.StrEnum):
    """How a tenure ended. ``released`` and ``revoked`` are written by the
    transaction (or the settling client) that ended it; ``completed`` is read
    from the job's result (its token is the tenure's: the completion writes
    nothing more); ``expired`` is read, never written: etcd deleted the holder
    with its lease and wrote nothing else; ``open``: the holder is still there."""

    OPEN = "open"
    COMPLETED = "completed"
    RELEASED = "released"
    REVOKED = "revoked"
    EXPIRED = "expired"


#: The ends a transaction writes (``expired`` and ``open`` are derived).
WRITTEN_ENDS = frozenset({TenureEnd.RELEASED, TenureEnd.REVOKED})


def encode_tenure_start(owner: str, claim_id: str, claimed_at: float) -> bytes:
    """``_history/<name>/<generation>``, put by the claim transaction: its create
    revision is the claim's commit revision, the token, so it is not stored."""
    if (_exact(owner, str) and _exact(claim_id, str) and _exact(claimed_at, float)
            and claimed_at - claimed_at == 0):  # finite
        # the sorted keys, as _dumps writes them (once per claim: formatted, not encoded)
        return (f'{{"claimId":{_string(claim_id)},"claimedAt":{claimed_at!r},'
                f'"owner":{_string(owner)}}}').encode()
    return _dumps({"claimId": claim_id, "claimedAt": claimed_at, "owner": owner})


def encode_holder_and_tenure(owner: str, claim_id: str, ttl: int, claimed_at: float
                             ) -> tuple[bytes, bytes]:
    """The holder value and the tenure start of one claim of a job with a history:
    the tenure is the holder's record without its ``ttl`` (both in sorted key
    order, ``ttl`` last), so their common part is formatted once. Byte for byte
    :meth:`Holder.encode_value` and :func:`encode_tenure_start`
    (tests/core/test_record_encoding.py)."""
    if (_exact(owner, str) and _exact(claim_id, str) and _exact(ttl, int)
            and _exact(claimed_at, float) and claimed_at - claimed_at == 0):  # finite
        head = (f'{{"claimId":{_string(claim_id)},"claimedAt":{claimed_at!r},'
                f'"owner":{_string(owner)}')
        return f'{head},"ttl":{ttl!r}}}'.encode(), f"{head}}}".encode()
    return (Holder.encode_value(owner, claim_id, ttl, claimed_at),
            encode_tenure_start(owner, claim_id, claimed_at))


def encode_tenure_end(how: TenureEnd, at: float) -> bytes:
    """``.../<generation>/end``: how the tenure ended, and when (informational)."""
    assert how in WRITTEN_ENDS
    return _dumps({"at": at, "how": how.value})


def encode_tenure_mark(at: float) -> bytes:
    """``.../checkpoints`` and ``.../refused``: put once per event, so the key's
    etcd ``version`` counts them (no read-modify-write); ``at``: the last one."""
    return _dumps({"at": at})


@dataclass(frozen=True)
class Tenure:
    """One claim of a job, from claim to end, as its history records it."""

    generation: int  # == the attempts used up to and including this claim
    token: int  # the tenure key's create revision: the claim's commit revision
    owner: str
    claim_id: str
    claimed_at: float  # informational wall clock of the claimer
    end: TenureEnd
    ended_at: float | None = None  # informational; None for open and expired tenures
    #: for the completed tenure: the etcd revision its completion committed at
    completed_revision: int | None = None
    checkpoints: int = 0  # checkpoints written under this tenure
    refused_completions: int = 0  # stale completions refused under this tenure's token
    last_refused_at: float | None = None

    @property
    def attempts(self) -> int:
        return self.generation

    @classmethod
    def decode(cls, generation: int, start: KeyValue, end: KeyValue | None,
               checkpoints: KeyValue | None, refused: KeyValue | None,
               holder_token: int, result: ResultRecord | None = None) -> Tenure:
        """The tenure from its keys; ``holder_token``: the live holder's token
        (0: none), which tells an open tenure from an expired one; ``result``:
        the job's result, which tells the completed one."""
        with decoding("tenure"):
            obj = _loads_object(start.value)
            how, ended_at = (TenureEnd.OPEN if holder_token == start.create_revision
                             else TenureEnd.EXPIRED), None
            completed_revision = None
            if result is not None and result.token == start.create_revision:
                how, ended_at = TenureEnd.COMPLETED, result.completed_at
                completed_revision = result.revision
            elif end is not None:
                end_obj = _loads_object(end.value)
                how = TenureEnd(_typed(end_obj, "how", str, str))
                if how not in WRITTEN_ENDS:
                    raise ValueError(f"{how.value!r} is not an end a transaction writes")
                ended_at = _typed(end_obj, "at", float, int, float)
            last_refused = None
            if refused is not None:
                last_refused = _typed(_loads_object(refused.value), "at", float, int, float)
            return cls(
                generation=generation, token=start.create_revision,
                owner=_typed(obj, "owner", str, str), claim_id=_typed(obj, "claimId", str, str),
                claimed_at=_typed(obj, "claimedAt", float, int, float),
                end=how, ended_at=ended_at, completed_revision=completed_revision,
                checkpoints=checkpoints.version if checkpoints is not None else 0,
                refused_completions=refused.version if refused is not None else 0,
                last_refused_at=last_refused,
            )

    def to_dict(self) -> dict[str, Any]:
        return {"generation": self.generation, "token": self.token, "owner": self.owner,
                "claimId": self.claim_id, "claimedAt": self.claimed_at,
                "end": self.end.value, "endedAt": self.ended_at, "attempts": self.attempts,
                "completedRevision": self.completed_revision,
                "checkpoints": self.checkpoints,
                "refusedCompletions": self.refused_completions,
                "lastRefusedAt": self.last_refused_at}


@dataclass(frozen=True)
class History:
    """A job's (or a queue item's) tenures, oldest first, all read at ``revision``
    (one read). For an item, ``registered`` says its queue exists and holds it."""

    job: JobRef | ItemRef
    revision: int
    registered: bool
    history_limit: int
    tenures: tuple[Tenure, ...]
    #: tenure keys that could not be decoded: ``(generation, why)``
    corrupt: tuple[tuple[int, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        name = ({"queue": str(self.job.queue), "item": self.job.id}
                if isinstance(self.job, ItemRef) else {"job": str(self.job)})
        return {**name, "revision": self.revision, "registered": self.registered,
                "historyLimit": self.history_limit,
                "tenures": [t.to_dict() for t in self.tenures],
                "corrupt": [{"generation": g, "why": why} for g, why in self.corrupt]}


# -- queues (docs/queues.md) ------------------------------------------------------------------


@dataclass(frozen=True)
class QueueSpec:
    """A queue's registration (``Q/spec``): what every claim of its items uses."""

    lease_duration_seconds: int
    max_attempts: int = 3
    suspend: bool = False
    shards: int = 0  # items "0".."shards-1" exist from creation (Indexed Jobs)
    semaphores: tuple[SemaphoreUse, ...] = ()  # taken by every item's claim
    #: tenures kept per item (docs/history.md, "Queue items"); 0: none written.
    #: Written only when > 0, so a spec without it has the bytes it always had
    #: (and its claims the transaction they had).
    history_limit: int = 0

    def encode(self) -> bytes:
        obj: dict[str, Any] = {"leaseDurationSeconds": self.lease_duration_seconds,
                               "maxAttempts": self.max_attempts, "shards": self.shards,
                               "suspend": self.suspend}
        if self.semaphores:
            obj["semaphores"] = [u.to_json() for u in self.semaphores]
        if self.history_limit:
            obj["historyLimit"] = self.history_limit
        return _dumps(obj)

    @classmethod
    def decode(cls, data: bytes) -> QueueSpec:
        with decoding("queue"):
            obj = _loads_object(data)
            return cls(
                lease_duration_seconds=_typed(obj, "leaseDurationSeconds", int, int),
                max_attempts=_typed(obj, "maxAttempts", int, int) if "maxAttempts" in obj else 0,
                suspend=_typed_bool(obj, "suspend") if "suspend" in obj else False,
                shards=_typed(obj, "shards", int, int) if "shards" in obj else 0,
                semaphores=_uses(obj),
                history_limit=(_typed(obj, "historyLimit", int, int)
                               if "historyLimit" in obj else 0),
            )

    def job_spec(self, attempts_from: int = 0) -> JobSpec:
        """The spec an item's claim uses, as a job's: the attempts of the item's
        current round counted from ``attempts_from`` (unlimited stays 0)."""
        return JobSpec(self.lease_duration_seconds,
                       attempts_from + self.max_attempts if self.max_attempts else 0,
                       semaphores=self.semaphores, history_limit=self.history_limit)


def _typed_bool(obj: dict[str, Any], key: str) -> bool:
    value = obj[key]
    if not isinstance(value, bool):
        raise TypeError(f"{key!r} must be bool")
    return value


@dataclass(frozen=True)
class ItemRecord:
    """An enqueued item (``Q/items/<id>``), written once."""

    payload: Any
    enqueued_at: float = 0.0  # informational wall clock of the enqueuer
    revision: int = 0  # create revision: the enqueue's commit

    def encode(self) -> bytes:
        return _dumps({"enqueuedAt": self.enqueued_at, "payload": self.payload})

    @classmethod
    def decode(cls, data: bytes, revision: int = 0) -> ItemRecord:
        with decoding("item"):
            obj = _loads_object(data)
            return cls(
                payload=_within_limit(obj.get("payload"), data, "payload",
                                      validation.MAX_PAYLOAD_BYTES),
                enqueued_at=(_typed(obj, "enqueuedAt", float, int, float)
                             if "enqueuedAt" in obj else 0.0),
                revision=revision,
            )


@dataclass(frozen=True)
class PendingRecord:
    """``Q/pending/<id>``: the item is in the queue (not completed, not failed)."""

    attempts_from: int = 0  # claims made before this round (0, or the generation at a retry)
    since: float = 0.0  # informational wall clock of the enqueue or retry

    def encode(self) -> bytes:
        return _dumps({"attemptsFrom": self.attempts_from, "since": self.since})

    @classmethod
    def decode(cls, data: bytes) -> PendingRecord:
        with decoding("pending"):
            obj = _loads_object(data)
            return cls(
                attempts_from=(_typed(obj, "attemptsFrom", int, int)
                               if "attemptsFrom" in obj else 0),
                since=_typed(obj, "since", float, int, float) if "since" in obj else 0.0,
            )


@dataclass(frozen=True)
class FailedRecord:
    """``Q/failed/<id>``: the item used its round's attempts without a result."""

    generation: int
    failed_at: float = 0.0  # informational wall clock of the claimer that marked it

    def encode(self) -> bytes:
        return _dumps({"failedAt": self.failed_at, "generation": self.generation})

    @classmethod
    def decode(cls, data: bytes) -> FailedRecord:
        with decoding("failed"):
            obj = _loads_object(data)
            return cls(
                generation=_typed(obj, "generation", int, int),
                failed_at=(_typed(obj, "failedAt", float, int, float)
                           if "failedAt" in obj else 0.0),
            )


# -- semaphores (docs/semaphores.md) ----------------------------------------------------------


@dataclass(frozen=True)
class SemaphoreSpec:
    """``S/spec``: how many slots may be live at once."""

    limit: int

    def encode(self) -> bytes:
        return _dumps({"limit": self.limit})

    @classmethod
    def decode(cls, data: bytes) -> SemaphoreSpec:
        with decoding("semaphore"):
            return cls(_typed(_loads_object(data), "limit", int, int))


@dataclass(frozen=True)
class SlotRecord:
    """``S/slots/<index>``: one slot, granted in a claim's transaction and bound
    to its etcd lease; its create revision is the slot's token."""

    holder: str  # the job or item whose claim took it
    owner: str
    claim_id: str

    def encode(self) -> bytes:
        if _exact(self.claim_id, str) and _exact(self.holder, str) and _exact(self.owner, str):
            # once per slot claim: formatted in _dumps's (sorted) key order, not encoded
            return (f'{{"claimId":{_string(self.claim_id)},"holder":{_string(self.holder)},'
                    f'"owner":{_string(self.owner)}}}').encode()
        return _dumps({"claimId": self.claim_id, "holder": self.holder, "owner": self.owner})

    @classmethod
    def decode(cls, data: bytes) -> SlotRecord:
        with decoding("slot"):
            obj = _loads_object(data)
            return cls(_typed(obj, "holder", str, str), _typed(obj, "owner", str, str),
                       _typed(obj, "claimId", str, str))


@dataclass(frozen=True)
class WaiterRecord:
    """``S/waiters/<ticket>``: a claim waiting for slots, bound to the waiter's
    etcd lease; its create revision is its place in line."""

    holder: str
    owner: str
    weight: int

    def encode(self) -> bytes:
        return _dumps({"holder": self.holder, "owner": self.owner, "weight": self.weight})

    @classmethod
    def decode(cls, data: bytes) -> WaiterRecord:
        with decoding("waiter"):
            obj = _loads_object(data)
            return cls(_typed(obj, "holder", str, str), _typed(obj, "owner", str, str),
                       _typed(obj, "weight", int, int))
