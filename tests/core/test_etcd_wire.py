"""joblease.etcd_wire writes a TxnRequest's bytes itself: they must be exactly the
generated protobuf classes' serialisation of the same ops, for every op, field and
value the store can send (no etcd needed: the bytes are the whole contract; that
etcd answers them is every other store test). The reference builder below is the
one the store used before etcd_wire, kept here as the oracle."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import pytest

from joblease import etcd_wire
from joblease._etcdpb import rpc_pb2
from joblease.store import Compare, Delete, Get, Put, Txn, TxnOp, prefix_end

_TARGETS = {"version": rpc_pb2.Compare.VERSION, "create": rpc_pb2.Compare.CREATE,
            "mod": rpc_pb2.Compare.MOD, "value": rpc_pb2.Compare.VALUE,
            "lease": rpc_pb2.Compare.LEASE}
_OPS = {"==": rpc_pb2.Compare.EQUAL, "!=": rpc_pb2.Compare.NOT_EQUAL,
        "<": rpc_pb2.Compare.LESS, ">": rpc_pb2.Compare.GREATER}


def ref_compare(c: Compare) -> Any:
    msg = rpc_pb2.Compare(key=c.key, target=_TARGETS[c.target], result=_OPS[c.op],
                          range_end=c.range_end)
    if c.target == "value":
        assert isinstance(c.value, bytes)
        msg.value = c.value
    else:
        setattr(msg, {"version": "version", "create": "create_revision",
                      "mod": "mod_revision", "lease": "lease"}[c.target], int(c.value))
    return msg


def ref_op(op: TxnOp) -> Any:
    if isinstance(op, Put):
        return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=op.key, value=op.value,
                                                                 lease=op.lease))
    if isinstance(op, Get):
        return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(
            key=op.key, range_end=prefix_end(op.key) if op.prefix else b"", limit=op.limit,
            keys_only=op.keys_only, count_only=op.count_only,
            sort_target=(rpc_pb2.RangeRequest.CREATE if op.oldest_first
                         else rpc_pb2.RangeRequest.KEY),
            sort_order=(rpc_pb2.RangeRequest.ASCEND if op.oldest_first
                        else rpc_pb2.RangeRequest.NONE)))
    if isinstance(op, Txn):
        return rpc_pb2.RequestOp(request_txn=ref_txn(op.compares, op.success, op.failure))
    assert isinstance(op, Delete)
    return rpc_pb2.RequestOp(request_delete_range=rpc_pb2.DeleteRangeRequest(
        key=op.key, range_end=op.end or (prefix_end(op.key) if op.prefix else b"")))


def ref_txn(compares: Sequence[Compare], success: Sequence[TxnOp],
            failure: Sequence[TxnOp]) -> Any:
    return rpc_pb2.TxnRequest(compare=[ref_compare(c) for c in compares],
                              success=[ref_op(op) for op in success],
                              failure=[ref_op(op) for op in failure])


def same(compares: Sequence[Compare], success: Sequence[TxnOp] = (),
         failure: Sequence[TxnOp] = ()) -> None:
    ours = etcd_wire.txn_request(compares, success, failure)
    theirs = ref_txn(compares, success, failure)
    assert ours == theirs.SerializeToString(), (compares, success, failure)
    assert rpc_pb2.TxnRequest.FromString(ours) == theirs


# lengths and numbers at the varint boundaries (1 / 2 / 3 bytes, int64's extremes)
KEYS = [b"", b"k", b"/j/" + b"x" * 120, b"/j/" + b"x" * 125, b"y" * 128, b"z" * 300,
        b"w" * 20_000, bytes(range(256))]
NUMBERS = [0, 1, 127, 128, 16_383, 16_384, 2**31, 2**63 - 1, -1, -(2**63)]


@pytest.mark.parametrize("target", ["version", "create", "mod", "lease"])
@pytest.mark.parametrize("op", ["==", "!=", "<", ">"])
def test_every_compare_on_a_number(target: str, op: str) -> None:
    for key in KEYS:
        for n in NUMBERS:
            same([Compare(key, target, op, n)])  # type: ignore[arg-type]
            same([Compare(key, target, op, n, range_end=prefix_end(key or b"a"))])  # type: ignore[arg-type]


@pytest.mark.parametrize("op", ["==", "!=", "<", ">"])
def test_every_compare_on_a_value(op: str) -> None:
    for key in KEYS:
        for value in [b"", b"v", b"x" * 127, b"x" * 128, b"\x00\xff" * 5000]:
            same([Compare(key, "value", op, value)])  # type: ignore[arg-type]
            same([Compare(key, "value", op, value, range_end=b"\xff" * 130)])  # type: ignore[arg-type]


def test_every_put_get_and_delete() -> None:
    for key in KEYS:
        for value in [b"", b"{}", b"v" * 200]:
            for lease in [0, 1, 128, 0x7FFF_FFFF_FFFF_FFFF]:
                same([], [Put(key, value, lease=lease)])
        for prefix in (False, True):
            for limit in [0, 1, 200]:
                for oldest in (False, True):
                    for keys_only in (False, True):
                        for count_only in (False, True):
                            same([], [Get(key, prefix=prefix, limit=limit, oldest_first=oldest,
                                          keys_only=keys_only, count_only=count_only)])
            same([], [], [Delete(key, prefix=prefix)])
        same([], [Delete(key, end=b"\xff" * 200)])


def test_nested_transactions_and_both_branches() -> None:
    inner = Txn((Compare(b"a", "create", "==", 0),), (Put(b"a", b"1"),), (Get(b"a"),))
    outer = Txn((Compare(b"t", "mod", "==", 300),), (inner, Get(b"t")), (Delete(b"x"),))
    same([Compare(b"term", "version", ">", 2)], [outer, Put(b"p", b"v" * 300)], [inner])
    same([], [Txn((), ())])  # an empty nested transaction is still written


def test_random_transactions() -> None:
    rng = random.Random(29)

    def key() -> bytes:
        return rng.choice(KEYS[:6]) + str(rng.randrange(10**6)).encode()

    def compare() -> Compare:
        target = rng.choice(["version", "create", "mod", "value", "lease"])
        value: int | bytes = (rng.randbytes(rng.choice([0, 3, 200])) if target == "value"
                              else rng.choice([*NUMBERS, rng.randrange(2 ** 40)]))
        return Compare(key(), target, rng.choice(["==", "!=", "<", ">"]), value,  # type: ignore[arg-type]
                       range_end=rng.choice([b"", key()]))

    def op(depth: int) -> TxnOp:
        kind = rng.randrange(4 if depth < 2 else 3)
        if kind == 0:
            return Put(key(), rng.randbytes(rng.choice([0, 10, 500])),
                       lease=rng.choice([0, rng.randrange(2**62)]))
        if kind == 1:
            return Get(key(), prefix=rng.random() < 0.5, limit=rng.choice([0, 5]),
                       oldest_first=rng.random() < 0.5, keys_only=rng.random() < 0.3,
                       count_only=rng.random() < 0.3)
        if kind == 2:
            return Delete(key(), prefix=rng.random() < 0.3, end=rng.choice([b"", key()]))
        return Txn(tuple(compare() for _ in range(rng.randrange(3))),
                   tuple(op(depth + 1) for _ in range(rng.randrange(3))),
                   tuple(op(depth + 1) for _ in range(rng.randrange(3))))

    for _ in range(2_000):
        same([compare() for _ in range(rng.randrange(6))],
             [op(0) for _ in range(rng.randrange(6))], [op(0) for _ in range(rng.randrange(5))])


def test_kept_forms_are_per_instance_and_never_change() -> None:
    c, d = Compare(b"k", "mod", "==", 5), Delete(b"k", prefix=True)
    first = etcd_wire.txn_request([c], [d])
    assert etcd_wire.txn_request([c], [d]) == first  # served from what was kept
    assert etcd_wire.txn_request([Compare(b"k", "mod", "==", 6)], [Delete(b"k")]) != first
    same([c], [d])


def test_an_unknown_op_is_refused() -> None:
    with pytest.raises(TypeError):
        etcd_wire.txn_request([], [object()])  # type: ignore[list-item]
