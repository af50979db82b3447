"""The example destination is fenced behind a path prefix too.

``uvicorn --root-path /api`` (what a proxy serving the ledger under ``/api``
needs) puts the prefix in ``scope["path"]`` and ``scope["root_path"]``;
Starlette routes on the path below the prefix. The fence must match routes the
same way, or stale tokens and requests without fencing headers reach the app.
A real uvicorn process serves the ledger; the tokens come from real claims.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.embedded import free_port
from joblease.fencing.http import HEADER_JOB, HEADER_TOKEN, route_path
from tests.support.waiting import poll

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def ledger_under_api(tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "uvicorn.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "examples.destination:create_app",
         "--root-path", "/api", "--host", "127.0.0.1", "--port", str(port)],
        cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)
        log.close()


async def _up(url: str) -> bool:
    try:
        async with httpx.AsyncClient(timeout=2) as http:
            return (await http.get(f"{url}/healthz")).status_code == 200
    except httpx.TransportError:
        return False


async def test_fencing_holds_behind_a_root_path(etcd_config: EtcdConfig,
                                               ledger_under_api: str) -> None:
    url = ledger_under_api
    await poll(lambda: _up(url), 30, "the ledger to serve")
    job = JobRef("default", "behind-a-proxy")
    async with JobLeaseClient(etcd_config) as c, httpx.AsyncClient(timeout=30) as http:
        await c.register(job, JobSpec(lease_duration_seconds=5))
        old = await c.claim(job, "worker-a")
        await old.release()
        new = await c.claim(job, "worker-b")

        def fence(token: int) -> dict[str, str]:
            return {HEADER_JOB: str(job), HEADER_TOKEN: str(token)}

        bare = await http.post(f"{url}/resources/out", json={"n": 0})
        assert bare.status_code == 400, bare.text  # no fencing headers: the app never runs
        ok = await http.post(f"{url}/resources/out", json={"n": 1}, headers=fence(new.token))
        assert ok.status_code == 201, ok.text
        stale = await http.post(f"{url}/resources/out", json={"n": 2},
                                headers=fence(old.token))
        assert stale.status_code == 409, stale.text
        assert stale.json()["highestToken"] == new.token
        await new.release()
        ledger = (await http.get(f"{url}/resources/out")).json()
    assert [e["data"] for e in ledger["entries"]] == [{"n": 1}]
    assert ledger["highestToken"] == new.token


@pytest.mark.parametrize("path, root_path", [
    ("/api/resources/a", "/api"), ("/api", "/api"), ("/apix/resources/a", "/api"),
    ("/resources/a", "/api"), ("/resources/a", ""), ("/", ""), ("/a/b/c", "/a/b"),
])
def test_route_path_matches_starlettes_routing(path: str, root_path: str) -> None:
    """The fence strips the prefix exactly as the installed Starlette routes."""
    from starlette._utils import get_route_path

    scope = {"type": "http", "path": path, "root_path": root_path}
    assert route_path(scope) == get_route_path(scope)
