"""Settings and the operator's main coroutine.

kopf settings, each chosen on purpose (see docs/operator.md):

- ``persistence.finalizer = "joblease.io/finalizer"``: our domain, not kopf's;
  deletion waits until the etcd keys are removed.
- progress and diff-base in *annotations* under ``joblease.io/``: ``status``
  belongs entirely to the mirror (kopf's default also writes ``status.kopf``).
- ``peering.standalone``: kopf's own peering is not used; replicas elect one
  active replica through etcd (:mod:`joblease.operator.election`), and only
  that one runs kopf. No peering objects or their RBAC. Two replicas that
  briefly both believe they lead still cannot regress a status (conditional
  writes on ``etcdRevision``), and a deposed one's registration or
  unregistration is refused by etcd (fenced by its term: ``Leadership.guard()``),
  which makes it step down; its Kubernetes writes are not fenced.
- ``watching.server_timeout``/``client_timeout``: the API server ends each
  watch after ``server_timeout`` and kopf re-lists; the client gives up a bit
  later so a silently dead connection is noticed.
- ``watching.chunk_size``: kopf's initial list (at start and after a 410) in
  pages of :data:`LIST_CHUNK` objects, handed on page by page: a restarted
  operator at 10,000 JobLeases never holds them all parsed at once.
- ``posting.level = WARNING``: kopf's own Events only for failures; the
  operator's lifecycle Events (Claimed, Expired, ...) come from the mirror.

kopf is also given the operator's identity (:func:`operator_identity`) instead
of guessing it with ``getpass.getuser()``, which fails for a UID without a
passwd entry: the image's 65532, or any ``runAsUser`` a cluster picks.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fnmatch
import logging
import math
import os
import re
import signal
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web

# kopf.operator(identity=...) takes this NewType; kopf's public namespace does
# not re-export it (kopf's own CLI imports it from here too).
from kopf._core.engines.peering import Identity

from joblease.client import JobLeaseClient
from joblease.envvars import read_bool, read_float, read_int, read_list, read_str
from joblease.errors import InvalidInputError, JobLeaseError
from joblease.etcd_store import EtcdConfig, EtcdStore
from joblease.operator import allocator
from joblease.operator.election import DEFAULT_TTL as ELECTION_TTL
from joblease.operator.election import MAX_TTL, MIN_TTL, Election, Leadership, check_name
from joblease.operator.handlers import build_registry
from joblease.operator.kube import KubeApi, api_connections, login
from joblease.operator.metrics import OperatorMetrics, serve
from joblease.operator.mirror import Mirror
from joblease.operator.queue_mirror import DEFAULT_INTERVAL as QUEUE_INTERVAL
from joblease.operator.queue_mirror import QueueMirror
from joblease.operator.registration import FINALIZER, GROUP
from joblease.operator.semaphore_mirror import SemaphoreMirror
from joblease.operator.status import DEFAULT_RESULT_LIMIT
from joblease.operator.tenants import (
    DEFAULT_RESYNC_INTERVAL,
    DEFAULT_ROTATION_GRACE,
    TenantManager,
    read_tls_dir,
    supervise,
    turn_auth_on,
    warn_if_auth_disabled,
)
from joblease.operator.webhook import (
    WebhookConfig,
    kube_cronjob_lookup,
    kube_lookup,
    kube_queue_lookup,
    kube_secret_lookup,
    serve_webhook,
)

log = logging.getLogger(__name__)


#: The operator's own variables (``docs/operator.md#configuration``), by setting;
#: the etcd connection's are :meth:`EtcdConfig.from_env`'s.
ENV = {
    "namespaces": "JOBLEASE_NAMESPACES",
    "metrics_host": "JOBLEASE_METRICS_HOST",
    "metrics_port": "JOBLEASE_METRICS_PORT",
    "tenant_credentials": "JOBLEASE_TENANT_CREDENTIALS",
    "tenant_resync_interval": "JOBLEASE_TENANT_RESYNC_INTERVAL",
    "tenant_namespace_label": "JOBLEASE_TENANT_NAMESPACE_LABEL",
    "tenant_tls_dir": "JOBLEASE_TENANT_TLS_DIR",
    "tenant_rotation_grace": "JOBLEASE_TENANT_ROTATION_GRACE",
    "etcd_enable_auth": "JOBLEASE_ETCD_ENABLE_AUTH",
    "queue_interval": "JOBLEASE_QUEUE_INTERVAL",
    "leader_election": "JOBLEASE_LEADER_ELECTION",
    "leader_election_ttl": "JOBLEASE_LEADER_ELECTION_TTL",
    "leader_election_name": "JOBLEASE_LEADER_ELECTION_NAME",
    "webhook_port": "JOBLEASE_WEBHOOK_PORT",
    "webhook_cert_dir": "JOBLEASE_WEBHOOK_CERT_DIR",
    "webhook_settings": "JOBLEASE_WEBHOOK_SETTINGS",
    "log_level": "JOBLEASE_LOG_LEVEL",
}


def _setting(attr: str) -> str:
    """How a user sets ``attr``: its variable and its flag, for error messages."""
    flag = "--" + attr.replace("_", "-")
    return f"{ENV[attr]}, {flag}" if attr in ENV else flag


@dataclass(frozen=True)
class OperatorConfig:
    """What one operator process does; each default here is the only one (the
    ``joblease operator`` flags and :meth:`from_env` fall back to it).

    ``namespaces`` empty means every namespace (cluster-wide)."""

    namespaces: tuple[str, ...] = ()
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    metrics_host: str = "0.0.0.0"
    metrics_port: int = 8080  # 0: no metrics/probe server
    server_timeout: int = 300  # whole seconds: the API server refuses "60.0"
    client_timeout_margin: int = 30
    result_limit: int = DEFAULT_RESULT_LIMIT
    concurrency: int = 32
    #: Seconds between two reads of each JobQueue's counts and each JobSemaphore's
    #: state (and at most one status write each).
    queue_interval: float = QUEUE_INTERVAL
    #: Per-namespace etcd users + Secret ``joblease-etcd-credentials`` (operator.tenants).
    tenant_credentials: bool = False
    tenant_resync_interval: float = DEFAULT_RESYNC_INTERVAL  # <= 0: no periodic resync
    #: ``key=value``: tenants follow this namespace label (the webhook's opt-in), not
    #: JobLeases; None: a tenant per namespace with JobLeases.
    tenant_namespace_label: str | None = None
    #: A directory whose ca.crt, tls.crt, tls.key are copied into each tenant Secret
    #: (the workers' transport certificate, naming no etcd user); None: none.
    tenant_tls_dir: str | None = None
    #: Seconds both users of a rotation stay valid (operator.tenants).
    tenant_rotation_grace: float = DEFAULT_ROTATION_GRACE
    #: Before connecting as the configured user (``root``), turn etcd auth on with its
    #: password if it is off (the chart's bundled etcd: tenancy.enable_auth).
    etcd_enable_auth: bool = False
    #: Elect one active replica through etcd (:mod:`joblease.operator.election`). False:
    #: this process is active whatever others do (tests that force overlapping operators).
    leader_election: bool = True
    leader_election_ttl: int = ELECTION_TTL
    #: Replicas with the same name elect one leader; None: ``DEFAULT_ELECTION_NAME``,
    #: the one election of every operator on the key root, whatever its namespaces.
    leader_election_name: str | None = None
    #: The sidecar-injection webhook (operator.webhook); None: not served.
    webhook: WebhookConfig | None = None
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not 0 <= self.metrics_port < 65536:
            raise InvalidInputError(
                f"invalid metrics port {self.metrics_port} ({_setting('metrics_port')}): "
                "0-65535")
        ttl = self.leader_election_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, int) or not MIN_TTL <= ttl <= MAX_TTL:
            raise InvalidInputError(
                f"invalid leader election TTL {ttl!r} ({_setting('leader_election_ttl')}): "
                f"whole seconds, {MIN_TTL}-{MAX_TTL}")
        if self.leader_election_name is not None:
            try:
                check_name(self.leader_election_name)
            except ValueError as exc:
                raise InvalidInputError(
                    f"{exc} ({_setting('leader_election_name')})") from None
        if not math.isfinite(self.tenant_resync_interval):
            raise InvalidInputError(
                f"invalid tenant resync interval {self.tenant_resync_interval!r} "
                f"({_setting('tenant_resync_interval')}): seconds, 0 disables")
        if not (math.isfinite(self.tenant_rotation_grace) and self.tenant_rotation_grace >= 0):
            raise InvalidInputError(
                f"invalid tenant rotation grace {self.tenant_rotation_grace!r} "
                f"({_setting('tenant_rotation_grace')}): seconds >= 0")
        label = self.tenant_namespace_label
        if label is not None and not re.fullmatch(r"[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*", label):
            raise InvalidInputError(
                f"invalid tenant namespace label {label!r} "
                f"({_setting('tenant_namespace_label')}): key=value")
        if self.etcd_enable_auth and not (self.etcd.username and self.etcd.password):
            raise InvalidInputError(
                f"{_setting('etcd_enable_auth')} needs the etcd user and password to enable "
                "auth with (JOBLEASE_ETCD_USERNAME, JOBLEASE_ETCD_PASSWORD_FILE)")
        if not (math.isfinite(self.queue_interval) and 0.1 <= self.queue_interval <= 3600):
            raise InvalidInputError(
                f"invalid queue interval {self.queue_interval!r} ({_setting('queue_interval')}):"
                " seconds, 0.1-3600")
        if not isinstance(logging.getLevelNamesMapping().get(self.log_level), int):
            raise InvalidInputError(
                f"invalid log level {self.log_level!r} ({_setting('log_level')}): one of "
                "DEBUG, INFO, WARNING, ERROR, CRITICAL")

    @property
    def clusterwide(self) -> bool:
        return not self.namespaces

    def with_(self, **changes: Any) -> OperatorConfig:
        """A copy with ``changes`` (the one copy-with-changes name of every config)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 all_namespaces: bool = False, webhook_port: int | None = None,
                 webhook_cert_dir: str | None = None, webhook_settings: str | None = None,
                 **overrides: Any) -> OperatorConfig:
        """Read the operator's ``JOBLEASE_*`` variables (:data:`ENV`; the etcd
        connection through :meth:`EtcdConfig.from_env`); what no variable sets
        keeps the dataclass default. An empty variable counts as unset.

        ``overrides`` (flags, by attribute) win over the environment when not
        ``None``. ``all_namespaces`` (``--all-namespaces``) is refused together with
        namespaces from ``--namespace`` or ``JOBLEASE_NAMESPACES``: the two ask for
        opposite scopes. The webhook is served when ``webhook_port``
        (``JOBLEASE_WEBHOOK_PORT``) is set and not 0; ``webhook_cert_dir`` and
        ``webhook_settings`` then fill in :meth:`WebhookConfig.from_env`.
        """
        env = os.environ if environ is None else environ
        read: dict[str, Any] = {
            "namespaces": read_list(env, ENV["namespaces"]),
            "metrics_host": read_str(env, ENV["metrics_host"]),
            "metrics_port": read_int(env, ENV["metrics_port"]),
            "tenant_credentials": read_bool(env, ENV["tenant_credentials"]),
            "tenant_resync_interval": read_float(env, ENV["tenant_resync_interval"]),
            "tenant_namespace_label": read_str(env, ENV["tenant_namespace_label"]),
            "tenant_tls_dir": read_str(env, ENV["tenant_tls_dir"]),
            "tenant_rotation_grace": read_float(env, ENV["tenant_rotation_grace"]),
            "etcd_enable_auth": read_bool(env, ENV["etcd_enable_auth"]),
            "queue_interval": read_float(env, ENV["queue_interval"]),
            "leader_election": read_bool(env, ENV["leader_election"]),
            "leader_election_ttl": read_int(env, ENV["leader_election_ttl"]),
            "leader_election_name": read_str(env, ENV["leader_election_name"]),
            "log_level": read_str(env, ENV["log_level"]),
        }
        values: dict[str, Any] = {k: v for k, v in read.items() if v is not None}
        given = {k: v for k, v in overrides.items() if v is not None}
        if all_namespaces and (given.get("namespaces") or values.get("namespaces")):
            source = "--namespace" if given.get("namespaces") else ENV["namespaces"]
            raise InvalidInputError(f"--all-namespaces and {source} exclude each other")
        if all_namespaces:
            given["namespaces"] = ()
        if "etcd" not in given:
            values["etcd"] = EtcdConfig.from_env(env)
        port = webhook_port if webhook_port is not None else read_int(env, ENV["webhook_port"])
        if "webhook" not in given and port:  # unset or 0: not served
            values["webhook"] = WebhookConfig.from_env(
                env, port=port, cert_dir=webhook_cert_dir, settings_file=webhook_settings)
        values.update(given)
        if "namespaces" in values:
            values["namespaces"] = tuple(values["namespaces"])
        if "log_level" in values:
            values["log_level"] = str(values["log_level"]).upper()
        return cls(**values)


#: Objects per page of kopf's initial list (``watching.chunk_size``).
LIST_CHUNK = 500


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
    settings.watching.chunk_size = LIST_CHUNK
    settings.networking.request_timeout = 60.0
    settings.posting.level = logging.WARNING
    settings.posting.reporting_component = "joblease-operator"
    settings.posting.reporting_instance = os.environ.get("HOSTNAME", "joblease-operator")
    return settings


def kube_api(config: OperatorConfig, login_fn: Callable[[], kopf.ConnectionInfo]) -> KubeApi:
    """The operator's own API session, its connections bounded to what the mirrors can
    have in flight at once: ``--concurrency`` status writes and the periodic mirrors'."""
    return KubeApi(login_fn, connections=api_connections(config.concurrency))


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


#: Seconds kopf gets to finish in-flight handlers after SIGTERM before it is cancelled.
STOP_GRACE = 1.0


class LeadershipLostError(Exception):
    """This replica stopped being the active one; the process exits with
    :data:`EXIT_LEADERSHIP_LOST` (its restart stands by)."""


#: The operator's exit code once it lost leadership (docs/operator.md).
EXIT_LEADERSHIP_LOST = 3


@dataclass
class _Replica:
    """What the probes need to know: the leader-only parts while this replica is active."""

    mirror_task: asyncio.Task[None] | None = None
    kopf_ready: asyncio.Event | None = None


#: The election of every operator on one etcd key root, unless it is given a name.
#: Not derived from the namespaces served: a rolling update that changes them, or two
#: installs whose sets overlap (``a`` and ``a,b``, or globs, which no name comparison
#: could resolve), would otherwise run one leader per set at once, and their terms
#: fence nothing across elections. The value is the name cluster-wide operators have
#: always used, so an upgrade of one stays in a single election through its rollout.
DEFAULT_ELECTION_NAME = "all-namespaces"


def election_name(config: OperatorConfig) -> str:
    """One election per etcd key root, whatever the namespaces served; a given
    ``leader_election_name`` makes a separate one (only for installs whose namespace
    sets never overlap: separate elections do not fence each other)."""
    return config.leader_election_name or DEFAULT_ELECTION_NAME


def _on_signals(stop: asyncio.Event) -> None:
    """SIGTERM/SIGINT set ``stop``. kopf installs its own handlers when it starts
    (they stop kopf only); the active parts put ours back once kopf is up."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)  # not in the main thread: no signals


async def run_operator(config: OperatorConfig) -> None:
    """Run one operator replica until a signal stops it or it fails.

    Every replica, leader or not, serves the health/metrics port (and the
    admission webhook) for as long as the process lives: the *always-on* parts.
    The leader-only parts (kopf's handlers, the etcd mirror, the tenant
    credentials) run only on the replica elected through etcd
    (:mod:`joblease.operator.election`), or on every process with
    ``leader_election=False``. A replica that loses leadership stops its
    leader-only parts at once and raises :class:`LeadershipLostError`, so the
    process exits and Kubernetes restarts it as a standby; a replica stopped by
    SIGTERM gives kopf ``STOP_GRACE`` seconds, then resigns so a standby takes over
    at once.
    A restart resyncs from an etcd snapshot.

    On glibc the process's allocator is tuned and trimmed so that freed memory
    goes back to the system (:mod:`joblease.operator.allocator`).
    """
    # Before any other thread allocates (gRPC's start with the etcd store).
    allocator.tune()
    trimming = asyncio.create_task(allocator.trim_periodically(), name="joblease-malloc-trim")
    try:
        await _run_replica(config)
    finally:
        trimming.cancel()
        await asyncio.gather(trimming, return_exceptions=True)


async def _run_replica(config: OperatorConfig) -> None:
    etcd = config.etcd
    settings = build_settings(config)
    metrics = OperatorMetrics()
    identity = operator_identity()
    stop = asyncio.Event()
    _on_signals(stop)

    def credentials() -> kopf.ConnectionInfo:
        return login(settings)

    kube = kube_api(config, credentials)
    replica = _Replica()
    # -- always-on parts: every replica, leader or not ----------------------------------
    # The webhook first, independent of kopf and etcd: every replica answers admissions.
    # Start each always-on part here (the probes just below) and stop it on the way out.
    # The operator builds the etcd store itself (typed: the tenant manager needs its
    # Auth API) and lends it to the client, which closes it.
    if config.etcd_enable_auth:
        await turn_auth_on(etcd)
    store = EtcdStore(etcd)
    async with serve_webhook(config.webhook, kube_lookup(kube.get),
                             kube_secret_lookup(kube.get_secret),
                             kube_cronjob_lookup(kube.get_cronjob),
                             kube_queue_lookup(kube.get_queue)), \
            JobLeaseClient(etcd, store=store) as client:
        runner = await _serve_probes(config, metrics, client, replica)
        log.info("joblease operator %s: etcd %s root %s, %s%s", identity,
                 ",".join(etcd.endpoints), etcd.root,
                 "all namespaces" if config.clusterwide else f"namespaces {config.namespaces}",
                 ", per-namespace tenant credentials" if config.tenant_credentials else "")
        try:
            # -- leader-only parts: the elected replica ------------------------------------
            if not config.leader_election:
                log.warning("leader election disabled: this process is active whatever "
                            "other replicas do")
                metrics.leader.set(1)
                await _run_active(config, settings, client, store, kube, credentials, metrics,
                                  identity, replica, stop, None)
                return
            # POD_ID (the chart sets it to the pod's name) names the pod, not the process:
            # a restarted container replaces its predecessor's key at once.
            election = Election(client.store, etcd.root, election_name(config), identity,
                                ttl=config.leader_election_ttl,
                                stable_identity=bool(os.environ.get("POD_ID")))
            campaign = asyncio.create_task(election.campaign(), name="joblease-campaign")
            stopped = asyncio.create_task(stop.wait())
            try:
                await asyncio.wait({campaign, stopped}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                stopped.cancel()
                if not campaign.done():
                    campaign.cancel()  # stopped while standing by
                    await asyncio.gather(campaign, return_exceptions=True)
            if campaign.cancelled():
                return
            leadership = campaign.result()
            metrics.leader.set(1)
            try:
                await _run_active(config, settings, client, store, kube, credentials, metrics,
                                  identity, replica, stop, leadership)
            finally:
                metrics.leader.set(0)
                await leadership.resign()
        finally:
            if runner is not None:
                await runner.cleanup()
    await kube.close()  # after the webhook, which looks JobLeases up through it
    log.info("joblease operator %s stopped", identity)


async def _serve_probes(config: OperatorConfig, metrics: OperatorMetrics,
                        client: JobLeaseClient, replica: _Replica) -> web.AppRunner | None:
    """/metrics, /healthz, /readyz on every replica. Ready means "this replica
    serves" (etcd answers; on the leader, kopf has started and the mirror runs),
    not "this replica leads": a standby is ready too, so a Service (the
    webhook's) sends to every replica and a rollout waits for standbys."""
    if not config.metrics_port:
        return None

    async def healthy() -> bool:
        return replica.mirror_task is None or not replica.mirror_task.done()

    async def ready() -> bool:
        if replica.mirror_task is not None and (
                replica.mirror_task.done()
                or (replica.kopf_ready is not None and not replica.kopf_ready.is_set())):
            return False
        try:
            await client.store.get(client.keys.namespace_prefix() + b"\0readyz")
        except JobLeaseError:
            return False
        return True

    return await serve(metrics, config.metrics_host, config.metrics_port,
                       healthy=healthy, ready=ready)


async def _run_active(config: OperatorConfig, settings: kopf.OperatorSettings,
                      client: JobLeaseClient, store: EtcdStore, kube: KubeApi,
                      credentials: Callable[[], kopf.ConnectionInfo], metrics: OperatorMetrics,
                      identity: Identity, replica: _Replica, stop: asyncio.Event,
                      leadership: Leadership | None) -> None:
    """kopf (registration, finalizer), the mirror (status, events) and the tenant
    credentials, until ``stop``, a failure, or the loss of ``leadership``."""
    etcd = client.config
    mirror = Mirror(client, kube, metrics, namespaces=config.namespaces,
                    concurrency=config.concurrency, result_limit=config.result_limit)
    tenants = None
    tasks: list[asyncio.Task[Any]] = []
    if config.tenant_credentials:
        tenants = TenantManager(
            store, etcd.root, kube, resync_interval=config.tenant_resync_interval,
            namespace_label=config.tenant_namespace_label,
            tls_files=read_tls_dir(config.tenant_tls_dir) if config.tenant_tls_dir else None,
            rotation_grace=config.tenant_rotation_grace,
            served=lambda ns: config.clusterwide or any(
                fnmatch.fnmatchcase(ns, pattern) for pattern in config.namespaces))
        await warn_if_auth_disabled(store)
        tasks.append(asyncio.create_task(supervise(tenants), name="joblease-tenants"))
    queue_mirror = QueueMirror(client, kube, metrics, interval=config.queue_interval)
    # Semaphores on the queues' timer: both are one small read per object per interval.
    semaphore_mirror = SemaphoreMirror(client, kube, metrics, interval=config.queue_interval,
                                       events=mirror.events)
    registry = build_registry(client, mirror, credentials, tenants, leadership, queue_mirror,
                              semaphore_mirror)
    ready_flag, stop_flag = asyncio.Event(), asyncio.Event()
    mirror_task = asyncio.create_task(mirror.run(), name="joblease-mirror")
    tasks.append(asyncio.create_task(queue_mirror.run(), name="joblease-queue-mirror"))
    tasks.append(asyncio.create_task(semaphore_mirror.run(), name="joblease-semaphore-mirror"))
    kopf_task = asyncio.create_task(kopf.operator(
        registry=registry, settings=settings, standalone=True, identity=identity,
        clusterwide=config.clusterwide, namespaces=list(config.namespaces),
        ready_flag=ready_flag, stop_flag=stop_flag,
    ), name="kopf")
    stopped = asyncio.create_task(stop.wait(), name="joblease-stop")
    lost = asyncio.create_task(leadership.wait_lost() if leadership else asyncio.Event().wait(),
                               name="joblease-leadership")
    kopf_up = asyncio.create_task(ready_flag.wait())
    kopf_up.add_done_callback(lambda _: _on_signals(stop))  # kopf's handlers replaced ours
    tasks += [mirror_task, kopf_task, stopped, lost, kopf_up]
    replica.mirror_task, replica.kopf_ready = mirror_task, ready_flag
    try:
        done, _ = await asyncio.wait({kopf_task, mirror_task, stopped, lost},
                                     return_when=asyncio.FIRST_COMPLETED)
        if lost in done:
            # Another replica may be elected from now on: stop every handler effect
            # at once (the finally cancels kopf and the mirror), no graceful stop.
            raise LeadershipLostError(f"leadership lost: {lost.result()}")
        if stopped in done or kopf_task in done:
            # SIGTERM (ours or kopf's): kopf may finish what it is doing for a moment,
            # then it is cancelled and we resign, so that the standby takes over at once.
            # (kopf's own graceful stop can wait seconds for workers sleeping on its
            # consistency timeout; every handler is idempotent, and the next leader's
            # kopf re-lists and re-runs whatever did not finish.)
            stop_flag.set()
            await asyncio.wait({kopf_task, lost}, timeout=STOP_GRACE,
                               return_when=asyncio.FIRST_COMPLETED)
            if kopf_task.done() and not kopf_task.cancelled():
                kopf_task.result()
        else:
            log.error("the etcd mirror stopped; stopping the operator")
            stop_flag.set()
            await asyncio.wait({kopf_task, lost}, timeout=30,
                               return_when=asyncio.FIRST_COMPLETED)
            mirror_task.result()  # re-raise its error
    finally:
        replica.mirror_task = replica.kopf_ready = None
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await mirror.close()
        _on_signals(stop)
