"""The sidecar's HTTP API is what docs/sidecar-api.yaml (OpenAPI 3.1) says, and nothing else.

Real sidecar processes (the Go binary) on the session's real etcd are driven
through every route, method and status code the document lists; each answer's
status must be one the document lists for that route and method, its body must
validate against the documented schema (``jsonschema``, draft 2020-12, the
dialect of OpenAPI 3.1; records and bodies are closed: an unknown field fails),
and its documented headers (``Allow``, ``Retry-After``, ``WWW-Authenticate``)
must be there. At the end every documented (route, method, status) must have
been seen. A probe of methods and paths the document does not list must get
only what the document's description promises (405 with ``Allow`` on a
documented route, 307 to a route for trailing slashes, else a plain-text 404),
so a route added to the sidecar without the document fails here.

Only the network is faulted, for the 503s: the sidecar's etcd endpoint is a TCP
proxy that drops requests (tests/support/sidecar_proxy.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import jsonschema
import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from tests.support.openapi_conformance import DOC, METHODS, Conformance, documented
from tests.support.sidecar_process import Env, Sidecar
from tests.support.sidecar_proxy import SeverableProxy

BEARER = "openapi-bearer-" + uuid.uuid4().hex

@pytest.fixture
def conformance() -> Conformance:
    return Conformance()


class Api:
    """One sidecar and the answers it gives, each checked against the document."""

    def __init__(self, sidecar: Sidecar, conformance: Conformance, bearer: str | None) -> None:
        self.sidecar, self.conformance, self.bearer = sidecar, conformance, bearer
        self.http = httpx.AsyncClient(base_url=sidecar.url, timeout=120)

    async def call(self, method: str, path: str, *, auth: bool = True,
                   **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}))
        if auth and self.bearer:
            headers["Authorization"] = f"Bearer {self.bearer}"
        r = await self.http.request(method, path, headers=headers, **kw)
        self.conformance.check(path, method, r)
        return r

    async def held(self) -> dict[str, Any]:
        lease: dict[str, Any] = (await self.sidecar.held())
        return lease


@pytest.fixture
async def start(env: Env, client: JobLeaseClient, conformance: Conformance
                ) -> AsyncIterator[Any]:
    """``await start(name, ttl=..., register=True, bearer=..., **env)``: a sidecar on a
    job of its own, as an :class:`Api`."""
    apis: list[Api] = []

    async def go(name: str, *, ttl: int = 20, register: bool = True,
                 bearer: str | None = None, **extra: str) -> tuple[Api, JobRef]:
        job = JobRef("default", f"oa-{name}-{uuid.uuid4().hex[:6]}")
        if register:
            await client.register(job, JobSpec(lease_duration_seconds=ttl))
        if bearer:
            secret = env.tmp / f"{name}.bearer"
            secret.write_text(bearer)
            extra["JOBLEASE_SIDECAR_API_TOKEN_FILE"] = str(secret)
        extra.setdefault("JOBLEASE_SIDECAR_RATE_LIMIT", "off")
        sidecar = env.sidecar(name, JOBLEASE_JOB_NAME=job.name, **extra)
        sidecar.api_token = bearer
        await sidecar.started()
        api = Api(sidecar, conformance, bearer)
        apis.append(api)
        return api, job
    yield go
    for api in apis:
        await api.http.aclose()


async def _main_routes(start: Any, client: JobLeaseClient) -> None:
    """One sidecar with a bearer token through claiming, held, checkpoint, completion."""
    api, job = await start("main", register=False, bearer=BEARER)
    # claiming: the job is not registered yet (the sidecar waits for it)
    assert (await api.call("GET", "/v1/lease")).status_code == 503
    assert (await api.call("HEAD", "/v1/lease")).status_code == 503
    assert (await api.call("GET", "/readyz")).status_code == 503
    assert (await api.call("HEAD", "/readyz")).status_code == 503
    # the long poll: a bad wait is refused; one that runs out answers the 503 of then
    for bad in ("-1", "61", "soon", ""):
        for method in ("GET", "HEAD"):
            r = await api.call(method, "/v1/lease", params={"wait": bad})
            assert r.status_code == 400, (method, bad, r.text)
    asked = time.monotonic()
    assert (await api.call("GET", "/v1/lease", params={"wait": "0.3"})).status_code == 503
    assert time.monotonic() - asked >= 0.3
    # one in flight when the claim commits answers with the lease
    waiting = asyncio.create_task(api.call("GET", "/v1/lease", params={"wait": "30"}))
    done, _ = await asyncio.wait({waiting}, timeout=0.5)
    assert not done, "the long poll answered while the sidecar was still claiming"
    await client.register(job, JobSpec(lease_duration_seconds=20))
    polled = await asyncio.wait_for(waiting, 20)
    assert polled.status_code == 200 and polled.json()["state"] == "held", polled.text
    lease = await api.held()
    token = lease["token"]
    for method, path in (("GET", "/v1/lease"), ("HEAD", "/v1/lease"), ("GET", "/readyz"),
                         ("HEAD", "/readyz"), ("GET", "/healthz"), ("HEAD", "/healthz"),
                         ("GET", "/metrics"), ("HEAD", "/metrics")):
        assert (await api.call(method, path)).status_code == 200, (method, path)
    # the bearer token: /v1/* only
    for method, path in (("GET", "/v1/lease"), ("HEAD", "/v1/lease"),
                         ("POST", "/v1/complete"), ("POST", "/v1/checkpoint"),
                         ("POST", "/v1/release")):
        assert (await api.call(method, path, auth=False, json={"token": token})
                ).status_code == 401
    # wrong methods
    for method, path in (("DELETE", "/v1/lease"), ("GET", "/v1/complete"),
                         ("GET", "/v1/checkpoint"), ("GET", "/v1/release"),
                         ("POST", "/healthz"), ("POST", "/readyz"), ("POST", "/metrics")):
        assert (await api.call(method, path)).status_code == 405, (method, path)
    # bad bodies, too large, stale: nothing is written
    big = "x" * 70_000
    for path, bad in (("/v1/complete", {"token": "1"}), ("/v1/checkpoint", {"token": token}),
                      ("/v1/release", {"token": True})):
        assert (await api.call("POST", path, json=bad)).status_code == 400, path
    assert (await api.call("POST", "/v1/release", content=b"{not json")).status_code == 400
    assert (await api.call("POST", "/v1/complete", json={"token": token, "result": big})
            ).status_code == 413
    assert (await api.call("POST", "/v1/checkpoint", json={"token": token, "data": big})
            ).status_code == 413
    assert (await api.call("POST", "/v1/release", json={"token": token, "pad": "x" * 8192})
            ).status_code == 413
    # next (the next queue item in the completion's answer) is only for a draining
    # sidecar: a job's refuses it; tests/sidecar/test_queue_mode.py holds its answers
    r = await api.call("POST", "/v1/complete", params={"next": "5"},
                       json={"token": token, "result": 1})
    assert r.status_code == 400 and "draining a queue" in r.json()["message"], r.text
    for path in ("/v1/complete", "/v1/checkpoint", "/v1/release"):
        r = await api.call("POST", path, json={"token": token + 1000, "result": 1, "data": 1})
        assert r.status_code == 409 and r.json()["error"] == "stale", path
    state = await client.get(job)
    assert state.result is None and state.holder is not None and state.holder.token == token
    # checkpoint, then complete
    r = await api.call("POST", "/v1/checkpoint", json={"token": token, "data": {"step": 1}})
    assert r.status_code == 200 and r.json()["data"] == {"step": 1}
    assert (await api.call("GET", "/v1/lease")).json()["checkpoint"]["data"] == {"step": 1}
    r = await api.call("POST", "/v1/complete", json={"token": token, "result": {"n": 1}})
    assert r.status_code == 200 and r.json()["result"] == {"n": 1}
    again = await api.call("POST", "/v1/complete", json={"token": token, "result": {"n": 1}})
    assert again.status_code == 200 and again.json() == r.json()
    view = await api.call("GET", "/v1/lease")
    assert view.status_code == 409 and view.json()["error"] == "completed"
    assert (await api.call("HEAD", "/v1/lease")).status_code == 409
    # a release under the token the job was completed with
    r = await api.call("POST", "/v1/release", json={"token": token})
    assert r.status_code == 409 and r.json()["error"] == "completed"


async def _release(start: Any) -> None:
    api, _ = await start("release")
    token = (await api.held())["token"]
    r = await api.call("POST", "/v1/release", json={"token": token})
    assert r.status_code == 200 and r.json() == {"state": "released", "token": token}
    assert (await api.call("POST", "/v1/release", json={"token": token})).status_code == 200
    view = await api.call("GET", "/v1/lease")
    assert view.status_code == 409 and view.json()["error"] == "released"


async def _rate_limited(start: Any) -> None:
    """A burst of one, refilled every 5 s: the second request at once is limited."""
    api, _ = await start("limited", JOBLEASE_SIDECAR_RATE_LIMIT="0.2")
    await api.held()  # through the sidecar helper: spends the burst
    for method, path in (("GET", "/v1/lease"), ("HEAD", "/v1/lease"),
                         ("POST", "/v1/complete"), ("POST", "/v1/checkpoint"),
                         ("POST", "/v1/release")):
        r = await api.call(method, path, json={"token": 1})
        assert r.status_code == 429, (method, path, r.status_code)


async def _unavailable(start: Any, env: Env, path: str) -> None:
    """etcd unreachable while the lease is held (requests dropped by the proxy): 503."""
    proxy = await SeverableProxy.to(env.etcd_config.endpoints[0])
    try:
        api, _ = await start("cut" + path.rsplit("/", 1)[1], ttl=30,
                             JOBLEASE_ETCD_ENDPOINTS=proxy.endpoint)
        token = (await api.held())["token"]
        if path == "/v1/release":
            # a release whose outcome is unknown ends in 200 once the lease has ended
            # (the job is given back either way); 503 is for an etcd that refuses
            # connections while the lease is still held
            await proxy.close()
        else:
            proxy.mode = "drop_requests"
        r = await api.call("POST", path, json={"token": token, "result": 1, "data": 1})
        assert r.status_code == 503, r.text
    finally:
        await proxy.close()


UNDOCUMENTED_PATHS = ["/", "/v1", "/v1/", "/v1/leases", "/v2/lease", "/v1/lease/",
                      "/healthz/", "/v1//lease", "/debug/pprof/", "/openapi.json", "/docs",
                      "/livez", "/v1/Lease"]


async def test_the_sidecar_serves_nothing_the_document_lacks(start: Any) -> None:
    """Every method on every documented route, and paths the document does not have."""
    api, _ = await start("probe", bearer=BEARER)
    await api.held()
    for path in DOC["paths"]:
        for method in METHODS:
            body = {"json": {"token": 1}} if method in ("post", "put", "patch") else {}
            await api.call(method.upper(), path, **body)
    for path in UNDOCUMENTED_PATHS:
        for method in ("GET", "POST", "HEAD"):
            await api.call(method, path, follow_redirects=False)


async def test_every_documented_route_and_status_is_served_as_documented(
        start: Any, env: Env, client: JobLeaseClient, conformance: Conformance) -> None:
    """Every (route, method, status) the document lists is produced by a real sidecar
    and its answer validates; an answer the document lacks fails at once."""
    await _main_routes(start, client)
    await _release(start)
    await _rate_limited(start)
    await asyncio.gather(*(_unavailable(start, env, path)
                           for path in ("/v1/complete", "/v1/checkpoint", "/v1/release")))
    missing = sorted(documented() - conformance.seen)
    assert not missing, f"documented but never seen: {missing}"


def test_the_document_is_openapi_3_1_with_valid_schemas() -> None:
    assert DOC["openapi"].startswith("3.1.")
    for schema in DOC["components"]["schemas"].values():
        jsonschema.Draft202012Validator.check_schema(schema)
    for path, item in DOC["paths"].items():
        assert set(item) <= set(METHODS), path
        for method, op in item.items():
            assert op["responses"], (path, method)
            assert all(100 <= int(s) < 600 for s in op["responses"]), (path, method)
