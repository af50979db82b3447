"""The completion fused with the next claim (docs/queues.md, "Complete and claim
the next"), pinned by a shared vector (tests/vectors/fused.json): given the same
held item, result, candidate and values, ``Queues.complete_next``'s request
(``joblease.queue.fused_request``, through the lease that sends it) is the one
in the file, compare by compare and op by op, nested claim included. The Go
sidecar's ``protocol.FusedRequest`` checks itself against the same file
(sidecar-go/internal/protocol/fused_vectors_test.go)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from joblease.keys import ItemRef, KeySpace, QueueRef
from joblease.lease import Lease
from joblease.queue import FusedClaim, fused_request
from joblease.store import Compare, Delete, Get, Put, Store, Txn, TxnOp

HERE = Path(__file__).resolve().parent
CASES: list[dict[str, Any]] = json.loads((HERE / "fused.json").read_text())["cases"]


def _compare(c: Compare) -> str:
    value = c.value.decode() if isinstance(c.value, bytes) else c.value
    assert not c.range_end
    return f"{c.target}({c.key.decode()}) {c.op} {value}"


def _op(op: TxnOp) -> Any:
    if isinstance(op, Put):
        return f"put {op.key.decode()} {op.value.decode()} lease={op.lease}"
    if isinstance(op, Get):
        assert not (op.prefix or op.limit or op.keys_only or op.count_only)
        return f"get {op.key.decode()}"
    if isinstance(op, Delete):
        assert not (op.prefix or op.end)
        return f"delete {op.key.decode()}"
    assert isinstance(op, Txn)
    return {"compare": [_compare(c) for c in op.compares],
            "success": [_op(o) for o in op.success], "failure": [_op(o) for o in op.failure]}


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_fused_request_is_the_vectors(case: dict[str, Any]) -> None:
    given = case["given"]
    queue = KeySpace(given["root"]).queue(QueueRef(given["namespace"], given["queue"]))
    held = queue.item(given["held"])
    lease = Lease(store=cast(Store, None), session=None,
                  job=ItemRef(QueueRef(given["namespace"], given["queue"]), given["held"]),
                  keys=held, owner="w", claim_id="c", token=given["token"], generation=1,
                  ttl=30, holder_value=given["heldHolderValue"].encode())
    claim = FusedClaim(keys=queue.item(given["next"]), spec_revision=given["specRevision"],
                       pending_revision=given["pendingRevision"],
                       max_attempts=given["maxAttempts"], lease_id=given["leaseId"],
                       holder_value=given["nextHolderValue"].encode(),
                       claims_value=given["nextClaimsValue"].encode())
    compares, success, failure = fused_request(lease, given["resultValue"].encode(), claim)
    assert {"compare": [_compare(c) for c in compares], "success": [_op(o) for o in success],
            "failure": [_op(o) for o in failure]} == case["request"]
