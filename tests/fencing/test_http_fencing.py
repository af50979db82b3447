"""The fenced HTTP destination (examples/destination) over real HTTP, with real etcd tokens."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.destination import create_app
from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, StaleTokenError
from joblease.embedded import free_port
from joblease.fencing.http import (
    HEADER_IDEMPOTENCY_KEY,
    HEADER_JOB,
    HEADER_REPLAYED,
    HEADER_TOKEN,
    FencingAuth,
    fencing_headers,
)
from tests.support.fenced_history import check_fenced_history
from tests.support.proxy import HoldingProxy
from tests.support.served import Served
from tests.support.waiting import claim_when_free

REPO_ROOT = Path(__file__).resolve().parents[2]


def headers(token: int | str, key: str | None = None, job: str = "default/ledger-writer"
            ) -> dict[str, str]:
    h = {HEADER_JOB: job, HEADER_TOKEN: str(token)}
    if key is not None:
        h[HEADER_IDEMPOTENCY_KEY] = key
    return h


async def test_delayed_write_from_old_holder_is_rejected(
        etcd_config: EtcdConfig, serve: Callable[[Any], Served]) -> None:
    """The seed's example: A (generation 1) pauses past its lease, B claims
    (generation 2) and writes; A's request, delayed in the network, then
    arrives: the destination answers 409 stale and keeps only B's effect."""
    job = JobRef("default", "nightly-report")
    async with JobLeaseClient(etcd_config) as admin:
        await admin.register(job, JobSpec(lease_duration_seconds=2))
    worker_a = JobLeaseClient(etcd_config)
    lease_a = await worker_a.claim(job, "worker-a")
    request_a = fencing_headers(lease_a, "append")  # built while A was the holder
    await worker_a.close(revoke=False)  # A pauses: no more keep-alives; etcd expires it

    served = serve(create_app())
    async with JobLeaseClient(etcd_config) as worker_b, \
            HoldingProxy(served.port) as proxy, httpx.AsyncClient(timeout=30) as http:
        lease_b = await claim_when_free(worker_b, job, "worker-b", interval=0.1)
        assert lease_b.token > lease_a.token
        assert lease_b.generation == lease_a.generation + 1

        a_write = asyncio.create_task(http.post(
            f"http://127.0.0.1:{proxy.port}/resources/report", json={"from": "A"},
            headers=request_a))
        await asyncio.wait_for(proxy.received.wait(), 10)  # A's bytes are in flight, held

        b_write = await http.post(f"{served.url}/resources/report", json={"from": "B"},
                                  auth=FencingAuth(lease_b, "append"))
        assert b_write.status_code == 201, b_write.text

        proxy.release()  # A's delayed request finally arrives
        a_response = await asyncio.wait_for(a_write, 10)
        assert a_response.status_code == 409, a_response.text
        assert a_response.json() == {
            "error": "stale", "message": a_response.json()["message"],
            "resource": "ledger/report", "token": lease_a.token, "highestToken": lease_b.token}
        assert str(lease_b.token) in a_response.json()["message"]

        state = (await http.get(f"{served.url}/resources/report")).json()
        assert [(e["token"], e["data"]) for e in state["entries"]] == [
            (lease_b.token, {"from": "B"})]
        assert state["highestToken"] == lease_b.token

        # ...and A's completion under its old token is refused by etcd as well.
        with pytest.raises(StaleTokenError):
            await worker_b.lease_for(job, "worker-a", lease_a.token)


@pytest.mark.parametrize("storage", ["memory", "sqlite"])
async def test_concurrent_writers_accept_only_non_decreasing_tokens_over_http(
        storage: str, tmp_path: Path, serve: Callable[[Any], Served]) -> None:
    """100 concurrent POSTs with mixed tokens on one resource: accepted tokens
    never decrease in commit order, every refusal names a higher accepted
    mark, and every accepted write is in the ledger."""
    served = serve(create_app(db=str(tmp_path / "ledger.sqlite") if storage == "sqlite"
                              else None))
    tokens = [(i * 37) % 23 + 1 for i in range(100)]
    limits = httpx.Limits(max_connections=100, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:

        async def write(i: int) -> tuple[int, int, bool, int | None]:
            r = await http.post(f"{served.url}/resources/hot", json={"writer": i},
                                headers=headers(tokens[i], f"w{i}"))
            if r.status_code == 201:
                return i, tokens[i], True, None
            assert r.status_code == 409, r.text
            assert r.json()["error"] == "stale" and r.json()["token"] == tokens[i]
            return i, tokens[i], False, int(r.json()["highestToken"])

        outcomes = await asyncio.gather(*(write(i) for i in range(100)))
        state = (await http.get(f"{served.url}/resources/hot")).json()
    committed = [(e["data"]["writer"], e["token"]) for e in state["entries"]]
    check_fenced_history(list(outcomes), committed)
    assert state["highestToken"] == max(tokens)


async def test_duplicate_request_is_applied_once_and_answered_the_same(
        serve: Callable[[Any], Served]) -> None:
    served = serve(create_app())
    url = f"{served.url}/resources/orders"
    async with httpx.AsyncClient(timeout=30) as http:
        first = await http.post(url, json={"n": 1}, headers=headers(5, "default/j#g1:order"))
        assert first.status_code == 201
        again = await http.post(url, json={"n": 1}, headers=headers(5, "default/j#g1:order"))
        assert (again.status_code, again.content) == (first.status_code, first.content)
        assert again.headers[HEADER_REPLAYED] == "true"
        # Concurrent retries of the same key: all answered with the first response.
        retries = await asyncio.gather(*(
            http.post(url, json={"n": 1}, headers=headers(5, "default/j#g1:order"))
            for _ in range(10)))
        assert {(r.status_code, r.content) for r in retries} == {(201, first.content)}
        # A newer holder writes; the old key is still replayed, not refused as stale,
        # because the effect it names was applied when its token was current.
        newer = await http.post(url, json={"n": 2}, headers=headers(9, "default/j#g2:order"))
        assert newer.status_code == 201
        late_retry = await http.post(url, json={"n": 1}, headers=headers(5, "default/j#g1:order"))
        assert (late_retry.status_code, late_retry.content) == (201, first.content)
        # The same key with a different token is a caller bug: refused, nothing applied.
        misuse = await http.post(url, json={"n": 3}, headers=headers(9, "default/j#g1:order"))
        assert misuse.status_code == 400 and misuse.json()["error"] == "invalid"
        state = (await http.get(url)).json()
    assert [(e["token"], e["data"]) for e in state["entries"]] == [(5, {"n": 1}), (9, {"n": 2})]


@pytest.mark.parametrize(("bad", "says"), [
    ({HEADER_JOB: "default/j"}, "missing Joblease-Token"),
    ({HEADER_TOKEN: "5"}, "missing Joblease-Job"),
    (headers("abc"), "must be a decimal integer"),
    (headers("12.5"), "must be a decimal integer"),
    (headers("-5"), "must not be negative"),
    (headers("0"), "start at 1"),
    (headers(str(2**63)), "exceeds the largest token"),
    (headers("9" * 400), "exceeds the largest token"),
    (headers(7, key="bad key\u00e9"), "invalid idempotency key"),
])
async def test_bad_fencing_headers_are_refused_with_400_and_nothing_applied(
        bad: dict[str, str], says: str, serve: Callable[[Any], Served]) -> None:
    served = serve(create_app())
    url = f"{served.url}/resources/strict"
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(url, json={"x": 1},
                            headers=[(k.encode(), v.encode()) for k, v in bad.items()])
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "invalid"
        assert says in r.json()["message"]
        state = (await http.get(url)).json()
        assert state["entries"] == [] and state["highestToken"] == 0
        # the largest valid token is accepted
        ok = await http.post(url, json={"x": 2}, headers=headers(2**63 - 1))
        assert ok.status_code == 201, ok.text


async def test_repeated_token_header_is_refused(serve: Callable[[Any], Served]) -> None:
    served = serve(create_app())
    async with httpx.AsyncClient(timeout=30) as http:
        r = await http.post(f"{served.url}/resources/strict", json={},
                            headers=[(b"Joblease-Job", b"default/j"), (b"Joblease-Token", b"5"),
                                     (b"Joblease-Token", b"9")])
        assert r.status_code == 400 and "given 2 times" in r.json()["message"]


def run_destination(port: int, db: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "examples.destination", "--port", str(port), "--db", str(db)],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError(f"destination did not start: {proc.communicate()[1]!r}")
        time.sleep(0.05)  # polling interval under a deadline


def test_sqlite_backed_destination_keeps_its_fence_across_a_restart(tmp_path: Path) -> None:
    """``python -m examples.destination --db``: a restart must not reopen the fence."""
    db, port = tmp_path / "ledger.sqlite", free_port()
    url = f"http://127.0.0.1:{port}/resources/durable"
    proc = run_destination(port, db)
    try:
        assert httpx.post(url, json={"n": 1}, headers=headers(10, "k1")).status_code == 201
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    proc = run_destination(port, db)
    try:
        stale = httpx.post(url, json={"n": 2}, headers=headers(5, "k2"))
        assert stale.status_code == 409 and stale.json()["highestToken"] == 10
        replay = httpx.post(url, json={"n": 1}, headers=headers(10, "k1"))
        assert replay.status_code == 201 and replay.headers[HEADER_REPLAYED] == "true"
        state = httpx.get(url).json()
        assert [(e["token"], e["data"]) for e in state["entries"]] == [(10, {"n": 1})]
    finally:
        proc.terminate()
        proc.wait(timeout=30)
