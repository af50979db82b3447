"""The claim path's formatted records are byte for byte the generic encoding.

The holder value, the ``claims`` value, the slot record, the tenure start and the result
record are formatted
directly on the claim and completion path (joblease.records), instead of
building a dict and running ``json.dumps`` per record; the result's JSON,
already produced by validation, is spliced into its record instead of being
encoded again. The bytes are the protocol (compares match them exactly, the Go
sidecar writes the same: tests/vectors), so each format is checked against the
generic encoding for values that exercise JSON's escaping and number forms,
including the types that must take the generic path (bools, ints for floats,
non-finite floats).
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

import pytest

from joblease import validation
from joblease.keys import GENERATION_DIGITS, JobRef, KeySpace
from joblease.records import (
    Holder,
    ResultRecord,
    SlotRecord,
    _dumps,
    encode_claim,
    encode_holder_and_tenure,
    encode_tenure_start,
    new_claim_id,
)

OWNERS = ["bench-worker", "worker-7d9f-x2k4q", 'quote"back\\slash', "tab\tnew\nline\x01",
          "ünïcødé", "emoji \U0001f600", "", "a/b:c@d", "\u2028\u2029"]
TIMES: list[Any] = [1764700000.123456, 0.0, -0.0, 1e22, 1e-7, 5e-324, 1.7976931348623157e308,
                    1764700000, True, math.inf, -math.inf, math.nan]
RESULTS: list[Any] = [None, True, False, 0, -1, 2**70, 1.5, 1e100, "", "ünï\"\\\n",
                      "emoji \U0001f600", {"ok": True}, {"b": 1, "a": [1, 2, {"z": None, "y": 2}]},
                      [], {}, (1, 2), {"nested": {"deeper": [[[]]]}}]


def _generic_holder(owner: str, claim_id: str, ttl: Any, claimed_at: Any) -> bytes:
    return _dumps({"owner": owner, "claimId": claim_id, "ttl": ttl, "claimedAt": claimed_at})


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("claimed_at", TIMES, ids=repr)
def test_holder_value_is_the_generic_encoding(owner: str, claimed_at: Any) -> None:
    for ttl in (1, 30, 2**40, True):
        assert Holder.encode_value(owner, "ab" * 16, ttl, claimed_at) == \
            _generic_holder(owner, "ab" * 16, ttl, claimed_at)


def _generic_tenure(owner: str, claim_id: str, claimed_at: Any) -> bytes:
    return _dumps({"claimId": claim_id, "claimedAt": claimed_at, "owner": owner})


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("claimed_at", TIMES, ids=repr)
def test_tenure_start_is_the_generic_encoding(owner: str, claimed_at: Any) -> None:
    for claim_id in ("ab" * 16, 'q"\\u', 7):
        assert encode_tenure_start(owner, claim_id, claimed_at) == \
            _generic_tenure(owner, claim_id, claimed_at)  # type: ignore[arg-type]


@pytest.mark.parametrize("owner", OWNERS)
@pytest.mark.parametrize("claimed_at", TIMES, ids=repr)
def test_holder_and_tenure_formatted_together_are_each_the_generic_encoding(
        owner: str, claimed_at: Any) -> None:
    for ttl in (1, 30, 2**40, True):
        holder, tenure = encode_holder_and_tenure(owner, "ab" * 16, ttl, claimed_at)
        assert holder == _generic_holder(owner, "ab" * 16, ttl, claimed_at)
        assert tenure == _generic_tenure(owner, "ab" * 16, claimed_at)


@pytest.mark.parametrize("owner", OWNERS)
def test_claims_value_is_the_generic_encoding_in_its_key_order(owner: str) -> None:
    claim_id = new_claim_id()
    assert encode_claim(owner, claim_id) == json.dumps(
        {"owner": owner, "claimId": claim_id}, separators=(",", ":")).encode()
    assert json.loads(encode_claim(owner, claim_id)) == {"owner": owner, "claimId": claim_id}


@pytest.mark.parametrize("owner", OWNERS)
def test_slot_record_is_the_generic_encoding(owner: str) -> None:
    for holder in ("bench/job-7", "ns/queue/item-1", *OWNERS):
        record = SlotRecord(holder, owner, new_claim_id())
        assert record.encode() == _dumps(
            {"claimId": record.claim_id, "holder": holder, "owner": owner})
        assert SlotRecord.decode(record.encode()) == record


@pytest.mark.parametrize("result", RESULTS, ids=repr)
@pytest.mark.parametrize("owner", OWNERS[:4])
def test_result_record_with_its_result_spliced_in_is_the_generic_encoding(
        result: Any, owner: str) -> None:
    encoded = validation.json_payload(result, "result", validation.MAX_RESULT_BYTES)
    for completed_at in TIMES:
        for token, generation in ((15, 7), (2**62, 1), (True, False)):
            record = ResultRecord(owner=owner, claim_id="cd" * 16, token=token,
                                  generation=generation, result=result,
                                  completed_at=completed_at)
            assert record.encode(encoded) == record.encode()
    # and what a reader decodes from it is the record (the result as JSON has it)
    record = ResultRecord(owner, "cd" * 16, 15, 7, result, 1764700000.5)
    decoded = ResultRecord.decode(record.encode(encoded), 99)
    assert decoded.result == json.loads(encoded)
    assert (decoded.owner, decoded.claim_id, decoded.token, decoded.generation,
            decoded.completed_at, decoded.revision) == (owner, "cd" * 16, 15, 7, 1764700000.5, 99)


class _Str(str):
    pass


class _Int(int):
    pass


PAYLOADS: list[Any] = [*RESULTS, {2: "int keys", 1: "a"}, {2.5: "float keys", 1.5: "b"},
                       {None: "none key"}, {True: "bool keys", False: "c"},
                       {"z": _Int(3), _Str("a"): _Str("b")},
                       [1e16, -0.0, 5e-324, 2**64], "ünï\u2028\"", {"k": ("a", ["b"])}]
NOT_JSON: list[Any] = [math.nan, math.inf, [-math.inf], {"set": {1, 2}}, {1: "a", "b": 2},
                       object(), {(1, 2): "tuple key"}, b"bytes"]


@pytest.mark.parametrize("value", PAYLOADS, ids=repr)
def test_a_payload_is_encoded_as_json_dumps_encodes_it(value: Any) -> None:
    """validation.json_payload's encoder, made once (json's C encoder), writes the
    bytes json.dumps(sort_keys, compact, allow_nan=False) writes: results and
    checkpoints are spliced into records byte for byte (tests/vectors)."""
    expected = json.dumps(value, separators=(",", ":"), sort_keys=True,
                          allow_nan=False).encode()
    assert validation.json_payload(value, "result", validation.MAX_RESULT_BYTES) == expected


@pytest.mark.parametrize("value", NOT_JSON, ids=repr)
def test_a_payload_json_dumps_refuses_is_refused_as_not_json(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)):
        json.dumps(value, separators=(",", ":"), sort_keys=True, allow_nan=False)
    with pytest.raises(validation.InvalidInputError, match="not JSON"):
        validation.json_payload(value, "result", validation.MAX_RESULT_BYTES)


def test_a_payload_that_contains_itself_is_refused_before_it_is_encoded() -> None:
    value: dict[str, Any] = {}
    value["self"] = value
    with pytest.raises(validation.InvalidInputError, match="nested deeper"):
        validation.json_payload(value, "result", validation.MAX_RESULT_BYTES)


AS_DECODED: list[Any] = [*RESULTS, 1e16, -0.0, 5e-324, {"z": 1, "a": "x", "m": None},
                         {"b": 1.5, "a": True}, [True, None, "x", 2.5], ("a", 1),
                         {"k": (1, 2)}, {1: "int key"}, {True: "bool key"}, [{"a": 1}],
                         _Str("subclass"), {"k": _Str("v")}, [_Str("v")], {_Str("k"): 1}]


@pytest.mark.parametrize("value", AS_DECODED, ids=repr)
def test_a_completed_handles_result_is_what_a_reader_decodes(value: Any) -> None:
    """Lease.complete hands back the result as a reader decodes it without parsing
    plain values again (validation.as_decoded): equal, of the same types, and a
    dict in the key order json.loads gives; never the caller's own mutable object."""
    encoded = validation.json_payload(value, "result", validation.MAX_RESULT_BYTES)
    expected = json.loads(encoded)
    got = validation.as_decoded(value, encoded)
    assert got == expected
    assert json.dumps(got) == json.dumps(expected)  # key order, and list for tuple
    assert type(got) is type(expected)
    if isinstance(got, dict | list):
        assert got is not value
        assert [type(v) for v in (got.values() if isinstance(got, dict) else got)] == [
            type(v) for v in (expected.values() if isinstance(expected, dict) else expected)]
        assert [type(k) for k in got] == [type(k) for k in expected]


def test_claim_ids_are_random_version_4_uuids_as_the_go_sidecar_writes() -> None:
    ids = {new_claim_id() for _ in range(2000)}
    assert len(ids) == 2000
    for claim_id in ids:
        assert len(claim_id) == 32 and claim_id == claim_id.lower()
        parsed = uuid.UUID(hex=claim_id)
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
        assert parsed.hex == claim_id


def test_tenure_keys_are_the_zero_padded_generation() -> None:
    history = KeySpace("/r").job(JobRef("ns", "job")).history
    for generation in (0, 1, 9, 10, 123456, 10**12 - 1, 10**12, 10**15, -5):
        assert history.tenure(generation) == \
            b"/r/ns/_history/job/" + str(generation).zfill(GENERATION_DIGITS).encode()
        assert history.parse(history.tenure(generation)) == (
            (generation, "") if 0 <= generation < 10**GENERATION_DIGITS else None)
