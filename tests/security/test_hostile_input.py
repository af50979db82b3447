"""Hostile, tenant-controlled input: limits are enforced with clear errors, the
sidecar API is rate limited, and fuzzing the sidecar's HTTP API and the CLI
finds no crash, no 5xx, no undocumented exit code and no write on refusal."""

from __future__ import annotations

import base64
import json
import string
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease import validation as v
from joblease.cli import main
from joblease.embedded import EtcdCluster, free_port
from joblease.errors import InvalidInputError
from joblease.sidecar.api import RateLimiter, build_app, rate_limit_from_env
from joblease.sidecar.config import SidecarConfig
from joblease.sidecar.runner import SidecarRunner
from tests.sidecar.conftest import Env

#: Exit codes the CLI documents (joblease/cli.py, joblease/errors.py).
DOCUMENTED_EXIT_CODES = {0, 2, 3, 4, 5, 6, 7, 8, 10, 11, 12}
FUZZ = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])


def etcd_revision(cluster: EtcdCluster) -> int:
    """The store's revision, through etcd's JSON gateway (independent of our client)."""
    body = json.dumps({"key": base64.b64encode(b"\0").decode()}).encode()
    url = f"http://{cluster.endpoints[0]}/v3/kv/range"
    with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=5) as r:
        return int(json.load(r)["header"]["revision"])


# -- limits ------------------------------------------------------------------------------------


async def test_limits_are_refused_with_clear_errors(client: JobLeaseClient,
                                                    etcd: EtcdCluster) -> None:
    job = JobRef("default", "limits")
    big = {"blob": "x" * v.MAX_PARAMETERS_BYTES}
    cases: list[tuple[Any, str]] = [
        (client.register(job, JobSpec(5, 1, big)), "parameters too large"),
        (client.register(JobRef("default", "n" * 254), JobSpec(5)), "at most 253"),
        (client.register(JobRef("n" * 64, "x"), JobSpec(5)), "at most 63"),
        (client.register(JobRef("default", "../escape"), JobSpec(5)), "invalid job name"),
        (client.register(JobRef("default/x", "y"), JobSpec(5)), "invalid namespace"),
        (client.register(job, JobSpec(10**9)), "between 2"),
        (client.claim(job, "o" * (v.MAX_OWNER_LENGTH + 1)), "1..253 characters"),
        (client.claim(job, "has space"), "printable ASCII"),
    ]
    before = etcd_revision(etcd)
    for coro, words in cases:
        with pytest.raises(InvalidInputError) as info:
            await coro
        assert words in str(info.value), str(info.value)
    assert etcd_revision(etcd) == before

    await client.register(job, JobSpec(5, 1))
    lease = await client.claim(job, "worker")
    before = etcd_revision(etcd)
    with pytest.raises(InvalidInputError) as info:
        await lease.complete({"blob": "y" * v.MAX_RESULT_BYTES})
    assert f"the limit is {v.MAX_RESULT_BYTES} bytes" in str(info.value)
    assert etcd_revision(etcd) == before
    await lease.release()


def test_cli_limits(etcd_config: EtcdConfig, etcd: EtcdCluster) -> None:
    env = {"JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd.endpoints), "JOBLEASE_ROOT": etcd_config.root}
    runner = CliRunner()
    before = etcd_revision(etcd)
    big = json.dumps({"blob": "x" * v.MAX_PARAMETERS_BYTES})
    for args, words in (
        (["register", "j", "--ttl", "5", "--parameters", big], "parameters too large"),
        (["register", "n" * 254, "--ttl", "5"], "at most 253"),
        (["register", "j", "-n", "N" * 64, "--ttl", "5"], "invalid namespace"),
        (["register", "j", "--ttl", "5", "--parameters", "[1]"], "JSON object"),
        (["register", "j", "--ttl", "1"], "between 2"),
        (["claim", "j", "--owner", "o" * 300], "1..253 characters"),
    ):
        r = runner.invoke(main, args, env=env)
        assert r.exit_code == 2, (args[:3], r.output)
        assert words in r.output and "Traceback" not in r.output
    assert etcd_revision(etcd) == before


# -- rate limiting -----------------------------------------------------------------------------


def test_token_bucket() -> None:
    now = [0.0]
    bucket = RateLimiter(2.0, clock=lambda: now[0])
    assert [bucket.take() for _ in range(2)] == [0.0, 0.0]  # a burst of one second's worth
    assert bucket.take() == pytest.approx(0.5)
    now[0] += 0.5
    assert bucket.take() == 0.0
    now[0] += 10
    assert [bucket.take() for _ in range(3)][:2] == [0.0, 0.0]  # never more than the burst
    with pytest.raises(ValueError):
        RateLimiter(0)


def test_rate_limit_setting() -> None:
    assert rate_limit_from_env({}) == 50.0
    assert rate_limit_from_env({"JOBLEASE_SIDECAR_RATE_LIMIT": "7.5"}) == 7.5
    for off in ("0", "off", "OFF", "none"):
        assert rate_limit_from_env({"JOBLEASE_SIDECAR_RATE_LIMIT": off}) is None
    for bad in ("fast", "-3", "nan", "inf"):  # a typo must not switch the limit off
        assert rate_limit_from_env({"JOBLEASE_SIDECAR_RATE_LIMIT": bad}) == 50.0


def _app_runner(**env: str) -> SidecarRunner:
    config = SidecarConfig.from_env({"JOBLEASE_JOB_NAME": "j", "JOBLEASE_OWNER": "o",
                                     "JOBLEASE_ETCD_ENDPOINTS": f"127.0.0.1:{free_port()}", **env})
    return SidecarRunner(config)


def _http(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://sidecar")


async def test_rate_limited_api_answers_429_json() -> None:
    runner = _app_runner()
    async with _http(build_app(runner, rate_limit=3)) as http:
        codes = [(await http.get("/v1/lease")).status_code for _ in range(3)]
        assert codes == [503, 503, 503]  # claiming (never connected): not limited yet
        r = await http.post("/v1/complete", json={"token": 1})
        assert r.status_code == 429
        assert r.json()["error"] == "rate_limited" and r.json()["message"]
        assert r.headers["retry-after"] == "1"
        # kubelet's probes are never limited
        assert [(await http.get("/healthz")).status_code for _ in range(10)] == [200] * 10


async def test_rate_limit_also_guards_the_bearer_check(tmp_path: Path) -> None:
    """Guessing the bearer token is throttled like everything else."""
    secret = tmp_path / "t"
    secret.write_text("right")
    runner = _app_runner(JOBLEASE_SIDECAR_API_TOKEN_FILE=str(secret))
    async with _http(build_app(runner, rate_limit=5)) as http:
        codes = [(await http.get("/v1/lease", headers={"Authorization": f"Bearer guess{i}"})
                  ).status_code for i in range(20)]
    assert codes[:5] == [401] * 5 and set(codes[5:]) == {429}


# -- fuzzing the sidecar's HTTP API (a real sidecar process holding a real lease) --------------

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12)
PATHS = st.sampled_from(["/v1/lease", "/v1/complete", "/v1/release", "/healthz", "/readyz",
                         "/metrics", "/v1/", "/v1/lease/", "/v1//complete"]) | st.text(
    alphabet=string.ascii_letters + string.digits + "/-._~%", max_size=30).map(lambda s: "/" + s)
HEADER_TEXT = st.text(alphabet=string.printable.strip() + " ", max_size=40)


async def test_fuzz_sidecar_http_api(tmp_path: Path, etcd_config: EtcdConfig,
                                     etcd: EtcdCluster, client: JobLeaseClient) -> None:
    env = Env(tmp_path, etcd_config)
    await env.register(client, ttl=10)
    bearer = "fuzz-bearer-" + uuid.uuid4().hex
    (tmp_path / "bearer").write_text(bearer)
    sidecar = env.sidecar("fuzz", JOBLEASE_SIDECAR_API_TOKEN_FILE=str(tmp_path / "bearer"),
                          JOBLEASE_SIDECAR_RATE_LIMIT="off")
    sidecar.api_token = bearer
    try:
        await sidecar.started()
        token = (await sidecar.held())["token"]
        revision = etcd_revision(etcd)
        not_token = st.integers().filter(lambda i: i != token)
        bodies = st.one_of(
            st.none(), st.binary(max_size=300),
            st.fixed_dictionaries({}, optional={
                "token": not_token | JSONISH, "result": JSONISH, "extra": JSONISH}),
            JSONISH)

        @FUZZ
        @given(method=st.sampled_from(["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD",
                                       "OPTIONS"]),
               path=PATHS, auth=st.sampled_from(["right", "none"]) | HEADER_TEXT,
               content_type=st.sampled_from(["application/json", "text/plain", ""]),
               body=bodies)
        def fuzz(method: str, path: str, auth: str, content_type: str, body: Any) -> None:
            headers = {"Content-Type": content_type} if content_type else {}
            if auth == "right":
                headers["Authorization"] = f"Bearer {bearer}"
            elif auth != "none":
                headers["Authorization"] = auth
            content = body if isinstance(body, bytes) else (
                None if body is None else json.dumps(body).encode())
            r = http.request(method, path, headers=headers, content=content)
            assert r.status_code < 500, (method, path, r.status_code, r.text)
            if path in ("/v1/lease", "/v1/complete", "/v1/release") and method != "HEAD":
                body_json = r.json()
                if r.status_code >= 400:
                    assert body_json["error"] and body_json["message"], body_json
            assert etcd_revision(etcd) == revision, (method, path, body)

        with httpx.Client(base_url=sidecar.url, timeout=10) as http:
            fuzz()
        assert sidecar.returncode() is None, sidecar.output()
        assert (await sidecar.lease())["token"] == token  # still held, same token
        assert "Traceback" not in sidecar.output()
        assert bearer not in sidecar.output()
    finally:
        for p in env.procs:
            p.stop()


async def test_deeply_nested_json_is_a_400() -> None:
    runner = _app_runner()
    depth = 20_000  # 40 KB: under the body limit, far over Python's recursion limit
    body = b'{"token": 1, "result": ' + b"[" * depth + b"]" * depth + b"}"
    app = build_app(runner, rate_limit=None)
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://sidecar") as http:
        r = await http.post("/v1/complete", content=body,
                            headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.status_code


def test_cli_deeply_nested_json_is_exit_2() -> None:
    nested = "[" * 20_000 + "]" * 20_000
    runner = CliRunner()
    for args in (["register", "j", "--ttl", "5", "--parameters", '{"a":' + nested + "}"],
                 ["complete", "j", "--owner", "o", "--token", "5", "--result", nested]):
        r = runner.invoke(main, [*args, "--endpoints", f"127.0.0.1:{free_port()}",
                                 "--timeout", "1"])
        assert r.exit_code == 2, (args[0], r.exit_code, r.exception)


# -- fuzzing the CLI's inputs (against the real session etcd) ---------------------------------

NAMES = st.sampled_from(["fuzz-job", "default/fuzz-job", ""]) | st.text(max_size=40)
NUMBERS = st.integers(-10, 10**6).map(str) | st.text(max_size=12)


def test_fuzz_cli_inputs(etcd_config: EtcdConfig, etcd: EtcdCluster) -> None:
    env = {"JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd.endpoints), "JOBLEASE_ROOT": etcd_config.root}
    runner = CliRunner()
    r = runner.invoke(main, ["register", "fuzz-job", "--ttl", "30"], env=env)
    assert r.exit_code == 0, r.output

    seen: set[int] = set()

    def check(args: list[str]) -> None:
        before = etcd_revision(etcd)
        r = runner.invoke(main, args, env=env)
        seen.add(r.exit_code)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.output)
        assert r.exit_code in DOCUMENTED_EXIT_CODES, (args, r.exit_code, r.output)
        assert "Traceback" not in r.output
        if r.exit_code != 0:
            assert etcd_revision(etcd) == before, (args, r.exit_code, r.output)

    @FUZZ
    @given(verb=st.sampled_from(["register", "claim", "complete", "release", "get"]),
           name=NAMES, namespace=st.sampled_from(["default", None]) | st.text(max_size=70),
           owner=st.sampled_from(["worker-1"]) | st.text(max_size=60),
           number=NUMBERS, payload=st.text(max_size=60) | JSONISH.map(json.dumps))
    def fuzz(verb: str, name: str, namespace: str | None, owner: str, number: str,
             payload: str) -> None:
        args = [verb, name]
        if namespace is not None:
            args += ["-n", namespace]
        if verb == "register":
            args += ["--ttl", number, "--max-attempts", number, "--parameters", payload]
        elif verb == "claim":
            args += ["--owner", owner]
        elif verb in ("complete", "release"):
            args += ["--owner", owner, "--token", number]
            if verb == "complete":
                args += ["--result", payload]
        check(args)

    fuzz()
    assert seen - {2}, f"the fuzz never got past input validation: {seen}"
