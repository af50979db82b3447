"""joblease: job leases with fencing tokens on etcd.

The public API is small, in the spirit of etcd's Go ``concurrency`` package:
a :class:`JobLeaseClient` registers jobs and claims them; a claim returns a
:class:`Lease` whose ``token`` (the etcd revision at which the claim committed)
must travel with every external effect. Errors say what happened.

A lease is temporary ownership, not exactly-once execution: see docs/protocol.md.
"""

from joblease.client import JobLeaseClient
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    ClaimOutcomeUnknownError,
    ClaimRevokedError,
    CorruptRecordError,
    FencedError,
    HeldError,
    InvalidInputError,
    JobLeaseError,
    LeaseLostError,
    NotRegisteredError,
    OutcomeUnknownError,
    PayloadTooLargeError,
    PermissionDeniedError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.etcd_store import EtcdConfig
from joblease.keys import JobRef
from joblease.lease import Lease
from joblease.records import CheckpointRecord, Holder, JobSpec, JobState, Phase, ResultRecord

__all__ = [
    "AlreadyCompletedError",
    "AttemptsExhaustedError",
    "CheckpointRecord",
    "ClaimOutcomeUnknownError",
    "ClaimRevokedError",
    "CorruptRecordError",
    "EtcdConfig",
    "FencedError",
    "HeldError",
    "Holder",
    "InvalidInputError",
    "JobLeaseClient",
    "JobLeaseError",
    "JobRef",
    "JobSpec",
    "JobState",
    "Lease",
    "LeaseLostError",
    "NotRegisteredError",
    "OutcomeUnknownError",
    "PayloadTooLargeError",
    "PermissionDeniedError",
    "Phase",
    "ResultRecord",
    "StaleTokenError",
    "StoreUnavailableError",
]
