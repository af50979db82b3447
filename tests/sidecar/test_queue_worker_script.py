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
from joblease.keys import ItemRef, QueueRef
from joblease.queue import ItemPhase, Queues
from joblease.records import QueueSpec
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
    await queues.enqueue(q, [(i, {"n": n}) for n, i in enumerate(ids)])
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
