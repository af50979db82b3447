"""The three Kubernetes shapes over a queue, on the real cluster: the example files of
examples/queue-*.yaml, injected by the chart's webhook, writing to the example ledger.

Real: the session cluster (kube-apiserver calls the shared release's webhook for pods
and Jobs), its Job, CronJob and Deployment controllers, the operator image's CLI
(``joblease queue ...``, run in the operator pod: it has the etcd credentials; the
queues come from the examples' JobQueue resources), the bundled etcd, the Go sidecar
image in queue mode, examples/workers/queue-worker.sh in the curl image, examples/ledger.yaml.

What each test changes in its example, and why, is said where it does: only the
worker's hold file (the example script's test hook: the first attempt at an item
lasts until a file exists), so a fault lands while an item is held.

- Indexed Job (completions 8, parallelism 3): the pod of index 1 is deleted and the
  sidecar of index 2 is frozen (cgroup freezer) past the queue's TTL while they hold;
  each index gets a new pod, which claims the next generation. Every index ends
  completed exactly once in etcd and with one accepted ledger write, under the
  completing token.
- CronJob every minute, concurrencyPolicy Allow, a worker slower than the schedule
  (held until the next slot's run holds its own): two slots run at once, and two
  extra Jobs for those slots (``kubectl create job --from=cronjob``, and one as a
  restarted controller would make it, with the scheduled-time annotation) end
  Succeeded without working. One minute is the schedule's finest grain: the test
  waits for the first slot (up to a minute) and the next (one more).
- Deployment of 3 drains 1,000 items while one pod is deleted: every item completed
  exactly once; its one in-flight item, released, is the only one claimed twice.
  (Its example is applied as written.)
- The Indexed Job and CronJob examples applied as written: every index and the first
  slot completed once, one ledger write each.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import freezer
from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster
from tests.support.pods import container_id, exec_in, job_condition, pod_logs
from tests.support.queue_pods import (
    describe,
    holding,
    ledger_books,
    pods_of,
    queue_cli,
    queue_items,
    queue_ready,
)
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

EXAMPLES = REPO_ROOT / "examples"
HOLD_FILE = "/run/joblease/go"  # in the pod's shared emptyDir


# ----------------------------------------------------------------------------- helpers
def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _with_hold(docs: list[dict[str, Any]], namespace: str, items: str | None = None,
               queue: dict[str, Any] | None = None) -> str:
    """The example's documents in ``namespace``, its worker given the hold file (and
    which items), its JobQueue's spec updated with ``queue`` (shorter TTLs)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "JobQueue":
            doc["spec"].update(queue or {})
            continue
        spec = doc.get("spec") or {}
        template = (spec.get("jobTemplate") or {}).get("spec", spec).get("template")
        if template is None:
            continue
        (worker,) = template["spec"]["containers"]
        worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_FILE", "value": HOLD_FILE})
        if items is not None:
            worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_ITEMS", "value": items})
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def _release(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    r = exec_in(cluster, namespace, pod["metadata"]["name"], "worker", "touch", HOLD_FILE)
    assert r.returncode == 0, r.stderr


def _first_token(log: str, item: str) -> int:
    (line,) = [ln for ln in log.splitlines() if ln.startswith(f"item {item} generation 1 ")]
    return int(line.rsplit(" ", 1)[1])


def _assert_one_write_each(cluster: Cluster, ns: str, queue: str,
                           items: dict[str, dict[str, Any]]) -> dict[str, Any]:
    names = {i: f"{queue}-{i.replace(':', '.')}" for i in items}
    books = ledger_books(cluster, ns, list(names.values()))
    for item, state in items.items():
        book = books[names[item]]
        (entry,) = book["entries"]  # one accepted write
        assert entry["token"] == state["result"]["token"] == book["highestToken"], (item, book)
        assert entry["job"] == f"{ns}/{queue}/{item}", entry
    return books


# ----------------------------------------------------------------------------- tests
@pytest.mark.node  # freezes a container from the node (cgroup freezer)
def test_indexed_job_every_index_once_despite_a_deleted_and_a_frozen_pod(
        cluster: Cluster, queue_namespace: str) -> None:
    ns, ttl = queue_namespace, 5
    # the example, its items 1 and 2 held at their first attempt (the faults land there)
    cluster.apply(_with_hold(_docs("queue-indexed-job.yaml"), ns, items="1 2",
                             queue={"leaseDurationSeconds": ttl, "maxAttempts": 4}))
    assert queue_ready(cluster, ns, "shards")["total"] == 8
    selector = "job-name=shards"
    held: dict[str, dict[str, Any]] = {}
    for i in ("1", "2"):
        def holds(i: str = i) -> dict[str, Any] | None:
            return holding(cluster, ns, selector, i)
        held[i] = wait_until(holds, timeout=300, interval=1, what=f"index {i} holding its item")
    first = {i: _first_token(pod_logs(cluster, ns, p["metadata"]["name"], "worker"), i)
             for i, p in held.items()}
    for i, pod in held.items():
        env = {e["name"]: e.get("valueFrom") for e in pod["spec"]["initContainers"][0]["env"]}
        assert env["JOBLEASE_ITEM"] == {"fieldRef": {"apiVersion": "v1", "fieldPath":
            "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}, i

    # index 1: deleted (its sidecar releases); index 2: its sidecar frozen until etcd
    # has expired its lease (nobody else claims item 2 meanwhile: only its pod may)
    cluster.kubectl("delete", "pod", held["1"]["metadata"]["name"], "-n", ns,
                    "--wait=false", check=True)
    frozen = held["2"]
    cgroup = freezer.container_cgroup(frozen["metadata"]["uid"],
                                      container_id(frozen, "joblease"))
    froze = time.monotonic()
    with freezer.frozen(cgroup):
        wait_until(lambda: queue_items(cluster, ns, "shards")["2"]["holder"] is None,
                   timeout=120, interval=0.5, what="etcd expiring the frozen pod's lease")
        # expiry, not a release: at least 2/3 TTL after the last keep-alive (every TTL/3)
        assert time.monotonic() - froze >= ttl / 3
    # thawed: its sidecar finds the lease lost and stops the worker; the pod fails and
    # the index gets a new pod, which claims the next generation
    state = wait_until(lambda: job_condition(cluster, ns, "shards"), timeout=600, interval=1,
                       what="Job shards Complete or Failed")
    assert state == "Complete", describe(cluster, ns)
    gone = cluster.pod(frozen["metadata"]["name"], ns)
    assert gone is not None and gone["status"]["phase"] == "Failed", gone
    assert "complete 2 ->" not in pod_logs(cluster, ns, frozen["metadata"]["name"], "worker")

    items = queue_items(cluster, ns, "shards")
    assert sorted(items) == [str(i) for i in range(8)]
    for i, s in items.items():
        assert s["phase"] == "Completed" and s["holder"] is None, s
        assert s["generation"] == (2 if i in first else 1), s  # claimed again only if lost
        assert s["result"]["result"] == {"item": i}, s
    for i, token in first.items():
        assert items[i]["result"]["token"] > token  # the new pod's claim, not the lost one
        assert items[i]["result"]["owner"].split("/")[0] != held[i]["metadata"]["name"]
    counts = queue_cli(cluster, ns, "queue", "get", "shards")
    assert (counts["completed"], counts["pending"], counts["held"], counts["failed"]) == (
        8, 0, 0, 0)
    _assert_one_write_each(cluster, ns, "shards", items)


def _jobs(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    r = cluster.kubectl("get", "jobs", "-n", namespace, "-o", "json", timeout=60)
    assert r.returncode == 0, r.stderr
    return {j["metadata"]["name"]: j for j in json.loads(r.stdout)["items"]}


def _slot_of(job: dict[str, Any]) -> str | None:
    notes = job["spec"]["template"]["metadata"].get("annotations") or {}
    return notes.get("joblease.io/item")


def _scheduled(cluster: Cluster, namespace: str) -> list[dict[str, Any]]:
    """The CronJob's own Jobs (they carry the scheduled time), oldest slot first."""
    jobs = [j for j in _jobs(cluster, namespace).values()
            if "batch.kubernetes.io/cronjob-scheduled-timestamp"
            in (j["metadata"].get("annotations") or {})]
    return sorted(jobs, key=lambda j: str(_slot_of(j)))


def test_cronjob_slots_run_at_most_once_with_overlapping_and_duplicate_jobs(
        cluster: Cluster, queue_namespace: str) -> None:
    ns = queue_namespace
    # the example, its worker slower than the schedule: each slot's first attempt lasts
    # until the test lets it go
    cluster.apply(_with_hold(_docs("queue-cronjob.yaml"), ns,
                             queue={"leaseDurationSeconds": 5}))
    queue_ready(cluster, ns, "report")
    try:
        (run1,) = wait_until(lambda: _scheduled(cluster, ns) or None, timeout=150,
                             interval=1, what="the CronJob's first run")
        slot1 = _slot_of(run1)
        assert slot1 is not None and slot1.endswith("Z"), run1["spec"]["template"]
        assert run1["spec"]["template"]["metadata"]["annotations"][
            "joblease.io/item-create"] == "true"
        pod1 = wait_until(lambda: holding(cluster, ns, f"job-name={run1['metadata']['name']}",
                                           slot1), timeout=240, interval=1,
                          what=f"slot {slot1} held")
        # a run by hand of the CronJob: its last slot, which is held: it waits
        made = cluster.kubectl("create", "job", "by-hand", "--from=cronjob/report", "-n", ns)
        assert made.returncode == 0, made.stderr
        assert f"runs the CronJob's last slot {slot1}" in made.stderr, made.stderr
        assert _slot_of(_jobs(cluster, ns)["by-hand"]) == slot1
        # the next slot comes while the first is still held: the runs overlap
        run2 = wait_until(lambda: (lambda s: s[1] if len(s) > 1 else None)(
            _scheduled(cluster, ns)), timeout=150, interval=1, what="the second run")
        slot2 = _slot_of(run2)
        assert slot2 is not None and slot2 > slot1
        cluster.kubectl("patch", "cronjob", "report", "-n", ns, "--type=merge",
                        "-p", '{"spec":{"suspend":true}}', check=True)  # two slots are enough
        pod2 = wait_until(lambda: holding(cluster, ns, f"job-name={run2['metadata']['name']}",
                                           slot2), timeout=240, interval=1,
                          what=f"slot {slot2} held while {slot1} still is")
        assert holding(cluster, ns, f"job-name={run1['metadata']['name']}", slot1)
        # the Job a restarted controller would make again for slot 2 (same annotation)
        uid = json.loads(cluster.kubectl("get", "cronjob", "report", "-n", ns, "-o", "json",
                                         check=True).stdout)["metadata"]["uid"]
        again = copy.deepcopy(run2)
        again["metadata"] = {
            "name": "again", "namespace": ns,
            "annotations": {"batch.kubernetes.io/cronjob-scheduled-timestamp": run2[
                "metadata"]["annotations"]["batch.kubernetes.io/cronjob-scheduled-timestamp"]},
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob",
                                 "name": "report", "uid": uid}]}
        template = again["spec"]["template"]
        template["metadata"]["annotations"] = {"joblease.io/queue": "report"}
        template["metadata"]["labels"] = {}
        for key in ("selector", "manualSelector"):
            again["spec"].pop(key, None)
        again.pop("status", None)
        cluster.apply(json.dumps(again))
        assert _slot_of(_jobs(cluster, ns)["again"]) == slot2

        # the slow runs finish; the duplicates then find their slot completed
        _release(cluster, ns, pod1)
        _release(cluster, ns, pod2)
        for name in (run1["metadata"]["name"], run2["metadata"]["name"], "by-hand", "again"):
            def done(name: str = name) -> str | None:
                return job_condition(cluster, ns, name)
            outcome = wait_until(done, timeout=300, interval=1, what=f"Job {name} done")
            assert outcome == "Complete", f"{name}\n{describe(cluster, ns)}"
        for dup in ("by-hand", "again"):
            (pod,) = pods_of(cluster, ns, f"job-name={dup}")
            log = pod_logs(cluster, ns, pod["metadata"]["name"], "worker")
            assert "nothing more to do" in log and "write" not in log, log
            assert pod["status"]["phase"] == "Succeeded"
    finally:
        cluster.kubectl("delete", "cronjob", "report", "-n", ns, "--wait=false")

    items = queue_items(cluster, ns, "report")
    assert sorted(items) == [slot1, slot2]
    for state in items.values():
        assert state["phase"] == "Completed" and state["generation"] == 1, state
    _assert_one_write_each(cluster, ns, "report", items)


def test_deployment_drains_1000_items_exactly_once_while_a_pod_is_deleted(
        cluster: Cluster, queue_namespace: str, tmp_path: Path) -> None:
    ns, total = queue_namespace, 1000
    r = cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "queue-deployment.yaml"))
    assert r.returncode == 0, r.stderr  # the example as written: its JobQueue and workers
    queue_ready(cluster, ns, "files")
    lines = "".join(json.dumps({"id": f"f{n:04d}", "payload": {"n": n}}) + "\n"
                    for n in range(total))
    added = queue_cli(cluster, ns, "queue", "enqueue", "files", "--file", "-", stdin=lines)
    assert added["added"] == total, added
    began = time.monotonic()

    def completed() -> int:
        return int(queue_cli(cluster, ns, "queue", "get", "files")["completed"])
    wait_until(lambda: completed() >= 150, timeout=400, interval=2,
               what="150 items completed")
    selector = "app.kubernetes.io/name=files"
    originals = {p["metadata"]["name"] for p in pods_of(cluster, ns, selector)}
    assert len(originals) == 3
    victim = sorted(originals)[0]
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false", check=True)
    wait_until(lambda: completed() == total, timeout=900, interval=2,
               what=f"all {total} items completed")
    print(f"\n{total} items drained in {time.monotonic() - began:.0f}s by 3 pods")

    counts = queue_cli(cluster, ns, "queue", "get", "files")
    assert (counts["total"], counts["completed"], counts["pending"], counts["held"],
            counts["failed"]) == (total, total, 0, 0, 0), counts
    items = queue_items(cluster, ns, "files")
    assert len(items) == total
    twice = [i for i, s in items.items() if s["generation"] != 1]
    assert len(twice) <= 1, twice  # the deleted pod's one in-flight item, released
    for s in items.values():
        assert s["phase"] == "Completed" and s["result"]["result"] == {"item": s["item"]}, s
    owners = {s["result"]["owner"].split("/")[0] for s in items.values()}
    assert victim in owners and owners - originals, owners  # the replacement worked too
    names = {i: f"files-{i}" for i in items}
    books = ledger_books(cluster, ns, list(names.values()))
    for item, s in items.items():
        book = books[names[item]]
        # the destination's fence agrees with etcd: the completing token is the highest
        assert book["highestToken"] == s["result"]["token"], (item, book)
        # one accepted write per claim at most; two only for the item claimed twice
        assert 1 <= len(book["entries"]) <= s["generation"], (item, book)


def test_the_indexed_job_and_cronjob_examples_as_written(
        cluster: Cluster, queue_namespace: str) -> None:
    """``kubectl apply -f`` of the two files, unmodified (the fault tests above add only
    the hold file): every index and the first slot completed once, one ledger write each."""
    ns = queue_namespace
    for name in ("queue-indexed-job.yaml", "queue-cronjob.yaml"):
        r = cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / name))
        assert r.returncode == 0, r.stderr
    try:
        state = wait_until(lambda: job_condition(cluster, ns, "shards"), timeout=300,
                           interval=1, what="Job shards Complete or Failed")
        assert state == "Complete", describe(cluster, ns)
        (run,) = wait_until(lambda: _scheduled(cluster, ns)[:1] or None, timeout=150,
                            interval=1, what="the CronJob's first run")

        def run_done() -> str | None:
            return job_condition(cluster, ns, run["metadata"]["name"])
        assert wait_until(run_done, timeout=240, interval=1,
                          what="the first run done") == "Complete", describe(cluster, ns)
    finally:
        cluster.kubectl("delete", "cronjob", "report", "-n", ns, "--wait=false")
    shards = queue_items(cluster, ns, "shards")
    assert sorted(shards) == [str(i) for i in range(8)]
    assert all(s["phase"] == "Completed" and s["generation"] == 1 for s in shards.values())
    _assert_one_write_each(cluster, ns, "shards", shards)
    slot = _slot_of(run)
    report = {i: s for i, s in queue_items(cluster, ns, "report").items() if i == slot}
    assert report and report[str(slot)]["phase"] == "Completed", queue_items(cluster, ns, "report")
    _assert_one_write_each(cluster, ns, "report", report)
