"""Bad HTTP input and wrong tokens get a clear 4xx and change nothing in etcd."""

from __future__ import annotations

from typing import Any

from joblease import JobLeaseClient
from tests.support.etcd_keys import snapshot, writes
from tests.support.sidecar_process import Env
from tests.support.value_vectors import value_text, values

LIMIT = 1024


async def test_bad_requests_change_nothing(registered: Env, client: JobLeaseClient) -> None:
    env = registered
    secret = env.tmp / "api-token"
    secret.write_text("s3cret-bearer\n")
    sidecar = env.sidecar("a", JOBLEASE_SIDECAR_API_TOKEN_FILE=str(secret),
                          JOBLEASE_SIDECAR_MAX_RESULT_BYTES=str(LIMIT))
    sidecar.api_token = "s3cret-bearer"
    await sidecar.started()
    lease = await sidecar.held()
    token = lease["token"]
    before = await client.get(env.job)
    job_prefix = client.keys.job(env.job).prefix
    keys_before = await snapshot(client.store, job_prefix)

    async def send(method: str, path: str, expect: int, error: str | None = None,
                   **kw: Any) -> dict[str, Any]:
        r = await sidecar.request(method, path, **kw)
        assert r.status_code == expect, (method, path, kw, r.status_code, r.text)
        body: dict[str, Any] = r.json()
        if error is not None:
            assert body["error"] == error, body
        assert body.get("message"), body  # every refusal says why
        return body

    raw = {"headers": {"Content-Type": "application/json",
                       "Authorization": "Bearer s3cret-bearer"}}
    for path in ("/v1/complete", "/v1/release"):
        await send("POST", path, 400, "invalid", content=b"{not json", **raw)
        await send("POST", path, 400, "invalid", content=b"[1, 2]", **raw)
        await send("POST", path, 400, "invalid", json={"result": {}})
        await send("POST", path, 400, "invalid", json={"token": str(token)})
        await send("POST", path, 400, "invalid", json={"token": True})
        await send("POST", path, 400, "invalid", json={"token": float(token)})
        await send("POST", path, 400, "invalid", json={"token": -1})
        await send("GET", path, 405, "method_not_allowed")
        await send("PUT", path, 405, "method_not_allowed", json={"token": token})
        await send("POST", path, 401, "unauthorized", json={"token": token},
                   headers={"Authorization": "Bearer wrong"})
        await send("POST", path, 401, "unauthorized", json={"token": token},
                   headers={"Authorization": ""})
        for wrong in (token - 1, token + 1):
            body = await send("POST", path, 409, "stale", json={"token": wrong})
            assert body["token"] == wrong and body["currentToken"] == token
    await send("POST", "/v1/complete", 400, "invalid",
               content=b'{"token": %d, "result": NaN}' % token, **raw)
    body = await send("POST", "/v1/complete", 413, "too_large",
                      json={"token": token, "result": {"blob": "x" * LIMIT}})
    assert str(LIMIT) in body["message"]
    await send("POST", "/v1/complete", 413, "too_large",
               content=b'{"token": %d, "result": "%s"}' % (token, b"y" * 100_000), **raw)
    await send("POST", "/v1/lease", 405, "method_not_allowed")
    await send("GET", "/v1/lease", 401, "unauthorized", headers={"Authorization": "Bearer x"})
    r = await sidecar.request("GET", "/v1/lease", headers={"Authorization": ""})
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"

    after = await client.get(env.job)
    # not a single write reached the job's keys (the session etcd's own revision
    # moves with other tests' writes, so it says nothing about this job)
    assert not writes(keys_before, await snapshot(client.store, job_prefix))
    assert after.holder == before.holder and after.result is None
    assert (await sidecar.lease())["status"] == 200  # still held, same token
    assert sidecar.token_file.read_text() == f"{token}\n"
    # the bearer token never appears in the logs
    assert "s3cret-bearer" not in sidecar.output()

    # and the right request still works
    r = await sidecar.request("POST", "/v1/complete",
                              json={"token": token, "result": {"ok": True}})
    assert r.status_code == 200, r.text
    done = await client.get(env.job)
    assert done.result is not None and done.result.token == token


async def test_results_and_checkpoints_outside_the_stored_value_rule_get_400_and_write_nothing(
    registered: Env, client: JobLeaseClient,
) -> None:
    """docs/protocol.md#stored-values, on the shared vectors (tests/vectors/values.json):
    every refused value, sent as the request body's text (so Go's decoder cannot
    turn a lone surrogate into U+FFFD first), is answered 400 ``invalid`` (413
    ``too_large`` over the size) by both endpoints, and not a byte reaches etcd
    (issue 24: item 7, a lone surrogate stored then answered 500; item 8, a
    3000-deep result stored that no Python reader could read). Values at the
    limits are then accepted."""
    sidecar = registered.sidecar("a")
    await sidecar.started()
    token = (await sidecar.held())["token"]
    job_prefix = client.keys.job(registered.job).prefix
    keys_before = await snapshot(client.store, job_prefix)
    headers = {"Content-Type": "application/json"}
    for v in values("refuse"):
        for path, field in (("/v1/complete", b"result"), ("/v1/checkpoint", b"data")):
            body = b'{"token": %d, "%s": ' % (token, field) + value_text(v) + b"}"
            r = await sidecar.request("POST", path, content=body, headers=headers)
            size = v["name"].startswith("size")
            assert r.status_code == (413 if size else 400), (v["name"], path, r.text)
            answer = r.json()
            assert answer["error"] == ("too_large" if size else "invalid"), answer
            assert answer["message"], answer
    assert not writes(keys_before, await snapshot(client.store, job_prefix))
    assert (await sidecar.lease())["status"] == 200  # still held

    for name in ("depth-at-limit", "valid-pair-escaped", "size-at-limit"):
        text = value_text(next(v for v in values("accept") if v["name"] == name))
        r = await sidecar.request("POST", "/v1/checkpoint", headers=headers,
                                  content=b'{"token": %d, "data": ' % token + text + b"}")
        assert r.status_code == 200, (name, r.text)
        assert (await client.get(registered.job)).checkpoint is not None
    r = await sidecar.request("POST", "/v1/complete", headers=headers,
                              content=b'{"token": %d, "result": ' % token + text + b"}")
    assert r.status_code == 200, r.text
    done = await client.get(registered.job)
    assert done.corrupt is None and done.result is not None
    assert len(done.result.result) == 65534  # the 64 KiB string, read back whole
