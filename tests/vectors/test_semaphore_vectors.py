"""The semaphore records, the ``semaphores`` field of job and queue specs and
the semaphore key layout, pinned by shared vectors
(tests/vectors/semaphore_records.json, semaphore_keys.json; format as
records.json in tests/vectors/README.md). The Go sidecar checks itself against
the same files."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from joblease.errors import CorruptRecordError
from joblease.keys import KeySpace, SemaphoreRef
from joblease.records import (
    JobSpec,
    QueueSpec,
    SemaphoreSpec,
    SemaphoreUse,
    SlotRecord,
    WaiterRecord,
)
from tests.support.vector_files import stored

HERE = Path(__file__).resolve().parent
RECORDS: dict[str, list[dict[str, Any]]] = json.loads(
    (HERE / "semaphore_records.json").read_text())
KEYS: dict[str, list[dict[str, Any]]] = json.loads((HERE / "semaphore_keys.json").read_text())


def _uses(m: dict[str, Any]) -> tuple[SemaphoreUse, ...]:
    return tuple(SemaphoreUse(u["name"], u["weight"]) for u in m["semaphores"])


def _spec(m: dict[str, Any]) -> JobSpec:
    return JobSpec(m["leaseDurationSeconds"], m["maxAttempts"], m["parameters"], _uses(m))


def _queue(m: dict[str, Any]) -> QueueSpec:
    return QueueSpec(m["leaseDurationSeconds"], m["maxAttempts"], m["suspend"], m["shards"],
                     _uses(m))


BUILD: dict[str, Callable[[dict[str, Any]], Any]] = {
    "semaphore": lambda m: SemaphoreSpec(m["limit"]),
    "slot": lambda m: SlotRecord(m["holder"], m["owner"], m["claimId"]),
    "waiter": lambda m: WaiterRecord(m["holder"], m["owner"], m["weight"]),
    "spec": _spec,
    "queue": _queue,
}
DECODE: dict[str, Callable[[bytes], Any]] = {
    "semaphore": SemaphoreSpec.decode, "slot": SlotRecord.decode, "waiter": WaiterRecord.decode,
    "spec": JobSpec.decode, "queue": QueueSpec.decode}


def _params(*directions: str) -> list[Any]:
    return [pytest.param(r, v, id=f"{r}-{v['name']}") for r, vs in RECORDS.items()
            for v in vs if v["direction"] in directions]


def test_every_semaphore_record_has_vectors_of_every_kind() -> None:
    assert set(RECORDS) == set(BUILD)
    for record, vs in RECORDS.items():
        assert {v["direction"] for v in vs} >= {"both", "refuse"}, record


@pytest.mark.parametrize(("record", "v"), _params("both"))
def test_semaphore_records_encode_to_the_stored_bytes(record: str, v: dict[str, Any]) -> None:
    assert BUILD[record](v["meaning"]).encode() == stored(v)


@pytest.mark.parametrize(("record", "v"), _params("both", "decode"))
def test_semaphore_records_decode_to_their_meaning(record: str, v: dict[str, Any]) -> None:
    assert DECODE[record](stored(v)) == BUILD[record](v["meaning"])


@pytest.mark.parametrize(("record", "v"), _params("refuse"))
def test_corrupt_semaphore_records_are_refused(record: str, v: dict[str, Any]) -> None:
    with pytest.raises(CorruptRecordError) as caught:
        DECODE[record](stored(v))
    assert caught.value.record == record


@pytest.mark.parametrize("case", KEYS["layout"], ids=lambda c: c["root"])
def test_semaphore_key_layout(case: dict[str, Any]) -> None:
    keys = KeySpace(case["root"]).semaphore(SemaphoreRef(case["namespace"], case["semaphore"]))
    assert keys.prefix == case["prefix"].encode()
    assert (keys.spec, keys.slots, keys.waiters) == tuple(
        case[k].encode() for k in ("spec", "slots", "waiters"))
    for index, key in case["slot"].items():
        assert keys.slot(int(index)) == key.encode()
        assert keys.slot_index(key.encode()) == int(index)
    assert keys.waiter(case["ticket"]) == case["waiter"].encode()


def test_semaphore_keys_are_never_read_as_jobs() -> None:
    """The operator's job mirror parses every key under the root: a semaphore's
    keys must not look like a job's (``_semaphores`` is no Kubernetes name)."""
    for case in KEYS["layout"]:
        for key in (case["spec"], case["waiter"], *case["slot"].values()):
            assert KeySpace(case["root"]).parse(key.encode()) is None
