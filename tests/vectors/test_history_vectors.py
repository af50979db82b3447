"""The tenure history's records, the ``historyLimit`` field of a job's spec and
the history key layout, pinned by shared vectors (tests/vectors/history.json;
format as records.json in tests/vectors/README.md). The Go sidecar writes the
same bytes (sidecar-go/internal/protocol/history_vectors_test.go)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from joblease.errors import CorruptRecordError
from joblease.keys import JobRef, KeySpace, QueueRef
from joblease.records import (
    JobSpec,
    Tenure,
    TenureEnd,
    encode_tenure_end,
    encode_tenure_mark,
    encode_tenure_start,
)
from joblease.store import KeyValue
from tests.support.vector_files import stored

HERE = Path(__file__).resolve().parent
VECTORS: dict[str, list[dict[str, Any]]] = json.loads((HERE / "history.json").read_text())


def vectors(record: str, *directions: str) -> list[Any]:
    return [pytest.param(v, id=v["name"]) for v in VECTORS[record]
            if v["direction"] in directions]


def _kv(value: bytes, create: int = 5, version: int = 1) -> KeyValue:
    return KeyValue(b"k", value, create, create, version, 0)


def _spec(m: dict[str, Any]) -> JobSpec:
    return JobSpec(m["leaseDurationSeconds"], m["maxAttempts"], m["parameters"],
                   history_limit=m["historyLimit"])


@pytest.mark.parametrize("v", vectors("spec", "both"))
def test_spec_with_a_history_limit_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    assert _spec(v["meaning"]).encode() == stored(v)


@pytest.mark.parametrize("v", vectors("spec", "both", "decode"))
def test_spec_history_limit_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    assert JobSpec.decode(stored(v)) == _spec(v["meaning"])


@pytest.mark.parametrize("v", vectors("spec", "refuse"))
def test_spec_with_a_bad_history_limit_is_corrupt(v: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecordError, match="spec"):
        JobSpec.decode(stored(v))


def _tenure(start: bytes, end: bytes | None = None) -> Tenure:
    return Tenure.decode(7, _kv(start), None if end is None else _kv(end, 9), None, None, 0)


@pytest.mark.parametrize("v", vectors("tenure", "both"))
def test_tenure_start_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    m = v["meaning"]
    assert encode_tenure_start(m["owner"], m["claimId"], m["claimedAt"]) == stored(v)


@pytest.mark.parametrize("v", vectors("tenure", "both", "decode"))
def test_tenure_start_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    t = _tenure(stored(v))
    assert (t.owner, t.claim_id, t.claimed_at) == (
        v["meaning"]["owner"], v["meaning"]["claimId"], v["meaning"]["claimedAt"])
    assert (t.token, t.generation, t.end) == (5, 7, TenureEnd.EXPIRED)


@pytest.mark.parametrize("v", vectors("tenure", "refuse"))
def test_a_bad_tenure_is_corrupt(v: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecordError, match="tenure"):
        _tenure(stored(v))


START = encode_tenure_start("w", "c1", 1.0)


@pytest.mark.parametrize("v", vectors("tenureEnd", "both"))
def test_tenure_end_encodes_and_decodes(v: dict[str, Any]) -> None:
    m = v["meaning"]
    assert encode_tenure_end(TenureEnd(m["how"]), m["at"]) == stored(v)
    t = _tenure(START, stored(v))
    assert (t.end.value, t.ended_at) == (m["how"], m["at"])


@pytest.mark.parametrize("v", vectors("tenureEnd", "refuse"))
def test_a_tenure_end_no_transaction_writes_is_corrupt(v: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecordError, match="tenure"):
        _tenure(START, stored(v))


@pytest.mark.parametrize("v", vectors("tenureMark", "both"))
def test_tenure_mark_encodes_and_its_version_is_the_count(v: dict[str, Any]) -> None:
    assert encode_tenure_mark(v["meaning"]["at"]) == stored(v)
    t = Tenure.decode(7, _kv(START), None, _kv(stored(v), version=3),
                      _kv(stored(v), version=2), 0)
    assert (t.checkpoints, t.refused_completions, t.last_refused_at) == (
        3, 2, v["meaning"]["at"])


@pytest.mark.parametrize("v", VECTORS["keys"])
def test_history_key_layout(v: dict[str, Any]) -> None:
    history = KeySpace(v["root"]).job(JobRef(v["namespace"], v["name"])).history
    g = v["generation"]
    assert history.prefix == v["history"].encode()
    assert [history.tenure(g), history.end(g), history.checkpoints(g), history.refused(g)] == [
        v[k].encode() for k in ("tenure", "end", "checkpoints", "refused")]
    assert history.parse(v["end"].encode()) == (g, "end")
    assert history.parse(v["tenure"].encode()) == (g, "")
    # a history key is no job's key: list and watch skip it
    assert KeySpace(v["root"]).parse(v["tenure"].encode()) is None


@pytest.mark.parametrize("v", VECTORS["itemKeys"])
def test_item_history_key_layout(v: dict[str, Any]) -> None:
    """A queue item's history: the job's layout, under its queue's ``history/<id>/``."""
    space = KeySpace(v["root"])
    queue = space.queue(QueueRef(v["namespace"], v["queue"]))
    history = queue.item(v["item"]).history
    g = v["generation"]
    assert history.prefix == v["history"].encode()
    assert history.prefix.startswith(queue.field_prefix("history"))
    assert [history.tenure(g), history.end(g), history.checkpoints(g), history.refused(g)] == [
        v[k].encode() for k in ("tenure", "end", "checkpoints", "refused")]
    assert history.parse(v["checkpoints"].encode()) == (g, "checkpoints")
    # under no field prefix the queue counts (items/, pending/, held/, ...)
    for field in ("items", "pending", "held", "claims", "results", "checkpoints", "failed"):
        assert not history.prefix.startswith(queue.field_prefix(field))
