"""kopf's API session (the operator's login handler gives kopf this one): at most
``requests`` connections for requests, however many are in flight, and watch streams
beside them without taking a slot; every response still readable. Real kube-apiserver."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest

from joblease.operator.kube import KOPF_KEEPALIVE, kopf_session, login
from tests.support.controlplane import ControlPlane
from tests.support.operator import joblease

GROUP = "/apis/joblease.io/v1alpha1"


@pytest.fixture
def kubeconfig(crds_installed: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> ControlPlane:
    monkeypatch.setenv("KUBECONFIG", str(crds_installed.kubeconfig))
    return crds_installed


def _count_connections(session: aiohttp.ClientSession) -> list[int]:
    created = [0]

    async def on_create(*_: Any) -> None:
        created[0] += 1

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(on_create)
    trace.freeze()
    session._trace_configs.append(trace)  # the session's own list, read per request
    return created


async def test_many_requests_in_flight_use_at_most_the_limits_connections(
        kubeconfig: ControlPlane, namespace: str) -> None:
    cp = kubeconfig
    await asyncio.to_thread(cp.kubectl, "-n", namespace, "apply", "-f", "-",
                            input=joblease("one", {"leaseDurationSeconds": 30}))
    info = login()
    kopf_ctx = kopf_session(info, requests=4)
    session = kopf_ctx.aiohttp_session
    created = _count_connections(session)
    url = f"{info.server}{GROUP}/namespaces/{namespace}/jobleases/one"
    try:
        async def get() -> dict[str, Any]:
            async with session.get(url) as resp:
                assert resp.status == 200
                body: dict[str, Any] = await resp.json()
                return body

        bodies = await asyncio.wait_for(asyncio.gather(*(get() for _ in range(40))), 120)
        assert {b["metadata"]["name"] for b in bodies} == {"one"}
        assert 1 <= created[0] <= 4, created[0]
    finally:
        await session.close()


async def test_watch_streams_do_not_take_the_requests_slots(
        kubeconfig: ControlPlane, namespace: str) -> None:
    """More open watches than slots, and requests still go through (counting the
    streams would leave none: the requests would wait for minutes)."""
    info = login()
    session = kopf_session(info, requests=2).aiohttp_session
    base = f"{info.server}{GROUP}/namespaces/{namespace}/jobleases"
    watches: list[aiohttp.ClientResponse] = []
    try:
        for _ in range(4):
            resp = await asyncio.wait_for(session.get(
                base, params={"watch": "true", "timeoutSeconds": "120"}), 30)
            assert resp.status == 200
            watches.append(resp)
        await asyncio.to_thread(kubeconfig.kubectl, "-n", namespace, "apply", "-f", "-",
                                input=joblease("two", {"leaseDurationSeconds": 30}))

        async def get() -> int:
            async with session.get(f"{base}/two") as resp:
                await resp.read()
                return resp.status

        assert await asyncio.wait_for(asyncio.gather(*(get() for _ in range(6))), 60) == [200] * 6
        line = await asyncio.wait_for(watches[0].content.readline(), 30)  # a stream still streams
        assert json.loads(line)["object"]["metadata"]["name"] == "two"
    finally:
        for resp in watches:
            resp.close()
        await session.close()


async def test_an_idle_connection_is_closed_after_the_keepalive(
        kubeconfig: ControlPlane, namespace: str) -> None:
    """kopf's requests come in bursts; the connections (each with a 256 KiB TLS read
    buffer) do not outlive them by more than ``KOPF_KEEPALIVE`` seconds."""
    info = login()
    session = kopf_session(info).aiohttp_session
    created = _count_connections(session)
    url = f"{info.server}{GROUP}/namespaces/{namespace}/jobleases"
    try:
        async def get() -> None:
            async with session.get(url) as resp:
                assert resp.status == 200
                await resp.read()

        await get()
        await get()
        assert created[0] == 1  # reused while fresh
        # A timing property, not a synchronisation: idle past the keep-alive (aiohttp
        # discards such a connection when it is next wanted, or at its cleanup tick).
        await asyncio.sleep(2 * KOPF_KEEPALIVE + 1)
        await get()
        assert created[0] == 2
    finally:
        await session.close()
