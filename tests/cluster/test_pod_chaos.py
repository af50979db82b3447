"""Pod-level chaos (issue 24): the fault-injection suite's queue checker judging worker
pods under faults from the node.

Real: the session cluster, the shared release (its webhook injects the Go sidecar in
queue mode, its operator creates the queue in the bundled etcd, auth on), a Deployment
of worker pods (examples/queue-deployment.yaml: examples/workers/queue-worker.sh in the
curl image) writing every item to the example ledger (examples/ledger.yaml), fenced by
the item's token. The faults (tests/support/pod_faults.py) come from the node: pods
frozen (shorter than the keep-alive period, and past the TTL), a worker's or a sidecar's
processes SIGKILLed, pods deleted, a pod's etcd traffic dropped in its own network
namespace past the TTL, the operator's pod deleted, the bundled etcd member killed. Items are
enqueued as the run goes, so the faults land on items in flight.

What the test changes in the example, and why: the queue's TTL (4 s, not 30: a lost
lease must expire within the run), ``maxAttempts: 0`` (the nemesis, not the item, makes
attempts fail: an item may be claimed many times and must still end Completed), four
replicas, and ``JOBLEASE_EXAMPLE_WORK_SECONDS`` (the script's test hook: each attempt's
work takes 0.5 s, so a fault finds items held).

The verdict (tests/chaos/queue_from_etcd.py, then ``queue_checker.check_queue``): read
from etcd's own history of the queue (a watch replayed from its creation: every committed
claim and completion) and the ledger's books, after the faults stopped and the queue
drained: no item completed twice, every enqueued item Completed (nothing lost, nothing
failed), an item's claims' tokens increase with the generation, every completion under
the item's last claim, and at the ledger no write accepted under a token older than one
it had accepted, nor from a superseded claim after its successor's write, nor under a
token no claim had.

The default run is bounded (``TRIALS``: each fault type once, 1.5-5 minutes of faults
on this 2-core machine, as loaded); the soak
(``--soak`` or ``JOBLEASE_SOAK=1``) runs 1,000 trials (``JOBLEASE_POD_CHAOS_TRIALS``
overrides). Figures: docs/fault-tests.md, "Pod-level chaos".
"""

from __future__ import annotations

import copy
import json
import os
import time
from typing import Any

import pytest
import yaml

from tests.chaos import queue_checker, queue_from_etcd
from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster
from tests.support.pod_faults import FAULTS, Nemesis
from tests.support.queue_pods import describe, ledger_books, queue_cli, queue_ready
from tests.support.release import Release
from tests.support.waiting import wait_until
from tests.support.worker_pods import operator_pod

pytestmark = [pytest.mark.cluster, pytest.mark.node]

EXAMPLE = REPO_ROOT / "examples" / "queue-deployment.yaml"
QUEUE, SELECTOR = "files", "app.kubernetes.io/name=files"
TTL, REPLICAS, WORK_SECONDS = 4, 4, "0.5"
TRIALS, SOAK_TRIALS = len(FAULTS), 1000
BACKLOG = 8  # items kept pending while the faults run

# etcd's history of the queue, read in the operator pod (it has etcd's credentials):
# the final keys (one read) and every event from the queue's creation up to that read's
# highest key revision (after it only deletes can follow, which the verdict does not use;
# etcd hands a replay over in batches of up to 1,000 revisions, so a batch's header
# revision cannot say it is the last one).
DUMP = """
import asyncio, json, sys
from joblease import EtcdConfig, JobLeaseClient
from joblease.keys import QueueRef

async def main(ns, name):
    async with JobLeaseClient(EtcdConfig.from_env()) as c:
        keys = c.keys.queue(QueueRef(ns, name))
        _, kvs = await c.store.get(keys.prefix, prefix=True)
        def kv(x):
            return {"createRevision": x.create_revision, "modRevision": x.mod_revision,
                    "version": x.version, "value": x.value.decode()}
        def split(key):
            field, _, item = key[len(keys.prefix):].decode().partition("/")
            return field, item
        (spec,) = [x for x in kvs if x.key == keys.spec]
        last = max(x.mod_revision for x in kvs)
        final = {}
        for x in kvs:
            field, item = split(x.key)
            if item:
                final.setdefault(field, {})[item] = kv(x)
        events = []
        async for batch in c.store.watch(keys.prefix, prefix=True,
                                         start_revision=spec.create_revision):
            for e in batch.events:
                field, item = split(e.kv.key)
                if item:
                    events.append({"kind": e.kind, "field": field, "item": item,
                                   "kv": kv(e.kv)})
            if batch.events and batch.events[-1].kv.mod_revision >= last:
                break
        print(json.dumps({"final": final, "events": events}))

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


def _example(namespace: str) -> str:
    """The example's documents in ``namespace``, with the changes the docstring gives."""
    docs = copy.deepcopy([d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d])
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "JobQueue":
            doc["spec"].update(leaseDurationSeconds=TTL, maxAttempts=0)
        if doc["kind"] == "Deployment":
            doc["spec"]["replicas"] = REPLICAS
            (worker,) = doc["spec"]["template"]["spec"]["containers"]
            worker["env"].append({"name": "JOBLEASE_EXAMPLE_WORK_SECONDS",
                                  "value": WORK_SECONDS})
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


class Feeder:
    """Enqueues items as the run goes (ids ``i00000``...), keeping about ``BACKLOG``
    pending, and remembers every acknowledged batch (the verdict's enqueues)."""

    def __init__(self, cluster: Cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.batches: list[list[str]] = []
        self.next = 0

    def top_up(self) -> None:
        counts = queue_cli(self.cluster, self.namespace, "queue", "get", QUEUE)
        missing = BACKLOG - int(counts["pending"])
        if missing <= 0:
            return
        ids = [f"i{n:05d}" for n in range(self.next, self.next + missing)]
        lines = "".join(json.dumps({"id": i, "payload": {"id": i}}) + "\n" for i in ids)
        added = queue_cli(self.cluster, self.namespace, "queue", "enqueue", QUEUE, "--file",
                          "-", stdin=lines)
        # a retried enqueue (kubectl lost the first answer) finds some already there
        assert added["added"] + added["existing"] == len(ids), added
        self.batches.append(ids)
        self.next += missing

    @property
    def total(self) -> int:
        return self.next


def _etcd_history(cluster: Cluster, namespace: str) -> dict[str, Any]:
    op_ns, op_pod = operator_pod(cluster)
    r = cluster.kubectl("exec", op_pod, "-n", op_ns, "-c", "operator", "--", "python", "-c",
                        DUMP, namespace, QUEUE, timeout=300)
    assert r.returncode == 0, r.stderr
    dumped: dict[str, Any] = json.loads(r.stdout)
    return dumped


def _run(cluster: Cluster, release: Release, ns: str, trials: int, seed: int) -> None:
    cluster.apply(_example(ns))
    queue_ready(cluster, ns, QUEUE)
    feeder = Feeder(cluster, ns)
    feeder.top_up()
    etcd_pod = json.loads(cluster.kubectl(
        "get", "pods", "-n", release.namespace, "-l",
        f"app.kubernetes.io/name=etcd,app.kubernetes.io/instance={release.name}",
        "-o", "json", check=True).stdout)["items"][0]["metadata"]["name"]
    nemesis = Nemesis(cluster, ns, SELECTOR, ttl=TTL, etcd_pod=(release.namespace, etcd_pod),
                      seed=seed)
    wait_until(lambda: len(nemesis.running_pods()) == REPLICAS, timeout=300, interval=1,
               what=f"{REPLICAS} worker pods running")
    began = time.monotonic()
    while len([t for t in nemesis.trials if not t.note]) < trials:
        trial = nemesis.one()
        print(f"{time.monotonic() - began:7.1f}s {trial}", flush=True)  # the run's log (-s)
        feeder.top_up()
    faults_for = time.monotonic() - began

    queue = f"{ns}/{QUEUE}"
    wait_until(lambda: queue_cli(cluster, ns, "queue", "get", QUEUE)["completed"]
               == feeder.total, timeout=600, interval=2,
               what=f"all {feeder.total} items completed after the faults")
    dumped = _etcd_history(cluster, ns)
    final = queue_from_etcd.final_items(queue, {
        f: {i: queue_from_etcd.Kv.from_dict(kv) for i, kv in items.items()}
        for f, items in dumped["final"].items()})
    events = [queue_from_etcd.Event.from_dict(e) for e in dumped["events"]]
    ops = queue_from_etcd.queue_ops(queue, events, feeder.batches)
    books = ledger_books(cluster, ns, [f"{QUEUE}-{i}" for batch in feeder.batches
                                       for i in batch])
    destinations = queue_from_etcd.ledger_entries(books, ops)
    violations = (queue_checker.check_queue(ops, final=final, max_attempts=0,
                                            destinations=destinations)
                  + queue_from_etcd.check_entry_tokens(ops, destinations))
    claims = [o for o in ops if o.kind == "claim" and o.phase == "ok"]
    again = sum(1 for s in final.values() if s.generation > 1)
    writes = sum(len(v) for v in destinations.values())
    print(f"\npod chaos: {len([t for t in nemesis.trials if not t.note])} trials "
          f"{nemesis.counts()} in {faults_for:.0f}s of faults; {feeder.total} items, "
          f"{len(claims)} claims ({again} items claimed more than once), {writes} accepted "
          f"ledger writes; {len(violations)} violations")
    assert not violations, "\n".join(str(v) for v in violations[:20]) + describe(
        cluster, ns, SELECTOR)
    assert len(final) == feeder.total and all(s.phase == "Completed" for s in final.values())
    # the faults did what they are for: some items lost their pod and were claimed again
    assert again > 0, nemesis.trials


@pytest.mark.timeout(1500)
def test_worker_pods_under_node_faults_complete_every_item_once_and_fenced(
        cluster: Cluster, joblease_release: Release, queue_namespace: str) -> None:
    _run(cluster, joblease_release, queue_namespace, TRIALS, seed=24)


@pytest.mark.soak
@pytest.mark.timeout(4 * 3600)
def test_soak_pod_chaos(soak: bool, cluster: Cluster, joblease_release: Release,
                        queue_namespace: str) -> None:
    assert soak  # collected only with --soak (or JOBLEASE_SOAK=1): see tests/conftest.py
    trials = int(os.environ.get("JOBLEASE_POD_CHAOS_TRIALS") or SOAK_TRIALS)
    _run(cluster, joblease_release, queue_namespace, trials, seed=int(time.time()))
