"""The mirror's cache of the last JobLease object read or written, per job, compressed.

The mirror decides each status write from the object it last read or wrote (its
``resourceVersion`` makes the write conditional, its ``status`` is what
``should_apply`` and ``same_facts`` compare with, its conditions keep their
transition times), so it keeps one object per JobLease for as long as the
JobLease exists: the one part of its memory that grows with the JobLeases.

Only what the mirror reads is kept (:func:`slim`: identity, ``resourceVersion``,
``generation``, ``deletionTimestamp``, spec and status; no ``managedFields``, no
annotations), as compact JSON compressed with a preset dictionary
(:data:`_DICTIONARY`: JobLease objects of every phase, so the field names, the
condition texts and the API group that every object repeats cost a few bytes
each): about 1.2 KB of JSON per object becomes about 0.1-0.3 KB. Read back only
when the job is written (a few times per claim): decompressing costs tens of
microseconds, against the milliseconds of the API request it precedes.

What :meth:`ObjectCache.get` returns is always a fresh copy of exactly what the
last :meth:`~ObjectCache.put` stored (slimmed): compression is lossless, and
nothing else is kept per job.
"""

from __future__ import annotations

import datetime as dt
import json
import zlib
from typing import Any

from joblease.keys import JobRef
from joblease.operator.status import status_from_state
from joblease.records import Holder, JobSpec, JobState, ResultRecord

_KEPT_METADATA = ("name", "namespace", "uid", "resourceVersion", "generation",
                  "deletionTimestamp")


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """What the mirror needs of a cached resource: identity, resourceVersion (the
    status write is conditional on it), generation, spec and status."""
    meta = obj.get("metadata", {})
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in _KEPT_METADATA if k in meta},
            "spec": obj.get("spec", {}), "status": obj.get("status", {})}


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _examples() -> list[dict[str, Any]]:
    """Slim JobLease objects of each phase, as the mirror writes them (built with
    :func:`status_from_state`, so the dictionary follows the status format)."""
    job = JobRef("namespace", "name")
    spec = JobSpec(lease_duration_seconds=30, max_attempts=3)
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    holder = Holder(owner="worker-0", claim_id="0" * 32, token=1000, generation=1,
                    lease_id=7587000000000000000, claimed_at=now.timestamp())
    result = ResultRecord(owner="worker-0", claim_id="0" * 32, token=1000, generation=1,
                          result={"ok": True}, completed_at=now.timestamp(), revision=1001)
    states = [
        JobState(job, 1002, spec, 999, None, 1, "worker-0", result, 1001),
        JobState(job, 1000, spec, 999, holder, 1, "worker-0", None, 1000),
        JobState(job, 3000, spec, 999, None, 3, "worker-0", None, 3000),
        JobState(job, 999, spec, 999, None, 0, None, None, 999),
    ]
    out = []
    for state in states:
        status = status_from_state(state, 1, None, now, lease_remaining=30)
        out.append(slim({
            "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
            "metadata": {"name": "name", "namespace": "namespace",
                         "uid": "00000000-0000-0000-0000-000000000000",
                         "resourceVersion": "1000", "generation": 1},
            "spec": {"leaseDurationSeconds": 30, "maxAttempts": 3}, "status": status}))
    return out


#: zlib's preset dictionary: the most common object (Pending) last, where the
#: shortest back-references reach it.
_DICTIONARY = b"".join(_encode(o) for o in _examples())
#: A 4 KiB window (the dictionary fits in it) and a small hash table: a few KB of
#: zlib state per call instead of the default's 256 KiB.
_WBITS = -12  # raw deflate, no header or checksum (the bytes never leave the process)
_MEM_LEVEL = 2


def pack(obj: dict[str, Any]) -> bytes:
    """``slim(obj)`` as compressed compact JSON."""
    c = zlib.compressobj(6, zlib.DEFLATED, _WBITS, _MEM_LEVEL, zlib.Z_DEFAULT_STRATEGY,
                         _DICTIONARY)
    return c.compress(_encode(slim(obj))) + c.flush()


def unpack(packed: bytes) -> dict[str, Any]:
    d = zlib.decompressobj(_WBITS, _DICTIONARY)
    obj: dict[str, Any] = json.loads(d.decompress(packed) + d.flush())
    return obj


class ObjectCache:
    """The last object read or written of each job (see the module docstring)."""

    def __init__(self) -> None:
        self._packed: dict[JobRef, bytes] = {}

    def get(self, job: JobRef) -> dict[str, Any] | None:
        """A fresh copy of the object last stored for ``job``, or None."""
        packed = self._packed.get(job)
        return unpack(packed) if packed is not None else None

    def put(self, job: JobRef, obj: dict[str, Any]) -> None:
        self._packed[job] = pack(obj)

    def discard(self, job: JobRef) -> None:
        """Forget ``job``'s object: the next write reads it from the API server."""
        self._packed.pop(job, None)

    def __contains__(self, job: object) -> bool:
        return job in self._packed

    def __len__(self) -> int:
        return len(self._packed)

    def packed_bytes(self) -> int:
        """Bytes of compressed objects held (not counting the dict's own)."""
        return sum(len(p) for p in self._packed.values())
