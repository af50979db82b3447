"""The Go sidecar takes semaphore slots (docs/semaphores.md) on a real etcd,
sharing each semaphore with the Python library: the limit holds across the two
implementations at every revision (etcd's own history of the slots), a sidecar
whose job's semaphore is full waits in line (phase ``waiting``) and is served
in arrival order with Python waiters, a paused ex-holder's completion is stale
once a Python waiter got its slot (and a gate on the slot token refuses its
write), and a draining sidecar waits for a slot on a watch. Every answer is
also held to docs/sidecar-api.yaml.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from joblease import JobLeaseClient, JobRef
from joblease.fencing.gate import Effect, MemoryGate, StaleFenceError
from joblease.keys import ItemRef, QueueRef, SemaphoreRef
from joblease.queue import ItemPhase, Queues
from joblease.records import JobSpec, QueueSpec, SemaphoreUse, WaiterRecord
from joblease.semaphore import Semaphores
from tests.support.openapi_conformance import Conformance
from tests.support.sidecar_process import Env, Sidecar
from tests.support.slot_history import max_live
from tests.support.waiting import poll


@pytest.fixture
def conformance() -> Conformance:
    return Conformance()


async def _semaphore(client: JobLeaseClient, limit: int) -> SemaphoreRef:
    ref = SemaphoreRef("default", "db-" + uuid.uuid4().hex[:8])
    await Semaphores(client).create(ref, limit)
    return ref


def _uses(sem: SemaphoreRef) -> tuple[SemaphoreUse, ...]:
    return (SemaphoreUse(sem.name, 1),)


async def _view(s: Sidecar, conformance: Conformance) -> dict[str, Any]:
    r = await s.request("GET", "/v1/lease")
    conformance.check("/v1/lease", "GET", r)
    return {"status": r.status_code, **r.json()}


async def _waiting_for_slot(s: Sidecar, conformance: Conformance, sem: SemaphoreRef
                            ) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        if s.returncode() is not None:
            raise AssertionError(f"{s.name} exited:\n{s.output()}")
        view = await _view(s, conformance)
        return view if view["status"] == 503 and view["state"] == "waiting" else None
    view: dict[str, Any] = await poll(check, 15, f"{s.name} to wait for a slot")
    assert view["message"].startswith("waiting for a slot: semaphore " + str(sem)), view
    assert view["semaphore"] == str(sem)
    assert await s.status("/readyz") == 503  # the worker does not start while it waits
    return view


async def _held(s: Sidecar, conformance: Conformance, timeout: float = 15) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        if s.returncode() is not None:
            raise AssertionError(f"{s.name} exited:\n{s.output()}")
        view = await _view(s, conformance)
        return view if view["status"] == 200 else None
    view: dict[str, Any] = await poll(check, timeout, f"{s.name} to hold its lease")
    return view


async def _waiters(client: JobLeaseClient, sem: SemaphoreRef) -> list[WaiterRecord]:
    _, kvs = await client.store.get(client.keys.semaphore(sem).waiters, prefix=True)
    return [WaiterRecord.decode(kv.value)
            for kv in sorted(kvs, key=lambda kv: kv.create_revision)]


async def test_a_sidecar_waits_in_line_with_python_waiters_and_the_limit_holds_across_both(
        env: Env, client: JobLeaseClient, conformance: Conformance) -> None:
    """Limit 1 shared by the library and the sidecar: Python holds the slot; the
    sidecar gets in line (its waiter key in etcd, phase waiting); a Python waiter
    gets in line behind it; when Python releases, the sidecar (first in line)
    gets the slot, and the Python waiter only once the sidecar completed."""
    sem = await _semaphore(client, 1)
    start, _ = await client.store.get(b"\0")
    spec = JobSpec(lease_duration_seconds=5, max_attempts=3, semaphores=_uses(sem))
    first, later = (JobRef("default", env.job.name + suffix) for suffix in ("-py1", "-py2"))
    for job in (env.job, first, later):
        await client.register(job, spec)
    python_holder = await client.claim(first, "python-1")

    s = await env.sidecar("go").started()
    await _waiting_for_slot(s, conformance, sem)
    waiting_seen = time.monotonic()
    in_line = await poll(lambda: _waiters(client, sem), 10, "the sidecar's waiter key")
    assert [(w.holder, w.weight) for w in in_line] == [(str(env.job), 1)]
    behind = asyncio.ensure_future(client.claim_waiting(later, "python-2", wait=30))
    await poll(lambda: _len_is(_waiters(client, sem), 2), 10, "the Python waiter's key")

    released_at = time.monotonic()
    await python_holder.release()
    view = await _held(s, conformance)
    # the wait is in its metrics once granted: one wait, lasting at least from the
    # moment it was seen waiting until the release (it began before it was seen)
    metrics = await s.metrics()
    assert metrics["joblease_sidecar_slot_waits_total"] == 1.0, metrics
    waited = metrics["joblease_sidecar_slot_wait_seconds_total"]
    assert released_at - waiting_seen <= waited <= time.monotonic() - waiting_seen + 15, metrics
    assert view["semaphores"] == [{"semaphore": str(sem), "slots": [0], "token": view["token"]}]
    info = json.loads((s.workdir / "token.json").read_text())
    assert info["semaphores"] == view["semaphores"]
    assert not behind.done()  # second in line: it waits for the sidecar's slot
    assert [w.holder for w in await _waiters(client, sem)] == [str(later)]

    r = await s.request("POST", "/v1/complete", json={"token": view["token"], "result": {"ok": 1}})
    conformance.check("/v1/complete", "POST", r)
    assert r.status_code == 200, r.text
    lease = await asyncio.wait_for(behind, 15)  # the completion freed the slot
    assert [(str(g.semaphore), g.indexes) for g in lease.slots] == [(str(sem), (0,))]
    assert lease.slots[0].token > view["token"]
    await lease.complete()
    assert await _waiters(client, sem) == []
    assert await max_live(client.store, client.keys.semaphore(sem).slots, start) == 1
    s.signal(signal.SIGTERM)
    assert await s.wait_exit(15) == 0, s.output()


async def _len_is(waiters: Any, n: int) -> bool:
    return len(await waiters) == n


async def test_a_paused_sidecar_holder_loses_its_slot_and_its_completion_is_stale(
        env: Env, client: JobLeaseClient, conformance: Conformance) -> None:
    """Sidecar A holds the only slot and is SIGSTOPped past its TTL; a Python
    waiter is granted the slot; A resumes: its completion is refused as stale,
    and a destination gated on the slot token refuses A's late write."""
    sem = await _semaphore(client, 1)
    start, _ = await client.store.get(b"\0")
    ttl = 2
    spec = JobSpec(lease_duration_seconds=ttl, max_attempts=0, semaphores=_uses(sem))
    other = JobRef("default", env.job.name + "-py")
    for job in (env.job, other):
        await client.register(job, spec)
    a = await env.sidecar("a").started()
    view = await _held(a, conformance)
    [grant] = view["semaphores"]
    gate = MemoryGate()
    slot = f"semaphore/{sem}/slot/{grant['slots'][0]}"
    await gate.admit(Effect(slot, grant["token"]))

    a.signal(signal.SIGSTOP)
    paused = time.monotonic()
    try:
        b = await client.claim_waiting(other, "python-b", wait=ttl + 15)
        assert time.monotonic() - paused >= ttl - 0.5  # etcd expired A's lease first
        assert b.slots[0].indexes == (0,) and b.slots[0].token > grant["token"]
        await gate.admit(Effect(slot, b.slots[0].token))
    finally:
        a.signal(signal.SIGCONT)
    with pytest.raises(StaleFenceError):  # A's late write under its old slot token
        await gate.admit(Effect(slot, grant["token"]))
    r = await a.request("POST", "/v1/complete", json={"token": view["token"], "result": None})
    conformance.check("/v1/complete", "POST", r)
    assert r.status_code == 409 and r.json()["error"] == "stale", r.text
    assert (await client.get(env.job)).result is None
    await b.complete()
    assert await max_live(client.store, client.keys.semaphore(sem).slots, start) == 1


async def test_a_draining_sidecar_waits_for_a_slot_on_a_watch(
        env: Env, client: JobLeaseClient, conformance: Conformance) -> None:
    """A queue whose spec names a semaphore: every item's claim takes a slot. While
    the library holds the only one the draining sidecar waits (phase waiting, a
    watch, no place in line); the release lets it in at once."""
    sem = await _semaphore(client, 1)
    start, _ = await client.store.get(b"\0")
    queues = Queues(client)
    q = QueueRef("default", "q-" + uuid.uuid4().hex[:8])
    await queues.create(q, QueueSpec(lease_duration_seconds=5, max_attempts=3,
                                     semaphores=_uses(sem)))
    await queues.enqueue(q, [("a", {"n": 1}), ("b", {"n": 2})])
    hog = JobRef("default", env.job.name + "-hog")
    await client.register(hog, JobSpec(lease_duration_seconds=5, semaphores=_uses(sem)))
    python_holder = await client.claim(hog, "python")
    s = await env.sidecar("drain", JOBLEASE_JOB_NAME="", JOBLEASE_QUEUE=str(q),
                          JOBLEASE_SIDECAR_RATE_LIMIT="off",
                          JOBLEASE_EXIT_WHEN_EMPTY="true").started()
    await _waiting_for_slot(s, conformance, sem)
    assert await _waiters(client, sem) == []  # queue claimers take no place in line
    assert (await queues.counts(q)).held == 0
    await python_holder.release()
    done = []
    token = 0
    for _ in range(2):
        view = await _held(s, conformance)
        if view["token"] <= token:
            continue
        assert view["semaphores"] == [{"semaphore": str(sem), "slots": [0],
                                       "token": view["token"]}], view
        token = view["token"]
        r = await s.request("POST", "/v1/complete", json={"token": token, "result": None})
        assert r.status_code == 200, r.text
        done.append(view["item"])
        await poll(_moved_past(s, conformance, token), 15, "the next answer")
    assert sorted(done) == ["a", "b"]
    for item in done:
        assert (await queues.item(ItemRef(q, item))).phase is ItemPhase.COMPLETED
    assert await max_live(client.store, client.keys.semaphore(sem).slots, start) == 1
    s.signal(signal.SIGTERM)
    assert await s.wait_exit(15) == 0, s.output()


def _moved_past(s: Sidecar, conformance: Conformance, token: int
                ) -> Callable[[], Awaitable[bool]]:
    """A condition: the sidecar answers with an item newer than ``token``, or finally."""
    async def check() -> bool:
        view = await _view(s, conformance)
        return bool(view["status"] == 409 or (view["status"] == 200 and view["token"] > token))
    return check
