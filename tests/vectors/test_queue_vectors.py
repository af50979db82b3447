"""The queue records and key layout, pinned by shared vectors
(tests/vectors/queue_records.json, queue_keys.json; format as records.json in
tests/vectors/README.md). The Go sidecar checks itself against the same files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from joblease.errors import CorruptRecordError
from joblease.keys import KeySpace, QueueRef
from joblease.records import FailedRecord, ItemRecord, PendingRecord, QueueSpec
from tests.support.vector_files import spelled_alike, stored

HERE = Path(__file__).resolve().parent
RECORDS: dict[str, list[dict[str, Any]]] = json.loads(
    (HERE / "queue_records.json").read_text())
KEYS: dict[str, list[dict[str, Any]]] = json.loads((HERE / "queue_keys.json").read_text())


def _queue(m: dict[str, Any]) -> QueueSpec:
    return QueueSpec(m["leaseDurationSeconds"], m["maxAttempts"], m["suspend"], m["shards"],
                     history_limit=m["historyLimit"])


def _item(m: dict[str, Any]) -> ItemRecord:
    return ItemRecord(m["payload"], m["enqueuedAt"])


def _pending(m: dict[str, Any]) -> PendingRecord:
    return PendingRecord(m["attemptsFrom"], m["since"])


def _failed(m: dict[str, Any]) -> FailedRecord:
    return FailedRecord(m["generation"], m["failedAt"])


BUILD: dict[str, Callable[[dict[str, Any]], Any]] = {
    "queue": _queue, "item": _item, "pending": _pending, "failed": _failed}
DECODE: dict[str, Callable[[bytes], Any]] = {
    "queue": QueueSpec.decode, "item": ItemRecord.decode, "pending": PendingRecord.decode,
    "failed": FailedRecord.decode}


def _params(*directions: str) -> list[Any]:
    return [pytest.param(r, v, id=f"{r}-{v['name']}") for r, vs in RECORDS.items()
            for v in vs if v["direction"] in directions]


def test_every_queue_record_has_vectors_of_every_kind() -> None:
    assert set(RECORDS) == set(BUILD)
    for record, vs in RECORDS.items():
        assert {v["direction"] for v in vs} >= {"both", "refuse"}, record


@pytest.mark.parametrize(("record", "v"), _params("both"))
def test_queue_records_encode_to_the_stored_bytes(record: str, v: dict[str, Any]) -> None:
    assert BUILD[record](v["meaning"]).encode() == stored(v)


@pytest.mark.parametrize(("record", "v"), _params("both", "decode"))
def test_queue_records_decode_to_their_meaning(record: str, v: dict[str, Any]) -> None:
    got = DECODE[record](stored(v))
    want = BUILD[record](v["meaning"])
    assert got == want
    if record == "item":
        assert spelled_alike(got.payload, v["meaning"]["payload"])


@pytest.mark.parametrize(("record", "v"), _params("refuse"))
def test_corrupt_queue_records_are_refused(record: str, v: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecordError) as caught:
        DECODE[record](stored(v))
    assert caught.value.record == record


@pytest.mark.parametrize("case", KEYS["layout"], ids=lambda c: c["root"])
def test_queue_key_layout(case: dict[str, Any]) -> None:
    queue = KeySpace(case["root"]).queue(QueueRef(case["namespace"], case["queue"]))
    assert queue.prefix == case["prefix"].encode()
    keys = queue.item(case["item"])
    assert {k: v.decode() for k, v in keys.fields().items()} == case["keys"]


def test_queue_keys_are_never_read_as_jobs() -> None:
    """The operator's job mirror parses every key under the root: a queue's
    keys must not look like a job's (``_queues`` is no Kubernetes name)."""
    for case in KEYS["layout"]:
        for key in case["keys"].values():
            assert KeySpace(case["root"]).parse(key.encode()) is None
