"""The destination-side fencing gate: records, errors and the reference semantics.

A destination that receives effects from leased workers keeps, per
*resource*, the highest fencing token it has accepted (its high-water mark).
The gate's rule, the same in every backend:

* accept an effect on resource ``R`` with token ``T`` only if ``T >=`` the
  highest token ``R`` has accepted, and raise ``R``'s mark to ``T``;
* apply each idempotency key ``K`` at most once: a second effect with ``K``
  is a *duplicate* and gets the first outcome back (not an error, and never
  applied again) -- even if its token has become stale since, because the
  effect it names was applied under a token that was current then.

Why ``>=`` and not ``>``: one claim produces many effects under one token.
Why per resource: a fence orders the writers of one thing; two resources
never constrain each other.

Tokens are etcd revisions (the claim's commit revision), so a newer claim of
a job always carries a larger token than any older claim of that job
(invariant ``tokens-increase``), and a worker that paused past its lease cannot
write after its successor has (invariant ``effects-carry-token``).

:class:`MemoryGate` is the reference implementation (one process, in memory);
:mod:`joblease.fencing.etcd_gate` and :mod:`joblease.fencing.sql` make the
check, the effect and the new mark commit in one transaction.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol

from joblease.errors import InvalidInputError, StaleTokenError
from joblease.keys import ItemRef, JobRef

#: Tokens are etcd revisions: positive signed 64-bit integers.
MAX_TOKEN = 2**63 - 1
MAX_RESOURCE_LENGTH = 1024
MAX_KEY_LENGTH = 512
_PRINTABLE = re.compile(r"[\x20-\x7e]+")  # used with fullmatch: "$" would admit a final "\n"


class StaleFenceError(StaleTokenError):
    """The destination refused an effect: its token is below the resource's mark.

    Same ``reason`` ("stale"), exit code (7) and HTTP status (409) as every
    other stale-token refusal. ``highest_token`` is the highest token the
    resource has accepted; nothing of the refused effect was applied.
    """

    def __init__(self, resource: str, token: int, highest_token: int) -> None:
        # StaleTokenError's message talks about jobs; this one names the resource.
        Exception.__init__(
            self,
            f"stale token for resource {resource!r}: token {token} is below the highest "
            f"token the resource has accepted ({highest_token}); the effect was not applied",
        )
        self.resource = resource
        self.job = resource
        self.token = token
        self.highest_token = highest_token
        self.current_token: int | None = highest_token
        self.current_owner: str | None = None

    def details(self) -> dict[str, Any]:
        return {"resource": self.resource, "token": self.token,
                "highestToken": self.highest_token}


class IdempotencyKeyConflictError(InvalidInputError):
    """An idempotency key was reused for a different resource or token.

    Keys name one effect of one claim (see :func:`idempotency_key`);
    reusing one for another effect is a caller bug, refused before anything
    is applied.
    """

    def __init__(self, key: str, resource: str, token: int, first_resource: str,
                 first_token: int) -> None:
        super().__init__(
            f"idempotency key {key!r} was first used for resource {first_resource!r} with "
            f"token {first_token}; it cannot be reused for resource {resource!r} with "
            f"token {token}"
        )
        self.key = key


def check_token(token: object) -> int:
    """A fencing token: a positive integer that fits a signed 64-bit column."""
    if isinstance(token, bool) or not isinstance(token, int) or not 0 < token <= MAX_TOKEN:
        raise InvalidInputError(
            f"invalid fencing token {token!r}: must be an integer between 1 and {MAX_TOKEN}"
        )
    return token


def check_resource(resource: object) -> str:
    if not isinstance(resource, str) or not 0 < len(resource) <= MAX_RESOURCE_LENGTH \
            or not _PRINTABLE.fullmatch(resource):
        raise InvalidInputError(
            f"invalid resource {resource!r}: must be 1..{MAX_RESOURCE_LENGTH} printable "
            "ASCII characters"
        )
    return resource


def check_key(key: object) -> str:
    if not isinstance(key, str) or not 0 < len(key) <= MAX_KEY_LENGTH \
            or not _PRINTABLE.fullmatch(key):
        raise InvalidInputError(
            f"invalid idempotency key {key!r}: must be 1..{MAX_KEY_LENGTH} printable "
            "ASCII characters"
        )
    return key


def idempotency_key(job: JobRef | ItemRef | str, generation: int, step: str = "", *,
                    token: int) -> str:
    """The conventional idempotency key of one effect: ``ns/name#g7.t1234`` or
    ``ns/name#g7.t1234:step``.

    The key names one claim's attempt by its fencing ``token``, which is unique
    per claim (the etcd revision at which the claim committed: no two claims
    of any job share it). ``(job, generation)`` alone is not unique: the
    generation counts the claims of one *registration*, and starts again at 1
    when a job is unregistered and registered again (a JobLease deleted and
    re-applied), so a new incarnation's first claim would reuse the old one's
    keys and durable gates would refuse its effects as key conflicts. The
    generation stays in the key for people reading it.

    A retry of the same request within one attempt (after a timeout, say)
    carries the same key, and the destination applies it once. ``step`` tells
    apart the different effects of one attempt (``"upload"``, ``"row-42"``...);
    omit it only when the attempt makes a single effect per destination.
    """
    if isinstance(generation, bool) or not isinstance(generation, int) or generation < 1:
        raise InvalidInputError(f"invalid generation {generation!r}: must be an integer >= 1")
    check_token(token)
    key = f"{job}#g{generation}.t{token}" + (f":{step}" if step else "")
    return check_key(key)


def slot_resource(semaphore: str, index: int) -> str:
    """The resource a destination gates a semaphore slot's writes on:
    ``semaphore/<ns>/<name>/slot/<index>`` (docs/semaphores.md, "Fencing on a slot").

    One mark per slot: a destination admitting at most K writers of semaphore
    ``ns/name`` (limit K) refuses a write under a slot token older than the
    newest it accepted for that slot, whatever item or job the write is for."""
    return f"semaphore/{semaphore}/slot/{index}"


@dataclass(frozen=True)
class Effect:
    """One effect a worker asks a destination to apply.

    ``response`` is the outcome to hand back to duplicates of this effect
    (e.g. the HTTP status and body the first request got); the gate stores
    it with the idempotency key. Without an idempotency key the effect is
    fenced but not deduplicated.
    """

    resource: str
    token: int
    idempotency_key: str | None = None
    response: str = ""

    def __post_init__(self) -> None:
        check_resource(self.resource)
        check_token(self.token)
        if self.idempotency_key is not None:
            check_key(self.idempotency_key)


@dataclass(frozen=True)
class Decision:
    """What the gate decided for an accepted effect (a stale one raises).

    ``duplicate`` is True when the idempotency key had already been applied:
    nothing was applied now, ``token`` and ``response`` are those of the
    first application. ``highest_token`` is the resource's mark as the gate
    saw it when deciding.
    """

    resource: str
    token: int
    highest_token: int
    idempotency_key: str | None = None
    duplicate: bool = False
    response: str = ""


class TokenGate(Protocol):
    """A per-resource highest-token gate with idempotency records."""

    async def admit(self, effect: Effect) -> Decision:
        """Atomically: replay a known idempotency key; else refuse a token below
        the resource's mark (:class:`StaleFenceError`); else raise the mark to
        the token and record the key with ``effect.response``."""
        ...

    async def recall(self, idempotency_key: str) -> Decision | None:
        """The first outcome recorded for ``idempotency_key``, if any (``duplicate=True``)."""
        ...

    async def highest(self, resource: str) -> int:
        """The resource's mark: the highest token it accepted (0 if none)."""
        ...


class MemoryGate:
    """The gate in one process's memory: the reference semantics, for tests and
    for destinations that keep their own state in memory.

    ``admit`` has no ``await`` between its check and its update, so on one
    event loop it is atomic. Nothing survives a restart: a restarted
    destination would accept any token again. Use the etcd or SQL gates when
    the destination's state is durable.
    """

    def __init__(self) -> None:
        self._marks: dict[str, int] = {}
        self._records: dict[str, Decision] = {}

    async def admit(self, effect: Effect) -> Decision:
        key = effect.idempotency_key
        if key is not None and key in self._records:
            return self._replay(effect, self._records[key])
        mark = self._marks.get(effect.resource, 0)
        if effect.token < mark:
            raise StaleFenceError(effect.resource, effect.token, mark)
        self._marks[effect.resource] = effect.token
        decision = Decision(effect.resource, effect.token, effect.token, key, False,
                            effect.response)
        if key is not None:
            self._records[key] = decision
        return decision

    def _replay(self, effect: Effect, first: Decision) -> Decision:
        if (first.resource, first.token) != (effect.resource, effect.token):
            assert first.idempotency_key is not None
            raise IdempotencyKeyConflictError(first.idempotency_key, effect.resource,
                                              effect.token, first.resource, first.token)
        return Decision(first.resource, first.token, self._marks.get(first.resource, 0),
                        first.idempotency_key, True, first.response)

    async def recall(self, idempotency_key: str) -> Decision | None:
        first = self._records.get(idempotency_key)
        if first is None:
            return None
        return Decision(first.resource, first.token, self._marks.get(first.resource, 0),
                        idempotency_key, True, first.response)

    async def highest(self, resource: str) -> int:
        return self._marks.get(resource, 0)
