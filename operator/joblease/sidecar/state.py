"""The sidecar's state vocabulary, shared by the runner and the HTTP layer.

Its own module so that neither imports the other for it: the runner decides
(a :class:`Phase`, an :class:`Outcome`), the API renders, and
:mod:`joblease.sidecar.serve` wires the two together.
"""

from __future__ import annotations

import enum
from typing import Any

from joblease.errors import JobLeaseError


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


class Outcome:
    """What an API operation yields: an HTTP status and a JSON body."""

    __slots__ = ("body", "status")

    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body

    @classmethod
    def of_error(cls, exc: JobLeaseError) -> Outcome:
        """A domain error as the API answers it: the error's own status and body
        (docs/sidecar.md: ``stale`` 409, ``unavailable`` 503, too large 413...)."""
        return cls(exc.http_status, exc.to_dict())
