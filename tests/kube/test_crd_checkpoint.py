"""The status the operator builds for a checkpointed job survives the real API
server's schema (nothing pruned, nothing refused)."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from joblease.keys import JobRef
from joblease.operator.status import status_from_state
from joblease.records import CheckpointRecord, Holder, JobSpec, JobState
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def test_status_checkpoint_is_kept_by_the_api_server(crds_installed: ControlPlane,
                                                     namespace: str) -> None:
    cp = crds_installed
    cp.kubectl("apply", "-n", namespace, "-f", "-", check=True, input=json.dumps({
        "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
        "metadata": {"name": "ckpt"}, "spec": {"leaseDurationSeconds": 5}}))
    now = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    state = JobState(
        job=JobRef(namespace, "ckpt"), revision=30, spec=JobSpec(5, 3), spec_revision=3,
        holder=Holder("w2", "c2", 25, 2, 7, now.timestamp()), generation=2,
        last_claim_owner="w2", result=None,
        checkpoint=CheckpointRecord("w1", "c1", 20, 1, {"offset": [1, {"x": "y"}]},
                                    now.timestamp(), 22))
    status = status_from_state(state, 1, None, now)
    cp.kubectl("patch", "jl", "ckpt", "-n", namespace, "--subresource=status",
               "--type=merge", "-p", json.dumps({"status": status}), check=True)
    got = json.loads(cp.kubectl("get", "jl", "ckpt", "-n", namespace, "-o", "json",
                                check=True).stdout)
    assert got["status"]["checkpoint"] == status["checkpoint"]
