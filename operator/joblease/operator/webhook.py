"""The pod-mutating admission webhook: an aiohttp HTTPS server of its own.

Not ``kopf.on.mutate``: kopf's managed webhook configuration sets no
``namespaceSelector`` (the opt-in that keeps a broken webhook from blocking
pods cluster-wide), and kopf's handlers run only where kopf runs, while every
operator replica must answer admission requests (with leader election only the
leader runs kopf). So this server is started by ``run_operator`` beside kopf,
needs neither kopf nor etcd, and keeps serving whatever kopf does.

``POST /mutate-jobs`` takes a Job's AdmissionReview and names the CronJob slot
its queue-mode pods claim (:func:`joblease.operator.cron_slots.plan_job`); for a Job
made by hand from a CronJob it reads the CronJob's ``status.lastScheduleTime``
(that lookup is not advisory: without it the slot is unknown, and the Job is
refused saying so).

``POST /mutate-pods`` takes an ``admission.k8s.io/v1`` AdmissionReview and
answers with the :func:`joblease.operator.injection.plan` patch, a refusal
(HTTP 200, ``allowed: false``, code 400 and the message saying which annotation
is wrong) or an unchanged admission. ``GET /healthz`` answers 200.

Before planning, the webhook looks up (through the API server, at most
``LOOKUP_TIMEOUT`` seconds, all at once) the pod's JobLease and the etcd
credential Secrets the injected pod will mount; a missing one becomes a
warning, and a found JobLease's ``spec.leaseDurationSeconds`` becomes the
sidecar's TTL hint (``JOBLEASE_LEASE_TTL``, see :func:`~joblease.operator.injection.plan`).
The lookups are advisory (:func:`advisory`): whatever goes wrong with them, the
answer is the same admission with a warning saying the check could not be made,
never an HTTP error (which ``failurePolicy: Fail`` would turn into a refused
pod), and without the hint.

TLS: the serving certificate and key come from files (a mounted Secret:
the chart's generated one or cert-manager's); they are re-read when they change
on disk (checked every ``reload_interval`` seconds), so a renewed certificate is
served without a restart.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import json
import logging
import os
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from joblease.envvars import read_int, read_str
from joblease.errors import InvalidInputError
from joblease.keys import JobRef, QueueRef
from joblease.operator.cron_slots import UnknownCronJob, cronjob_owner, plan_job
from joblease.operator.injection import (
    Injection,
    InjectionRefused,
    PodOptions,
    SidecarSettings,
    installation_secrets,
    lease_ttl_hint,
    parse_options,
    plan,
    pod_annotations,
    wants_injection,
)
from joblease.operator.kube import NotFoundError

log = logging.getLogger(__name__)

PATH = "/mutate-pods"
JOBS_PATH = "/mutate-jobs"
#: The API server's own limit on an AdmissionReview is 3 MiB of object.
MAX_BODY = 4 * 1024 * 1024
#: The JobLease lookup is only for a warning: never let it eat the webhook's timeout.
LOOKUP_TIMEOUT = 2.0



@dataclass(frozen=True)
class JobLeaseFound:
    """What the advisory JobLease lookup found: ``exists`` True, False (404) or None
    (cannot be told); ``lease_ttl`` its ``spec.leaseDurationSeconds`` when found
    (:func:`~joblease.operator.injection.lease_ttl_hint`), else None."""

    exists: bool | None
    lease_ttl: int | None = None


#: ``await find(JobRef)`` → what was found of the pod's JobLease.
JobLeaseLookup = Callable[[JobRef], Awaitable[JobLeaseFound]]
#: ``await exists(namespace, name)`` of a Secret → True / False, or None when it
#: cannot be told (e.g. no right to read it).
SecretLookup = Callable[[str, str], Awaitable[bool | None]]

#: ``await last_schedule(namespace, name)`` of a CronJob → its ``status.lastScheduleTime``
#: (None: never scheduled, or no such CronJob), or :class:`UnknownCronJob`.
CronJobLookup = Callable[[str, str], Awaitable["str | UnknownCronJob | None"]]
#: Whether a JobQueue exists (None: the lookup failed), like :data:`JobLeaseLookup`.
QueueLookup = Callable[[QueueRef], Awaitable[bool | None]]


#: Where the serving certificate (``tls.crt``) and key (``tls.key``) are mounted.
DEFAULT_CERT_DIR = "/etc/joblease/webhook"


@dataclass(frozen=True)
class WebhookConfig:
    """The webhook server's settings (``port`` 0: any free port, for tests).

    Whether the operator serves it at all is :class:`~joblease.operator.main.OperatorConfig`'s
    ``webhook`` (``None``: not served; ``JOBLEASE_WEBHOOK_PORT`` 0 or unset)."""

    port: int = 8443
    host: str = "0.0.0.0"
    cert_file: str = os.path.join(DEFAULT_CERT_DIR, "tls.crt")
    key_file: str = os.path.join(DEFAULT_CERT_DIR, "tls.key")
    settings: SidecarSettings = field(default_factory=SidecarSettings)
    reload_interval: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.port < 65536:
            raise InvalidInputError(
                f"invalid webhook port {self.port} (JOBLEASE_WEBHOOK_PORT, --webhook-port): "
                "0-65535")

    def with_(self, **changes: Any) -> WebhookConfig:
        """A copy with ``changes`` (the one copy-with-changes name of every config)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 cert_dir: str | None = None, settings_file: str | None = None,
                 **overrides: Any) -> WebhookConfig:
        """``JOBLEASE_WEBHOOK_PORT``, ``JOBLEASE_WEBHOOK_CERT_DIR`` (``tls.crt`` and
        ``tls.key`` in it), ``JOBLEASE_WEBHOOK_SETTINGS`` (a JSON file of the injected
        sidecar's settings, read now: a bad file fails here, before anything starts).

        ``cert_dir``, ``settings_file`` and ``overrides`` (flags) win over the
        environment when not ``None``; what neither sets keeps the dataclass default."""
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        port = read_int(env, "JOBLEASE_WEBHOOK_PORT")
        if port is not None:
            values["port"] = port
        cert_dir = cert_dir if cert_dir is not None else read_str(env, "JOBLEASE_WEBHOOK_CERT_DIR")
        if cert_dir is not None:
            values["cert_file"] = os.path.join(cert_dir, "tls.crt")
            values["key_file"] = os.path.join(cert_dir, "tls.key")
        settings_file = (settings_file if settings_file is not None
                         else read_str(env, "JOBLEASE_WEBHOOK_SETTINGS"))
        if settings_file is not None:
            try:
                values["settings"] = cls.settings_from_file(settings_file)
            except (ValueError, TypeError) as exc:
                raise InvalidInputError(
                    f"JOBLEASE_WEBHOOK_SETTINGS (--webhook-settings): {exc}") from None
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)

    @staticmethod
    def settings_from_file(path: str) -> SidecarSettings:
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise ValueError(f"sidecar settings file {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise ValueError(f"sidecar settings file {path}: not a JSON object")
        return SidecarSettings.from_json(data)


async def advisory(what: str, lookup: Callable[[], Awaitable[Any]]) -> bool | None:
    """Whether ``lookup()`` found its object: True, False (404), or None for
    every other outcome.

    The lookups only ever add a warning, so no failure of theirs may fail the
    admission (with ``failurePolicy: Fail`` an HTTP 500 refuses the pod): an API
    error, a refused or dropped connection, a truncated or non-JSON answer, a
    timeout (``LOOKUP_TIMEOUT``) or anything unforeseen all mean "cannot tell".
    Only cancellation (the server stopping) propagates.
    """
    return (await advisory_read(what, lookup))[0]


async def advisory_read(what: str, read: Callable[[], Awaitable[Any]]
                        ) -> tuple[bool | None, Any]:
    """:func:`advisory`, and what ``read()`` returned when it found its object
    (else None)."""
    try:
        found = await asyncio.wait_for(read(), LOOKUP_TIMEOUT)
    except NotFoundError:
        return False, None
    except Exception as exc:  # advisory: see advisory()
        log.info("webhook: cannot look up %s: %s: %s", what, type(exc).__name__, exc)
        return None, None
    return True, found


def kube_lookup(get: Callable[[JobRef], Awaitable[dict[str, Any]]]) -> JobLeaseLookup:
    """A :data:`JobLeaseLookup` from ``KubeApi.get`` (see :func:`advisory`): whether
    the JobLease exists and its TTL (anything but a TTL within the CRD's bounds in the
    answer: no hint, never a failure)."""
    async def find(ref: JobRef) -> JobLeaseFound:
        exists, obj = await advisory_read(f"JobLease {ref.namespace}/{ref.name}",
                                          lambda: get(ref))
        return JobLeaseFound(exists, lease_ttl_hint(obj) if isinstance(obj, Mapping) else None)
    return find


def kube_queue_lookup(get: Callable[[QueueRef], Awaitable[dict[str, Any]]]) -> QueueLookup:
    """A :data:`QueueLookup` from ``KubeApi.get_queue`` (see :func:`advisory`)."""
    async def exists(ref: QueueRef) -> bool | None:
        return await advisory(f"JobQueue {ref.namespace}/{ref.name}", lambda: get(ref))
    return exists


def kube_secret_lookup(get: Callable[[str, str], Awaitable[dict[str, Any] | None]]
                       ) -> SecretLookup:
    """A :data:`SecretLookup` from ``KubeApi.get_secret`` (None: not found)."""
    async def exists(namespace: str, name: str) -> bool | None:
        async def read() -> None:
            if await get(namespace, name) is None:
                raise NotFoundError(404, f"secret {namespace}/{name}")
        return await advisory(f"Secret {namespace}/{name}", read)
    return exists


def kube_cronjob_lookup(get: Callable[[str, str], Awaitable[dict[str, Any] | None]]
                        ) -> CronJobLookup:
    """A :data:`CronJobLookup` from ``KubeApi.get_cronjob`` (None: not found), within
    ``LOOKUP_TIMEOUT``; any failure is an :class:`UnknownCronJob` saying what happened."""
    async def last_schedule(namespace: str, name: str) -> str | UnknownCronJob | None:
        try:
            cronjob = await asyncio.wait_for(get(namespace, name), LOOKUP_TIMEOUT)
        except Exception as exc:  # reported in the refusal, see plan_job
            log.info("webhook: cannot read CronJob %s/%s: %s: %s", namespace, name,
                     type(exc).__name__, exc)
            return UnknownCronJob(f"{type(exc).__name__}: {str(exc)[:200]}"
                                  if str(exc) else type(exc).__name__)
        if cronjob is None:
            return None
        value = (cronjob.get("status") or {}).get("lastScheduleTime")
        return value if isinstance(value, str) else None
    return last_schedule


def _request_of(review: Any) -> dict[str, Any]:
    if not isinstance(review, dict) or not isinstance(review.get("request"), dict):
        raise ValueError("not an AdmissionReview with a request")
    request: dict[str, Any] = review["request"]
    if not isinstance(request.get("uid"), str) or not isinstance(request.get("object"), dict):
        raise ValueError("AdmissionReview request without uid or object")
    return request


def _answer(review: Mapping[str, Any], uid: str, make: Callable[[], Injection],
            notes: Sequence[str] = ()) -> dict[str, Any]:
    """The AdmissionReview around ``make()``'s patch and warnings, or its refusal."""
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    try:
        injection = make()
    except InjectionRefused as exc:
        response["allowed"] = False
        response["status"] = {"code": 400, "reason": "BadRequest",
                              "message": f"joblease sidecar injection: {exc}"}
    else:
        if injection.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(
                json.dumps(injection.patch).encode()).decode()
        warnings = [*injection.warnings, *notes] if injection.patch else injection.warnings
        if warnings:
            response["warnings"] = [f"joblease: {w}" for w in warnings]
    return {"apiVersion": review.get("apiVersion", "admission.k8s.io/v1"),
            "kind": "AdmissionReview", "response": response}


def job_review_response(review: Any, last_schedule: str | UnknownCronJob | None = None
                        ) -> dict[str, Any]:
    """The AdmissionReview answer to a Job's ``review`` (pure; the handler looks up
    ``last_schedule`` when :func:`cronjob_owner` names a CronJob). Raises ValueError for
    a body that is not a review."""
    request = _request_of(review)
    return _answer(review, request["uid"],
                   lambda: plan_job(request["object"], last_schedule=last_schedule))


def review_response(review: Any, settings: SidecarSettings,
                    exists: bool | None = None, *,
                    missing_secrets: Collection[str] = (),
                    notes: Sequence[str] = (),
                    lease_ttl: int | None = None) -> dict[str, Any]:
    """The AdmissionReview answer to ``review`` (a pure function; the handler adds
    the lookups: ``exists`` of the JobLease and its ``lease_ttl``, the
    ``missing_secrets`` and ``notes``, further warnings, e.g. that a lookup could
    not be made). Raises ValueError for a body that is not a pod review."""
    request = _request_of(review)
    pod = request["object"]
    namespace = request.get("namespace") or (pod.get("metadata") or {}).get("namespace") or ""
    return _answer(review, request["uid"],
                   lambda: plan(pod, settings, namespace=namespace, joblease_exists=exists,
                                missing_secrets=missing_secrets, lease_ttl=lease_ttl), notes)


class WebhookServer:
    def __init__(self, config: WebhookConfig, lookup: JobLeaseLookup | None = None,
                 secret_lookup: SecretLookup | None = None,
                 cronjob_lookup: CronJobLookup | None = None,
                 queue_lookup: QueueLookup | None = None) -> None:
        self.config = config
        self.lookup = lookup
        self.secret_lookup = secret_lookup
        self.cronjob_lookup = cronjob_lookup
        self.queue_lookup = queue_lookup
        self._runner: web.AppRunner | None = None
        self._reload: asyncio.Task[None] | None = None
        self._ssl: ssl.SSLContext | None = None
        self._stamp: tuple[float, float] | None = None
        self.port: int | None = None

    async def _mutate(self, request: web.Request) -> web.Response:
        try:
            review = await request.json()
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        found = JobLeaseFound(None)
        missing: list[str] = []
        unknown: list[str] = []
        try:
            req = review["request"]
            pod = req["object"]
            annotations = pod_annotations(pod)
            if wants_injection(pod):
                namespace = req.get("namespace") or pod["metadata"].get("namespace", "")
                options = parse_options(annotations)
                found, missing, unknown = await self._look_up(namespace, options)
        except (KeyError, TypeError, AttributeError, InjectionRefused):
            pass  # review_response says what is wrong with it
        notes = [f"could not check that {what} exists (the webhook's lookup failed, "
                 "see the operator's log); admitted without that check" for what in unknown]
        try:
            answer = review_response(review, self.config.settings, found.exists,
                                     missing_secrets=missing, notes=notes,
                                     lease_ttl=found.lease_ttl)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        r = answer["response"]
        log.info("webhook: pod %s/%s: %s", req_namespace(review), pod_name(review),
                 "refused: " + r["status"]["message"] if not r["allowed"]
                 else "injected" if "patch" in r else "unchanged")
        return web.json_response(answer)

    async def _mutate_job(self, request: web.Request) -> web.Response:
        try:
            review = await request.json()
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        last: str | UnknownCronJob | None = None
        try:
            req = review["request"]
            job = req["object"]
            owner = cronjob_owner(job)
            if owner:
                namespace = req.get("namespace") or job["metadata"].get("namespace", "")
                last = (await self.cronjob_lookup(namespace, owner) if self.cronjob_lookup
                        else UnknownCronJob("this webhook has no API access"))
        except (KeyError, TypeError, AttributeError):
            pass  # job_review_response says what is wrong with it
        try:
            answer = job_review_response(review, last)
        except ValueError as exc:
            return web.json_response({"error": str(exc)}, status=400)
        r = answer["response"]
        log.info("webhook: job %s/%s: %s", req_namespace(review), pod_name(review),
                 "refused: " + r["status"]["message"] if not r["allowed"]
                 else "slot named" if "patch" in r else "unchanged")
        return web.json_response(answer)

    async def _look_up(self, namespace: str, options: PodOptions
                       ) -> tuple[JobLeaseFound, list[str], list[str]]:
        """What was found of the JobLease (in queue mode: whether the JobQueue exists,
        no TTL), the missing Secrets the pod would mount, and what could not be looked
        up (each lookup :func:`advisory`, all at once)."""
        secrets = installation_secrets(self.config.settings)

        async def queue_found(lookup: QueueLookup) -> JobLeaseFound:
            return JobLeaseFound(await lookup(QueueRef(namespace, options.queue)))

        # the resource the pod names: its JobLease, or in queue mode its JobQueue
        jobs: list[Awaitable[JobLeaseFound]] = []
        named = ""
        if options.queue:
            if self.queue_lookup:
                jobs, named = [queue_found(self.queue_lookup)], "JobQueue"
        elif self.lookup and options.job:
            jobs, named = [self.lookup(JobRef(namespace, options.job))], "JobLease"
        finds = ([self.secret_lookup(namespace, name) for name in secrets]
                 if self.secret_lookup else [])
        results = await asyncio.gather(*jobs, *finds)
        found = results[0] if jobs else JobLeaseFound(None)
        assert isinstance(found, JobLeaseFound)
        unknown = ([f"{named} {namespace}/{options.queue or options.job}"]
                   if jobs and found.exists is None else [])
        missing = []
        for name, there in zip(secrets, results[len(jobs):], strict=False):
            if there is False:
                missing.append(name)
            elif there is None:
                unknown.append(f"Secret {namespace}/{name}")
        return found, missing, unknown

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    def _stat(self) -> tuple[float, float]:
        return (os.stat(self.config.cert_file).st_mtime, os.stat(self.config.key_file).st_mtime)

    def _load(self) -> None:
        assert self._ssl is not None
        self._ssl.load_cert_chain(self.config.cert_file, self.config.key_file)
        self._stamp = self._stat()

    async def _watch_cert(self) -> None:
        while True:
            await asyncio.sleep(self.config.reload_interval)
            try:
                if self._stat() != self._stamp:
                    self._load()
                    log.info("webhook: serving certificate reloaded from %s",
                             self.config.cert_file)
            except (OSError, ssl.SSLError) as exc:
                log.warning("webhook: cannot reload the serving certificate: %s", exc)

    async def start(self) -> None:
        self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._ssl.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load()
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post(PATH, self._mutate)
        app.router.add_post(JOBS_PATH, self._mutate_job)
        app.router.add_get("/healthz", self._healthz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.config.host, self.config.port,
                           ssl_context=self._ssl)
        await site.start()
        # the bound port (config.port 0: any free one, for tests)
        addresses = self._runner.addresses
        self.port = int(addresses[0][1]) if addresses else self.config.port
        self._reload = asyncio.create_task(self._watch_cert(), name="joblease-webhook-cert")
        log.info("webhook: serving %s on %s:%s (sidecar image %s)", PATH, self.config.host,
                 self.port, self.config.settings.image)

    async def stop(self) -> None:
        if self._reload is not None:
            self._reload.cancel()
            await asyncio.gather(self._reload, return_exceptions=True)
        if self._runner is not None:
            await self._runner.cleanup()


def req_namespace(review: Any) -> str:
    try:
        return str(review["request"].get("namespace") or "?")
    except (KeyError, TypeError, AttributeError):
        return "?"


def pod_name(review: Any) -> str:
    try:
        meta = review["request"]["object"].get("metadata") or {}
        return str(meta.get("name") or meta.get("generateName", "") + "*")
    except (KeyError, TypeError, AttributeError):
        return "?"


@contextlib.asynccontextmanager
async def serve_webhook(config: WebhookConfig | None, lookup: JobLeaseLookup | None,
                        secret_lookup: SecretLookup | None = None,
                        cronjob_lookup: CronJobLookup | None = None,
                        queue_lookup: QueueLookup | None = None
                        ) -> AsyncIterator[WebhookServer | None]:
    """Serve while the block runs, if ``config`` is given (the hook ``run_operator`` uses)."""
    if config is None:
        yield None
        return
    server = WebhookServer(config, lookup, secret_lookup, cronjob_lookup, queue_lookup)
    await server.start()
    try:
        yield server
    finally:
        await server.stop()
