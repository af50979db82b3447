"""``status.checkpoint``: the last checkpoint with the claim that wrote it,
size-limited like the result, and every field declared in the CRD (no I/O)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import yaml

from joblease.keys import JobRef
from joblease.operator.status import status_from_state
from joblease.records import CheckpointRecord, Holder, JobSpec, JobState, ResultRecord

JOB = JobRef("ns", "job")
T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
CRD = Path(__file__).resolve().parents[2] / "crds" / "jobleases.joblease.io.yaml"


def _state(data: Any, *, completed: bool = False) -> JobState:
    checkpoint = CheckpointRecord(owner="worker-a", claim_id="c1", token=41, generation=2,
                                  data=data, checkpointed_at=T0.timestamp(), revision=45)
    holder = None if completed else Holder(owner="worker-b", claim_id="c2", token=50,
                                           generation=3, lease_id=7,
                                           claimed_at=T0.timestamp())
    result = (ResultRecord(owner="worker-b", claim_id="c2", token=50, generation=3,
                           result={"ok": True}, completed_at=T0.timestamp(), revision=60)
              if completed else None)
    return JobState(job=JOB, revision=70, spec=JobSpec(10, 5), spec_revision=3, holder=holder,
                    generation=3, last_claim_owner="worker-b", result=result,
                    mod_revision=60, checkpoint=checkpoint)


def test_status_carries_the_checkpoint_and_the_claim_that_wrote_it() -> None:
    status = status_from_state(_state({"offset": 42}), 1, None, T0)
    assert status["checkpoint"] == {
        "data": {"offset": 42}, "dataTruncated": False, "owner": "worker-a",
        "generation": 2, "fencingToken": 41, "etcdRevision": 45,
        "checkpointTime": "2025-01-01T12:00:00Z",
    }
    # the holder now is another claim: the status says whose checkpoint it is
    assert status["fencingToken"] == 50 and status["generation"] == 3


def test_checkpoint_in_status_is_size_limited_like_the_result() -> None:
    status = status_from_state(_state("x" * 10_000), 1, None, T0, result_limit=100)
    cp = status["checkpoint"]
    assert cp["dataTruncated"] is True
    assert set(cp["data"]) == {"preview"} and len(cp["data"]["preview"].encode()) <= 100
    small = status_from_state(_state(7), 1, None, T0)["checkpoint"]
    assert small["data"] == {"value": 7} and small["dataTruncated"] is False


def test_completed_job_keeps_its_last_checkpoint_and_none_means_absent() -> None:
    status = status_from_state(_state({"offset": 1}, completed=True), 1, None, T0)
    assert status["phase"] == "Completed" and status["checkpoint"]["data"] == {"offset": 1}
    bare = JobState(job=JOB, revision=5, spec=JobSpec(10, 5), spec_revision=3, holder=None,
                    generation=0, last_claim_owner=None, result=None)
    assert "checkpoint" not in status_from_state(bare, 1, None, T0)


def test_every_checkpoint_field_is_declared_in_the_crd() -> None:
    crd = yaml.safe_load(CRD.read_text())
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    declared = schema["properties"]["status"]["properties"]["checkpoint"]["properties"]
    status = status_from_state(_state({"offset": 42}), 1, None, T0)
    assert set(status["checkpoint"]) <= set(declared)
