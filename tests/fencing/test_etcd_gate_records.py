"""The etcd gate's stored values are input: a bad one is a CorruptRecordError, not a crash.

Anyone with write access to the gate's root (a second destination with a wrong
root, a bad restore, a tenant's typo) can leave a value there that the gate
did not write. The gate must then refuse with the project's error for that
record, name it, and write nothing (not the mark, not the effect). Real etcd.
"""

from __future__ import annotations

import pytest

from joblease import EtcdConfig, JobLeaseClient
from joblease.errors import CorruptRecordError
from joblease.fencing import EtcdGate
from joblease.fencing.etcd_gate import FenceRecord, decode_mark
from joblease.fencing.gate import Effect
from joblease.store import Put

BAD_RECORDS = [b"", b"not json", b"[]", b'{"token": 5}', b'{"resource": "r", "token": "5"}',
               b'{"resource": "r", "token": 0}', b'{"resource": 1, "token": 5}',
               b'{"resource": "r", "token": 5, "nonce": 7}', b'{"resource": "r", "token": true}']
BAD_MARKS = [b"", b"-1", b"0", b"1e3", b" 7", b"seven", b"\xff", b"99999999999999999999"]


def test_a_record_round_trips_byte_for_byte() -> None:
    record = FenceRecord("ledger/a", 1234, '{"status":200}', "n1")
    assert record.encode() == (b'{"resource":"ledger/a","token":1234,'
                               b'"response":"{\\"status\\":200}","nonce":"n1"}')
    assert FenceRecord.decode(record.encode()) == record
    assert decode_mark(b"1234") == 1234


@pytest.mark.parametrize("value", BAD_RECORDS)
def test_a_bad_record_is_refused_by_name(value: bytes) -> None:
    with pytest.raises(CorruptRecordError) as err:
        FenceRecord.decode(value)
    assert err.value.record == "fence"


@pytest.mark.parametrize("value", BAD_MARKS)
def test_a_bad_mark_is_refused_by_name(value: bytes) -> None:
    with pytest.raises(CorruptRecordError) as err:
        decode_mark(value)
    assert err.value.record == "fence mark"


async def _snapshot(client: JobLeaseClient, prefix: str) -> dict[bytes, tuple[bytes, int]]:
    _, kvs = await client.store.get(prefix.encode(), prefix=True)
    return {kv.key: (kv.value, kv.mod_revision) for kv in kvs}


@pytest.mark.parametrize("where", ["mark", "record"])
async def test_admit_over_a_corrupt_value_writes_nothing(
        client: JobLeaseClient, etcd_config: EtcdConfig, where: str) -> None:
    root = f"{etcd_config.root}/fence"
    gate = EtcdGate(client.store, root=root, timeout=5)
    effect = Effect("ledger/a", 10, "a#g1.t10")
    bad = gate.mark_key("ledger/a") if where == "mark" else gate.record_key("a#g1.t10")
    await client.store.txn([], [Put(bad, b"garbage")])
    before = await _snapshot(client, root)
    effect_key = f"{etcd_config.root}/effects/a".encode()

    with pytest.raises(CorruptRecordError):
        await gate.admit(effect, puts=[Put(effect_key, b"applied")])

    assert await _snapshot(client, root) == before
    _, effects = await client.store.get(effect_key)
    assert effects == []
