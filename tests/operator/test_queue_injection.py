"""Queue mode of the injection plan (joblease.operator.injection.plan): which item
the sidecar claims follows the pod's shape. Pure functions of dicts, the patch
applied with a real RFC 6902 implementation (``jsonpatch``)."""

from __future__ import annotations

from typing import Any

import jsonpatch  # type: ignore[import-untyped]
import pytest

from joblease.operator.injection import (
    COMPLETION_INDEX_ANNOTATION,
    InjectionRefused,
    SidecarSettings,
    plan,
    wants_injection,
)
from joblease.operator.webhook import review_response

NS = "team-a"


def _pod(restart: str = "Always", **notes: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "w-", "annotations": dict(notes)},
            "spec": {"restartPolicy": restart,
                     "securityContext": {"runAsUser": 65532},
                     "containers": [{"name": "worker", "image": "busybox"}]}}


def _inject(pod: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    result = plan(pod, SidecarSettings(), namespace=NS)
    return jsonpatch.apply_patch(pod, result.patch), result.warnings


def _sidecar_env(pod: dict[str, Any]) -> dict[str, Any]:
    (sidecar,) = pod["spec"]["initContainers"]
    assert sidecar["name"] == "joblease"
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in sidecar["env"]}


def test_a_deployment_pod_drains_the_queue() -> None:
    pod, warnings = _inject(_pod(**{"joblease.io/queue": "files"}))
    env = _sidecar_env(pod)
    assert env["JOBLEASE_QUEUE"] == "files"
    assert env["JOBLEASE_JOB_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    for absent in ("JOBLEASE_JOB_NAME", "JOBLEASE_ITEM", "JOBLEASE_ITEM_CREATE",
                   "JOBLEASE_EXIT_WHEN_EMPTY"):
        assert absent not in env
    assert warnings == []
    # the workers are wired exactly as for a JobLease
    worker_env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert {"JOBLEASE_SIDECAR_URL", "JOBLEASE_TOKEN_FILE"} <= worker_env
    assert pod["metadata"]["annotations"]["joblease.io/injected"] == "true"


def test_an_indexed_job_pod_claims_its_completion_index_through_the_downward_api() -> None:
    pod, warnings = _inject(_pod("Never", **{"joblease.io/queue": "shards",
                                             COMPLETION_INDEX_ANNOTATION: "5"}))
    env = _sidecar_env(pod)
    assert env["JOBLEASE_QUEUE"] == "shards"
    assert env["JOBLEASE_ITEM"] == {"fieldRef": {
        "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert "JOBLEASE_ITEM_CREATE" not in env and warnings == []


def test_a_slot_pod_claims_and_creates_its_item() -> None:
    pod, warnings = _inject(_pod("Never", **{"joblease.io/queue": "nightly",
                                             "joblease.io/item": "2026-12-01T23:00:00Z",
                                             "joblease.io/item-create": "true"}))
    env = _sidecar_env(pod)
    assert env["JOBLEASE_ITEM"] == "2026-12-01T23:00:00Z"
    assert env["JOBLEASE_ITEM_CREATE"] == "true"
    assert warnings == []


def test_a_draining_job_pod_is_warned_unless_it_exits_when_empty() -> None:
    _, warnings = _inject(_pod("Never", **{"joblease.io/queue": "files"}))
    (warning,) = warnings
    assert "waits for new items forever" in warning and "joblease.io/exit-when-empty" in warning
    pod, warnings = _inject(_pod("OnFailure", **{"joblease.io/queue": "files",
                                                 "joblease.io/exit-when-empty": "true"}))
    assert _sidecar_env(pod)["JOBLEASE_EXIT_WHEN_EMPTY"] == "true" and warnings == []
    _, warnings = _inject(_pod("Always", **{"joblease.io/queue": "files",
                                            "joblease.io/exit-when-empty": "true"}))
    (warning,) = warnings
    assert "the pod never ends" in warning


@pytest.mark.parametrize(("notes", "says"), [
    ({"joblease.io/job": "report", "joblease.io/queue": "files"},
     "annotations joblease.io/job and joblease.io/queue both set: a pod's sidecar works on "
     "one JobLease or on one queue; keep one of them"),
    ({"joblease.io/queue": "Files"}, "invalid annotation joblease.io/queue: 'Files' is not a "
     "JobQueue name"),
    ({"joblease.io/queue": "files", "joblease.io/item": "a/b"},
     "invalid annotation joblease.io/item: 'a/b' is not an item id"),
    ({"joblease.io/queue": "files", "joblease.io/item": "2026-12-01T23:00:00+01:00"},
     "is not an item id"),
    ({"joblease.io/job": "report", "joblease.io/item": "a"},
     "annotation joblease.io/item is for queue mode (joblease.io/queue)"),
    ({"joblease.io/queue": "files", "joblease.io/item-create": "yes"},
     "invalid annotation joblease.io/item-create: 'yes' is not \"true\" or \"false\""),
    ({"joblease.io/queue": "files", "joblease.io/item-create": "true"},
     "joblease.io/item-create: true needs the item to create"),
    ({"joblease.io/queue": "files", "joblease.io/item": "a",
      "joblease.io/exit-when-empty": "true"},
     "joblease.io/exit-when-empty: true is for a pod that drains the queue"),
    ({"joblease.io/queue": "files", COMPLETION_INDEX_ANNOTATION: "3",
      "joblease.io/item": "a"},
     "annotation joblease.io/item in a pod of an Indexed Job"),
    ({"joblease.io/queue": "files", COMPLETION_INDEX_ANNOTATION: "x"},
     "'x' is not a completion index"),
])
def test_bad_queue_annotations_are_refused_saying_which(notes: dict[str, str],
                                                        says: str) -> None:
    pod = _pod("Never", **notes)
    with pytest.raises(InjectionRefused) as refused:
        plan(pod, SidecarSettings(), namespace=NS)
    assert says in str(refused.value)
    # through the AdmissionReview: refused, nothing patched
    answer = review_response({"request": {"uid": "u", "namespace": NS, "object": pod}},
                             SidecarSettings())["response"]
    assert answer["allowed"] is False and "patch" not in answer
    assert says in answer["status"]["message"]


def test_only_pods_annotated_with_a_job_or_a_queue_want_injection() -> None:
    assert wants_injection(_pod(**{"joblease.io/queue": "q"}))
    assert wants_injection(_pod(**{"joblease.io/job": "j"}))
    assert not wants_injection(_pod(**{"joblease.io/item": "a"}))
    assert plan(_pod(**{"joblease.io/item": "a"}), SidecarSettings(), namespace=NS).patch == []
