"""Typed records stored in etcd and the job state assembled from them.

Stored values are compact JSON. Wall-clock times in records are informational
only: no ownership decision ever reads them (expiry is decided by etcd).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any

from joblease.keys import JobRef


class Phase(enum.StrEnum):
    PENDING = "Pending"  # registered, claimable
    CLAIMED = "Claimed"  # a live holder exists
    COMPLETED = "Completed"  # a result was accepted
    FAILED = "Failed"  # maxAttempts claims used without a result


def _dumps(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


@dataclass(frozen=True)
class JobSpec:
    """The registration: what the operator copies from the JobLease's spec."""

    lease_duration_seconds: int
    max_attempts: int = 3
    parameters: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return _dumps({
            "leaseDurationSeconds": self.lease_duration_seconds,
            "maxAttempts": self.max_attempts,
            "parameters": self.parameters,
        })

    @classmethod
    def decode(cls, data: bytes) -> JobSpec:
        obj = json.loads(data)
        return cls(
            lease_duration_seconds=int(obj["leaseDurationSeconds"]),
            max_attempts=int(obj.get("maxAttempts", 0)),
            parameters=dict(obj.get("parameters") or {}),
        )


@dataclass(frozen=True)
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
        return _dumps({"owner": owner, "claimId": claim_id, "ttl": ttl, "claimedAt": claimed_at})

    @staticmethod
    def decode_value(data: bytes) -> dict[str, Any]:
        obj: dict[str, Any] = json.loads(data)
        return obj


@dataclass(frozen=True)
class ResultRecord:
    """The accepted completion, written once."""

    owner: str
    claim_id: str
    token: int
    generation: int
    result: Any
    completed_at: float  # informational wall clock of the completer
    revision: int = 0  # etcd revision at which the completion committed

    def encode(self) -> bytes:
        return _dumps({
            "owner": self.owner, "claimId": self.claim_id, "token": self.token,
            "generation": self.generation, "result": self.result,
            "completedAt": self.completed_at,
        })

    @classmethod
    def decode(cls, data: bytes, revision: int = 0) -> ResultRecord:
        obj = json.loads(data)
        return cls(
            owner=obj["owner"], claim_id=obj["claimId"], token=int(obj["token"]),
            generation=int(obj["generation"]), result=obj.get("result"),
            completed_at=float(obj.get("completedAt", 0.0)), revision=revision,
        )

    def to_dict(self) -> dict[str, Any]:
        return {"owner": self.owner, "claimId": self.claim_id, "token": self.token,
                "generation": self.generation, "result": self.result,
                "completedAt": self.completed_at, "revision": self.revision}


@dataclass(frozen=True)
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

    @property
    def registered(self) -> bool:
        return self.spec is not None

    @property
    def attempts(self) -> int:
        return self.generation

    @property
    def phase(self) -> Phase:
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
        }
