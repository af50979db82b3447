"""Settings and the operator's main coroutine.

kopf settings, each chosen on purpose (see docs/operator.md):

- ``persistence.finalizer = "joblease.io/finalizer"``: our domain, not kopf's;
  deletion waits until the etcd keys are removed.
- progress and diff-base in *annotations* under ``joblease.io/``: ``status``
  belongs entirely to the mirror (kopf's default also writes ``status.kopf``).
- ``peering.standalone``: one replica (Deployment strategy ``Recreate``); no
  peering objects or their RBAC. Two overlapping replicas would still not
  regress a status (conditional writes), but handlers could run twice.
- ``watching.server_timeout``/``client_timeout``: the API server ends each
  watch after ``server_timeout`` and kopf re-lists; the client gives up a bit
  later so a silently dead connection is noticed.
- ``posting.level = WARNING``: kopf's own Events only for failures; the
  operator's lifecycle Events (Claimed, Expired, ...) come from the mirror.

kopf is also given the operator's identity (:func:`operator_identity`) instead
of guessing it with ``getpass.getuser()``, which fails for a UID without a
passwd entry: the image's 65532, or any ``runAsUser`` a cluster picks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from dataclasses import dataclass

import kopf

# kopf.operator(identity=...) takes this NewType; kopf's public namespace does
# not re-export it (kopf's own CLI imports it from here too).
from kopf._core.engines.peering import Identity

from joblease.client import JobLeaseClient
from joblease.errors import JobLeaseError
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.operator.handlers import build_registry
from joblease.operator.kube import KubeApi, login
from joblease.operator.metrics import OperatorMetrics, serve
from joblease.operator.mirror import Mirror
from joblease.operator.registration import FINALIZER, GROUP
from joblease.operator.status import DEFAULT_RESULT_LIMIT
from joblease.operator.tenants import (
    DEFAULT_RESYNC_INTERVAL,
    TenantManager,
    supervise,
    warn_if_auth_disabled,
)
from joblease.operator.webhook import WebhookConfig, kube_lookup, serve_webhook

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OperatorConfig:
    """``namespaces`` empty means every namespace (cluster-wide)."""

    namespaces: tuple[str, ...] = ()
    etcd: EtcdConfig | None = None  # None: EtcdConfig.from_env()
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080  # 0: no metrics/probe server
    server_timeout: int = 300  # whole seconds: the API server refuses "60.0"
    client_timeout_margin: int = 30
    result_limit: int = DEFAULT_RESULT_LIMIT
    concurrency: int = 32
    #: Per-namespace etcd users + Secret ``joblease-etcd-credentials`` (operator.tenants).
    tenant_credentials: bool = False
    tenant_resync_interval: float = DEFAULT_RESYNC_INTERVAL  # <= 0: no periodic resync
    #: The sidecar-injection webhook (operator.webhook); None: not served.
    webhook: WebhookConfig | None = None

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces


def build_settings(config: OperatorConfig) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=GROUP, key="last-handled-configuration")
    settings.peering.standalone = True
    settings.peering.clusterwide = config.clusterwide
    settings.watching.server_timeout = int(config.server_timeout)
    settings.watching.client_timeout = config.server_timeout + config.client_timeout_margin
    settings.watching.connect_timeout = 30.0
    settings.networking.request_timeout = 60.0
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "joblease-operator"
    settings.posting.reporting_instance = os.environ.get("HOSTNAME", "joblease-operator")
    return settings


def operator_identity() -> Identity:
    """Who this operator process is, for kopf (peering records, logs).

    kopf's default (``peering.detect_own_id``) is ``user@host/...`` with the
    user from ``getpass.getuser()``, which raises ``KeyError`` when the UID has
    no passwd entry and neither ``LOGNAME`` nor ``USER`` is set: the image runs
    as 65532, which its base (python:slim) does not list, so the operator
    crash-looped in a pod. This identity needs no account database: kopf's own
    ``POD_ID`` if set, else the numeric UID, the host name (the pod's name in a
    pod), the start time and the pid.
    """
    pod = os.environ.get("POD_ID")
    if pod:
        return Identity(pod)
    host = socket.gethostname() or "localhost"
    started = time.strftime("%Y%m%d%H%M%S", time.gmtime())
    return Identity(f"uid-{os.getuid()}@{host}/{started}/{os.getpid()}")


async def run_operator(config: OperatorConfig) -> None:
    """Run kopf (registration, finalizer) and the mirror (status, events) until a
    signal stops kopf or the mirror fails; the process then exits so that
    Kubernetes restarts it, and the restart resyncs from an etcd snapshot."""
    etcd = config.etcd or EtcdConfig.from_env()
    settings = build_settings(config)
    metrics = OperatorMetrics()

    def credentials() -> kopf.ConnectionInfo:
        return login(settings)

    kube = KubeApi(credentials)
    # the webhook first, independent of kopf and etcd: every replica answers admissions
    async with serve_webhook(config.webhook, kube_lookup(kube.get)), \
            JobLeaseClient(etcd) as client:
        mirror = Mirror(client, kube, metrics, namespaces=config.namespaces,
                        concurrency=config.concurrency, result_limit=config.result_limit)
        tenants = None
        tenants_task: asyncio.Task[None] | None = None
        if config.tenant_credentials:
            if not isinstance(client.store, EtcdStore):
                raise TypeError("tenant credentials need the etcd store")
            tenants = TenantManager(client.store, etcd.root, kube,
                                    resync_interval=config.tenant_resync_interval)
            await warn_if_auth_disabled(client.store)
            tenants_task = asyncio.create_task(supervise(tenants), name="joblease-tenants")
        registry = build_registry(client, mirror, credentials, tenants)
        ready_flag, stop_flag = asyncio.Event(), asyncio.Event()
        mirror_task = asyncio.create_task(mirror.run(), name="joblease-mirror")

        async def healthy() -> bool:
            return not mirror_task.done()

        async def ready() -> bool:
            if not ready_flag.is_set() or mirror_task.done():
                return False
            try:
                await client.store.get(client.keys.namespace_prefix() + b"\0readyz")
            except JobLeaseError:
                return False
            return True

        runner = None
        if config.metrics_port:
            runner = await serve(metrics, config.metrics_host, config.metrics_port,
                                 healthy=healthy, ready=ready)
        log.info("joblease operator: etcd %s root %s, %s%s", ",".join(etcd.endpoints), etcd.root,
                 "all namespaces" if config.clusterwide else f"namespaces {config.namespaces}",
                 ", per-namespace tenant credentials" if tenants is not None else "")
        kopf_task = asyncio.create_task(kopf.operator(
            registry=registry, settings=settings, standalone=True,
            identity=operator_identity(),
            clusterwide=config.clusterwide, namespaces=list(config.namespaces),
            ready_flag=ready_flag, stop_flag=stop_flag,
        ), name="kopf")
        try:
            done, _ = await asyncio.wait({kopf_task, mirror_task},
                                         return_when=asyncio.FIRST_COMPLETED)
            if mirror_task in done:
                log.error("the etcd mirror stopped; stopping the operator")
                stop_flag.set()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(kopf_task, timeout=30)
                mirror_task.result()  # re-raise its error
            else:
                kopf_task.result()
        finally:
            tasks = [mirror_task, kopf_task] + ([tenants_task] if tenants_task else [])
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await mirror.close()
            await kube.close()
            if runner is not None:
                await runner.cleanup()
