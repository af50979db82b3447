"""``POST /v1/checkpoint`` and the checkpoint in ``GET /v1/lease``, through real
sidecar processes against a real etcd: fenced like completion, checked like it."""

from __future__ import annotations

import signal
from typing import Any

from joblease import JobLeaseClient
from joblease.store import Put
from tests.support.etcd_keys import snapshot, writes
from tests.support.openapi_conformance import Conformance
from tests.support.sidecar_process import Env
from tests.support.waiting import poll

LIMIT = 1024


async def test_checkpoint_is_fenced_and_handed_to_the_next_holder(
    registered: Env, client: JobLeaseClient,
) -> None:
    env = registered
    secret = env.tmp / "api-token"
    secret.write_text("s3cret-bearer\n")
    a = env.sidecar("a", JOBLEASE_SIDECAR_API_TOKEN_FILE=str(secret),
                    JOBLEASE_SIDECAR_MAX_RESULT_BYTES=str(LIMIT))
    a.api_token = "s3cret-bearer"
    await a.started()
    lease = await a.held()
    token = lease["token"]
    assert lease["checkpoint"] is None

    async def send(path: str, expect: int, error: str | None = None,
                   **kw: Any) -> dict[str, Any]:
        r = await a.request("POST", path, **kw)
        assert r.status_code == expect, (path, kw, r.status_code, r.text)
        body: dict[str, Any] = r.json()
        if error is not None:
            assert body["error"] == error, body
        return body

    # bad input: refused before etcd is touched, nothing written
    job_prefix = client.keys.job(env.job).prefix
    before = await snapshot(client.store, job_prefix)
    raw = {"headers": {"Content-Type": "application/json",
                       "Authorization": "Bearer s3cret-bearer"}}
    await send("/v1/checkpoint", 400, "invalid", content=b"{not json", **raw)
    await send("/v1/checkpoint", 400, "invalid", json={"data": 1})
    await send("/v1/checkpoint", 400, "invalid", json={"token": token})
    await send("/v1/checkpoint", 400, "invalid",
               content=b'{"token": %d, "data": NaN}' % token, **raw)
    body = await send("/v1/checkpoint", 413, "too_large",
                      json={"token": token, "data": "x" * LIMIT})
    assert str(LIMIT) in body["message"]
    await send("/v1/checkpoint", 401, "unauthorized", json={"token": token, "data": 1},
               headers={"Authorization": "Bearer wrong"})
    stale = await send("/v1/checkpoint", 409, "stale", json={"token": token + 1, "data": 1})
    assert stale["currentToken"] == token
    assert (await a.request("GET", "/v1/checkpoint")).status_code == 405
    assert not writes(before, await snapshot(client.store, job_prefix))

    written = await send("/v1/checkpoint", 200, json={"token": token, "data": {"step": 5}})
    assert written["token"] == token and written["data"] == {"step": 5}
    shown = await a.held()
    assert shown["checkpoint"]["data"] == {"step": 5}
    assert shown["checkpoint"]["generation"] == lease["generation"]

    # A pauses past its TTL; B claims and is handed A's checkpoint
    a.signal(signal.SIGSTOP)
    try:
        b = await env.sidecar("b").started()
        b_lease = await b.held(timeout=30)
    finally:
        a.signal(signal.SIGCONT)
    assert b_lease["token"] > token
    assert b_lease["checkpoint"]["data"] == {"step": 5}
    assert b_lease["checkpoint"]["token"] == token
    r = await b.request("POST", "/v1/checkpoint",
                        json={"token": b_lease["token"], "data": {"step": 6}})
    assert r.status_code == 200, r.text

    # A's late checkpoint is refused as stale; B's stands
    late = await send("/v1/checkpoint", 409, "stale", json={"token": token, "data": {"step": 9}})
    assert late["token"] == token
    state = await client.get(env.job)
    assert state.checkpoint is not None
    assert state.checkpoint.data == {"step": 6} and state.checkpoint.token == b_lease["token"]


async def test_a_stored_lone_surrogate_checkpoint_is_shown_corrupt_and_the_holder_replaces_it(
    registered: Env, client: JobLeaseClient,
) -> None:
    """Issue 24, item 7: a checkpoint holding an escaped lone surrogate, already
    in etcd (written past the writers' rule), made ``GET /v1/lease`` answer 500
    for every later holder (the Python sidecar), or was shown with U+FFFD in
    its place as if fine (Go). Now the holder claims, ``GET /v1/lease`` answers
    200 with ``{"corrupt": why}`` for the checkpoint, and its own checkpoint
    replaces the bad one."""
    env = registered
    bad = (b'{"checkpointedAt":1.0,"claimId":"c0","data":{"note":"\\ud800"},'
           b'"generation":1,"owner":"old","token":3}')
    await client.store.txn([], [Put(client.keys.job(env.job).checkpoint, bad)], [])
    a = await env.sidecar("a").started()
    lease = await a.held()
    assert "lone UTF-16 surrogate" in lease["checkpoint"]["corrupt"], lease
    r = await a.request("POST", "/v1/checkpoint",
                        json={"token": lease["token"], "data": {"note": "clean"}})
    assert r.status_code == 200, r.text
    assert (await a.held())["checkpoint"]["data"] == {"note": "clean"}
    state = await client.get(env.job)
    assert state.corrupt is None and state.checkpoint is not None
    assert state.checkpoint.data == {"note": "clean"}


async def test_checkpoint_volume_is_bounded_per_sidecar_and_over_it_nothing_is_written(
    registered: Env, client: JobLeaseClient,
) -> None:
    """Issue 24: every checkpoint is a new etcd revision, kept until compaction, so one
    worker checkpointing at the request rate could fill etcd's quota for every
    tenant. The sidecar admits at most ``JOBLEASE_SIDECAR_CHECKPOINT_RATE`` bytes of
    checkpoints per second (bursts of 16 s worth, at least one largest checkpoint):
    over it, ``429 checkpoint_volume`` with ``Retry-After``, and etcd is not touched;
    once the bytes have come back, checkpoints are admitted again. Here 256 B/s,
    a result limit of 4096 B: the burst is 4096 B (16 s x 256 = one largest)."""
    env = registered
    a = env.sidecar("a", JOBLEASE_SIDECAR_CHECKPOINT_RATE="256",
                    JOBLEASE_SIDECAR_MAX_RESULT_BYTES="4096", JOBLEASE_SIDECAR_RATE_LIMIT="off")
    await a.started()
    token = (await a.held())["token"]
    chunk = "x" * 1000  # ~1 KB of JSON per checkpoint
    accepted = 0
    while True:
        r = await a.request("POST", "/v1/checkpoint",
                            json={"token": token, "data": {"n": accepted, "pad": chunk}})
        if r.status_code != 200:
            break
        accepted += 1
        assert accepted <= 4, "more than the 4096-byte burst was admitted at once"
    assert accepted >= 3, accepted  # the burst admits about four ~1 KB checkpoints
    assert r.status_code == 429 and r.json()["error"] == "checkpoint_volume", r.text
    Conformance().check("/v1/checkpoint", "POST", r)  # as docs/sidecar-api.yaml says
    assert "256 bytes per second" in r.json()["message"]
    retry = int(r.headers["Retry-After"])
    assert 1 <= retry <= 5, r.headers
    # the refused checkpoint wrote nothing: etcd holds the last admitted one
    state = await client.get(env.job)
    assert state.checkpoint is not None and state.checkpoint.data["n"] == accepted - 1
    before = await snapshot(client.store, client.keys.job(env.job).prefix)
    again = await a.request("POST", "/v1/checkpoint",
                            json={"token": token, "data": {"n": -1, "pad": chunk}})
    assert again.status_code == 429
    assert not writes(before, await snapshot(client.store, client.keys.job(env.job).prefix))

    # the bytes come back at the rate: after Retry-After, the next one is admitted
    async def admitted() -> bool:
        r = await a.request("POST", "/v1/checkpoint",
                            json={"token": token, "data": {"n": accepted, "pad": chunk}})
        return r.status_code == 200
    assert await poll(admitted, retry + 10, "a checkpoint admitted once the bytes came back",
                      interval=0.5)
    assert (await client.get(env.job)).checkpoint.data["n"] == accepted  # type: ignore[union-attr]
