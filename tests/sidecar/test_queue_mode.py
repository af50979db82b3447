"""The Go sidecar in queue mode (docs/sidecar.md, "Queue mode"; docs/queues.md) on a real
etcd, driven as a worker drives it: the Python library enqueues and the sidecar drains,
the seed example per item, a single-item sidecar whose item is already completed, a
CronJob slot created by the sidecar, and records crossing between the two implementations
through etcd (Python-written items read by Go, Go-written records and results read by
Python). Every answer is also held to docs/sidecar-api.yaml.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from joblease import JobLeaseClient
from joblease.errors import HeldError
from joblease.keys import ItemRef, QueueRef
from joblease.lease import Lease
from joblease.queue import ItemPhase, Queues
from joblease.records import ItemRecord, PendingRecord, QueueSpec
from tests.support.etcd_keys import snapshot, writes
from tests.support.openapi_conformance import Conformance
from tests.support.sidecar_process import Env, Sidecar
from tests.support.waiting import poll

VECTORS = json.loads((Path(__file__).resolve().parents[1] / "vectors" / "queue_records.json")
                     .read_text())


@pytest.fixture
def queues(client: JobLeaseClient) -> Queues:
    return Queues(client)


@pytest.fixture
def conformance() -> Conformance:
    return Conformance()


def queue_ref() -> QueueRef:
    return QueueRef("default", "q-" + uuid.uuid4().hex[:8])


def sidecar(env: Env, name: str, queue: QueueRef, **extra: str) -> Sidecar:
    """A sidecar in queue mode: JOBLEASE_QUEUE instead of the job the harness would name."""
    return env.sidecar(name, JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(queue),
                       JOBLEASE_SIDECAR_RATE_LIMIT="off", **extra)


async def lease_view(s: Sidecar, conformance: Conformance) -> dict[str, Any]:
    r = await s.request("GET", "/v1/lease")
    conformance.check("/v1/lease", "GET", r)
    return {"status": r.status_code, **r.json()}


async def post(s: Sidecar, conformance: Conformance, path: str, body: dict[str, Any]
               ) -> tuple[int, dict[str, Any]]:
    r = await s.request("POST", path, json=body)
    conformance.check(path, "POST", r)
    return r.status_code, r.json()


async def next_answer(s: Sidecar, conformance: Conformance, after_token: int = 0,
                      timeout: float = 15) -> dict[str, Any]:
    """What a draining worker waits for: a held item newer than ``after_token``, or a
    final answer."""
    async def check() -> dict[str, Any] | None:
        view = await lease_view(s, conformance)
        if view["status"] == 200 and view["token"] > after_token:
            return view
        return view if view["status"] == 409 else None
    answer: dict[str, Any] = await poll(check, timeout, f"{s.name}'s next item")
    return answer


async def test_the_sidecar_drains_what_python_enqueued_each_item_completed_once(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    payloads = {f"f{i}": {"file": f"s3://bucket/{i}", "n": i} for i in range(4)}
    await queues.enqueue(q, list(payloads.items()))
    s = await sidecar(env, "drain", q, JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    seen: dict[str, int] = {}
    token = 0
    for _ in payloads:
        view = await next_answer(s, conformance, token)
        assert view["status"] == 200, view
        assert view["state"] == "held" and view["queue"] == str(q), view
        item = view["item"]
        assert view["job"] == f"{q}/{item}"
        assert view["payload"] == payloads[item]  # the payload Python enqueued, over HTTP
        assert s.token_file.read_text().strip() == str(view["token"])  # rewritten per item
        info = json.loads((s.workdir / "token.json").read_text())
        assert (info["queue"], info["item"], info["token"]) == (str(q), item, view["token"])
        token = view["token"]
        status, body = await post(s, conformance, "/v1/complete",
                                  {"token": token, "result": {"did": view["payload"]["file"]}})
        assert status == 200 and body["token"] == token, body
        # a retried completion of this item gets the same answer, even once the next is held
        status, again = await post(s, conformance, "/v1/complete",
                                   {"token": token, "result": {"did": view["payload"]["file"]}})
        assert (status, again) == (200, body)
        seen[item] = token
    assert sorted(seen) == sorted(payloads)
    final = await next_answer(s, conformance, token)
    assert final["status"] == 409 and final["error"] == "completed", final
    assert final["exitCode"] == 0 and final["item"] is None and final["result"] is None
    s.signal(signal.SIGTERM)  # a native sidecar is stopped once the worker exited
    assert await s.wait_exit(15) == 0, s.output()
    for item, tok in seen.items():
        state = await queues.item(ItemRef(q, item))
        assert state.phase is ItemPhase.COMPLETED
        assert state.result is not None and state.result.token == tok
        assert state.result.result == {"did": payloads[item]["file"]}
        assert state.generation == 1  # claimed once, completed once
    counts = await queues.counts(q)
    assert (counts.total, counts.completed, counts.pending, counts.held) == (4, 4, 0, 0)


async def test_an_empty_queue_is_waited_on_with_a_watch_not_a_poll(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=0))
    # claim retries 20-40 s apart: only the watch can make it claim within seconds
    s = await sidecar(env, "waiter", q, JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL="20",
                      JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX="40").started()
    waiting = await poll(lambda: _waiting(s, conformance), 15, "the sidecar to wait for an item")
    assert waiting["item"] is None and waiting["queue"] == str(q)
    assert "waiting for an item" in waiting["message"]
    ready = await s.request("GET", "/readyz")
    conformance.check("/readyz", "GET", ready)
    assert ready.status_code == 503 and ready.json()["state"] == "waiting"
    await queues.enqueue(q, [("late", {"k": "v"})])
    enqueued = time.monotonic()
    view = await next_answer(s, conformance, 0, timeout=10)
    assert view["status"] == 200 and view["item"] == "late" and view["payload"] == {"k": "v"}
    assert time.monotonic() - enqueued < 5, "claimed a backoff late: no watch woke it"
    # a released item is claimable at once: the draining sidecar claims it again (generation 2)
    status, body = await post(s, conformance, "/v1/release", {"token": view["token"]})
    assert status == 200 and body == {"state": "released", "token": view["token"]}
    again = await next_answer(s, conformance, view["token"], timeout=10)
    assert again["item"] == "late" and again["generation"] == 2
    metrics = await s.metrics()
    assert metrics["joblease_sidecar_claims_total"] == 2


async def long_poll(s: Sidecar, conformance: Conformance, wait: float) -> dict[str, Any]:
    """``GET /v1/lease?wait=...``: the answer once the sidecar moved on (or the wait ran out)."""
    r = await s.request("GET", "/v1/lease", params={"wait": str(wait)}, timeout=wait + 10)
    conformance.check("/v1/lease", "GET", r)
    return {"status": r.status_code, **r.json()}


async def test_a_long_poll_answers_the_next_item_once_claimed_never_the_one_just_ended(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """A draining worker on ``GET /v1/lease?wait=``: it waits on an empty queue until an
    item is claimed, gets each next item right after completing (or releasing) the last,
    never that item's 409, a 503 once the wait runs out with nothing claimable, and an
    answer at once when the sidecar is stopped."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    s = await sidecar(env, "longpoll", q).started()
    first = asyncio.create_task(long_poll(s, conformance, 30))
    done, _ = await asyncio.wait({first}, timeout=0.5)
    assert not done, "the long poll answered while the queue was empty"
    await queues.enqueue(q, [(f"lp{i}", {"n": i}) for i in range(4)])
    view = await asyncio.wait_for(first, 20)
    assert view["status"] == 200 and view["state"] == "held", view
    tokens = [view["token"]]
    done_items = {view["item"]}
    status, _ = await post(s, conformance, "/v1/release", {"token": view["token"]})
    assert status == 200
    while True:  # the released item comes back (generation 2) among the others
        view = await long_poll(s, conformance, 8)
        if view["status"] == 503:
            break
        assert view["status"] == 200 and view["token"] > tokens[-1], view
        tokens.append(view["token"])
        status, body = await post(s, conformance, "/v1/complete",
                                  {"token": view["token"], "result": view["payload"]})
        assert status == 200 and body["token"] == view["token"], body
        done_items.add(view["item"])
        assert len(tokens) <= 5, tokens
    assert view["state"] == "waiting" and view["item"] is None, view  # nothing left: it waited 8 s
    assert len(tokens) == 5 and done_items == {f"lp{i}" for i in range(4)}, tokens
    counts = await queues.counts(q)
    assert (counts.completed, counts.pending, counts.held) == (4, 0, 0)
    stopped = asyncio.create_task(long_poll(s, conformance, 30))
    done, _ = await asyncio.wait({stopped}, timeout=0.5)
    assert not done
    asked = time.monotonic()
    s.signal(signal.SIGTERM)
    view = await asyncio.wait_for(stopped, 10)
    assert view["status"] == 503 and time.monotonic() - asked < 10, view
    assert await s.wait_exit(15) == 0, s.output()


async def _waiting(s: Sidecar, conformance: Conformance) -> dict[str, Any] | None:
    view = await lease_view(s, conformance)
    return view if view["state"] == "waiting" else None


async def claim_once_free(queues: Queues, item: ItemRef, owner: str) -> Lease:
    """Python's claim of ``item``, retried while another holder (a paused sidecar whose TTL
    has not run out in etcd yet) still has it."""
    async def claims() -> Lease | None:
        try:
            return await queues.claim(item, owner)
        except HeldError:
            return None
    lease: Lease = await poll(claims, 15, f"{owner} to claim {item} after the holder's TTL")
    return lease


async def test_a_paused_item_holder_loses_and_its_completion_is_stale(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """The seed example per item: A holds x (TTL 2 s) and is SIGSTOPped past its TTL;
    Python claims x with a larger token; A resumed cannot complete: 409 stale, nothing
    written; Python's completion is the one accepted."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=2, max_attempts=0))
    await queues.enqueue(q, [("x", {"part": 1})])
    a = await sidecar(env, "a", q, JOBLEASE_ITEM="x").started()
    lease_a = await a.held()
    assert lease_a["item"] == "x" and lease_a["payload"] == {"part": 1}
    a.signal(signal.SIGSTOP)
    paused = time.monotonic()

    lease_b = await claim_once_free(queues, ItemRef(q, "x"), "python-b")
    assert time.monotonic() - paused > 1.5  # only once A's TTL ran out in etcd
    assert lease_b.token > lease_a["token"] and lease_b.generation == lease_a["generation"] + 1

    a.signal(signal.SIGCONT)
    after = await lease_view(a, conformance)
    assert after["status"] == 409 and after["error"] == "lost", after
    assert not a.token_file.exists()
    prefix = queues.keys(q).prefix
    before = await snapshot(client.store, prefix)
    status, body = await post(a, conformance, "/v1/complete",
                              {"token": lease_a["token"], "result": "from a"})
    assert status == 409 and body["error"] == "stale", body
    assert body["token"] == lease_a["token"] and body["currentToken"] == lease_b.token
    assert not writes(before, await snapshot(client.store, prefix))  # nothing written
    await lease_b.complete({"by": "python"})
    state = await queues.item(ItemRef(q, "x"))
    assert state.result is not None and state.result.token == lease_b.token


async def test_a_draining_sidecar_that_lost_an_item_signals_its_worker_and_drains_on(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """On-loss ``signal`` while draining (docs/sidecar.md, "Queue mode"): A holds x
    (TTL 2 s) and is SIGSTOPped past its TTL; Python claims x. Resumed, A sends its
    worker SIGTERM and claims the next item, y, under a new token; its completion under
    x's token is refused, nothing written. (It used to stay ``lost`` for good, so a
    Deployment's pod whose item was lost once never worked again.)"""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=2, max_attempts=0))
    await queues.enqueue(q, [("x", {"part": 1})])
    sleep = shutil.which("sleep")
    assert sleep is not None
    worker = env.spawn("dummy-worker", [sleep, "300"])
    pid_file = env.tmp / "worker.pid"
    pid_file.write_text(f"{worker.pid}\n")
    a = await sidecar(env, "a", q, JOBLEASE_SIDECAR_ON_LOSS="signal",
                      JOBLEASE_WORKER_PID_FILE=str(pid_file)).started()
    lease_a = await a.held()
    assert lease_a["item"] == "x"
    a.signal(signal.SIGSTOP)

    lease_b = await claim_once_free(queues, ItemRef(q, "x"), "python-b")
    await queues.enqueue(q, [("y", {"part": 2})])
    a.signal(signal.SIGCONT)

    await poll(lambda: worker.returncode() is not None, 15, "A's worker to be signalled")
    assert worker.returncode() == -signal.SIGTERM
    following = await next_answer(a, conformance, after_token=lease_a["token"])
    assert following["status"] == 200 and following["item"] == "y", following
    assert following["token"] > lease_b.token
    prefix = queues.keys(q).prefix
    before = await snapshot(client.store, prefix)
    status, body = await post(a, conformance, "/v1/complete",
                              {"token": lease_a["token"], "result": "late, from a"})
    assert status == 409 and body["error"] in ("stale", "lost"), body
    assert not writes(before, await snapshot(client.store, prefix))
    status, body = await post(a, conformance, "/v1/complete",
                              {"token": following["token"], "result": "y by a"})
    assert status == 200, body
    await lease_b.complete({"by": "python"})
    x = await queues.item(ItemRef(q, "x"))
    assert x.result is not None and x.result.token == lease_b.token
    assert a.returncode() is None


async def test_a_single_item_sidecar_on_a_completed_item_ends_without_work(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """As for a completed JobLease: 409 completed with exit code 0 and the result, no
    token file, and with on-final exit the sidecar exits 0 (the pod ends Succeeded)."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=3, shards=3))
    done = await queues.claim(ItemRef(q, "1"), "earlier-pod")
    await done.complete({"shard": 1})
    s = sidecar(env, "done", q, JOBLEASE_ITEM="1", JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await s.wait_exit(15) == 0, s.output()
    assert s.logged("job already completed; nothing to do")
    assert not s.token_file.exists()
    served = await sidecar(env, "served", q, JOBLEASE_ITEM="1").started()
    view = await poll(lambda: _final(served, conformance), 15, "the final answer")
    assert view["error"] == "completed" and view["exitCode"] == 0
    assert view["result"]["result"] == {"shard": 1} and view["result"]["token"] == done.token
    assert view["job"] == f"{q}/1" and view["item"] == "1"
    ready = await served.request("GET", "/readyz")  # a startup probe must pass once
    assert ready.status_code == 200
    # another shard of the same Indexed Job is claimed as usual
    other = await sidecar(env, "shard0", q, JOBLEASE_ITEM="0").started()
    held = await other.held()
    assert held["item"] == "0" and held["payload"] is None


async def _final(s: Sidecar, conformance: Conformance) -> dict[str, Any] | None:
    view = await lease_view(s, conformance)
    return view if view["status"] == 409 else None


async def test_records_cross_between_python_and_go_through_etcd(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """Python-written items (the shared vectors' payloads) are read by Go byte-exact over
    HTTP; a CronJob slot the Go sidecar creates and completes is read by Python, its
    records byte for byte what Python writes."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=3))
    both = [v for v in VECTORS["item"] if v["direction"] == "both"]
    for v in both:
        await queues.enqueue(q, [(v["name"], v["meaning"]["payload"])])
        s = await sidecar(env, "read-" + v["name"], q, JOBLEASE_ITEM=v["name"]).started()
        view = await s.held()
        # the number beyond 2**53 and the escaped text arrive exactly as enqueued
        assert view["payload"] == v["meaning"]["payload"], v["name"]
        status, _ = await post(s, conformance, "/v1/complete",
                               {"token": view["token"], "result": v["meaning"]["payload"]})
        assert status == 200
        state = await queues.item(ItemRef(q, v["name"]))
        assert state.result is not None and state.result.result == v["meaning"]["payload"]

    slot = "2026-12-01T23:00:00Z"
    s = await sidecar(env, "slot", q, JOBLEASE_ITEM=slot, JOBLEASE_ITEM_CREATE="true").started()
    view = await s.held()
    assert view["item"] == slot and view["payload"] is None and view["generation"] == 1
    keys = queues.keys(q).item(slot)
    _, item_kvs = await client.store.get(keys.item)
    _, pending_kvs = await client.store.get(keys.pending)
    record = ItemRecord.decode(item_kvs[0].value)  # Go-written, read by Python
    assert record.payload is None
    assert ItemRecord(None, record.enqueued_at).encode() == item_kvs[0].value  # byte for byte
    pending = PendingRecord.decode(pending_kvs[0].value)
    assert PendingRecord(pending.attempts_from, pending.since).encode() == pending_kvs[0].value
    assert pending.attempts_from == 0
    status, body = await post(s, conformance, "/v1/checkpoint",
                              {"token": view["token"], "data": {"step": 1}})
    assert status == 200 and body["data"] == {"step": 1}
    status, body = await post(s, conformance, "/v1/complete",
                              {"token": view["token"], "result": {"rows": 7}})
    assert status == 200 and body["token"] == view["token"]
    state = await queues.item(ItemRef(q, slot))
    assert state.phase is ItemPhase.COMPLETED and state.result is not None
    assert (state.result.token, state.result.result) == (view["token"], {"rows": 7})
    _, pending_after = await client.store.get(keys.pending)
    assert pending_after == []  # the completion left the pending set
    # a second pod for the same slot, after it completed, does no work
    late = sidecar(env, "late", q, JOBLEASE_ITEM=slot, JOBLEASE_ITEM_CREATE="true",
                   JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await late.wait_exit(15) == 0, late.output()
    assert late.logged("job already completed; nothing to do")
    counts = await queues.counts(q)
    assert (counts.total, counts.completed) == (len(both) + 1, len(both) + 1)


async def test_queue_mode_settings_are_refused_when_they_contradict(env: Env) -> None:
    """Bad settings are usage errors (exit 2) before anything connects."""
    q = queue_ref()
    for name, extra in {
        "both": {"JOBLEASE_JOB_NAME": "j", "JOBLEASE_QUEUE": str(q)},
        "create-without-item": {"JOBLEASE_JOB_NAME": "", "JOBLEASE_QUEUE": str(q),
                                "JOBLEASE_ITEM_CREATE": "true"},
        "bad-id": {"JOBLEASE_JOB_NAME": "", "JOBLEASE_QUEUE": str(q), "JOBLEASE_ITEM": "a/b"},
    }.items():
        s = env.sidecar("bad-" + name, **extra)
        assert await s.wait_exit(15) == 2, s.output()
        assert "Error:" in s.output()


async def test_an_item_never_enqueued_is_a_final_not_found(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """Within the registration wait the item is waited for; after it, 409 failed /
    not_found naming the item (exit 3 with on-final exit), nothing written."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=3))
    s = await sidecar(env, "absent", q, JOBLEASE_ITEM="nope",
                      JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.5").started()
    view = await poll(lambda: _final(s, conformance), 15, "the final answer")
    assert view["error"] == "failed" and view["reason"] == "not_found", view
    assert view["exitCode"] == 3 and view["item"] == "nope"
    assert "was it enqueued?" in view["message"]
    assert (await queues.counts(q)).total == 0
    exits = sidecar(env, "absent-exit", q, JOBLEASE_ITEM="nope",
                    JOBLEASE_SIDECAR_REGISTRATION_WAIT="0.2", JOBLEASE_SIDECAR_ON_FINAL="exit")
    assert await exits.wait_exit(15) == 3, exits.output()


async def test_a_suspended_queue_is_waited_on_and_claimed_once_resumed(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """A draining sidecar (state waiting) and a single-item one (state claiming), each on
    a suspended queue of its own, claim within seconds of the resume although their claim
    retries are 20-40 s apart: a watch of the spec wakes them."""
    q, q1 = queue_ref(), queue_ref()
    suspended = QueueSpec(lease_duration_seconds=5, max_attempts=3, suspend=True)
    for queue, item in ((q, "a"), (q1, "b")):
        await queues.create(queue, suspended)
        await queues.enqueue(queue, [(item, None)])
    slow = {"JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL": "20",
            "JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX": "40"}
    s = await sidecar(env, "suspended", q, **slow).started()
    one = await sidecar(env, "suspended-b", q1, JOBLEASE_ITEM="b", **slow).started()
    await poll(lambda: _waiting(s, conformance), 15, "the sidecar to wait on the suspended queue")
    await poll(lambda: one.logged("queue suspended; waiting for it to be resumed"), 15,
               "the single-item sidecar to wait on the suspended queue")
    assert (await lease_view(one, conformance))["state"] == "claiming"
    assert s.logged("queue suspended; waiting for it to be resumed")
    for queue in (q, q1):
        counts = await queues.counts(queue)
        assert (counts.held, counts.pending) == (0, 1)  # nothing claimed
    resumed = time.monotonic()
    for queue in (q, q1):
        await queues.create(queue, QueueSpec(lease_duration_seconds=5, max_attempts=3))
    view = await next_answer(s, conformance, 0, timeout=10)
    assert view["status"] == 200 and view["item"] == "a"
    assert (await one.held(timeout=10))["item"] == "b"
    assert time.monotonic() - resumed < 5, "claimed a backoff late: no watch of the spec woke it"
    # waiting is a watch: a handful of claim attempts, not a loop
    for sc in (s, one):
        assert (await sc.metrics())["joblease_sidecar_claim_attempts_total"] <= 4


async def test_a_single_item_sidecar_takes_its_queues_semaphore_slot(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """The item's claim takes a slot of the semaphore its queue names, in the claim's
    transaction; while the library holds the only slot, the sidecar waits (503
    waiting); the completion frees the slot (docs/semaphores.md;
    tests/sidecar/test_semaphores.py has the draining and job cases)."""
    from joblease.keys import JobRef, SemaphoreRef
    from joblease.records import JobSpec, SemaphoreUse
    from joblease.semaphore import Semaphores
    q = queue_ref()
    sem = SemaphoreRef(q.namespace, "db-" + q.name)
    await Semaphores(client).create(sem, 1)
    uses = (SemaphoreUse(sem.name, 1),)
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=3, semaphores=uses))
    await queues.enqueue(q, [("a", None)])
    hog = JobRef(q.namespace, "hog-" + q.name)
    await client.register(hog, JobSpec(lease_duration_seconds=5, semaphores=uses))
    held = await client.claim(hog, "python")
    s = await sidecar(env, "limited", q, JOBLEASE_ITEM="a").started()
    view = await poll(lambda: _waiting(s, conformance), 15, "the wait for a slot")
    assert view["status"] == 503 and view["semaphore"] == str(sem) and view["item"] == "a", view
    assert (await queues.counts(q)).held == 0  # nothing claimed past the limit
    await held.release()
    view = await next_answer(s, conformance)
    assert view["status"] == 200 and view["item"] == "a", view
    assert view["semaphores"] == [{"semaphore": str(sem), "slots": [0], "token": view["token"]}]
    status, _ = await post(s, conformance, "/v1/complete", {"token": view["token"]})
    assert status == 200
    _, slots = await client.store.get(client.keys.semaphore(sem).slots, prefix=True)
    assert slots == []  # the completion deleted the slot in its transaction


async def complete_next(s: Sidecar, conformance: Conformance, token: int, result: Any,
                        next_: str | list[str]) -> tuple[int, dict[str, Any]]:
    """``POST /v1/complete?next=...`` (docs/sidecar.md, "The next item in the completion's
    answer"), held to the document."""
    params = [("next", v) for v in ([next_] if isinstance(next_, str) else next_)]
    r = await s.request("POST", "/v1/complete", params=params,
                        json={"token": token, "result": result}, timeout=70)
    conformance.check("/v1/complete", "POST", r)
    return r.status_code, r.json()


async def test_each_completion_with_next_answers_with_the_next_item_then_the_drained_queue(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """One exchange per item: each ``complete?next=`` answers with its record under
    ``completed`` and the next item, held, whose token files are already written when the
    answer arrives; the last one's next is the drained queue's final answer (409,
    ``exitCode`` 0). Every item is completed once, with the result sent."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    payloads = {f"n{i}": {"n": i} for i in range(4)}
    await queues.enqueue(q, list(payloads.items()))
    s = await sidecar(env, "chain", q, JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    view = await next_answer(s, conformance)
    assert view["status"] == 200, view
    seen: dict[str, int] = {}
    while True:
        item, token = view["item"], view["token"]
        assert item not in seen and view["payload"] == payloads[item], view
        seen[item] = token
        status, body = await complete_next(s, conformance, token, {"did": item}, "10")
        assert status == 200 and set(body) == {"completed", "next", "nextStatus"}, body
        assert body["completed"]["token"] == token
        assert body["completed"]["result"] == {"did": item}
        view = {"status": body["nextStatus"], **body["next"]}
        if view["status"] != 200:
            break
        assert view["state"] == "held" and view["token"] > token, view
        # the next item's token files were written before its answer was sent
        assert s.token_file.read_text().strip() == str(view["token"])
        info = json.loads((s.workdir / "token.json").read_text())
        assert (info["item"], info["token"]) == (view["item"], view["token"])
        if len(seen) == 1:  # a repeated completion: the same record, the lease as it is now
            status, again = await complete_next(s, conformance, token, {"did": item}, "10")
            assert (status, again["completed"]) == (200, body["completed"]), again
            assert again["nextStatus"] == 200 and again["next"]["token"] == view["token"]
    assert view["status"] == 409 and view["error"] == "completed", view
    assert view["exitCode"] == 0 and view["item"] is None
    assert sorted(seen) == sorted(payloads)
    for item, tok in seen.items():
        state = await queues.item(ItemRef(q, item))
        assert state.phase is ItemPhase.COMPLETED and state.generation == 1
        assert state.result is not None and state.result.token == tok
        assert state.result.result == {"did": item}


async def test_the_next_wait_runs_out_with_the_waiting_answer_and_a_late_item_follows(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """The queue empty after the completion: the answer comes once ``next`` ran out, the
    completion reported (200, its record) and ``next`` the 503 ``waiting``; an item
    enqueued later is what ``GET /v1/lease?wait=`` then finds."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    await queues.enqueue(q, [("only", None)])
    s = await sidecar(env, "runout", q).started()
    view = await s.held()
    asked = time.monotonic()
    status, body = await complete_next(s, conformance, view["token"], "r", "1.5")
    waited = time.monotonic() - asked
    assert status == 200 and body["completed"]["token"] == view["token"], body
    assert body["nextStatus"] == 503 and body["next"]["state"] == "waiting", body
    assert body["next"]["item"] is None and waited >= 1.4, (waited, body)
    state = await queues.item(ItemRef(q, "only"))
    assert state.phase is ItemPhase.COMPLETED
    await queues.enqueue(q, [("late", {"k": 1})])
    later = await long_poll(s, conformance, 20)
    assert later["status"] == 200 and later["item"] == "late", later


async def test_a_stale_completion_with_next_is_refused_alone_and_nothing_changes(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """A completion refused (a token not the current one) gets the same 409 ``stale`` as
    without ``next``, no ``next`` beside it, and nothing is written: the held item stays
    held under its token, no other item is claimed."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    await queues.enqueue(q, [("a", None), ("b", None)])
    s = await sidecar(env, "stale", q).started()
    view = await s.held()
    prefix = queues.keys(q).prefix
    before = await snapshot(client.store, prefix)
    status, body = await complete_next(s, conformance, view["token"] + 1000, "x", "5")
    assert status == 409 and body["error"] == "stale", body
    assert "completed" not in body and "next" not in body
    assert body["currentToken"] == view["token"]
    assert not writes(before, await snapshot(client.store, prefix))
    again = await lease_view(s, conformance)
    assert (again["status"], again["item"], again["token"]) == (200, view["item"], view["token"])


async def test_bad_next_values_and_next_outside_draining_are_400_and_change_nothing(
        env: Env, queues: Queues, client: JobLeaseClient, conformance: Conformance) -> None:
    """``next`` is one number of seconds above 0 up to 60, and only for a draining
    sidecar: anything else is 400 ``invalid`` before the body is read, nothing is written
    and the item stays held."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    await queues.enqueue(q, [("a", None)])
    s = await sidecar(env, "badnext", q).started()
    view = await s.held()
    prefix = queues.keys(q).prefix
    before = await snapshot(client.store, prefix)
    for bad in ("0", "-1", "", "soon", "NaN", "inf", "60.5", ["1", "2"]):
        status, body = await complete_next(s, conformance, view["token"], "x", bad)
        assert status == 400 and body["error"] == "invalid" and "next" in body["message"], \
            (bad, body)
    assert not writes(before, await snapshot(client.store, prefix))
    again = await lease_view(s, conformance)
    assert (again["status"], again["token"]) == (200, view["token"])
    # one item's sidecar (an Indexed Job's pod) claims no next item: next is refused
    shards = queue_ref()
    await queues.create(shards, QueueSpec(lease_duration_seconds=10, max_attempts=3, shards=1))
    single = await sidecar(env, "single", shards, JOBLEASE_ITEM="0").started()
    held = await single.held()
    prefix = queues.keys(shards).prefix
    before = await snapshot(client.store, prefix)
    status, body = await complete_next(single, conformance, held["token"], "x", "5")
    assert status == 400 and body["error"] == "invalid", body
    assert "draining a queue" in body["message"]
    assert not writes(before, await snapshot(client.store, prefix))
    assert (await lease_view(single, conformance))["token"] == held["token"]


async def test_an_items_history_is_one_history_whichever_implementation_claims(
        env: Env, queues: Queues, conformance: Conformance) -> None:
    """docs/history.md, "Queue items": a Python claim released, then the Go
    sidecar's claim of the same item (its first guess of the generation, the
    round's 0, is refused by the claim's compare and corrected), a checkpoint
    and its completion: Python reads both tenures, the sidecar's written by
    its own claim and checkpoint transactions under ``Q/history/<id>/``."""
    q = queue_ref()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3,
                                     history_limit=3))
    await queues.enqueue(q, [("x", {"n": 1})])
    first = await queues.claim(ItemRef(q, "x"), "python")
    await first.release()
    s = await sidecar(env, "hist", q, JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    view = await next_answer(s, conformance)
    assert view["status"] == 200 and view["item"] == "x" and view["generation"] == 2, view
    status, _ = await post(s, conformance, "/v1/checkpoint", {"token": view["token"],
                                                               "data": {"half": True}})
    assert status == 200
    status, _ = await post(s, conformance, "/v1/complete", {"token": view["token"],
                                                             "result": "ok"})
    assert status == 200
    history = await queues.history(ItemRef(q, "x"))
    assert [(t.generation, t.token, t.end.value, t.checkpoints) for t in history.tenures] == [
        (1, first.token, "released", 0), (2, view["token"], "completed", 1)]
    assert history.tenures[1].owner == view["owner"]
    s.signal(signal.SIGTERM)
    assert await s.wait_exit(15) == 0, s.output()
