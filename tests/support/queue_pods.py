"""Queue workers on the session cluster: the helpers of the queue-shape and semaphore
cluster tests (tests/cluster/test_queue_shapes.py, test_queue_semaphore.py).

The CLI runs in the operator pod (it has etcd's credentials), the ledger
(examples/ledger.yaml) is read from inside its own pod, and a worker "holds" an item
while the example script's hold file is missing (JOBLEASE_EXAMPLE_HOLD_FILE)."""

from __future__ import annotations

import json
import time
from typing import Any

from tests.support.cluster import Cluster
from tests.support.pods import pod_logs
from tests.support.waiting import wait_until
from tests.support.worker_pods import operator_pod


def queue_cli(cluster: Cluster, namespace: str, *args: str, stdin: str | None = None,
         timeout: float = 180) -> Any:
    """``joblease ARGS -n NAMESPACE -o json`` in the operator pod (etcd's credentials are
    there); retried while etcd or the pod is unreachable (exit 10), like joblease_cli,
    and while no operator pod runs or kubectl cannot exec into it (a restarted operator:
    tests/cluster/test_pod_chaos.py deletes its pod)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            op_ns, op_pod = operator_pod(cluster)
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)  # poll interval; the deadline bounds the wait
            continue
        r = cluster.kubectl("exec", *(["-i"] if stdin is not None else []), op_pod, "-n",
                            op_ns, "-c", "operator", "--", "joblease", *args, "-n",
                            namespace, "-o", "json", input=stdin, timeout=120)
        if r.returncode == 0:
            return json.loads(r.stdout)
        # 10: etcd unreachable; 137/143: the CLI killed with its pod (being deleted);
        # 1 with kubectl's own error message: kubectl could not exec at all
        unreachable = r.returncode in (10, 137, 143) or (r.returncode == 1 and r.stderr.startswith(
            ("error:", "Error from server")))
        if not unreachable or time.monotonic() > deadline:
            raise AssertionError(f"joblease {' '.join(args)} -> {r.returncode}: "
                                 f"{r.stdout[-2000:]}{r.stderr[-2000:]}")
        time.sleep(1)  # poll interval; the deadline bounds the wait


def queue_ready(cluster: Cluster, namespace: str, queue: str, timeout: float = 120
                 ) -> dict[str, Any]:
    """The queue's counts once the operator created it in etcd from its JobQueue."""
    def ready() -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = queue_cli(cluster, namespace, "queue", "get", queue)
        except AssertionError:  # not_found until the operator registered it
            return None
        return got
    found: dict[str, Any] = wait_until(ready, timeout=timeout, interval=1,
                                       what=f"queue {queue} created from its JobQueue")
    return found


def queue_items(cluster: Cluster, namespace: str, queue: str, limit: int = 5000
                ) -> dict[str, dict[str, Any]]:
    items: list[dict[str, Any]] = queue_cli(cluster, namespace, "items", queue, "--limit",
                                            str(limit))
    return {i["item"]: i for i in items}


def ledger_books(cluster: Cluster, namespace: str, resources: list[str]) -> dict[str, Any]:
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


def pods_of(cluster: Cluster, namespace: str, selector: str) -> list[dict[str, Any]]:
    r = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json",
                        timeout=60)
    assert r.returncode == 0, r.stderr
    pods: list[dict[str, Any]] = json.loads(r.stdout)["items"]
    return pods


def holding(cluster: Cluster, namespace: str, selector: str, item: str
             ) -> dict[str, Any] | None:
    """The live pod of ``selector`` whose worker holds ``item`` (on the hold file)."""
    for pod in pods_of(cluster, namespace, selector):
        if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
            continue
        log = pod_logs(cluster, namespace, pod["metadata"]["name"], "worker")
        if f"holding item {item} until" in log:
            return pod
    return None


def describe(cluster: Cluster, namespace: str, selector: str = "job-name") -> str:
    pods = cluster.kubectl("get", "pods,jobs", "-n", namespace, "-o", "wide").stdout
    logs = cluster.kubectl("logs", "-n", namespace, "-l", selector, "--all-containers",
                           "--prefix", "--tail=20", "--max-log-requests=20").stdout
    events = cluster.kubectl("get", "events", "-n", namespace, "--sort-by=.lastTimestamp"
                             ).stdout
    return f"{pods}\n{logs[-6000:]}\n{events[-4000:]}"
