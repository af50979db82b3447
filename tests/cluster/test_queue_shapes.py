"""The three Kubernetes shapes over a queue, on the real cluster: the example files of
examples/queue-*.yaml, injected by the chart's webhook, writing to the example ledger.

Real: the session cluster (kube-apiserver calls the shared release's webhook for pods
and Jobs), its Job, CronJob and Deployment controllers, the operator image's CLI
(``joblease queue ...``, run in the operator pod: it has the etcd credentials; there
is no JobQueue resource to declare yet), the bundled etcd, the Go sidecar image in
queue mode, examples/workers/queue-worker.sh in the curl image, examples/ledger.yaml.

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
from tests.support.cluster import Cluster, image_ref
from tests.support.pods import container_id, exec_in, job_condition, pod_logs
from tests.support.worker_pods import operator_pod
from tests.waiting import wait_until

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1200)]

EXAMPLES = REPO_ROOT / "examples"
LEDGER = EXAMPLES / "ledger.yaml"
HOLD_FILE = "/run/joblease/go"  # in the pod's shared emptyDir


# ----------------------------------------------------------------------------- helpers
def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _with_hold(docs: list[dict[str, Any]], namespace: str, items: str | None = None) -> str:
    """The example's documents in ``namespace``, its worker given the hold file (and
    which items)."""
    docs = copy.deepcopy(docs)
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        spec = doc.get("spec") or {}
        template = (spec.get("jobTemplate") or {}).get("spec", spec).get("template")
        if template is None:
            continue
        (worker,) = template["spec"]["containers"]
        worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_FILE", "value": HOLD_FILE})
        if items is not None:
            worker["env"].append({"name": "JOBLEASE_EXAMPLE_HOLD_ITEMS", "value": items})
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def _cli(cluster: Cluster, namespace: str, *args: str, stdin: str | None = None,
         timeout: float = 180) -> Any:
    """``joblease ARGS -n NAMESPACE -o json`` in the operator pod (etcd's credentials are
    there); retried while etcd or the pod is unreachable (exit 10), like joblease_cli."""
    deadline = time.monotonic() + timeout
    while True:
        op_ns, op_pod = operator_pod(cluster)
        r = cluster.kubectl("exec", *(["-i"] if stdin is not None else []), op_pod, "-n",
                            op_ns, "-c", "operator", "--", "joblease", *args, "-n",
                            namespace, "-o", "json", input=stdin, timeout=120)
        if r.returncode == 0:
            return json.loads(r.stdout)
        if r.returncode != 10 or time.monotonic() > deadline:
            raise AssertionError(f"joblease {' '.join(args)} -> {r.returncode}: "
                                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
        time.sleep(1)  # poll interval; the deadline bounds the wait


def _items(cluster: Cluster, namespace: str, queue: str) -> dict[str, dict[str, Any]]:
    items: list[dict[str, Any]] = _cli(cluster, namespace, "items", queue, "--limit", "5000")
    return {i["item"]: i for i in items}


def _books(cluster: Cluster, namespace: str, resources: list[str]) -> dict[str, Any]:
    """``GET /resources/<name>`` of the ledger for each name, in one exec in its pod."""
    script = ("import json, sys, urllib.request\n"
              "names = json.load(sys.stdin)\n"
              "print(json.dumps({n: json.load(urllib.request.urlopen("
              "'http://127.0.0.1:8080/resources/' + n)) for n in names}))\n")
    r = cluster.kubectl("exec", "-i", "deploy/ledger", "-n", namespace, "--", "python", "-c",
                        script, input=json.dumps(resources), timeout=300)
    assert r.returncode == 0, r.stderr
    books: dict[str, Any] = json.loads(r.stdout)
    return books


def _pods(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json",
                        timeout=60)
    assert r.returncode == 0, r.stderr
    pods: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return pods


def _holding(cluster: Cluster, namespace: str, selector: str, item: str
             ) -> dict[str, Any] | None:
    """The live pod of ``selector`` whose worker holds ``item`` (on the hold file)."""
    for pod in _pods(cluster, namespace, selector):
        if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        log = pod_logs(cluster, namespace, pod["metadata"]["name"], "worker")
        if f"holding item {item} until" in log:
            return pod
    return None


def _release(cluster: Cluster, namespace: str, pod: dict[str, Any]) -> None:
    r = exec_in(cluster, namespace, pod["metadata"]["name"], "worker", "touch", HOLD_FILE)
    assert r.returncode == 0, r.stderr


def _describe(cluster: Cluster, namespace: str, selector: str = "job-name") -> str:
    pods = cluster.kubectl("get", "pods,jobs", "-n", namespace, "-o", "wide").stdout
    logs = cluster.kubectl("logs", "-n", namespace, "-l", selector, "--all-containers",
                           "--prefix", "--tail=20", "--max-log-requests=20").stdout
    events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"
                             ).stdout
    return f"{pods}\n{logs[-6000:]}\n{events[-4000:]}"


def _first_token(log: str, item: str) -> int:
    (line,) = [ln for ln in log.splitlines() if ln.startswith(f"item {item} generation 1 ")]
    return int(line.rsplit(" ", 1)[1])


@pytest.fixture
def queue_namespace(cluster: Cluster, worker_namespace: str) -> str:
    """This test's namespace: opted in to injection, the etcd client Secret, the ledger."""
    ns = worker_namespace
    cluster.kubectl("label", "namespace", ns, "joblease.io/inject=enabled", "--overwrite",
                    check=True)
    r = cluster.kubectl("apply", "-n", ns, "-f", str(LEDGER))
    assert r.returncode == 0, r.stderr
    probe = {"apiVersion": "v1", "kind": "Pod",
             "metadata": {"name": "probe", "namespace": ns,
                          "annotations": {"joblease.io/queue": "probe"}},
             "spec": {"containers": [{"name": "w", "command": ["true"],
                                      "image": image_ref("docker.io/curlimages/curl")}]}}

    def injecting() -> bool:  # the shared release's webhook may still be starting
        r = cluster.kubectl("create", "--dry-run=server", "-o", "json", "-f", "-",
                            input=json.dumps(probe), timeout=60)
        return r.returncode == 0 and any(
            c["name"] == "joblease" for c in json.loads(r.stdout)["spec"].get(
                "initContainers") or [])
    wait_until(injecting, timeout=180, what="the webhook injecting queue pods", interval=1)
    rollout = cluster.kubectl("rollout", "status", "deployment/ledger", "-n", ns,
                              "--timeout=300s", timeout=330)
    assert rollout.returncode == 0, rollout.stderr
    return ns


def _assert_one_write_each(cluster: Cluster, ns: str, queue: str,
                           items: dict[str, dict[str, Any]]) -> dict[str, Any]:
    names = {i: f"{queue}-{i.replace(':', '.')}" for i in items}
    books = _books(cluster, ns, list(names.values()))
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
    _cli(cluster, ns, "queue", "create", "shards", "--ttl", str(ttl), "--max-attempts", "4",
         "--shards", "8")
    # the example, its items 1 and 2 held at their first attempt (the faults land there)
    cluster.apply(_with_hold(_docs("queue-indexed-job.yaml"), ns, items="1 2"))
    selector = "job-name=shards"
    held: dict[str, dict[str, Any]] = {}
    for i in ("1", "2"):
        def holds(i: str = i) -> dict[str, Any] | None:
            return _holding(cluster, ns, selector, i)
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
        wait_until(lambda: _items(cluster, ns, "shards")["2"]["holder"] is None,
                   timeout=120, interval=0.5, what="etcd expiring the frozen pod's lease")
        # expiry, not a release: at least 2/3 TTL after the last keep-alive (every TTL/3)
        assert time.monotonic() - froze >= ttl / 3
    # thawed: its sidecar finds the lease lost and stops the worker; the pod fails and
    # the index gets a new pod, which claims the next generation
    state = wait_until(lambda: job_condition(cluster, ns, "shards"), timeout=600, interval=1,
                       what="Job shards Complete or Failed")
    assert state == "Complete", _describe(cluster, ns)
    gone = cluster.pod(frozen["metadata"]["name"], ns)
    assert gone is not None and gone["status"]["phase"] == "Failed", gone
    assert "complete 2 ->" not in pod_logs(cluster, ns, frozen["metadata"]["name"], "worker")

    items = _items(cluster, ns, "shards")
    assert sorted(items) == [str(i) for i in range(8)]
    for i, s in items.items():
        assert s["phase"] == "Completed" and s["holder"] is None, s
        assert s["generation"] == (2 if i in first else 1), s  # claimed again only if lost
        assert s["result"]["result"] == {"item": i}, s
    for i, token in first.items():
        assert items[i]["result"]["token"] > token  # the new pod's claim, not the lost one
        assert items[i]["result"]["owner"].split("/")[0] != held[i]["metadata"]["name"]
    counts = _cli(cluster, ns, "queue", "get", "shards")
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
    _cli(cluster, ns, "queue", "create", "report", "--ttl", "5", "--max-attempts", "3")
    # the example, its worker slower than the schedule: each slot's first attempt lasts
    # until the test lets it go
    cluster.apply(_with_hold(_docs("queue-cronjob.yaml"), ns))
    try:
        (run1,) = wait_until(lambda: _scheduled(cluster, ns) or None, timeout=150,
                             interval=1, what="the CronJob's first run")
        slot1 = _slot_of(run1)
        assert slot1 is not None and slot1.endswith("Z"), run1["spec"]["template"]
        assert run1["spec"]["template"]["metadata"]["annotations"][
            "joblease.io/item-create"] == "true"
        pod1 = wait_until(lambda: _holding(cluster, ns, f"job-name={run1['metadata']['name']}",
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
        pod2 = wait_until(lambda: _holding(cluster, ns, f"job-name={run2['metadata']['name']}",
                                           slot2), timeout=240, interval=1,
                          what=f"slot {slot2} held while {slot1} still is")
        assert _holding(cluster, ns, f"job-name={run1['metadata']['name']}", slot1)
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
            assert outcome == "Complete", f"{name}\n{_describe(cluster, ns)}"
        for dup in ("by-hand", "again"):
            (pod,) = _pods(cluster, ns, f"job-name={dup}")
            log = pod_logs(cluster, ns, pod["metadata"]["name"], "worker")
            assert "nothing more to do" in log and "write" not in log, log
            assert pod["status"]["phase"] == "Succeeded"
    finally:
        cluster.kubectl("delete", "cronjob", "report", "-n", ns, "--wait=false")

    items = _items(cluster, ns, "report")
    assert sorted(items) == [slot1, slot2]
    for state in items.values():
        assert state["phase"] == "Completed" and state["generation"] == 1, state
    _assert_one_write_each(cluster, ns, "report", items)


def test_deployment_drains_1000_items_exactly_once_while_a_pod_is_deleted(
        cluster: Cluster, queue_namespace: str, tmp_path: Path) -> None:
    ns, total = queue_namespace, 1000
    _cli(cluster, ns, "queue", "create", "files", "--ttl", "10", "--max-attempts", "3")
    lines = "".join(json.dumps({"id": f"f{n:04d}", "payload": {"n": n}}) + "\n"
                    for n in range(total))
    added = _cli(cluster, ns, "queue", "enqueue", "files", "--file", "-", stdin=lines)
    assert added["added"] == total, added
    began = time.monotonic()
    r = cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / "queue-deployment.yaml"))
    assert r.returncode == 0, r.stderr  # the example as written

    def completed() -> int:
        return int(_cli(cluster, ns, "queue", "get", "files")["completed"])
    wait_until(lambda: completed() >= 150, timeout=400, interval=2,
               what="150 items completed")
    selector = "app.kubernetes.io/name=files"
    originals = {p["metadata"]["name"] for p in _pods(cluster, ns, selector)}
    assert len(originals) == 3
    victim = sorted(originals)[0]
    cluster.kubectl("delete", "pod", victim, "-n", ns, "--wait=false", check=True)
    wait_until(lambda: completed() == total, timeout=900, interval=2,
               what=f"all {total} items completed")
    print(f"\n{total} items drained in {time.monotonic() - began:.0f}s by 3 pods")

    counts = _cli(cluster, ns, "queue", "get", "files")
    assert (counts["total"], counts["completed"], counts["pending"], counts["held"],
            counts["failed"]) == (total, total, 0, 0, 0), counts
    items = _items(cluster, ns, "files")
    assert len(items) == total
    twice = [i for i, s in items.items() if s["generation"] != 1]
    assert len(twice) <= 1, twice  # the deleted pod's one in-flight item, released
    for s in items.values():
        assert s["phase"] == "Completed" and s["result"]["result"] == {"item": s["item"]}, s
    owners = {s["result"]["owner"].split("/")[0] for s in items.values()}
    assert victim in owners and owners - originals, owners  # the replacement worked too
    names = {i: f"files-{i}" for i in items}
    books = _books(cluster, ns, list(names.values()))
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
    _cli(cluster, ns, "queue", "create", "shards", "--ttl", "30", "--max-attempts", "3",
         "--shards", "8")
    _cli(cluster, ns, "queue", "create", "report", "--ttl", "30", "--max-attempts", "3")
    for name in ("queue-indexed-job.yaml", "queue-cronjob.yaml"):
        r = cluster.kubectl("apply", "-n", ns, "-f", str(EXAMPLES / name))
        assert r.returncode == 0, r.stderr
    try:
        state = wait_until(lambda: job_condition(cluster, ns, "shards"), timeout=300,
                           interval=1, what="Job shards Complete or Failed")
        assert state == "Complete", _describe(cluster, ns)
        (run,) = wait_until(lambda: _scheduled(cluster, ns)[:1] or None, timeout=150,
                            interval=1, what="the CronJob's first run")

        def run_done() -> str | None:
            return job_condition(cluster, ns, run["metadata"]["name"])
        assert wait_until(run_done, timeout=240, interval=1,
                          what="the first run done") == "Complete", _describe(cluster, ns)
    finally:
        cluster.kubectl("delete", "cronjob", "report", "-n", ns, "--wait=false")
    shards = _items(cluster, ns, "shards")
    assert sorted(shards) == [str(i) for i in range(8)]
    assert all(s["phase"] == "Completed" and s["generation"] == 1 for s in shards.values())
    _assert_one_write_each(cluster, ns, "shards", shards)
    slot = _slot_of(run)
    report = {i: s for i, s in _items(cluster, ns, "report").items() if i == slot}
    assert report and report[str(slot)]["phase"] == "Completed", _items(cluster, ns, "report")
    _assert_one_write_each(cluster, ns, "report", report)
