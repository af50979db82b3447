"""Input checks that run before anything is written.

Limits are chosen well under etcd's 1.5 MiB request limit and match the CRD's
schema, so a value the API server accepts is one the protocol accepts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from joblease.errors import InvalidInputError
from joblease.keys import JobRef

#: etcd raises any TTL under its minimum (2 s by default) and counts whole seconds.
MIN_TTL_SECONDS = 2
#: One day; a longer lease is almost certainly a unit mistake.
MAX_TTL_SECONDS = 86_400
#: Serialized JSON size limits (bytes).
MAX_RESULT_BYTES = 64 * 1024
#: A checkpoint has the result's limit (it lands in the same kind of status field).
MAX_CHECKPOINT_BYTES = MAX_RESULT_BYTES
MAX_PARAMETERS_BYTES = 64 * 1024
MAX_OWNER_LENGTH = 253

# RFC 1123 DNS subdomain for names (Kubernetes object names), label for namespaces.
# Always applied with ``fullmatch``: ``$`` would also match before a final "\n".
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_OWNER = re.compile(r"[\x21-\x7e]+")  # printable ASCII without spaces


def job_ref(ref: JobRef) -> JobRef:
    """Kubernetes naming: namespace a DNS label (<= 63), name a DNS subdomain (<= 253)."""
    if not (0 < len(ref.namespace) <= 63 and _DNS_LABEL.fullmatch(ref.namespace)):
        raise InvalidInputError(
            f"invalid namespace {ref.namespace!r}: must be a DNS label "
            "(lowercase letters, digits and '-', at most 63 characters)"
        )
    if not (0 < len(ref.name) <= 253 and _DNS_SUBDOMAIN.fullmatch(ref.name)):
        raise InvalidInputError(
            f"invalid job name {ref.name!r}: must be a DNS subdomain "
            "(lowercase letters, digits, '-' and '.', at most 253 characters)"
        )
    return ref


def ttl(seconds: object) -> int:
    """Whole seconds within etcd's bounds."""
    if isinstance(seconds, bool) or not isinstance(seconds, int):
        raise InvalidInputError(
            f"invalid lease duration {seconds!r}: must be a whole number of seconds"
        )
    if not MIN_TTL_SECONDS <= seconds <= MAX_TTL_SECONDS:
        raise InvalidInputError(
            f"invalid lease duration {seconds}s: must be between {MIN_TTL_SECONDS} "
            f"(etcd's minimum TTL) and {MAX_TTL_SECONDS} seconds"
        )
    return seconds


def margin(value: object, ttl_seconds: int) -> float:
    """The safety margin subtracted from a session's deadline: seconds in ``[0, ttl)``.

    A negative margin would put the local deadline after etcd's expiry (a
    holder could act after etcd freed the job); one of the TTL or more leaves
    no time at all in which the lease is valid.
    """
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidInputError(f"invalid margin {value!r}: must be a number of seconds")
    if not 0 <= value < ttl_seconds:
        raise InvalidInputError(
            f"invalid margin {value}s: must be at least 0 and less than the lease "
            f"duration ({ttl_seconds}s)"
        )
    return float(value)


def max_attempts(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(
            f"invalid maxAttempts {value!r}: must be a whole number >= 0 (0 = unlimited)"
        )
    return value


def owner(value: object) -> str:
    if not isinstance(value, str) or not (0 < len(value) <= MAX_OWNER_LENGTH):
        raise InvalidInputError(
            f"invalid owner {value!r}: must be 1..{MAX_OWNER_LENGTH} characters"
        )
    if not _OWNER.fullmatch(value):
        raise InvalidInputError(
            f"invalid owner {value!r}: printable ASCII without spaces only"
        )
    return value


def token(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 2**63:
        raise InvalidInputError(f"invalid token {value!r}: must be a positive 64-bit integer")
    return value


def json_payload(value: Any, what: str, limit: int,
                 too_large: type[InvalidInputError] = InvalidInputError) -> bytes:
    """Serialize ``value`` as compact JSON and refuse it above ``limit`` bytes
    (raising ``too_large``: :class:`PayloadTooLargeError` for request bodies)."""
    try:
        data = json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"invalid {what}: not JSON-serializable ({exc})") from None
    if len(data) > limit:
        raise too_large(
            f"{what} too large: {len(data)} bytes of JSON, the limit is {limit} bytes"
        )
    return data
