"""The wire form of an etcd ``TxnRequest``, written directly from the store's ops.

Why not the generated protobuf classes: building a claim's request through them
(a ``Compare``/``RequestOp``/``PutRequest`` message per op, each a call into upb
with keyword arguments) cost about 20 us of the client's CPU per claim, more
than the rest of the request's Python; these few byte joins cost about 7 us
(docs/benchmarks.md, "The request's wire form"). The transaction is still
sent and answered through grpc.aio; only the request's serialisation is ours.

The bytes are exactly the ones ``rpc_pb2.TxnRequest(...).SerializeToString()``
gives for the same ops (fields in field-number order, proto3 defaults left out,
a oneof member always written): tests/core/test_etcd_wire.py checks that over
every op and field this module writes, so a request etcd receives is the one
the protocol wrote, byte for byte. The field numbers are etcd's
``api/etcdserverpb/rpc.proto`` (v3.6), as ``joblease/_etcdpb`` was generated from.

A ``Compare``'s or ``Delete``'s wire form is kept on the (frozen) instance: one
built once and sent in every claim (a semaphore's, in :mod:`joblease.slots`) is
encoded once. Bytes are immutable, so a kept form can be shared by any number
of requests.
"""

from __future__ import annotations

from collections.abc import Sequence

from joblease.store import Compare, Delete, Get, Put, Txn, TxnOp, prefix_end

_KEPT = "_wire"
_SMALL = [bytes((i,)) for i in range(128)]


def _varint(value: int) -> bytes:
    if 0 <= value < 128:
        return _SMALL[value]
    if value < 0:
        value += 1 << 64  # int64: two's complement, ten bytes
    out = bytearray()
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _field(tag: bytes, data: bytes) -> bytes:
    """A length-delimited field: ``tag`` (one byte, or two), length, ``data``."""
    n = len(data)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + data


def _optional(tag: bytes, data: bytes) -> bytes:
    """A proto3 bytes field: left out when empty, as protobuf leaves its default."""
    return _field(tag, data) if data else b""


# Compare: result = 1, target = 2, key = 3, the target_union oneof version = 4,
# create_revision = 5, mod_revision = 6, value = 7, lease = 8; range_end = 64.
_RESULT = {"==": 0, ">": 1, "<": 2, "!=": 3}
_TARGET = {"version": 0, "create": 1, "mod": 2, "value": 3, "lease": 4}
_HEAD = {(target, op): (b"\x08" + _SMALL[r] if r else b"") + (b"\x10" + _SMALL[t] if t else b"")
         for target, t in _TARGET.items() for op, r in _RESULT.items()}
_UNION_TAG = {"version": b"\x20", "create": b"\x28", "mod": b"\x30", "lease": b"\x40"}
_RANGE_END_TAG = b"\x82\x04"  # field 64, length-delimited


def compare(c: Compare) -> bytes:
    """The Compare message (without its own tag and length)."""
    kept: bytes | None = c.__dict__.get(_KEPT)
    if kept is not None:
        return kept
    if c.target == "value":
        assert isinstance(c.value, bytes)
        union = _field(b"\x3a", c.value)
    else:
        union = _UNION_TAG[c.target] + _varint(int(c.value))
    wire = _HEAD[c.target, c.op] + _optional(b"\x1a", c.key) + union
    if c.range_end:
        wire += _field(_RANGE_END_TAG, c.range_end)
    c.__dict__[_KEPT] = wire
    return wire


def _get(op: Get) -> bytes:
    # RangeRequest: key = 1, range_end = 2, limit = 3, sort_order = 5, sort_target = 6,
    # keys_only = 8, count_only = 9. RequestOp.request_range = 1.
    wire = _optional(b"\x0a", op.key)
    if op.prefix:
        wire += _optional(b"\x12", prefix_end(op.key))
    if op.limit:
        wire += b"\x18" + _varint(op.limit)
    if op.oldest_first:
        wire += b"\x28\x01\x30\x02"  # sort_order ASCEND (1), sort_target CREATE (2)
    if op.keys_only:
        wire += b"\x40\x01"
    if op.count_only:
        wire += b"\x48\x01"
    return _field(b"\x0a", wire)


def _put(op: Put) -> bytes:
    # PutRequest: key = 1, value = 2, lease = 3. RequestOp.request_put = 2.
    wire = _optional(b"\x0a", op.key) + _optional(b"\x12", op.value)
    if op.lease:
        wire += b"\x18" + _varint(op.lease)
    return _field(b"\x12", wire)


def _delete(op: Delete) -> bytes:
    # DeleteRangeRequest: key = 1, range_end = 2. RequestOp.request_delete_range = 3.
    kept: bytes | None = op.__dict__.get(_KEPT)
    if kept is None:
        end = op.end or (prefix_end(op.key) if op.prefix else b"")
        kept = op.__dict__[_KEPT] = _field(
            b"\x1a", _optional(b"\x0a", op.key) + _optional(b"\x12", end))
    return kept


def request_op(op: TxnOp) -> bytes:
    """The RequestOp message (without its own tag and length)."""
    if isinstance(op, Put):
        return _put(op)
    if isinstance(op, Get):
        return _get(op)
    if isinstance(op, Delete):
        return _delete(op)
    if isinstance(op, Txn):
        return _field(b"\x22", txn_request(op.compares, op.success, op.failure))
    raise TypeError(f"not a transaction op: {op!r}")


def txn_request(compares: Sequence[Compare], success: Sequence[TxnOp],
                failure: Sequence[TxnOp] = ()) -> bytes:
    """The TxnRequest message: compare = 1, success = 2, failure = 3 (repeated)."""
    return b"".join([*(_field(b"\x0a", compare(c)) for c in compares),
                     *(_field(b"\x12", request_op(op)) for op in success),
                     *(_field(b"\x1a", request_op(op)) for op in failure)])
