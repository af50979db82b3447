"""The sidecar's state vocabulary, shared by the runner and the HTTP layer.

Its own module so that neither imports the other for it: the runner decides
(a :class:`Phase`; an :data:`Answer` to each operation, in the protocol's
terms), the API renders it as HTTP (:func:`joblease.sidecar.api.render`), and
:mod:`joblease.sidecar.serve` wires the two together.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from joblease.errors import JobLeaseError
from joblease.records import CheckpointRecord, ResultRecord


class Phase(enum.StrEnum):
    """Where the sidecar's lease is; ``/healthz``, ``/v1/lease`` and the
    ``joblease_sidecar_state`` gauge all report it by its value."""

    CLAIMING = "claiming"
    HELD = "held"
    #: the lease ended while a completion of ours may have committed; its result decides
    COMPLETING = "completing"
    LOST = "lost"
    COMPLETED = "completed"
    #: the claim was refused for good (attempts exhausted, not registered in time, ...)
    FAILED = "failed"
    RELEASED = "released"
    STOPPING = "stopping"


@dataclass(frozen=True)
class Stale:
    """``token`` is not (or no longer) the job's current token; ``current_token``
    is, when known. Nothing was written under ``token``."""

    token: int
    message: str
    current_token: int | None
    state: Phase


@dataclass(frozen=True)
class Unsettled:
    """The lease ended while the completion under ``token`` was in flight, and
    etcd cannot say yet whether it committed: the same request may be retried."""

    token: int
    state: Phase


@dataclass(frozen=True)
class Released:
    """The job was given back under ``token``."""

    token: int


@dataclass(frozen=True)
class NothingToRelease:
    """A release under ``token`` after the job was completed under it."""

    token: int
    state: Phase
    result: ResultRecord


#: What an operation (complete, checkpoint, release) answers: the record it
#: wrote (or found already written), one of the outcomes above, or the domain
#: error that stopped it.
Answer = (ResultRecord | CheckpointRecord | Stale | Unsettled | Released | NothingToRelease
          | JobLeaseError)
