"""CronJob slots (joblease.operator.cron_slots.plan_job): the Job → the item its pods claim.
Pure functions of dicts; the patch applied with a real RFC 6902 implementation."""

from __future__ import annotations

from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest

from joblease.operator.cron_slots import (
    SCHEDULED_ANNOTATION,
    UnknownCronJob,
    cronjob_owner,
    plan_job,
    slot_id,
)
from joblease.operator.injection import InjectionRefused, SidecarSettings, plan
from joblease.operator.webhook import job_review_response

OWNER = {"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly", "uid": "u1",
         "controller": True}


def _job(*, scheduled: str | None = None, owned: bool = True, indexed: bool = False,
         notes: dict[str, str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": "nightly-29000000"}
    if scheduled is not None:
        meta["annotations"] = {SCHEDULED_ANNOTATION: scheduled}
    if owned:
        meta["ownerReferences"] = [OWNER]
    spec: dict[str, Any] = {"template": {
        "metadata": {"annotations": {"joblease.io/queue": "nightly", **(notes or {})}},
        "spec": {"restartPolicy": "Never", "securityContext": {"runAsUser": 65532},
                 "containers": [{"name": "worker", "image": "busybox"}]}}}
    if indexed:
        spec["completionMode"] = "Indexed"
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": meta, "spec": spec}


def _planned(job: dict[str, Any], **kw: Any) -> tuple[dict[str, str], list[str]]:
    result = plan_job(job, **kw)
    patched = jsonpatch.apply_patch(job, result.patch)
    notes: dict[str, str] = patched["spec"]["template"]["metadata"]["annotations"]
    return notes, result.warnings


def test_a_cronjob_run_claims_its_slot_and_creates_it() -> None:
    notes, warnings = _planned(_job(scheduled="2026-12-01T23:05:00Z"))
    assert notes["joblease.io/item"] == "2026-12-01T23:05:00Z"
    assert notes["joblease.io/item-create"] == "true"
    assert warnings == []
    assert cronjob_owner(_job(scheduled="2026-12-01T23:05:00Z")) is None  # no lookup needed


def test_the_pod_of_a_slotted_job_is_injected_with_that_item() -> None:
    job = jsonpatch.apply_patch(_job(scheduled="2026-12-01T23:05:00Z"),
                                plan_job(_job(scheduled="2026-12-01T23:05:00Z")).patch)
    template = job["spec"]["template"]
    pod = {"metadata": template["metadata"], "spec": template["spec"]}
    injected = jsonpatch.apply_patch(pod, plan(pod, SidecarSettings(), namespace="a").patch)
    env = {e["name"]: e.get("value") for e in injected["spec"]["initContainers"][0]["env"]}
    assert env["JOBLEASE_ITEM"] == "2026-12-01T23:05:00Z"
    assert env["JOBLEASE_ITEM_CREATE"] == "true"


def test_a_slot_in_another_time_zone_is_the_same_utc_id() -> None:
    assert slot_id("2026-12-02T00:05:00+01:00") == "2026-12-01T23:05:00Z"
    assert slot_id("2026-12-01T23:05:00Z") == "2026-12-01T23:05:00Z"
    notes, _ = _planned(_job(scheduled="2026-12-01T18:05:00-05:00"))
    assert notes["joblease.io/item"] == "2026-12-01T23:05:00Z"
    for bad in ("yesterday", "2026-12-01T23:05:00"):
        with pytest.raises(InjectionRefused, match=SCHEDULED_ANNOTATION):
            slot_id(bad)


def test_a_job_made_by_hand_from_a_cronjob_runs_its_last_slot_with_a_warning() -> None:
    job = _job()
    assert cronjob_owner(job) == "nightly"
    notes, warnings = _planned(job, last_schedule="2026-12-01T23:04:00Z")
    assert notes["joblease.io/item"] == "2026-12-01T23:04:00Z"
    (warning,) = warnings
    assert warning.startswith("Job nightly-29000000 was created from CronJob nightly by "
                              "hand: it runs the CronJob's last slot 2026-12-01T23:04:00Z")
    assert "succeeds without working" in warning


def test_a_job_made_by_hand_is_refused_when_the_slot_is_unknown() -> None:
    with pytest.raises(InjectionRefused, match="the CronJob has no slot to take"):
        plan_job(_job(), last_schedule=None)
    with pytest.raises(InjectionRefused, match=r"cannot be read \(TimeoutError\)"):
        plan_job(_job(), last_schedule=UnknownCronJob("TimeoutError"))
    answer = job_review_response({"request": {"uid": "u", "object": _job()}}, None)["response"]
    assert answer["allowed"] is False and "joblease.io/item" in answer["status"]["message"]


@pytest.mark.parametrize("job", [
    _job(owned=False),                                    # a plain Job: drains
    _job(owned=False, indexed=True),                      # an Indexed Job: its indexes
    _job(scheduled="2026-12-01T23:05:00Z", notes={"joblease.io/item": "fixed"}),  # chosen
    _job(scheduled="2026-12-01T23:05:00Z", notes={"joblease.io/exit-when-empty": "true"}),
])
def test_jobs_that_are_not_slots_are_left_alone(job: dict[str, Any]) -> None:
    assert plan_job(job).patch == [] and plan_job(job).warnings == []
    assert cronjob_owner(job) is None


def test_a_job_without_a_queue_is_not_touched() -> None:
    job = _job(scheduled="2026-12-01T23:05:00Z")
    job["spec"]["template"]["metadata"]["annotations"] = {"joblease.io/job": "nightly"}
    assert plan_job(job).patch == [] and cronjob_owner(job) is None


@pytest.mark.parametrize(("job", "says"), [
    (_job(scheduled="2026-12-01T23:05:00Z", indexed=True),
     "an Indexed Job created by CronJob nightly"),
    (_job(owned=False, indexed=True, notes={"joblease.io/item": "a"}),
     "annotation joblease.io/item in the template of an Indexed Job"),
    (_job(scheduled="2026-12-01T23:05:00Z", notes={"joblease.io/on-loss": "kill"}),
     "invalid annotation joblease.io/on-loss"),
    (_job(scheduled="2026-12-01T23:05:00Z", notes={"joblease.io/job": "x"}),
     "annotations joblease.io/job and joblease.io/queue both set"),
])
def test_bad_templates_are_refused_at_the_job_saying_why(job: dict[str, Any],
                                                         says: str) -> None:
    with pytest.raises(InjectionRefused, match=says):
        plan_job(job)
