"""The stored record formats, pinned by shared test vectors (tests/vectors/*.json).

Every implementation that reads or writes joblease's etcd keys (the Python
package, the Go sidecar in ``sidecar-go/``) checks itself against the same
files, so both sides write byte-identical values and refuse the same corrupt
ones. The format of the files is in tests/vectors/README.md. Here the Python
side is judged: ``records.py``/``keys.py``/``client.assemble`` on the vectors
themselves, and, against the session's real etcd, the bytes the client's own
register/claim/checkpoint/complete transactions store.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from joblease import JobLeaseClient, JobRef, JobSpec, validation
from joblease.client import assemble
from joblease.errors import CorruptRecordError, InvalidInputError
from joblease.keys import KeySpace
from joblease.records import CheckpointRecord, Holder, ResultRecord
from joblease.store import KeyValue
from tests.support.value_vectors import VALUES, value_text, values
from tests.support.vector_files import spelled_alike as _spelled_alike
from tests.support.vector_files import stored

HERE = Path(__file__).resolve().parent
RECORDS: dict[str, list[dict[str, Any]]] = json.loads((HERE / "records.json").read_text())
STATES: dict[str, Any] = json.loads((HERE / "job_state.json").read_text())
KEYS: dict[str, list[dict[str, Any]]] = json.loads((HERE / "keys.json").read_text())


def vectors(record: str, *directions: str) -> list[Any]:
    return [pytest.param(v, id=f"{record}-{v['name']}") for v in RECORDS[record]
            if v["direction"] in directions]


def _fields(**values: bytes) -> dict[str, KeyValue]:
    """Stored keys of one job with plausible metadata (the record tests need none)."""
    return {name: KeyValue(key=name.encode(), value=value, create_revision=3,
                           mod_revision=3, version=1, lease=0)
            for name, value in values.items()}


def _spec(m: dict[str, Any]) -> JobSpec:
    return JobSpec(m["leaseDurationSeconds"], m["maxAttempts"], m["parameters"])


def _result(m: dict[str, Any]) -> ResultRecord:
    return ResultRecord(owner=m["owner"], claim_id=m["claimId"], token=m["token"],
                        generation=m["generation"], result=m["result"],
                        completed_at=m["completedAt"])


def _checkpoint(m: dict[str, Any]) -> CheckpointRecord:
    return CheckpointRecord(owner=m["owner"], claim_id=m["claimId"], token=m["token"],
                            generation=m["generation"], data=m["data"],
                            checkpointed_at=m["checkpointedAt"])


def _without_revision(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if k != "revision"}


# -- every record: writers produce exactly these bytes --------------------------------------


@pytest.mark.parametrize("v", vectors("spec", "both"))
def test_spec_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    assert _spec(v["meaning"]).encode() == stored(v)


@pytest.mark.parametrize("v", vectors("holder", "both"))
def test_holder_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    m = v["meaning"]
    assert Holder.encode_value(m["owner"], m["claimId"], m["ttl"], m["claimedAt"]) == stored(v)


@pytest.mark.parametrize("v", vectors("result", "both"))
def test_result_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    assert _result(v["meaning"]).encode() == stored(v)


@pytest.mark.parametrize("v", vectors("checkpoint", "both"))
def test_checkpoint_encodes_to_the_stored_bytes(v: dict[str, Any]) -> None:
    assert _checkpoint(v["meaning"]).encode() == stored(v)


# -- every record: readers get exactly this meaning -----------------------------------------


@pytest.mark.parametrize("v", vectors("spec", "both", "decode"))
def test_spec_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    spec = JobSpec.decode(stored(v))
    assert spec == _spec(v["meaning"])
    assert _spelled_alike(spec.parameters, v["meaning"]["parameters"])


@pytest.mark.parametrize("v", vectors("holder", "both", "decode"))
def test_holder_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    m = v["meaning"]
    state = assemble(JobRef("ns", "j"), _fields(holder=stored(v)), 9)
    assert state.corrupt is None and state.holder is not None
    h = state.holder
    assert (h.owner, h.claim_id, h.claimed_at) == (m["owner"], m["claimId"], m["claimedAt"])
    assert isinstance(h.claimed_at, float)
    # the TTL is read from the holder when another process adopts the claim
    assert int(Holder.decode_value(stored(v)).get("ttl", 0)) == m["ttl"]


@pytest.mark.parametrize("v", vectors("claims", "both", "decode"))
def test_claims_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    m = v["meaning"]
    state = assemble(JobRef("ns", "j"), _fields(claims=stored(v)), 9)
    assert state.corrupt is None
    assert state.last_claim_owner == m["owner"]
    # the claim read-back's view: whose claim this is (None: not one we wrote)
    kv = _fields(claims=stored(v))["claims"]
    assert JobLeaseClient._claim_id_of(kv) == m["claimId"]


@pytest.mark.parametrize("v", vectors("result", "both", "decode"))
def test_result_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    record = ResultRecord.decode(stored(v), revision=42)
    assert record.revision == 42
    got = _without_revision(record.to_dict())
    assert got == v["meaning"] and _spelled_alike(got, v["meaning"])


@pytest.mark.parametrize("v", vectors("checkpoint", "both", "decode"))
def test_checkpoint_decodes_to_its_meaning(v: dict[str, Any]) -> None:
    record = CheckpointRecord.decode(stored(v), revision=42)
    got = _without_revision(record.to_dict())
    assert got == v["meaning"] and _spelled_alike(got, v["meaning"])


# -- corrupt values are refused, naming the record -------------------------------------------

_DECODERS = {
    "spec": JobSpec.decode,
    "holder": Holder.decode_value,
    "result": ResultRecord.decode,
    "checkpoint": CheckpointRecord.decode,
}


@pytest.mark.parametrize(("record", "v"), [
    pytest.param(r, v, id=f"{r}-{v['name']}") for r, vs in RECORDS.items() for v in vs
    if v["direction"] == "refuse"])
def test_corrupt_values_are_refused(record: str, v: dict[str, Any]) -> None:
    if record in _DECODERS:
        with pytest.raises(CorruptRecordError) as caught:
            _DECODERS[record](stored(v))
        assert caught.value.record == record
    # and a reader of the whole job (list, watch, the sidecar's claim) sees that
    # one record named, the job Corrupt, and nothing raised
    state = assemble(JobRef("ns", "j"), _fields(**{record: stored(v)}), 9)
    assert state.phase.value == "Corrupt"
    assert _corrupt_records(state.corrupt) == [record]


def _corrupt_records(text: str | None) -> list[str]:
    return re.findall(r"stored (\w+) record cannot be decoded", text or "")


def test_every_record_has_vectors_of_every_kind() -> None:
    """Guards the files themselves: a record without refusals (or without
    canonical bytes) would silently stop constraining an implementation."""
    for record, vs in RECORDS.items():
        kinds = {v["direction"] for v in vs}
        assert kinds >= {"both", "refuse"}, (record, kinds)
        names = [v["name"] for v in vs]
        assert len(names) == len(set(names)), record
        for v in vs:
            assert v["direction"] in ("both", "decode", "refuse"), v
            assert ("meaning" in v) == (v["direction"] != "refuse"), v
            assert ("stored" in v) != ("stored_base64" in v), v


# -- a job assembled from its keys ------------------------------------------------------------


@pytest.mark.parametrize("case", [pytest.param(c, id=c["name"]) for c in STATES["states"]])
def test_job_state_is_assembled_from_the_stored_keys(case: dict[str, Any]) -> None:
    job = JobRef(STATES["job"]["namespace"], STATES["job"]["name"])
    prefix = KeySpace().job(job).prefix
    fields = {
        name: KeyValue(key=prefix + name.encode(), value=k["value"].encode(),
                       create_revision=k["createRevision"], mod_revision=k["modRevision"],
                       version=k["version"], lease=k["lease"])
        for name, k in case["keys"].items()}
    state = assemble(job, fields, 100)
    want = case["state"]
    got = state.to_dict()
    assert got["phase"] == want["phase"]
    assert got["registered"] == want["registered"]
    assert got["token"] == want["token"]
    assert got["generation"] == want["generation"]
    assert state.last_claim_owner == want["lastClaimOwner"]
    assert got["leaseDurationSeconds"] == want["leaseDurationSeconds"]
    assert got["maxAttempts"] == want["maxAttempts"]
    assert got["holder"] == want["holder"]
    assert got["result"] == want["result"]
    assert got["checkpoint"] == want["checkpoint"]
    assert _corrupt_records(state.corrupt) == want["corrupt"]
    assert (state.corrupt is None) == (not want["corrupt"])


# -- keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", KEYS["layout"], ids=lambda c: c["root"])
def test_key_layout(case: dict[str, Any]) -> None:
    keys = KeySpace(case["root"]).job(JobRef(case["namespace"], case["name"]))
    assert keys.prefix == case["prefix"].encode()
    for name, key in case["keys"].items():
        assert getattr(keys, name) == key.encode()


@pytest.mark.parametrize("case", KEYS["parse"], ids=lambda c: c["key"])
def test_keys_parse_back_to_jobs(case: dict[str, Any]) -> None:
    parsed = KeySpace(case["root"]).parse(case["key"].encode())
    if case["job"] is None:
        assert parsed is None
    else:
        assert parsed == (JobRef(case["job"]["namespace"], case["job"]["name"]), case["field"])


# -- what the client really stores, through real etcd ---------------------------------------


def _one(record: str, name: str) -> dict[str, Any]:
    return next(v for v in RECORDS[record] if v["name"] == name)


async def _raw(client: JobLeaseClient, key: bytes) -> bytes:
    _, kvs = await client.store.get(key)
    assert kvs, key
    return kvs[0].value


async def test_the_client_stores_the_vectors_bytes(client: JobLeaseClient) -> None:
    """register, claim, checkpoint and complete through the real client and etcd:
    the stored values are the vectors' bytes, with only the fields no vector can
    know (claim id, wall-clock times, token, generation) substituted."""
    job = JobRef("default", "vectors")
    keys = client.keys.job(job)
    spec_v, claims_v = _one("spec", "basic"), _one("claims", "basic")
    holder_v, cp_v, result_v = (_one("holder", "basic"), _one("checkpoint", "basic"),
                                _one("result", "rich-result"))
    await client.register(job, _spec(spec_v["meaning"]))
    assert await _raw(client, keys.spec) == stored(spec_v)

    owner = holder_v["meaning"]["owner"]
    lease = await client.claim(job, owner)
    holder = json.loads(await _raw(client, keys.holder))
    assert await _raw(client, keys.holder) == Holder.encode_value(
        owner, holder["claimId"], spec_v["meaning"]["leaseDurationSeconds"],
        holder["claimedAt"])
    assert set(holder) == set(holder_v["meaning"])
    want_claims = stored(claims_v).replace(claims_v["meaning"]["claimId"].encode(),
                                           holder["claimId"].encode())
    assert await _raw(client, keys.claims) == want_claims

    def substituted(v: dict[str, Any], raw: bytes, at: str) -> bytes:
        got = json.loads(raw)
        m = v["meaning"]
        text = stored(v).decode()
        for field, value in (("claimId", holder["claimId"]), ("token", lease.token),
                             ("generation", lease.generation), (at, got[at])):
            text = text.replace(f'"{field}":{json.dumps(m[field])}',
                                f'"{field}":{json.dumps(value)}')
        return text.encode()

    await lease.checkpoint(cp_v["meaning"]["data"])
    raw = await _raw(client, keys.checkpoint)
    assert raw == substituted(cp_v, raw, "checkpointedAt")

    await lease.complete(result_v["meaning"]["result"])
    raw = await _raw(client, keys.result)
    assert raw == substituted(result_v, raw, "completedAt")


# -- what a result or checkpoint may be (values.json; docs/protocol.md#stored-values) --------

def _values(*verdicts: str) -> list[Any]:
    return [pytest.param(v, id=v["name"]) for v in values(*verdicts)]


def _record_around(record: str, text: bytes) -> bytes:
    """A stored result or checkpoint record holding the value ``text`` as is."""
    field, at = ("result", "completedAt") if record == "result" else ("data", "checkpointedAt")
    return (b'{"claimId":"c1","%s":1.5,"generation":2,"owner":"w","%s":' % (at.encode(),
                                                                           field.encode())
            + text + b',"token":7}')


def test_the_values_limits_are_the_protocols() -> None:
    assert VALUES["limits"] == {"maxDepth": validation.MAX_JSON_DEPTH,
                                "maxBytes": validation.MAX_RESULT_BYTES}
    assert validation.MAX_CHECKPOINT_BYTES == validation.MAX_RESULT_BYTES
    names = [v["name"] for v in VALUES["values"]]
    assert len(names) == len(set(names))
    assert {v["verdict"] for v in VALUES["values"]} == {"accept", "refuse"}


@pytest.mark.parametrize("v", _values("accept"))
def test_writers_accept_a_value_within_the_rule(v: dict[str, Any]) -> None:
    value = validation.json_text(value_text(v), "result", validation.MAX_RESULT_BYTES)
    # the library's writers (complete, checkpoint) check the decoded value the same way
    data = validation.json_payload(value, "checkpoint", validation.MAX_CHECKPOINT_BYTES)
    assert json.loads(data) == value


@pytest.mark.parametrize("v", _values("refuse"))
def test_writers_refuse_a_value_outside_the_rule(v: dict[str, Any]) -> None:
    with pytest.raises(InvalidInputError):
        validation.json_text(value_text(v), "result", validation.MAX_RESULT_BYTES)
    try:  # the decoded object, as a caller of lease.complete() would pass it
        value = json.loads(value_text(v))
    except (ValueError, RecursionError):
        return  # not JSON, or too deep for Python to build: the text check is the writer
    with pytest.raises(InvalidInputError):
        validation.json_payload(value, "result", validation.MAX_RESULT_BYTES)


@pytest.mark.parametrize("record", ["result", "checkpoint"])
@pytest.mark.parametrize("v", _values("accept"))
def test_readers_read_a_stored_value_within_the_rule(v: dict[str, Any], record: str) -> None:
    stored_bytes = _record_around(record, value_text(v))
    state = assemble(JobRef("ns", "j"), _fields(**{record: stored_bytes}), 9)
    assert state.corrupt is None
    got = state.result.result if record == "result" else state.checkpoint.data  # type: ignore[union-attr]
    assert _spelled_alike(got, json.loads(value_text(v)))
    json.dumps(state.to_dict(), ensure_ascii=False).encode("utf-8")  # answerable as UTF-8


@pytest.mark.parametrize("record", ["result", "checkpoint"])
@pytest.mark.parametrize("v", _values("refuse"))
def test_readers_report_a_stored_value_outside_the_rule_as_corrupt(
        v: dict[str, Any], record: str) -> None:
    """A value no writer may store (written past them, e.g. with etcdctl) makes
    that one record Corrupt with its reason, and the job's state is still
    answerable as UTF-8 JSON: no RecursionError, no UnicodeEncodeError."""
    stored_bytes = _record_around(record, value_text(v))
    with pytest.raises(CorruptRecordError) as caught:
        _DECODERS[record](stored_bytes)
    assert caught.value.record == record
    state = assemble(JobRef("ns", "j"), _fields(**{record: stored_bytes}), 9)
    assert state.phase.value == "Corrupt"
    assert _corrupt_records(state.corrupt) == [record]
    json.dumps(state.to_dict(), ensure_ascii=False).encode("utf-8")
