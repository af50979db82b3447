"""The operator's two API sessions, bounded. kopf's (the operator's login handler gives
kopf this one): at most ``requests`` connections for requests, however many are in
flight, and watch streams beside them without taking a slot; every response still
readable. The operator's own (``KubeApi``: the mirrors' status writes, the Event
recorder's writes): at most ``connections`` connections in a burst of writes, every write
landing, and a request waiting for a connection still bounded by its timeout.
Real kube-apiserver (and its etcd), the admin kubeconfig; nothing faked."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from typing import Any

import aiohttp
import pytest

from joblease.keys import JobRef
from joblease.operator.kube import (
    API_KEEPALIVE,
    KUBE_API_CONNECTIONS,
    KubeApi,
    kopf_session,
    login,
)
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


async def _apply(cp: ControlPlane, namespace: str, doc: str) -> subprocess.CompletedProcess[str]:
    """``kubectl apply -f -`` of ``doc`` in ``namespace``, in a thread."""
    return await asyncio.to_thread(cp.kubectl, "-n", namespace, "apply", "-f", "-", input=doc)


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
    buffer) do not outlive them by more than ``API_KEEPALIVE`` seconds."""
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
        await asyncio.sleep(2 * API_KEEPALIVE + 1)
        await get()
        assert created[0] == 2
    finally:
        await session.close()


async def test_a_burst_of_status_writes_and_events_opens_at_most_the_bound(
    kubeconfig: ControlPlane, namespace: str
) -> None:
    """Twice :data:`KUBE_API_CONNECTIONS` writes at once (a status write per JobLease and
    an Event each, as a claim storm makes them): at most that many connections (the
    unbounded session opened one per write), and every write lands."""
    n = KUBE_API_CONNECTIONS
    names = [f"burst-{i}" for i in range(n)]
    items = [json.loads(joblease(name, {"leaseDurationSeconds": 30})) for name in names]
    applied = await _apply(
        kubeconfig, namespace, json.dumps({"apiVersion": "v1", "kind": "List", "items": items})
    )
    assert applied.returncode == 0, applied.stderr
    kube = KubeApi(login)
    try:
        created = _count_connections(await kube._client())  # the real session
        objs = await asyncio.wait_for(
            asyncio.gather(*(kube.get(JobRef(namespace, name)) for name in names)), 60
        )

        def event(obj: dict[str, Any]) -> dict[str, Any]:
            meta = obj["metadata"]
            return {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {
                    "apiVersion": obj["apiVersion"],
                    "kind": obj["kind"],
                    "name": meta["name"],
                    "namespace": namespace,
                    "uid": meta["uid"],
                },
                "type": "Normal",
                "reason": "Burst",
                "message": "one of a burst",
                "count": 1,
            }

        await asyncio.wait_for(
            asyncio.gather(
                *(kube.replace_status(obj, {"etcdRevision": 7}) for obj in objs),
                *(kube.create_event(namespace, event(obj)) for obj in objs),
            ),
            120,
        )
        assert 1 <= created[0] <= n, created[0]
        after = await asyncio.wait_for(
            asyncio.gather(*(kube.get(JobRef(namespace, name)) for name in names)), 60
        )
        assert [o["status"]["etcdRevision"] for o in after] == [7] * n
        events = await kube._request(  # one list, not n gets
            "GET", f"/api/v1/namespaces/{namespace}/events"
        )
        assert sorted(
            e["involvedObject"]["name"] for e in events["items"] if e["reason"] == "Burst"
        ) == sorted(names)
    finally:
        await kube.close()


async def test_a_request_waiting_for_a_connection_is_still_subject_to_its_timeout(
    kubeconfig: ControlPlane, namespace: str
) -> None:
    """One connection, held by a watch stream: a request waiting for it fails after the
    request's timeout (not never), and goes through once the connection is free again."""
    await _apply(kubeconfig, namespace, joblease("held", {"leaseDurationSeconds": 30}))
    kube = KubeApi(login, timeout=2.0, connections=1)
    ref = JobRef(namespace, "held")
    try:
        session = await kube._client()  # the real session
        watch = await asyncio.wait_for(
            session.get(
                f"{kube._server}{GROUP}/namespaces/{namespace}/jobleases",
                params={"watch": "true", "timeoutSeconds": "120"},
                timeout=aiohttp.ClientTimeout(total=None),
            ),
            30,
        )
        assert watch.status == 200
        try:
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(kube.get(ref), 30)
            assert time.monotonic() - started < 20  # the request's 2 s, not wait_for's 30
        finally:
            watch.close()
        assert (await asyncio.wait_for(kube.get(ref), 30))["metadata"]["name"] == "held"
    finally:
        await kube.close()
