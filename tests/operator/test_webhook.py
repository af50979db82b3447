"""The webhook server (joblease.operator.webhook) over real TLS on a loopback port.

Real: the aiohttp server, TLS with a certificate made here (``cryptography``), an
aiohttp client verifying it. Faked: the JobLease lookup (a function answering
from a set) instead of the API server, because these tests are about the HTTP
and TLS side; tests/cluster/test_injection.py covers the API server calling it.
The lookup-failure tests put the operator's real API client (``KubeApi``) in
front of a loopback HTTP server that misbehaves as a real kube-apiserver cannot
be made to (drops the connection, truncates its answer, answers non-JSON).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kopf
import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from joblease.keys import JobRef
from joblease.operator.injection import JOB_ANNOTATION, SidecarSettings
from joblease.operator.kube import KubeApi
from joblease.operator.webhook import (
    PATH,
    JobLeaseFound,
    WebhookConfig,
    WebhookServer,
    kube_lookup,
    kube_secret_lookup,
)
from tests.support.waiting import wait_until
from tests.support.webhook_tls import post_review
from tests.support.webhook_tls import write_cert as _write_cert


def _review(annotations: dict[str, str]) -> dict[str, Any]:
    pod = {"metadata": {"generateName": "w-", "namespace": "ns", "annotations": annotations},
           "spec": {"containers": [{"name": "worker", "image": "busybox"}]}}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "abc", "namespace": "ns", "operation": "CREATE", "object": pod}}


@pytest.fixture
async def server(tmp_path: Path) -> Any:
    _write_cert(tmp_path, "first")
    known = {JobRef("ns", "present")}

    async def lookup(ref: JobRef) -> JobLeaseFound:
        return JobLeaseFound(True, 30) if ref in known else JobLeaseFound(False)

    config = WebhookConfig(port=0, host="127.0.0.1", cert_file=str(tmp_path / "tls.crt"),
                           key_file=str(tmp_path / "tls.key"), settings=SidecarSettings(),
                           reload_interval=0.1)
    srv = WebhookServer(config, lookup)
    await srv.start()
    yield srv, tmp_path
    await srv.stop()


async def _post(srv: WebhookServer, directory: Path, body: Any) -> tuple[int, Any]:
    assert srv.port is not None
    return await post_review(srv.port, directory, PATH, body)


async def test_annotated_pod_is_answered_with_a_patch_over_tls(server: Any) -> None:
    srv, directory = server
    status, answer = await _post(srv, directory, _review({JOB_ANNOTATION: "present"}))
    assert status == 200
    response = answer["response"]
    assert response["uid"] == "abc" and response["allowed"] is True
    patch = json.loads(base64.b64decode(response["patch"]))
    sidecar = patch[0]["value"][0]
    assert patch[0]["path"] == "/spec/initContainers" and sidecar["name"] == "joblease"
    # the found JobLease's TTL, as the sidecar's hint
    assert {"name": "JOBLEASE_LEASE_TTL", "value": "30"} in sidecar["env"]
    # the lookup found the JobLease; the one warning is about the worker's user
    (warning,) = response["warnings"]
    assert "'worker' runs as the image user" in warning


async def test_missing_joblease_is_warned_about_and_bad_values_refused(server: Any) -> None:
    srv, directory = server
    _, answer = await _post(srv, directory, _review({JOB_ANNOTATION: "absent"}))
    assert answer["response"]["allowed"] is True
    assert "JobLease ns/absent does not exist" in answer["response"]["warnings"][0]
    (sidecar,) = json.loads(base64.b64decode(answer["response"]["patch"]))[0]["value"]
    assert "JOBLEASE_LEASE_TTL" not in {e["name"] for e in sidecar["env"]}
    _, answer = await _post(srv, directory, _review({JOB_ANNOTATION: "present",
                                                     "joblease.io/api-port": "0"}))
    assert answer["response"]["allowed"] is False
    assert "joblease.io/api-port: '0'" in answer["response"]["status"]["message"]


async def test_a_body_that_is_no_review_gets_400(server: Any) -> None:
    srv, directory = server
    status, body = await _post(srv, directory, {"kind": "AdmissionReview"})
    assert status == 400 and "request" in body["error"]


async def test_a_renewed_certificate_is_served_without_a_restart(server: Any) -> None:
    srv, directory = server

    def served_name() -> str:
        pem = ssl.get_server_certificate(("127.0.0.1", srv.port))
        cert = x509.load_pem_x509_certificate(pem.encode())
        return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)

    assert await asyncio.to_thread(served_name) == "first"
    _write_cert(directory, "second")
    await asyncio.to_thread(wait_until, lambda: served_name() == "second", timeout=30,
                            what="the renewed certificate served", interval=0.1)
    status, _ = await _post(srv, directory, _review({JOB_ANNOTATION: "present"}))
    assert status == 200  # verified against the new certificate


#: How the fake API server answers every request (see :func:`_bad_api_server`).
MISBEHAVIOURS = {
    "disconnect": b"",  # reads the request, closes without a byte
    "truncated": (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 400\r\n\r\n{\"kind\": \"JobLe"),
    "not-json": (b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 23\r\n"
                 b"Connection: close\r\n\r\n<html>bad gateway</html"),
}


@contextlib.asynccontextmanager
async def _bad_api_server(answer: bytes) -> AsyncIterator[int]:
    """A loopback HTTP server that reads each request's head and sends ``answer``
    (raw bytes), then closes the connection."""
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            await reader.readuntil(b"\r\n\r\n")
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize("misbehaviour", sorted(MISBEHAVIOURS))
async def test_a_failing_lookup_only_adds_a_warning(tmp_path: Path, misbehaviour: str) -> None:
    """Whatever the API server does to the advisory lookups (JobLease and Secret), the
    pod is admitted with its patch and a warning that the check could not be made:
    never an HTTP 500, which ``failurePolicy: Fail`` turns into a refused pod."""
    _write_cert(tmp_path, "webhook")
    async with _bad_api_server(MISBEHAVIOURS[misbehaviour]) as port:
        kube = KubeApi(lambda: kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))
        config = WebhookConfig(port=0, host="127.0.0.1", cert_file=str(tmp_path / "tls.crt"),
                               key_file=str(tmp_path / "tls.key"),
                               settings=SidecarSettings(
                                   tenant_credentials=True,
                                   etcd_tls_secret="joblease-etcd-client"))
        srv = WebhookServer(config, kube_lookup(kube.get), kube_secret_lookup(kube.get_secret))
        await srv.start()
        try:
            status, answer = await _post(srv, tmp_path, _review({JOB_ANNOTATION: "job"}))
        finally:
            await srv.stop()
            await kube.close()
    assert status == 200, answer
    response = answer["response"]
    assert response["allowed"] is True and response["patch"]
    (sidecar,) = json.loads(base64.b64decode(response["patch"]))[0]["value"]
    assert "JOBLEASE_LEASE_TTL" not in {e["name"] for e in sidecar["env"]}  # no hint
    checks = [w for w in response["warnings"] if "could not check" in w]
    assert [w.split(" exists")[0] for w in checks] == [
        "joblease: could not check that JobLease ns/job",
        "joblease: could not check that Secret ns/joblease-etcd-client",
        "joblease: could not check that Secret ns/joblease-etcd-credentials"]
