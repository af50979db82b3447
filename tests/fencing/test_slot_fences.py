"""Writes gated on semaphore slots as well as on their job or item: the ``Joblease-Slot``
header, the middleware's check of each slot's fence and the example ledger's record of
the slots an entry was admitted under (docs/semaphores.md, "Fencing on a slot").

Real: the example ledger (SQLite, one transaction per entry; and in memory) under
uvicorn, real HTTP; for the client side, claims on a real etcd with a real semaphore."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.fencing.destination import create_app
from joblease.fencing.gate import slot_resource
from joblease.fencing.http import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_JOB,
    HEADER_SLOT,
    HEADER_TOKEN,
    MAX_SLOT_FENCES,
    FencingAuth,
    fencing_headers,
)
from joblease.keys import SemaphoreRef
from joblease.records import SemaphoreUse
from joblease.semaphore import Semaphores
from tests.support.served import Served

SLOT0 = slot_resource("team-a/db", 0)


def _headers(job: str, token: int, slots: str | None = None,
             key: str | None = None) -> dict[str, str]:
    h = {HEADER_JOB: f"team-a/q/{job}", HEADER_TOKEN: str(token)}
    if slots is not None:
        h[HEADER_SLOT] = slots
    if key is not None:
        h[HEADER_IDEMPOTENCY_KEY] = key
    return h


@pytest.fixture(params=["sqlite", "memory"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path,
           serve: Callable[[Any], Served]) -> Served:
    """The example ledger: its SQLite file (entry and marks in one transaction) or in
    memory (the middleware records the marks after the app)."""
    db = str(tmp_path / "ledger.sqlite") if request.param == "sqlite" else None
    return serve(create_app(db))


def _book(ledger: Served, name: str) -> dict[str, Any]:
    got: dict[str, Any] = httpx.get(f"{ledger.url}/resources/{name}", timeout=10).json()
    return got


def _mark(ledger: Served, resource: str) -> int:
    r = httpx.get(f"{ledger.url}/fences/{resource}", timeout=10)
    assert r.status_code == 200, r.text
    assert r.json()["resource"] == resource
    return int(r.json()["highestToken"])


def test_a_write_under_a_stale_slot_token_is_refused_though_its_item_is_new(
        ledger: Served) -> None:
    """B took slot 0 after A and wrote; A's late write for another item, whose own fence
    has never seen a token, is refused by the slot's fence and applied to nothing."""
    b = httpx.post(f"{ledger.url}/resources/b", json={"from": "B"},
                   headers=_headers("b", 20, "team-a/db/0=20"), timeout=10)
    assert b.status_code == 201, b.text
    assert b.json()["slots"] == [{"resource": SLOT0, "token": 20}]

    a = httpx.post(f"{ledger.url}/resources/a", json={"from": "A"},
                   headers=_headers("a", 10, "team-a/db/0=10", key="team-a/q/a#g1.t10"),
                   timeout=10)
    assert a.status_code == 409, a.text
    assert a.json() == {"error": "stale", "message": a.json()["message"], "resource": SLOT0,
                        "token": 10, "highestToken": 20}
    assert _book(ledger, "a") == {"resource": "a", "highestToken": 0, "entries": []}
    assert _mark(ledger, SLOT0) == 20
    # the refusal recorded nothing under its key: the same request is refused again
    again = httpx.post(f"{ledger.url}/resources/a", json={"from": "A"},
                       headers=_headers("a", 10, "team-a/db/0=10", key="team-a/q/a#g1.t10"),
                       timeout=10)
    assert again.status_code == 409 and again.json()["resource"] == SLOT0, again.text


def test_entries_record_their_slots_and_each_slot_mark_only_rises(ledger: Served) -> None:
    """Two slots, writers taking turns: every accepted entry names the slots it was
    admitted under; per slot, the tokens of accepted entries never go backwards."""
    writes = [("i1", 10, "team-a/db/0=10"), ("i2", 11, "team-a/db/1=11"),
              ("i3", 15, "team-a/db/0=15"), ("i1", 12, "team-a/db/1=12"),  # item i1's mark: ok
              ("i4", 11, "team-a/db/1=11"),  # slot 1 has seen 12: stale
              ("i5", 16, "team-a/db/0=16, team-a/db/1=16")]  # weight 2: both slots
    codes = []
    for item, token, slots in writes:
        r = httpx.post(f"{ledger.url}/resources/{item}", json={"item": item},
                       headers=_headers(item, token, slots), timeout=10)
        codes.append(r.status_code)
    assert codes == [201, 201, 201, 201, 409, 201]
    entries = sorted((e for i in ("i1", "i2", "i3", "i4", "i5")
                      for e in _book(ledger, i)["entries"]), key=lambda e: e["seq"])
    per_slot: dict[str, list[int]] = {}
    for entry in entries:
        for slot in entry["slots"]:
            per_slot.setdefault(slot["resource"], []).append(slot["token"])
    assert per_slot == {SLOT0: [10, 15, 16], slot_resource("team-a/db", 1): [11, 12, 16]}
    assert _mark(ledger, SLOT0) == 16 and _mark(ledger, slot_resource("team-a/db", 1)) == 16
    assert _book(ledger, "i1")["highestToken"] == 12  # the item's own fence, as before


def test_a_write_without_slots_is_fenced_as_before(ledger: Served) -> None:
    r = httpx.post(f"{ledger.url}/resources/plain", json={}, headers=_headers("plain", 5),
                   timeout=10)
    assert r.status_code == 201 and r.json()["slots"] == [], r.text
    assert _mark(ledger, "ledger/plain") == 5


@pytest.mark.parametrize("value, says", [
    ("team-a/db/0", "namespace/semaphore/index=token"),
    ("team-a/db/x=5", "namespace/semaphore/index=token"),
    ("team-a/db/10000=5", "namespace/semaphore/index=token"),  # above the largest limit
    ("team-a/db/01=5", "namespace/semaphore/index=token"),
    ("Team-A/db/0=5", "namespace/semaphore/index=token"),
    ("db/0=5", "namespace/semaphore/index=token"),
    ("team-a/db/0=0", "start at 1"),
    ("team-a/db/0=-3", "negative"),
    ("team-a/db/0=9223372036854775808", "largest token"),
    ("team-a/db/0=5, team-a/db/0=6", "twice"),
    ("team-a/db/0=5,", "namespace/semaphore/index=token"),
    (", ".join(f"team-a/db/{i}=5" for i in range(MAX_SLOT_FENCES + 1)), "at most"),
])
def test_a_bad_slot_header_is_refused_and_nothing_is_applied(
        ledger: Served, value: str, says: str) -> None:
    r = httpx.post(f"{ledger.url}/resources/bad", json={}, headers=_headers("bad", 5, value),
                   timeout=10)
    assert r.status_code == 400, r.text
    assert r.json()["error"] == "invalid" and says in r.json()["message"], r.json()
    assert HEADER_SLOT in r.json()["message"]
    assert _book(ledger, "bad") == {"resource": "bad", "highestToken": 0, "entries": []}
    assert _mark(ledger, SLOT0) == 0


def test_the_slot_header_may_be_repeated(ledger: Served) -> None:
    """A list header: two header lines mean the same as one comma-separated value."""
    headers = [(HEADER_JOB, "team-a/q/r"), (HEADER_TOKEN, "7"),
               (HEADER_SLOT, "team-a/db/0=7"), (HEADER_SLOT, "team-a/db/1=7")]
    r = httpx.post(f"{ledger.url}/resources/r", json={}, headers=headers, timeout=10)
    assert r.status_code == 201, r.text
    assert [s["resource"] for s in r.json()["slots"]] == [SLOT0, slot_resource("team-a/db", 1)]


async def test_the_client_headers_carry_the_slots_a_claim_holds(
        client: JobLeaseClient, serve: Callable[[Any], Served], tmp_path: Path) -> None:
    """``fencing_headers`` and ``FencingAuth`` of a lease holding a slot name it with its
    token; a lease without slots sends no ``Joblease-Slot``."""
    sem = SemaphoreRef("default", "billing-db")
    await Semaphores(client).create(sem, limit=2)
    with_slot, plain = JobRef("default", "with-slot"), JobRef("default", "plain")
    await client.register(with_slot, JobSpec(lease_duration_seconds=10, semaphores=(
        SemaphoreUse("billing-db", weight=2),)))
    await client.register(plain, JobSpec(lease_duration_seconds=10))
    lease = await client.claim(with_slot, "w")
    other = await client.claim(plain, "w")
    try:
        [grant] = lease.slots
        assert sorted(grant.indexes) == [0, 1]
        expected = ", ".join(f"default/billing-db/{i}={grant.token}" for i in grant.indexes)
        assert fencing_headers(lease, "x")[HEADER_SLOT] == expected
        assert HEADER_SLOT not in fencing_headers(other, "x")
        served = serve(create_app(str(tmp_path / "ledger.sqlite")))
        async with httpx.AsyncClient(timeout=10) as http:
            r = await http.post(f"{served.url}/resources/out", json={},
                                auth=FencingAuth(lease, "out"))
            assert r.status_code == 201, r.text
            assert sorted(s["resource"] for s in r.json()["slots"]) == [
                slot_resource("default/billing-db", i) for i in (0, 1)]
            assert {s["token"] for s in r.json()["slots"]} == {lease.token}
            r = await http.post(f"{served.url}/resources/plain", json={},
                                auth=FencingAuth(other, "out"))
            assert r.status_code == 201 and r.json()["slots"] == [], r.text
    finally:
        await lease.complete()
        await other.complete()
