"""Status and Events of a job with an undecodable record, and of one etcd does not know
(pure functions, no I/O; the real operator is in tests/kube/test_operator_corrupt.py)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from typing import Any

from joblease.client import assemble
from joblease.keys import JobRef
from joblease.operator.events import derive_events
from joblease.operator.status import status_from_state
from joblease.records import Holder, JobSpec, JobState, Phase
from joblease.store import KeyValue

JOB = JobRef("ns", "job")
T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)


def kv(field: str, value: bytes, revision: int, version: int = 1) -> KeyValue:
    return KeyValue(key=f"/r/ns/job/{field}".encode(), value=value, create_revision=revision,
                    mod_revision=revision, version=version, lease=0)


SPEC_KV = kv("spec", JobSpec(10, max_attempts=2).encode(), 3)


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_job_etcd_does_not_know_is_not_registered_and_not_claimable() -> None:
    state = assemble(JOB, {}, 50)
    s = status_from_state(state, 0, None, T0)
    assert s["phase"] == "NotRegistered"
    c = conditions(s)
    assert (c["Registered"]["status"], c["Registered"]["reason"]) == ("False", "NotRegistered")
    assert (c["Claimed"]["status"], c["Claimed"]["reason"]) == ("False", "NotRegistered")
    assert "claimable" not in c["Claimed"]["message"].replace("not claimable", "")
    assert c["Failed"]["status"] == "False" and c["Corrupt"]["status"] == "False"


def test_an_undecodable_result_makes_the_status_corrupt_and_says_why() -> None:
    state = assemble(JOB, {"spec": SPEC_KV, "result": kv("result", b"{not json", 9)}, 9)
    assert state.phase is Phase.CORRUPT
    s = status_from_state(state, 1, None, T0)
    assert s["phase"] == "Corrupt" and s["etcdRevision"] == 9
    c = conditions(s)
    assert c["Corrupt"]["status"] == "True" and c["Corrupt"]["reason"] == "UndecodableRecord"
    assert "result" in c["Corrupt"]["message"]
    assert c["Registered"]["status"] == "True"
    assert {c[t]["status"] for t in ("Claimed", "Completed", "Failed")} == {"Unknown"}


def test_an_undecodable_spec_is_a_registration_of_unknown_content() -> None:
    state = assemble(JOB, {"spec": kv("spec", b"[1, 2]", 3)}, 4)
    s = status_from_state(state, 0, {"observedGeneration": 2}, T0)
    c = conditions(s)
    assert s["phase"] == "Corrupt"
    assert (c["Registered"]["status"], c["Registered"]["reason"]) == ("Unknown", "Corrupt")
    assert "spec" in c["Corrupt"]["message"] and s["observedGeneration"] == 2


def test_unknown_conditions_keep_their_transition_time_while_unknown() -> None:
    bad = assemble(JOB, {"spec": SPEC_KV, "result": kv("result", b"7", 9)}, 9)
    first = status_from_state(bad, 1, None, T0)
    later = status_from_state(dataclasses.replace(bad, revision=12), 1, first,
                              T0 + dt.timedelta(minutes=5))
    assert conditions(later)["Claimed"]["lastTransitionTime"] == "2025-01-01T12:00:00Z"
    fixed = assemble(JOB, {"spec": SPEC_KV}, 13)
    healed = status_from_state(fixed, 1, later, T0 + dt.timedelta(minutes=9))
    assert healed["phase"] == "Pending"
    assert conditions(healed)["Corrupt"]["status"] == "False"
    assert conditions(healed)["Corrupt"]["lastTransitionTime"] == "2025-01-01T12:09:00Z"


def test_a_corrupt_message_longer_than_the_condition_limit_is_cut() -> None:
    state = assemble(JOB, {"spec": SPEC_KV}, 5)
    state = dataclasses.replace(state, corrupt="x" * 40_000)
    assert len(conditions(status_from_state(state, 1, None, T0))["Corrupt"]["message"]) <= 32768


def held(revision: int) -> JobState:
    holder_kv = kv("holder", Holder.encode_value("a", "c1", 10, 0.0), 7)
    return assemble(JOB, {"spec": SPEC_KV, "holder": holder_kv,
                          "claims": kv("claims", b'{"owner":"a"}', 7)}, revision)


def reasons(before: JobState | None, after: JobState) -> list[str]:
    return [e.reason for e in derive_events(before, after)]


def test_corruption_posts_one_warning_and_no_invented_lifecycle_events() -> None:
    ok = held(7)
    bad_holder = assemble(JOB, {"spec": SPEC_KV, "holder": kv("holder", b'{"owner": 1}', 7),
                                "claims": kv("claims", b'{"owner":"a"}', 7)}, 8)
    assert bad_holder.phase is Phase.CORRUPT and bad_holder.holder is None
    events = derive_events(ok, bad_holder)
    assert [(e.type, e.reason) for e in events] == [("Warning", "Corrupt")]  # not "Expired"
    assert "holder" in events[0].message
    assert reasons(bad_holder, dataclasses.replace(bad_holder, revision=9)) == []  # same problem
    assert reasons(None, bad_holder) == ["Corrupt"]  # first sight after a restart: reported
    assert reasons(bad_holder, held(10)) == []  # the repair is not a new claim
    assert reasons(held(10), held(11)) == []


def _record(field: str, value: bytes) -> bytes:
    at = "completedAt" if field == "result" else "checkpointedAt"
    return (b'{"claimId":"c1","%s":1.5,"generation":1,"owner":"w","%s":' % (at.encode(),
                                                                           field.encode())
            + value + b',"token":7}')


def test_a_stored_value_outside_the_rule_makes_the_status_corrupt_and_stays_utf8() -> None:
    """docs/protocol.md#stored-values: a lone surrogate (issue 24, item 7) or a
    3000-deep value (item 8) stored in a result or checkpoint is a corrupt
    record with its reason: the status says so, carries no such value, and is
    sendable to the API server as UTF-8 JSON; an Event says why."""
    cases = [
        ("result", kv("result", _record("result", b'{"note":"\\ud800"}'), 9),
         "lone UTF-16 surrogate"),
        ("checkpoint", kv("checkpoint", _record("data", b'["\\udc00"]'), 9),
         "lone UTF-16 surrogate"),
        ("result", kv("result", _record("result", b"[" * 3000 + b"]" * 3000), 9),
         "nested deeper than 64 levels"),
    ]
    for field, bad, why in cases:
        state = assemble(JOB, {"spec": SPEC_KV, field: bad}, 9)
        s = status_from_state(state, 1, None, T0)
        assert s["phase"] == "Corrupt"
        message = conditions(s)["Corrupt"]["message"]
        assert field in message and why in message
        assert "result" not in s and "checkpoint" not in s
        json.dumps(s, ensure_ascii=False).encode("utf-8")
        events = derive_events(None, state)
        assert [e.reason for e in events] == ["Corrupt"] and why in events[0].message
