"""examples/workers/queue-worker.sh (the worker of every queue example) beside the real
Go sidecar in queue mode, on a real etcd, writing to the real example ledger
(joblease.fencing.destination, served by uvicorn): what the cluster examples run, here
in seconds. The script is run by ``sh`` with curl, as in the curl image."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from joblease import JobLeaseClient
from joblease.fencing.destination import create_app
from joblease.fencing.http import HEADER_JOB, HEADER_SLOT, HEADER_TOKEN
from joblease.keys import ItemRef, QueueRef, SemaphoreRef
from joblease.queue import ItemPhase, Queues
from joblease.records import QueueSpec, SemaphoreUse
from joblease.semaphore import Semaphores
from tests.support.served import Served
from tests.support.sidecar_process import Env

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "workers" / "queue-worker.sh"


@pytest.fixture
def ledger(tmp_path: Path) -> Any:
    served = Served(create_app(str(tmp_path / "ledger.sqlite"))).start()
    yield served
    served.stop()


def _queue() -> QueueRef:
    return QueueRef("default", "q-" + uuid.uuid4().hex[:8])


def _entries(ledger: Served, resource: str) -> dict[str, Any]:
    found: dict[str, Any] = httpx.get(f"{ledger.url}/resources/{resource}", timeout=10).json()
    return found


async def test_the_script_drains_a_queue_one_fenced_write_per_item(
        env: Env, client: JobLeaseClient, ledger: Served) -> None:
    queues = Queues(client)
    q = _queue()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    ids = [f"i{n}" for n in range(5)] + ["2026-12-01T23:05:00Z"]  # a slot id, with ':'
    # every payload repeats the lease's own field names: the script must read the
    # sidecar's fields, not the payload's (an earlier script took the last match)
    decoy = {"token": 1, "item": "decoy", "queue": "x/y", "generation": 9, "error": "lost"}
    await queues.enqueue(q, [(i, {"n": n, **decoy}) for n, i in enumerate(ids)])
    s = await env.sidecar("drain", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q),
                          JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    worker = env.spawn_with("queue-worker", ["sh", str(SCRIPT)], {
        "JOBLEASE_SIDECAR_URL": s.url, "LEDGER_URL": ledger.url})
    assert await worker.wait_exit(60) == 0, worker.output()
    assert "nothing more to do" in worker.output()
    for i in ids:
        state = await queues.item(ItemRef(q, i))
        assert state.phase is ItemPhase.COMPLETED and state.generation == 1, state
        assert state.result is not None and state.result.result == {"item": i}
        book = _entries(ledger, f"{q.name}-{i.replace(':', '.')}")
        (entry,) = book["entries"]
        assert entry["token"] == state.result.token == book["highestToken"], book
        assert entry["job"] == f"{q}/{i}" and entry["data"]["item"] == i, entry


async def test_the_script_on_a_completed_slot_exits_0_without_working(
        env: Env, client: JobLeaseClient, ledger: Served) -> None:
    queues = Queues(client)
    q = _queue()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3))
    slot = "2026-12-01T23:06:00Z"
    first = await env.sidecar("first", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q),
                              JOBLEASE_ITEM=slot, JOBLEASE_ITEM_CREATE="true").started()
    w1 = env.spawn_with("w1", ["sh", str(SCRIPT)], {"JOBLEASE_SIDECAR_URL": first.url,
                                                     "LEDGER_URL": ledger.url})
    assert await w1.wait_exit(60) == 0, w1.output()
    assert f"complete {slot} -> 200" in w1.output()
    # a second Job for the same slot: its sidecar finds the slot completed
    second = await env.sidecar("second", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q),
                               JOBLEASE_ITEM=slot, JOBLEASE_ITEM_CREATE="true").started()
    w2 = env.spawn_with("w2", ["sh", str(SCRIPT)], {"JOBLEASE_SIDECAR_URL": second.url,
                                                     "LEDGER_URL": ledger.url})
    assert await w2.wait_exit(60) == 0, w2.output()
    assert "nothing more to do" in w2.output() and "write" not in w2.output()
    (entry,) = _entries(ledger, f"{q.name}-{slot.replace(':', '.')}")["entries"]
    state = await queues.item(ItemRef(q, slot))
    assert state.generation == 1 and state.result is not None
    assert entry["token"] == state.result.token


async def _limited_queue(client: JobLeaseClient) -> tuple[Queues, QueueRef, SemaphoreRef]:
    """A queue whose items each take the one slot of a semaphore of limit 1."""
    sem = SemaphoreRef("default", "s-" + uuid.uuid4().hex[:8])
    await Semaphores(client).create(sem, limit=1)
    queues, q = Queues(client), _queue()
    await queues.create(q, QueueSpec(lease_duration_seconds=10, max_attempts=3,
                                     semaphores=(SemaphoreUse(sem.name),)))
    return queues, q, sem


async def test_the_script_gates_each_write_on_its_slot_token_too(
        env: Env, client: JobLeaseClient, ledger: Served) -> None:
    """Items taking a semaphore slot: each write carries the slot's token
    (``Joblease-Slot``, from GET /v1/lease's ``semaphores``) and the ledger records it."""
    queues, q, sem = await _limited_queue(client)
    ids = ["a", "b", "c"]
    await queues.enqueue(q, [(i, {"n": n}) for n, i in enumerate(ids)])
    s = await env.sidecar("drain", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q),
                          JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    worker = env.spawn_with("queue-worker", ["sh", str(SCRIPT)], {
        "JOBLEASE_SIDECAR_URL": s.url, "LEDGER_URL": ledger.url})
    assert await worker.wait_exit(60) == 0, worker.output()
    tokens = []
    for i in ids:
        state = await queues.item(ItemRef(q, i))
        assert state.phase is ItemPhase.COMPLETED and state.result is not None, state
        (entry,) = _entries(ledger, f"{q.name}-{i}")["entries"]
        assert entry["token"] == state.result.token
        assert entry["slots"] == [{"resource": f"semaphore/{sem}/slot/0",
                                   "token": state.result.token}], entry
        assert f"item {i} slots {sem}/0={state.result.token}" in worker.output()
        tokens.append(entry["token"])
    mark = httpx.get(f"{ledger.url}/fences/semaphore/{sem}/slot/0", timeout=10).json()
    assert mark["highestToken"] == max(tokens)


async def test_the_script_stops_when_the_ledger_refuses_its_slot_token(
        env: Env, client: JobLeaseClient, ledger: Served) -> None:
    """The ledger has accepted a newer token for the slot than the worker's (a later
    holder of the slot wrote; here a write made by the test): the worker's write is
    refused, it says why, exits 7 and does not complete the item."""
    queues, q, sem = await _limited_queue(client)
    await queues.enqueue(q, [("a", {})])
    later = 2**62  # a token newer than any this etcd will give
    r = httpx.post(f"{ledger.url}/resources/other", json={}, timeout=10, headers={
        HEADER_JOB: f"{q}/other", HEADER_TOKEN: str(later), HEADER_SLOT: f"{sem}/0={later}"})
    assert r.status_code == 201, r.text
    s = await env.sidecar("drain", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q)).started()
    worker = env.spawn_with("queue-worker", ["sh", str(SCRIPT)], {
        "JOBLEASE_SIDECAR_URL": s.url, "LEDGER_URL": ledger.url})
    assert await worker.wait_exit(60) == 7, worker.output()
    assert "write a -> 409 refused: " in worker.output()
    assert f'"resource":"semaphore/{sem}/slot/0"' in worker.output()
    assert "complete a" not in worker.output()
    assert _entries(ledger, f"{q.name}-a")["entries"] == []
    assert (await queues.item(ItemRef(q, "a"))).phase is not ItemPhase.COMPLETED
