"""The few Kubernetes API calls the mirror (and the tenant credentials) make, over aiohttp.

kopf's own API client is private, so the mirror keeps a small one of its own
built from the *same* credentials kopf uses: a :class:`kopf.ConnectionInfo`
from ``kopf.login_with_service_account`` (in a pod) or
``kopf.login_with_kubeconfig`` (``KUBECONFIG``), and kopf's own helpers turn it
into an SSL context and auth headers. aiohttp is already a kopf dependency;
no other Kubernetes client is needed.

Status writes are conditional: :meth:`KubeApi.replace_status` sends the
``resourceVersion`` it read, so a write based on a stale read fails with
:class:`ConflictError` instead of overwriting a newer status.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import kopf

from joblease.keys import JobRef, QueueRef, SemaphoreRef
from joblease.operator.queue_registration import QUEUE_KIND, QUEUE_PLURAL
from joblease.operator.registration import GROUP, KIND, PLURAL, VERSION
from joblease.operator.semaphore_registration import SEMAPHORE_KIND, SEMAPHORE_PLURAL

log = logging.getLogger(__name__)

COMPONENT = "joblease-operator"


class KubeApiError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class ConflictError(KubeApiError):
    """The object changed since it was read (resourceVersion mismatch)."""


class NotFoundError(KubeApiError):
    """The object does not exist (any more)."""


class InvalidError(KubeApiError):
    """The API server refused the content (422), e.g. a CRD validation rule."""


def login(settings: kopf.OperatorSettings | None = None) -> kopf.ConnectionInfo:
    """kopf's ConnectionInfo: an explicit ``KUBECONFIG`` first, then the pod's
    service account, then ``~/.kube/config``."""
    settings = settings or kopf.OperatorSettings()
    info = None
    if os.environ.get("KUBECONFIG"):
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        info = kopf.login_with_service_account(settings=settings)
    if info is None:
        info = kopf.login_with_kubeconfig(settings=settings)
    if info is None:
        raise kopf.LoginError("no service account token and no kubeconfig found")
    return info


#: kopf's API requests in flight at most, watch streams not counted (:func:`kopf_session`):
#: aiohttp's own default pool size. 32 made kopf fall 40 s behind a creation burst of
#: 10,000 JobLeases on a loaded machine (its backlog then cost more memory than the
#: connections it saved).
KOPF_REQUESTS = 100
#: Seconds an idle connection of either API session (kopf's, :func:`kopf_session`, and the
#: operator's own, :class:`KubeApi`) stays open (aiohttp's default: 15). Requests come in
#: bursts (creations, deletions, a claim storm); each idle TLS connection keeps a 256 KiB
#: read buffer, and a burst's connections would otherwise hold them for 15 s after it.
API_KEEPALIVE = 2.0
#: The operator's own requests in flight at most (:class:`KubeApi`: status writes, Events,
#: reads). It had no limit: 111 connections in a load run at 10,000 JobLeases, mostly the
#: Event recorder's background writes (one per series, not bounded by anything). 48 is the
#: mirrors' own bounds by default (the JobLease mirror's ``--concurrency`` 32, the queue
#: and semaphore mirrors' 8 each), so the mirrors never queue behind each other; Events
#: queue for a connection beyond that. Nothing holds a connection while it waits for
#: another (:meth:`KubeApi._request` reads the whole body first), so the bound cannot
#: deadlock, and the wait for a connection is inside the request's timeout.
KUBE_API_CONNECTIONS = 48
#: The queue and semaphore mirrors' bounds together (8 each), which do not change with
#: ``--concurrency``.
PERIODIC_MIRROR_CONNECTIONS = 16


def api_connections(mirror_concurrency: int) -> int:
    """The bound for :class:`KubeApi` when the JobLease mirror writes up to
    ``mirror_concurrency`` statuses at once (``--concurrency``): that many plus the
    periodic mirrors', so a raised ``--concurrency`` is not throttled back to 32 by the
    connection pool (48 at the default 32)."""
    return max(1, mirror_concurrency) + PERIODIC_MIRROR_CONNECTIONS


class _BoundedRequests:
    """An aiohttp client middleware: at most ``limit`` requests hold a connection at a
    time, except watches (``watch=true``: a stream holds its connection for minutes,
    and counting them could leave no slot for anything else).

    kopf's own session has no connection limit (``limit=0``); in a creation burst it
    opened a connection per concurrent request and kept them open (330-380 at 2,000
    JobLeases being created, docs/benchmarks-operator.md), each with asyncio's 256 KiB
    TLS read buffer. Here a request takes a slot and reads its body before giving the
    slot back, so the connection is back in the pool first: the pool never needs more
    than ``limit`` connections plus the watch streams. Requests beyond the limit wait
    for a slot, as they would for a connection of a bounded pool. (Connections idle for
    :data:`API_KEEPALIVE` seconds after a burst are closed, and their buffers freed.)"""

    def __init__(self, limit: int) -> None:
        self._slots = asyncio.Semaphore(limit)

    async def __call__(self, request: aiohttp.ClientRequest,
                       handler: Callable[[aiohttp.ClientRequest],
                                         Awaitable[aiohttp.ClientResponse]]
                       ) -> aiohttp.ClientResponse:
        if request.url.query.get("watch") in ("true", "1"):
            return await handler(request)
        async with self._slots:
            response = await handler(request)
            try:
                await response.read()  # kept by the response for the caller's json()/text()
            except BaseException:
                response.close()
                raise
            return response


def kopf_session(info: kopf.ConnectionInfo, *, requests: int = KOPF_REQUESTS
                 ) -> kopf.AiohttpSession:
    """kopf's API session as kopf builds it from ``info`` (its TLS context, auth
    headers, proxy), but with at most ``requests`` requests in flight besides the
    watch streams (:class:`_BoundedRequests`), and idle connections closed after
    :data:`API_KEEPALIVE` seconds. kopf closes it when it re-logs in (then the login
    handler makes a new one) and when it stops."""
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=info.as_ssl_context(),
                                       keepalive_timeout=API_KEEPALIVE),
        headers=info.as_http_headers(),
        proxy=info.proxy_url,
        trust_env=info.trust_env,
        middlewares=(_BoundedRequests(requests),),
    )
    return kopf.AiohttpSession(aiohttp_session=session, server=info.server,
                               default_namespace=info.default_namespace,
                               priority=info.priority, expiration=info.expiration)


class KubeApi:
    """JobLease, JobQueue and JobSemaphore reads, status replacement, Event create/patch.

    At most ``connections`` requests hold a connection at a time
    (:data:`KUBE_API_CONNECTIONS`); the others wait for one, and ``timeout`` (aiohttp's
    ``total``) counts that wait too, so a request never waits for a connection forever.
    Idle connections are closed after :data:`API_KEEPALIVE` seconds."""

    def __init__(self, login_fn: Callable[[], kopf.ConnectionInfo], *,
                 timeout: float = 10.0, connections: int = KUBE_API_CONNECTIONS) -> None:
        if connections < 1:
            raise ValueError("connections must be at least 1")  # aiohttp's 0 is unbounded
        self._login = login_fn
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._connections = connections
        self._session: aiohttp.ClientSession | None = None
        self._server = ""
        self._lock = asyncio.Lock()
        self.instance = socket.gethostname()

    @property
    def connections(self) -> int:
        """Requests that may hold a connection at once."""
        return self._connections

    async def _client(self, *, relogin: bool = False) -> aiohttp.ClientSession:
        async with self._lock:
            if relogin and self._session is not None:
                await self._session.close()
                self._session = None
            if self._session is None:
                info = self._login()  # re-read: service account tokens rotate
                self._server = str(info.server).rstrip("/")
                self._session = aiohttp.ClientSession(
                    connector=aiohttp.TCPConnector(ssl=info.as_ssl_context(),
                                                   limit=self._connections, limit_per_host=0,
                                                   keepalive_timeout=API_KEEPALIVE),
                    headers={**info.as_http_headers(), "User-Agent": COMPONENT},
                    timeout=self._timeout,
                )
            return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _request(self, method: str, path: str, body: Any = None, *,
                       content_type: str | None = None) -> dict[str, Any]:
        headers = {"Content-Type": content_type} if content_type else None
        for attempt in (1, 2):
            session = await self._client(relogin=attempt == 2)
            async with session.request(method, self._server + path, json=body,
                                       headers=headers) as resp:
                if resp.status == 401 and attempt == 1:
                    continue  # expired token: log in again once
                text = await resp.text()
                if resp.status == 404:
                    raise NotFoundError(404, text[:300])
                if resp.status == 409:
                    raise ConflictError(409, text[:300])
                if resp.status == 422:
                    raise InvalidError(422, text[:500])
                if resp.status >= 300:
                    raise KubeApiError(resp.status, text[:500])
                data: dict[str, Any] = await resp.json(content_type=None)
                return data
        raise AssertionError("unreachable")

    @staticmethod
    def _path(job: JobRef | QueueRef | SemaphoreRef, subresource: str = "",
              plural: str = PLURAL) -> str:
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{job.namespace}/{plural}/{job.name}"
        return path + (f"/{subresource}" if subresource else "")

    async def get(self, job: JobRef) -> dict[str, Any]:
        return await self._request("GET", self._path(job))

    async def get_queue(self, queue: QueueRef) -> dict[str, Any]:
        return await self._request("GET", self._path(queue, plural=QUEUE_PLURAL))

    async def get_semaphore(self, semaphore: SemaphoreRef) -> dict[str, Any]:
        return await self._request("GET", self._path(semaphore, plural=SEMAPHORE_PLURAL))

    async def replace_status(self, obj: dict[str, Any], status: dict[str, Any]
                             ) -> dict[str, Any]:
        """PUT the status subresource; conditional on ``obj``'s resourceVersion.
        ``obj`` is a JobLease, a JobQueue or a JobSemaphore (its ``kind`` says which)."""
        meta = obj["metadata"]
        kind = obj.get("kind") or KIND
        plural = {QUEUE_KIND: QUEUE_PLURAL, SEMAPHORE_KIND: SEMAPHORE_PLURAL}.get(kind, PLURAL)
        body = {"apiVersion": obj.get("apiVersion", f"{GROUP}/{VERSION}"), "kind": kind,
                "metadata": {"name": meta["name"], "namespace": meta["namespace"],
                             "resourceVersion": meta["resourceVersion"]},
                "spec": obj.get("spec", {}), "status": status}
        return await self._request(
            "PUT", self._path(JobRef(meta["namespace"], meta["name"]), "status", plural), body)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a core/v1 Event (:mod:`joblease.operator.event_recorder` builds it)."""
        return await self._request("POST", f"/api/v1/namespaces/{namespace}/events", body)

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]
                          ) -> dict[str, Any]:
        """JSON merge patch of one Event (its ``count``, ``lastTimestamp``, ``message``);
        :class:`NotFoundError` once it is gone (deleted, or expired by the API server)."""
        return await self._request("PATCH", f"/api/v1/namespaces/{namespace}/events/{name}",
                                   patch, content_type="application/merge-patch+json")

    # -- JobLease listing and the tenant credentials Secret (joblease.operator.tenants) -----

    async def list_jobleases(self, namespace: str) -> list[dict[str, Any]]:
        data = await self._request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/"
                                          f"{PLURAL}")
        items: list[dict[str, Any]] = data.get("items") or []
        return items

    async def list_namespaces(self, label_selector: str) -> list[str]:
        """Names of the namespaces matching ``label_selector`` (``key=value``) that are
        not being deleted."""
        data = await self._request("GET", "/api/v1/namespaces?labelSelector="
                                   + urllib.parse.quote(label_selector, safe=""))
        return sorted(o["metadata"]["name"] for o in data.get("items") or []
                      if not o["metadata"].get("deletionTimestamp"))

    @staticmethod
    def _secret_path(namespace: str, name: str = "") -> str:
        return f"/api/v1/namespaces/{namespace}/secrets" + (f"/{name}" if name else "")

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Secret, or None if it does not exist."""
        try:
            return await self._request("GET", self._secret_path(namespace, name))
        except NotFoundError:
            return None

    async def get_cronjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The CronJob (batch/v1), or None if it does not exist (the webhook reads its
        ``status.lastScheduleTime`` for a Job made from it by hand)."""
        try:
            return await self._request(
                "GET", f"/apis/batch/v1/namespaces/{namespace}/cronjobs/{name}")
        except NotFoundError:
            return None

    async def create_secret(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._request("POST", self._secret_path(namespace), body)

    async def replace_secret(self, namespace: str, name: str, body: dict[str, Any]
                             ) -> dict[str, Any]:
        """PUT; conditional on ``body.metadata.resourceVersion`` (409 if it changed)."""
        return await self._request("PUT", self._secret_path(namespace, name), body)

    async def delete_secret(self, namespace: str, name: str, *, uid: str) -> bool:
        """Delete the Secret with this uid; False if it was already gone."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": {"uid": uid}}
        try:
            await self._request("DELETE", self._secret_path(namespace, name), body)
        except NotFoundError:
            return False
        return True
