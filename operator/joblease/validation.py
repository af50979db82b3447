"""Input checks that run before anything is written.

Limits are chosen well under etcd's 1.5 MiB request limit and match the CRD's
schema where OpenAPI can express them. What a result, checkpoint or
parameters value may be is one rule (docs/protocol.md#stored-values), checked
here for every Python writer and by ``records`` for every reader, and the same
in the Go sidecar (shared vectors: tests/vectors/values.json).
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
#: A queue item's payload (docs/queues.md): a stored value like a result.
MAX_PAYLOAD_BYTES = 64 * 1024
#: Items per enqueue transaction: two puts each within etcd's default --max-txn-ops (128).
ENQUEUE_CHUNK = 64
#: The deepest nesting a result, checkpoint or parameters value may have: a
#: scalar is depth 0, each array or object around it adds one. Far under
#: Python's recursion limit (json.loads fails near 1000) and Go's (10000),
#: so every reader can decode whatever a writer may store.
MAX_JSON_DEPTH = 64
MAX_OWNER_LENGTH = 253

# RFC 1123 DNS subdomain for names (Kubernetes object names), label for namespaces.
# Always applied with ``fullmatch``: ``$`` would also match before a final "\n".
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
# Queue item ids: an Indexed Job's index and an RFC 3339 CronJob slot are ids as they are.
_ITEM_ID = re.compile(r"[A-Za-z0-9._:-]{1,253}")
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


def item_id(value: object) -> str:
    """1 to 253 characters of ``A-Z a-z 0-9 . _ : -`` (no ``/``: ids are key segments)."""
    if not isinstance(value, str) or not _ITEM_ID.fullmatch(value):
        raise InvalidInputError(
            f"invalid item id {value!r}: must be 1 to 253 characters of letters, digits, "
            "'.', '_', ':' and '-'")
    return value


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


#: The most tenures a job's history may keep (each is up to four small keys).
MAX_HISTORY_LIMIT = 1000
#: What a JobLease (and ``joblease register``) keeps when it does not say.
DEFAULT_HISTORY_LIMIT = 10


#: The most tenures a queue may keep per item: a queue holds many items, so its
#: history is bounded per item and small (items x limit x 4 keys at most).
MAX_QUEUE_HISTORY_LIMIT = 100
#: What a JobQueue (and ``joblease queue create``) keeps per item when it does
#: not say: most items are claimed once, and a retried one shows its last few.
DEFAULT_QUEUE_HISTORY_LIMIT = 3


def history_limit(value: object, maximum: int = MAX_HISTORY_LIMIT) -> int:
    if (isinstance(value, bool) or not isinstance(value, int)
            or not 0 <= value <= maximum):
        raise InvalidInputError(
            f"invalid historyLimit {value!r}: must be a whole number in "
            f"[0, {maximum}] (0 = no history)")
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


# A JSON string token (escapes skipped whole) or one bracket: brackets inside
# strings are not nesting. The unrolled loop never backtracks.
_JSON_NESTING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text_depth(data: bytes) -> int:
    """The deepest nesting of the JSON text ``data``, counted without parsing
    it (so a value nested far too deep is measured, not a RecursionError).
    Exact whenever it exceeds :data:`MAX_JSON_DEPTH`; text with too few
    brackets to exceed it is not scanned and reads as 0."""
    if data.count(b"[") + data.count(b"{") <= MAX_JSON_DEPTH:
        return 0  # cannot be deeper than the limit: the common case, no scan
    depth = deepest = 0
    for m in _JSON_NESTING.finditer(data):
        c = m.group()
        if c in (b"[", b"{"):
            depth += 1
            deepest = max(deepest, depth)
        elif c in (b"]", b"}"):
            depth -= 1
    return deepest


def json_value_problem(value: Any, depth_limit: int = MAX_JSON_DEPTH) -> str | None:
    """Why ``value`` (decoded JSON, or what a caller wants stored) is not a
    value joblease stores, or None: nested deeper than ``depth_limit``, or a
    string (or object key) holding a UTF-16 surrogate code point. A Python
    ``str`` holds a valid surrogate pair as one code point beyond U+FFFF, so any
    surrogate left in it is a lone one: not a Unicode scalar value, not
    encodable as UTF-8, and Go's JSON would silently read it as U+FFFD.
    Iterative: a value nested arbitrarily deep cannot exhaust the stack."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, str):
            if _SURROGATE.search(v):
                return f"a string holds a lone UTF-16 surrogate ({_surrogate_at(v)})"
        elif isinstance(v, dict | list | tuple):
            if depth + 1 > depth_limit:
                return f"nested deeper than {depth_limit} levels of arrays and objects"
            if isinstance(v, dict):
                for k, item in v.items():
                    stack.append((k, depth + 1))
                    stack.append((item, depth + 1))
            else:
                stack.extend((item, depth + 1) for item in v)
    return None


def _surrogate_at(s: str) -> str:
    m = _SURROGATE.search(s)
    return "" if m is None else f"\\u{ord(m.group()):04x} at index {m.start()}"


#: ``json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)``,
#: with the encoder built once rather than per call (every completion passes here).
_PAYLOAD_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True, allow_nan=False)
#: The same encoding by json's C encoder, made once: ``JSONEncoder.encode`` makes
#: a new one (and a circular-reference table) at every call. Without that table:
#: a value that contains itself is refused by :func:`json_value_problem` (too
#: deep) before it is encoded. None where json has no C accelerator.
_c_make_encoder = getattr(json.encoder, "c_make_encoder", None)
_PAYLOAD_C = None if _c_make_encoder is None else _c_make_encoder(
    None, _PAYLOAD_JSON.default, json.encoder.encode_basestring_ascii, None, ":", ",",
    True, False, False)


def json_payload(value: Any, what: str, limit: int,
                 too_large: type[InvalidInputError] = InvalidInputError) -> bytes:
    """Serialize ``value`` as compact sorted JSON, refusing what joblease does
    not store (docs/protocol.md, "Stored values"): not JSON (NaN, Infinity, other
    types), nested deeper than :data:`MAX_JSON_DEPTH`, a lone surrogate in a
    string, or more than ``limit`` bytes (raising ``too_large``:
    :class:`PayloadTooLargeError` for request bodies)."""
    problem = json_value_problem(value)
    if problem is not None:
        raise InvalidInputError(f"invalid {what}: {problem}")
    try:
        data = ("".join(_PAYLOAD_C(value, 0)) if _PAYLOAD_C is not None
                else _PAYLOAD_JSON.encode(value)).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidInputError(f"invalid {what}: not JSON-serializable ({exc})") from None
    if len(data) > limit:
        raise too_large(
            f"{what} too large: {len(data)} bytes of JSON, the limit is {limit} bytes"
        )
    return data


#: Exact types JSON gives back as an equal value of the same type (a float's
#: JSON text is its ``repr``, which reads back as the same float).
_PLAIN = frozenset({str, int, float, bool, type(None)})


def as_decoded(value: Any, data: bytes) -> Any:
    """What a reader decodes from ``data``, the JSON :func:`json_payload` made of
    ``value``: ``json.loads(data)``, without parsing it when ``value`` is a plain
    scalar (itself), or a flat object with string keys or a flat array of plain
    scalars (a copy, objects in the sorted key order the JSON has, arrays as
    lists): equal to, and ordered as, what ``json.loads`` returns."""
    kind = type(value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        if all(type(k) is str and type(v) in _PLAIN for k, v in value.items()):
            return dict(sorted(value.items()))
    elif (kind is list or kind is tuple) and all(type(v) in _PLAIN for v in value):
        return list(value)
    return json.loads(data)


def json_text(text: str | bytes, what: str, limit: int,
              too_large: type[InvalidInputError] = InvalidInputError) -> Any:
    """Parse ``text`` (a result or checkpoint given as JSON, e.g. on the command
    line) and check it as :func:`json_payload` does: the decoded value, or
    :class:`InvalidInputError` naming what is wrong. Raw lone surrogates are
    refused like escaped ones (bytes are read with ``surrogatepass``, as
    ``json.loads`` reads them; a ``str`` from ``sys.argv`` carries undecodable
    bytes as surrogates already)."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", "surrogatepass")
    if json_text_depth(data) > MAX_JSON_DEPTH:
        raise InvalidInputError(
            f"invalid {what}: nested deeper than {MAX_JSON_DEPTH} levels of arrays and objects")
    try:
        value = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InvalidInputError(f"invalid {what}: not JSON ({exc})") from None
    json_payload(value, what, limit, too_large)
    return value
