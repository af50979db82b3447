"""Issue 27 on the real cluster: a Deployment of 6 workers on a queue limited to 2 slots
(examples/queue-semaphore-deployment.yaml); a pod deleted and one frozen while they hold:
never more than 2 accepted writers at the destination, and the queue still drains.

Real: the session cluster (the shared release's webhook injects the Go sidecar image in
queue mode; its operator creates the semaphore and the queue in the bundled etcd from the
JobSemaphore and the JobQueue), the Deployment controller, examples/workers/queue-worker.sh
in the curl image writing to examples/ledger.yaml, gated on each item's token and on its
slot's (``Joblease-Slot``); the CLI and etcd's own history read in the operator pod (it
has the etcd credentials); the kernel's cgroup freezer.

What the test changes in the example, and why: the queue's TTL (5 s, not 30: the frozen
pod's lease must expire within the test's time) and the worker's hold file for items
``h1`` and ``h2`` (the example script's test hook: the first attempt at those items
lasts until a file exists), so the faults land while an item and its slot are held.

The story: pods A and B hold h1 and h2, hence both slots (the other four wait). A is
frozen whole (sidecar and worker, as a paused VM would be) and B is deleted: B's sidecar
releases h2 and its slot at once, which the next claim takes (the only free index); A's
slot is freed only when etcd expires A's lease. More items come; once another pod has
written under A's old slot index, A's worker is thawed and let go (its sidecar still
frozen: nothing can stop it), and its late write is refused by the ledger. Then A's
sidecar is thawed and the queue drains.

Judged: every item Completed exactly once in etcd (h1 and h2 by another pod, at
generation 2), one accepted ledger write per item under the completing token and one
slot below the limit; per slot, accepted slot tokens never go backwards; from etcd's
history of the slot keys: never more than 2 live, none at an index >= 2, and B's and A's
slots went to other pods after B's release and A's expiry.
"""

from __future__ import annotations

import copy
import json
import re
import time
from typing import Any

import pytest
import yaml

from tests.support import freezer
from tests.support.binaries import REPO_ROOT
from tests.support.cluster import Cluster
from tests.support.pods import container_id, exec_in
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
from tests.support.worker_pods import operator_pod

pytestmark = [pytest.mark.cluster, pytest.mark.node, pytest.mark.timeout(900)]

EXAMPLE = REPO_ROOT / "examples" / "queue-semaphore-deployment.yaml"
SEMAPHORE, QUEUE, LIMIT, TTL = "ledger-writers", "uploads", 2, 5
HOLD_FILE = "/run/joblease/go"  # in the pod's shared emptyDir
SELECTOR = "app.kubernetes.io/name=uploads"

# etcd's history of the semaphore's slot keys since a revision, replayed in the operator
# pod: every put and delete with its revision, slot index and record (the holder, owner).
HISTORY = """
import asyncio, json, sys
from joblease import EtcdConfig, JobLeaseClient
from joblease.keys import SemaphoreRef

async def main(ns, name, since):
    async with JobLeaseClient(EtcdConfig.from_env()) as c:
        keys = c.keys.semaphore(SemaphoreRef(ns, name))
        _, before = await c.store.get(keys.slots, prefix=True, revision=since)
        now, _ = await c.store.get(b"\\0")
        out = {"live": [keys.slot_index(kv.key) for kv in before], "events": []}
        async for batch in c.store.watch(keys.slots, prefix=True, start_revision=since + 1):
            for e in batch.events:
                out["events"].append({
                    "kind": e.kind, "revision": e.kv.mod_revision,
                    "index": keys.slot_index(e.kv.key),
                    "record": json.loads(e.kv.value) if e.kind == "put" else None})
            if batch.revision >= now:
                break
        print(json.dumps(out))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""


def _example(namespace: str) -> str:
    """The example's documents in ``namespace``, with the two changes the module's
    docstring gives (TTL 5 s; the hold file for h1 and h2)."""
    docs = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d]
    docs = copy.deepcopy(docs)
    for doc in docs:
        doc["metadata"]["namespace"] = namespace
        if doc["kind"] == "JobQueue":
            doc["spec"]["leaseDurationSeconds"] = TTL
        if doc["kind"] == "Deployment":
            (worker,) = doc["spec"]["template"]["spec"]["containers"]
            worker["env"] += [{"name": "JOBLEASE_EXAMPLE_HOLD_FILE", "value": HOLD_FILE},
                              {"name": "JOBLEASE_EXAMPLE_HOLD_ITEMS", "value": "h1 h2"}]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def _enqueue(cluster: Cluster, ns: str, ids: list[str]) -> None:
    lines = "".join(json.dumps({"id": i, "payload": {"id": i}}) + "\n" for i in ids)
    added = queue_cli(cluster, ns, "queue", "enqueue", QUEUE, "--file", "-", stdin=lines)
    assert added["added"] == len(ids), added


def _semaphore(cluster: Cluster, ns: str) -> dict[str, Any]:
    got: dict[str, Any] = queue_cli(cluster, ns, "semaphore", "get", SEMAPHORE)
    return got


def _semaphore_ready(cluster: Cluster, ns: str) -> dict[str, Any]:
    def ready() -> dict[str, Any] | None:
        try:
            return _semaphore(cluster, ns)
        except AssertionError:  # not_found until the operator created it
            return None
    found: dict[str, Any] = wait_until(ready, timeout=120, interval=1,
                                       what=f"semaphore {SEMAPHORE} created from its "
                                            "JobSemaphore")
    return found


def _slot_resource(ns: str, index: int) -> str:
    return f"semaphore/{ns}/{SEMAPHORE}/slot/{index}"


def _fence_mark(cluster: Cluster, ns: str, resource: str) -> int:
    """The ledger's highest accepted token for ``resource`` (GET /fences/<resource>)."""
    script = ("import json, sys, urllib.request\n"
              "print(json.load(urllib.request.urlopen("
              "'http://127.0.0.1:8080/fences/' + sys.argv[1]))['highestToken'])\n")
    r = cluster.kubectl("exec", "deploy/ledger", "-n", ns, "--", "python", "-c", script,
                        resource, timeout=60)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def _claim_of(log: str, item: str) -> tuple[int, int]:
    """(token, slot index) of the worker's first attempt at ``item``, from its log lines
    ``item <id> generation 1 token <T>`` and ``item <id> slots <ns>/<sem>/<i>=<T>``."""
    (token_line,) = [ln for ln in log.splitlines()
                     if ln.startswith(f"item {item} generation 1 ")]
    token = int(token_line.rsplit(" ", 1)[1])
    (slots_line,) = [ln for ln in log.splitlines() if ln.startswith(f"item {item} slots ")]
    found = re.fullmatch(rf"item {item} slots [^/]+/{SEMAPHORE}/(\d+)=(\d+)", slots_line)
    assert found is not None and int(found.group(2)) == token, slots_line
    return token, int(found.group(1))


def _worker_logs(cluster: Cluster, ns: str, pod: str) -> str:
    """The worker's log, its previous container's first (it exits 7 once refused)."""
    previous = cluster.kubectl("logs", pod, "-n", ns, "-c", "worker", "--previous",
                               timeout=30)
    current = cluster.kubectl("logs", pod, "-n", ns, "-c", "worker", timeout=30)
    return (previous.stdout if previous.returncode == 0 else "") + current.stdout


def _slot_history(cluster: Cluster, ns: str, since: int) -> dict[str, Any]:
    op_ns, op_pod = operator_pod(cluster)
    r = cluster.kubectl("exec", op_pod, "-n", op_ns, "-c", "operator", "--", "python", "-c",
                        HISTORY, ns, SEMAPHORE, str(since), timeout=120)
    assert r.returncode == 0, r.stderr
    history: dict[str, Any] = json.loads(r.stdout)
    return history


def _owner_pod(record: dict[str, Any]) -> str:
    return str(record["owner"]).split("/")[0]


def test_a_deployment_of_6_on_2_slots_never_has_more_than_2_writers_and_drains(
        cluster: Cluster, queue_namespace: str) -> None:
    ns = queue_namespace
    cluster.apply(_example(ns))
    assert _semaphore_ready(cluster, ns)["limit"] == LIMIT
    queue_ready(cluster, ns, QUEUE)
    since = int(_semaphore(cluster, ns)["revision"])
    began = time.monotonic()
    phases: dict[str, float] = {}  # seconds since began, printed at the end

    def phase(name: str) -> None:
        phases[name] = round(time.monotonic() - began, 1)

    # A and B hold h1 and h2, so both slots; the other four pods wait for a slot
    _enqueue(cluster, ns, ["h1", "h2"])
    held: dict[str, dict[str, Any]] = {}
    for item in ("h1", "h2"):
        def holds(item: str = item) -> dict[str, Any] | None:
            return holding(cluster, ns, SELECTOR, item)
        held[item] = wait_until(holds, timeout=300, interval=1, what=f"a pod holding {item}")
    phase("both slots held")
    a, b = held["h1"], held["h2"]
    a_name, b_name = a["metadata"]["name"], b["metadata"]["name"]
    assert a_name != b_name
    a_token, a_slot = _claim_of(_worker_logs(cluster, ns, a_name), "h1")
    b_token, b_slot = _claim_of(_worker_logs(cluster, ns, b_name), "h2")
    assert {a_slot, b_slot} == {0, 1}, (a_slot, b_slot)
    first = [f"b{n:02d}" for n in range(10)]
    _enqueue(cluster, ns, first)
    sem = _semaphore(cluster, ns)
    assert sem["live"] == LIMIT and sorted((h["holder"], h["slot"], h["token"])
                                           for h in sem["holders"]) == [
        (f"{ns}/{QUEUE}/h1", a_slot, a_token), (f"{ns}/{QUEUE}/h2", b_slot, b_token)], sem
    assert len(pods_of(cluster, ns, SELECTOR)) == 6  # the others wait (in their sidecar)

    # A frozen whole; B deleted (its sidecar releases h2 and its slot)
    a_sidecar = freezer.container_cgroup(a["metadata"]["uid"], container_id(a, "joblease"))
    a_worker = freezer.container_cgroup(a["metadata"]["uid"], container_id(a, "worker"))
    froze = time.monotonic()
    with freezer.frozen(a_sidecar), freezer.frozen(a_worker):
        cluster.kubectl("delete", "pod", b_name, "-n", ns, "--wait=false", check=True)
        wait_until(lambda: all(h["token"] != a_token
                               for h in _semaphore(cluster, ns)["holders"]),
                   timeout=60, interval=0.5, what="etcd expiring the frozen pod's lease "
                                                  "(and with it its slot)")
        # expiry, not a release: at least 2/3 TTL after A's last keep-alive (every TTL/3)
        assert time.monotonic() - froze >= TTL / 3
        phase("frozen pod's slot expired")
        second = [f"c{n:02d}" for n in range(30)]
        _enqueue(cluster, ns, second)
        # another pod has written under A's old slot index: the ledger knows a newer token
        wait_until(lambda: _fence_mark(cluster, ns, _slot_resource(ns, a_slot)) > a_token,
                   timeout=60, interval=0.5,
                   what=f"a write under slot {a_slot} after the frozen pod lost it")
        phase("its slot written by another pod")
        # A's worker thawed and let go, its sidecar still frozen: its late write
        freezer.thaw(a_worker)
        r = exec_in(cluster, ns, a_name, "worker", "touch", HOLD_FILE)
        assert r.returncode == 0, r.stderr
        refused = wait_until(
            lambda: re.search(r"write h1 -> 409 refused: (\{.*\})",
                              _worker_logs(cluster, ns, a_name)),
            timeout=60, interval=0.5, what="the frozen pod's late write answered")
    phase("late write refused")
    body = json.loads(refused.group(1))
    # refused by a fence: the slot's (another pod wrote under it: checked above) or, if
    # h1 was redone meanwhile, the item's; never accepted
    assert body["error"] == "stale" and body["token"] == a_token, body
    assert body["resource"] in (_slot_resource(ns, a_slot), f"ledger/{QUEUE}-h1"), body
    assert body["highestToken"] > a_token, body

    total = 2 + len(first) + len(second)
    wait_until(lambda: queue_cli(cluster, ns, "queue", "get", QUEUE)["completed"] == total,
               timeout=300, interval=1, what=f"all {total} items completed")
    phase("drained")
    print(f"\n{total} items drained by 6 pods on {LIMIT} slots; the late write refused on "
          f"{body['resource']}; seconds: {phases}")

    # the queue drained: every item Completed exactly once in etcd
    counts = queue_cli(cluster, ns, "queue", "get", QUEUE)
    assert (counts["total"], counts["completed"], counts["pending"], counts["held"],
            counts["failed"]) == (total, total, 0, 0, 0), (counts, describe(cluster, ns,
                                                                               SELECTOR))
    items = queue_items(cluster, ns, QUEUE)
    assert sorted(items) == sorted(["h1", "h2", *first, *second])
    for item, s in items.items():
        assert s["phase"] == "Completed" and s["holder"] is None, s
        assert s["result"]["result"] == {"item": item}, s
        assert s["generation"] == (2 if item in held else 1), s  # again only if lost
    for item, (pod, token) in {"h1": (a_name, a_token), "h2": (b_name, b_token)}.items():
        assert items[item]["result"]["token"] > token
        assert items[item]["result"]["owner"].split("/")[0] != pod

    # one accepted write per item, under its completing token and one slot below the limit
    names = {i: f"{QUEUE}-{i}" for i in items}
    books = ledger_books(cluster, ns, list(names.values()))
    entries = []
    for item, s in items.items():
        book = books[names[item]]
        (entry,) = book["entries"]  # the frozen pod's late write for h1 was not accepted
        assert entry["token"] == s["result"]["token"] == book["highestToken"], (item, book)
        (slot,) = entry["slots"]
        assert slot["token"] == entry["token"], entry
        assert slot["resource"] in {_slot_resource(ns, i) for i in range(LIMIT)}, entry
        entries.append(entry)
    # per slot, the accepted slot tokens never go backwards (in the ledger's commit order)
    per_slot: dict[str, list[int]] = {}
    for entry in sorted(entries, key=lambda e: e["seq"]):
        per_slot.setdefault(entry["slots"][0]["resource"], []).append(entry["token"])
    for resource, tokens in per_slot.items():
        assert tokens == sorted(tokens), (resource, tokens)
        assert _fence_mark(cluster, ns, resource) == tokens[-1]

    # etcd's own history of the slot keys: never more than 2 live, none at index >= 2
    history = _slot_history(cluster, ns, since)
    live, most = set(history["live"]), len(history["live"])
    grants = []
    for e in history["events"]:
        assert e["index"] < LIMIT, e
        if e["kind"] == "put":
            live.add(e["index"])
            grants.append(e)
        else:
            live.discard(e["index"])
        most = max(most, len(live))
    assert most == LIMIT, most  # reached (A and B), never exceeded
    assert len(grants) >= total + 2  # every claim took a slot (h1, h2: twice)
    # B's slot, freed by its release, and A's, freed by etcd's expiry, went to other pods
    for pod, index, token in ((b_name, b_slot, b_token), (a_name, a_slot, a_token)):
        freed = next(e["revision"] for e in history["events"]
                     if e["kind"] == "delete" and e["index"] == index
                     and e["revision"] > token)
        taken = next(e for e in grants if e["index"] == index and e["revision"] > freed)
        assert _owner_pod(taken["record"]) != pod, taken
    # while A's lease lived on (frozen), every new grant was at B's old index
    a_freed = next(e["revision"] for e in history["events"]
                   if e["kind"] == "delete" and e["index"] == a_slot
                   and e["revision"] > a_token)
    between = [e for e in grants if max(a_token, b_token) < e["revision"] < a_freed]
    assert between and all(e["index"] == b_slot for e in between), between
