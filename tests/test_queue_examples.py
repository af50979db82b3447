"""The queue examples (examples/queue-*.yaml) as the webhook sees them, without a
cluster: each embeds examples/workers/queue-worker.sh verbatim, and each shape's pod
is injected in the queue mode it is about (an Indexed Job's pod claims its index, a
CronJob's run its slot, a Deployment's pod drains; the semaphore example's queue
takes a slot of its JobSemaphore, as docs/semaphores.md shows it).
tests/cluster/test_queue_shapes.py and test_queue_semaphore.py apply the files on the
real cluster."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest
import yaml

from joblease.operator.cron_slots import SCHEDULED_ANNOTATION, plan_job
from joblease.operator.injection import COMPLETION_INDEX_ANNOTATION, SidecarSettings, plan

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPT = (EXAMPLES / "workers" / "queue-worker.sh").read_text()
FILES = ("queue-indexed-job.yaml", "queue-cronjob.yaml", "queue-deployment.yaml",
         "queue-semaphore-deployment.yaml")


def _docs(name: str) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d}


def _sidecar_env(template: dict[str, Any], **notes: str) -> dict[str, Any]:
    pod = {"metadata": copy.deepcopy(template["metadata"]),
           "spec": copy.deepcopy(template["spec"])}
    pod["metadata"]["annotations"].update(notes)
    result = plan(pod, SidecarSettings(), namespace="team-a")
    assert result.warnings == []
    injected = jsonpatch.apply_patch(pod, result.patch)
    names = {v["name"] for v in injected["spec"]["volumes"]}
    for c in injected["spec"]["containers"] + injected["spec"]["initContainers"]:
        assert {m["name"] for m in c.get("volumeMounts", [])} <= names, c["name"]
    (sidecar,) = injected["spec"]["initContainers"]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}


@pytest.mark.parametrize("name", FILES)
def test_every_queue_example_carries_the_worker_script_verbatim(name: str) -> None:
    config_map = _docs(name)["ConfigMap"]
    assert config_map["metadata"]["name"] == "queue-worker"
    assert config_map["data"]["queue-worker.sh"] == SCRIPT


def test_the_indexed_job_example_claims_each_index() -> None:
    job = _docs("queue-indexed-job.yaml")["Job"]
    spec = job["spec"]
    assert (spec["completionMode"], spec["completions"], spec["parallelism"]) == (
        "Indexed", 8, 3)
    assert plan_job(job).patch == []  # not a CronJob's: nothing to name
    env = _sidecar_env(spec["template"], **{COMPLETION_INDEX_ANNOTATION: "4"})
    assert env["JOBLEASE_QUEUE"] == "shards"
    assert env["JOBLEASE_ITEM"] == {"fieldRef": {
        "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}


def test_the_cronjob_example_claims_and_creates_its_slot() -> None:
    cron = _docs("queue-cronjob.yaml")["CronJob"]
    assert cron["spec"]["concurrencyPolicy"] == "Allow"
    job = {"apiVersion": "batch/v1", "kind": "Job",
           "metadata": {"name": "report-29000000",
                        "annotations": {SCHEDULED_ANNOTATION: "2026-12-01T23:05:00Z"},
                        "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                             "name": "report", "uid": "u"}]},
           "spec": copy.deepcopy(cron["spec"]["jobTemplate"]["spec"])}
    job = jsonpatch.apply_patch(job, plan_job(job).patch)
    env = _sidecar_env(job["spec"]["template"])
    assert env["JOBLEASE_QUEUE"] == "report"
    assert env["JOBLEASE_ITEM"] == "2026-12-01T23:05:00Z"
    assert env["JOBLEASE_ITEM_CREATE"] == "true"


def test_the_deployment_example_drains() -> None:
    deployment = _docs("queue-deployment.yaml")["Deployment"]
    assert deployment["spec"]["replicas"] == 3
    env = _sidecar_env(deployment["spec"]["template"])
    assert env["JOBLEASE_QUEUE"] == "files"
    assert "JOBLEASE_ITEM" not in env and "JOBLEASE_EXIT_WHEN_EMPTY" not in env


def test_the_semaphore_example_drains_6_pods_through_2_slots() -> None:
    docs = _docs("queue-semaphore-deployment.yaml")
    semaphore, queue, deployment = docs["JobSemaphore"], docs["JobQueue"], docs["Deployment"]
    assert semaphore["spec"] == {"limit": 2}
    assert queue["spec"]["semaphores"] == [{"name": semaphore["metadata"]["name"],
                                            "weight": 1}]
    assert deployment["spec"]["replicas"] == 6
    env = _sidecar_env(deployment["spec"]["template"])
    assert env["JOBLEASE_QUEUE"] == queue["metadata"]["name"]
    assert "JOBLEASE_ITEM" not in env and "JOBLEASE_EXIT_WHEN_EMPTY" not in env


def test_docs_show_the_semaphore_example_as_written() -> None:
    """docs/semaphores.md's manifest is the example's JobSemaphore and JobQueue."""
    doc = (EXAMPLES.parent / "docs" / "semaphores.md").read_text()
    shown = doc.split("```yaml\n", 1)[1].split("```", 1)[0]
    example = [d for d in yaml.safe_load_all((EXAMPLES / "queue-semaphore-deployment.yaml"
                                               ).read_text()) if d]
    assert list(yaml.safe_load_all(shown)) == example[:2]
    assert "examples/queue-semaphore-deployment.yaml" in doc
