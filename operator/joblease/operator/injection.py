"""Sidecar injection: a pod annotated ``joblease.io/job: <name>`` (or
``joblease.io/queue: <name>``, queue mode) → a JSON patch.

Pure functions, no I/O: :func:`plan` takes the pod (as the API server sends it
in an AdmissionReview), the operator's :class:`SidecarSettings` and whether the
JobLease exists, and returns an :class:`Injection` (RFC 6902 operations plus
warnings for the user) or raises :class:`InjectionRefused` with a message that
names the offending annotation or field. :mod:`joblease.operator.webhook` is
the server around it.

The injected pod is the one ``examples/worker-pod.yaml`` spells out by hand:
the sidecar as a native sidecar (first ``initContainers`` entry,
``restartPolicy: Always``) with a startup probe on ``/readyz`` (the worker
starts only once the lease is held, or once to read a final answer) and a
liveness probe on ``/healthz``; the token emptyDir mounted at the same path
in every container; ``shareProcessNamespace`` when the on-loss action signals
the worker (``signal``, and ``exit``, which signals before it exits: a native
sidecar's exit alone ends nothing, the kubelet restarts it); the etcd client
credentials (the client certificate Secret, and the namespace's tenant Secret
when tenant credentials are on); a restricted security context; resources.
Every other container gets ``JOBLEASE_SIDECAR_URL`` and ``JOBLEASE_TOKEN_FILE``
(plus the pid file and API token variables when they apply); variables a
container already sets are left as they are.

Queue mode (docs/queues.md, docs/sidecar.md "Queues"): the sidecar works on the
queue instead of a JobLease. Which item it claims follows the pod's shape: an
Indexed Job's pod claims its completion index (``JOBLEASE_ITEM`` from the pod's
``batch.kubernetes.io/job-completion-index`` annotation, through the downward
API), a pod whose template names ``joblease.io/item`` claims that one (a CronJob
slot, written by :mod:`joblease.operator.cron_slots` into the Job's template), and
any other pod (a Deployment's) drains the queue.

Idempotent: a pod that already has a container named ``joblease`` is not
given a second one. If this webhook injected it (annotation
``joblease.io/injected``), containers added since (another webhook, with
``reinvocationPolicy: IfNeeded``) are completed with the mount and variables;
a sidecar written by hand is left entirely alone.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

PREFIX = "joblease.io/"
JOB_ANNOTATION = PREFIX + "job"
#: Queue mode: the JobQueue's name (same namespace); excludes ``joblease.io/job``.
QUEUE_ANNOTATION = PREFIX + "queue"
#: Queue mode: claim this one item (a CronJob slot: :mod:`joblease.operator.cron_slots`).
ITEM_ANNOTATION = PREFIX + "item"
#: Queue mode, with an item: enqueue it first if absent ("true"/"false").
ITEM_CREATE_ANNOTATION = PREFIX + "item-create"
#: Queue mode, draining: end with success once nothing is pending or held.
EXIT_WHEN_EMPTY_ANNOTATION = PREFIX + "exit-when-empty"
#: Set on every pod of an Indexed Job by the Job controller (Kubernetes >= 1.28 also
#: sets the label; the annotation is there since 1.21).
COMPLETION_INDEX_ANNOTATION = "batch.kubernetes.io/job-completion-index"
ON_LOSS_ANNOTATION = PREFIX + "on-loss"
API_PORT_ANNOTATION = PREFIX + "api-port"
PROBE_PORT_ANNOTATION = PREFIX + "probe-port"
API_TOKEN_SECRET_ANNOTATION = PREFIX + "api-token-secret"
WORKER_PROCESS_ANNOTATION = PREFIX + "worker-process-name"
#: Seconds the sidecar may wait for its first lease before the kubelet restarts it.
STARTUP_WAIT_ANNOTATION = PREFIX + "startup-wait-seconds"
#: Written by the webhook on every pod it injected.
INJECTED_ANNOTATION = PREFIX + "injected"
#: The annotations a pod may carry in our domain; any other is refused (a typo
#: such as ``joblease.io/onloss`` would otherwise be silently ignored).
KNOWN_ANNOTATIONS = (JOB_ANNOTATION, QUEUE_ANNOTATION, ITEM_ANNOTATION,
                     ITEM_CREATE_ANNOTATION, EXIT_WHEN_EMPTY_ANNOTATION, ON_LOSS_ANNOTATION,
                     API_PORT_ANNOTATION, PROBE_PORT_ANNOTATION, API_TOKEN_SECRET_ANNOTATION,
                     WORKER_PROCESS_ANNOTATION, STARTUP_WAIT_ANNOTATION,
                     INJECTED_ANNOTATION)
#: The annotations that only mean something in queue mode.
QUEUE_ONLY_ANNOTATIONS = (ITEM_ANNOTATION, ITEM_CREATE_ANNOTATION, EXIT_WHEN_EMPTY_ANNOTATION)

SIDECAR_NAME = "joblease"
RUN_VOLUME = "joblease-run"
ETCD_TLS_VOLUME = "joblease-etcd-tls"
ETCD_AUTH_VOLUME = "joblease-etcd-auth"
API_TOKEN_VOLUME = "joblease-api-token"
RUN_DIR = "/run/joblease"
TOKEN_FILE = RUN_DIR + "/token"
PID_FILE = RUN_DIR + "/worker.pid"
ETCD_TLS_DIR = "/etc/joblease/etcd"
ETCD_AUTH_DIR = "/etc/joblease/etcd-auth"
API_TOKEN_DIR = "/etc/joblease/api-token"
API_TOKEN_KEY = "token"
TENANT_SECRET = "joblease-etcd-credentials"  # operator.tenants.SECRET_NAME
ON_LOSS_ACTIONS = ("signal", "exit", "none")
#: The on-loss actions that signal the worker, through the shared process namespace.
SIGNALLING_ACTIONS = ("signal", "exit")
DEFAULT_API_PORT = 8470
DEFAULT_PROBE_PORT = 8471
#: The startup probe's bound on the wait for the first lease (period 1 s): a JobLease's
#: pod waiting on another holder or an unreachable etcd is restarted after 10 min.
DEFAULT_STARTUP_WAIT_SECONDS = 600
#: A draining queue pod waits for its first item as long as the queue stays empty:
#: waiting is its normal state, and a restart would only drop its place in line (a
#: semaphore's waiters are served in arrival order). The probe's largest threshold.
UNBOUNDED_STARTUP_WAIT_SECONDS = 2**31 - 1
#: The JobLease CRD's bounds on ``spec.leaseDurationSeconds`` (crds/jobleases.joblease.io.yaml).
MIN_LEASE_TTL, MAX_LEASE_TTL = 2, 86400

# RFC 1123: Secret and JobLease names are DNS subdomains; process names are
# checked only for being printable (the kernel's comm is 15 bytes, argv longer).
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_PROCESS_NAME = re.compile(r"[\x21-\x7e]{1,255}")
# docs/queues.md: an Indexed Job's index and an RFC 3339 slot (UTC) are ids as they are.
_ITEM_ID = re.compile(r"[A-Za-z0-9._:-]{1,253}")


class InjectionRefused(ValueError):
    """The pod cannot be injected as it is; the message says which annotation or
    field and what would be accepted. The webhook refuses the pod with it."""


@dataclass(frozen=True)
class SidecarSettings:
    """What the operator's installation decides (chart values), the same for every pod.

    ``etcd_tls_secret``: a Secret in the pod's namespace with the CA (and a client
    certificate and key, for mutual TLS) under the given keys; empty for
    plain-text etcd. ``tenant_credentials``: also mount the namespace's
    ``joblease-etcd-credentials`` (username + password file).
    """

    image: str = "ghcr.io/joblease/joblease-sidecar:0.1.0"
    args: tuple[str, ...] = ()
    image_pull_policy: str = "IfNotPresent"
    etcd_endpoints: str = "https://joblease-etcd.joblease-system.svc:2379"
    etcd_root: str = "/joblease/v1"
    etcd_server_name: str = ""
    etcd_tls_secret: str = TENANT_SECRET  # the chart's: the tenant Secret carries TLS too
    etcd_ca_key: str = "ca.crt"
    etcd_cert_key: str = "tls.crt"
    etcd_key_key: str = "tls.key"
    tenant_credentials: bool = True
    run_as_user: int = 65532
    run_as_group: int = 65532
    resources: Mapping[str, Any] = field(default_factory=lambda: {
        "requests": {"cpu": "5m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SidecarSettings:
        """From the chart's ``settings.json`` (camelCase keys; unknown keys refused)."""
        names = {"image": "image", "args": "args", "imagePullPolicy": "image_pull_policy",
                 "etcdEndpoints": "etcd_endpoints", "etcdRoot": "etcd_root",
                 "etcdServerName": "etcd_server_name", "etcdTlsSecret": "etcd_tls_secret",
                 "etcdCaKey": "etcd_ca_key", "etcdCertKey": "etcd_cert_key",
                 "etcdKeyKey": "etcd_key_key", "tenantCredentials": "tenant_credentials",
                 "runAsUser": "run_as_user", "runAsGroup": "run_as_group",
                 "resources": "resources"}
        unknown = sorted(set(data) - set(names))
        if unknown:
            raise ValueError(f"unknown sidecar settings {unknown}; known: {sorted(names)}")
        kwargs: dict[str, Any] = {names[k]: v for k, v in data.items()}
        if "args" in kwargs:
            kwargs["args"] = tuple(str(a) for a in kwargs["args"])
        settings = cls(**kwargs)
        if not settings.image:
            raise ValueError("sidecar settings: image must not be empty")
        if not settings.etcd_endpoints:
            raise ValueError("sidecar settings: etcdEndpoints must not be empty")
        return settings


@dataclass(frozen=True)
class PodOptions:
    """The pod's own choices, from its ``joblease.io/*`` annotations.

    Exactly one of ``job`` (a JobLease) and ``queue`` (queue mode) is set. In queue
    mode ``item`` is the one item to claim (empty: the completion index if
    ``indexed``, else drain) and ``item_create`` enqueues it first."""

    job: str = ""
    queue: str = ""
    item: str = ""
    item_create: bool = False
    exit_when_empty: bool = False
    #: The pod is one of an Indexed Job's: it claims its completion index.
    indexed: bool = False
    on_loss: str = "signal"
    api_port: int = DEFAULT_API_PORT
    probe_port: int = DEFAULT_PROBE_PORT
    api_token_secret: str = ""
    worker_process_name: str = ""
    #: The startup probe's ``failureThreshold`` (period 1 s): how long the sidecar may
    #: wait for its first lease (or final answer) before the kubelet restarts it.
    startup_wait_seconds: int = DEFAULT_STARTUP_WAIT_SECONDS


@dataclass(frozen=True)
class Injection:
    """``patch``: RFC 6902 operations (empty: admit unchanged); ``warnings``: shown
    to the user by kubectl (AdmissionReview ``response.warnings``)."""

    patch: list[dict[str, Any]]
    warnings: list[str]


def pod_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("annotations") or {})


def wants_injection(pod: Mapping[str, Any]) -> bool:
    notes = pod_annotations(pod)
    return JOB_ANNOTATION in notes or QUEUE_ANNOTATION in notes


def parse_options(notes: Mapping[str, str]) -> PodOptions:
    """The pod's options; :class:`InjectionRefused` names the first bad annotation."""
    unknown = sorted(k for k in notes if k.startswith(PREFIX) and k not in KNOWN_ANNOTATIONS)
    if unknown:
        raise InjectionRefused(
            f"unknown annotation {unknown[0]}: the joblease webhook knows "
            + ", ".join(KNOWN_ANNOTATIONS))
    if JOB_ANNOTATION in notes and QUEUE_ANNOTATION in notes:
        raise InjectionRefused(
            f"annotations {JOB_ANNOTATION} and {QUEUE_ANNOTATION} both set: a pod's sidecar "
            "works on one JobLease or on one queue; keep one of them")
    queue_mode = QUEUE_ANNOTATION in notes
    job = notes.get(JOB_ANNOTATION, "")
    queue = notes.get(QUEUE_ANNOTATION, "")
    if queue_mode:
        if not (0 < len(queue) <= 253 and _DNS_SUBDOMAIN.fullmatch(queue)):
            raise InjectionRefused(
                f"invalid annotation {QUEUE_ANNOTATION}: {queue!r} is not a JobQueue name (a "
                "DNS subdomain: lowercase letters, digits, '-' and '.', at most 253 "
                "characters)")
    elif not (0 < len(job) <= 253 and _DNS_SUBDOMAIN.fullmatch(job)):
        raise InjectionRefused(
            f"invalid annotation {JOB_ANNOTATION}: {job!r} is not a JobLease name (a DNS "
            "subdomain: lowercase letters, digits, '-' and '.', at most 253 characters)")
    else:
        stray = [k for k in QUEUE_ONLY_ANNOTATIONS if k in notes]
        if stray:
            raise InjectionRefused(
                f"annotation {stray[0]} is for queue mode ({QUEUE_ANNOTATION}), but the pod "
                f"names a JobLease ({JOB_ANNOTATION}); drop it")
    item, item_create, exit_when_empty, indexed = _queue_options(notes) if queue_mode else (
        "", False, False, False)
    on_loss = notes.get(ON_LOSS_ANNOTATION, "signal")
    if on_loss not in ON_LOSS_ACTIONS:
        raise InjectionRefused(
            f"invalid annotation {ON_LOSS_ANNOTATION}: {on_loss!r} is not one of "
            + ", ".join(ON_LOSS_ACTIONS))
    api_port = _port(notes, API_PORT_ANNOTATION, DEFAULT_API_PORT)
    probe_port = _port(notes, PROBE_PORT_ANNOTATION, DEFAULT_PROBE_PORT)
    if api_port == probe_port:
        raise InjectionRefused(
            f"invalid annotations {API_PORT_ANNOTATION} and {PROBE_PORT_ANNOTATION}: both are "
            f"{api_port}; the lease API and the probe listener need two ports")
    secret = notes.get(API_TOKEN_SECRET_ANNOTATION, "")
    if secret and not (len(secret) <= 253 and _DNS_SUBDOMAIN.fullmatch(secret)):
        raise InjectionRefused(
            f"invalid annotation {API_TOKEN_SECRET_ANNOTATION}: {secret!r} is not a Secret "
            "name (a DNS subdomain)")
    process = notes.get(WORKER_PROCESS_ANNOTATION, "")
    if process and not _PROCESS_NAME.fullmatch(process):
        raise InjectionRefused(
            f"invalid annotation {WORKER_PROCESS_ANNOTATION}: {process!r} is not a process "
            "name (printable characters without spaces, at most 255)")
    draining = queue_mode and not item and not indexed
    startup_wait = _startup_wait(notes, UNBOUNDED_STARTUP_WAIT_SECONDS if draining
                                 else DEFAULT_STARTUP_WAIT_SECONDS)
    return PodOptions(job=job, queue=queue, item=item, item_create=item_create,
                      exit_when_empty=exit_when_empty, indexed=indexed, on_loss=on_loss,
                      api_port=api_port, probe_port=probe_port, api_token_secret=secret,
                      worker_process_name=process, startup_wait_seconds=startup_wait)


def _startup_wait(notes: Mapping[str, str], default: int) -> int:
    text = notes.get(STARTUP_WAIT_ANNOTATION)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,10}", text) or not (
            1 <= int(text) <= UNBOUNDED_STARTUP_WAIT_SECONDS):
        raise InjectionRefused(
            f"invalid annotation {STARTUP_WAIT_ANNOTATION}: {text!r} is not a number of "
            f"seconds from 1 to {UNBOUNDED_STARTUP_WAIT_SECONDS} (how long the sidecar may "
            "wait for its first lease before the kubelet restarts it)")
    return int(text)


def _queue_options(notes: Mapping[str, str]) -> tuple[str, bool, bool, bool]:
    """``(item, item_create, exit_when_empty, indexed)`` of a queue-mode pod."""
    item = notes.get(ITEM_ANNOTATION)
    if item is not None and not _ITEM_ID.fullmatch(item):
        raise InjectionRefused(
            f"invalid annotation {ITEM_ANNOTATION}: {item!r} is not an item id (1 to 253 "
            "letters, digits, '.', '_', ':' and '-')")
    index = notes.get(COMPLETION_INDEX_ANNOTATION)
    indexed = index is not None
    if indexed and not re.fullmatch(r"[0-9]{1,9}", index or ""):
        raise InjectionRefused(
            f"annotation {COMPLETION_INDEX_ANNOTATION}: {index!r} is not a completion index "
            "(the Job controller writes a number)")
    if indexed and item is not None:
        raise InjectionRefused(
            f"annotation {ITEM_ANNOTATION} in a pod of an Indexed Job: the pod's item is its "
            f"completion index ({COMPLETION_INDEX_ANNOTATION}), and every pod would claim "
            f"{item!r} instead; drop {ITEM_ANNOTATION}, or completionMode: Indexed")
    item_create = _flag(notes, ITEM_CREATE_ANNOTATION)
    exit_when_empty = _flag(notes, EXIT_WHEN_EMPTY_ANNOTATION)
    if item_create and item is None and not indexed:
        raise InjectionRefused(
            f"annotation {ITEM_CREATE_ANNOTATION}: true needs the item to create: "
            f"{ITEM_ANNOTATION} (a CronJob's Jobs get it from the webhook) or an Indexed "
            "Job's completion index; a draining pod creates nothing")
    if exit_when_empty and (item is not None or indexed):
        raise InjectionRefused(
            f"annotation {EXIT_WHEN_EMPTY_ANNOTATION}: true is for a pod that drains the "
            f"queue, but this one claims one item ("
            f"{ITEM_ANNOTATION if item is not None else 'its completion index'}) and ends "
            "with it; drop one of them")
    return item or "", item_create, exit_when_empty, indexed


def _flag(notes: Mapping[str, str], key: str) -> bool:
    text = notes.get(key, "false")
    if text not in ("true", "false"):
        raise InjectionRefused(f"invalid annotation {key}: {text!r} is not \"true\" or "
                               "\"false\"")
    return text == "true"


def _port(notes: Mapping[str, str], key: str, default: int) -> int:
    text = notes.get(key)
    if text is None:
        return default
    if not re.fullmatch(r"[0-9]{1,5}", text) or not 1 <= int(text) <= 65535:
        raise InjectionRefused(f"invalid annotation {key}: {text!r} is not a port "
                               "(a number from 1 to 65535)")
    return int(text)


def lease_ttl_hint(joblease: Mapping[str, Any] | None) -> int | None:
    """The JobLease's ``spec.leaseDurationSeconds``, as the sidecar's TTL hint
    (``JOBLEASE_LEASE_TTL``), or None when the object gives none within the CRD's
    bounds (the API server stores no other, but the lookup is advisory: rather no
    hint than a wrong one; a wrong one would only cost the sidecar a second grant)."""
    spec = (joblease or {}).get("spec")
    ttl = spec.get("leaseDurationSeconds") if isinstance(spec, Mapping) else None
    if isinstance(ttl, int) and not isinstance(ttl, bool) and (
            MIN_LEASE_TTL <= ttl <= MAX_LEASE_TTL):
        return ttl
    return None


def plan(pod: Mapping[str, Any], settings: SidecarSettings, *, namespace: str,
         joblease_exists: bool | None = None,
         missing_secrets: Collection[str] = (),
         lease_ttl: int | None = None) -> Injection:
    """The patch that injects the sidecar into ``pod`` (see the module docstring).

    ``joblease_exists``: whether the JobLease ``namespace/<job>`` (in queue mode:
    the JobQueue ``namespace/<queue>``) exists (None: not known). A missing one
    is admitted with a warning, not refused: a Job and its JobLease (or JobQueue)
    are often applied together and the pod may come first; the sidecar
    then waits for the registration (``JOBLEASE_SIDECAR_REGISTRATION_WAIT``) and
    the pod fails with "not registered" if it never comes.

    ``missing_secrets``: names of :func:`installation_secrets` known not to exist in
    ``namespace``. Each is warned about, naming what provides it: the kubelet
    cannot mount it, so the pod would stay ``Pending`` (``FailedMount``) until it
    exists, with nothing else saying why.

    ``lease_ttl``: the JobLease's ``spec.leaseDurationSeconds`` as the webhook's
    lookup found it (:func:`lease_ttl_hint`; None: not found or not known). A job
    pod's sidecar gets it as ``JOBLEASE_LEASE_TTL``, a hint that lets its first
    claim grant the session's lease while it reads the spec (one etcd round trip
    less to held). Only a hint: the claim still uses the spec's TTL as etcd has
    it, and a hint that differs (the JobLease changed since) costs one more
    grant, never a claim on the wrong TTL (docs/sidecar-go.md "Start to held").
    Ignored in queue mode: a queue claim's lease is of the queue's TTL, granted
    once the queue's spec is read; the sidecar takes no hint for it.
    """
    notes = pod_annotations(pod)
    if not wants_injection(pod):
        return Injection([], [])
    options = parse_options(notes)
    spec = pod.get("spec") or {}
    containers: list[dict[str, Any]] = list(spec.get("containers") or [])
    inits: list[dict[str, Any]] = list(spec.get("initContainers") or [])
    if any(c.get("name") == SIDECAR_NAME for c in containers + inits):
        if INJECTED_ANNOTATION not in notes:
            return Injection([], [f"pod already has a container named {SIDECAR_NAME!r}: "
                                  "joblease left it as it is"])
        return Injection(_complete_workers(spec, options), [])

    warnings: list[str] = []
    if options.queue:
        warnings += _queue_warnings(spec, options)
        if joblease_exists is False:
            warnings.append(
                f"JobQueue {namespace}/{options.queue} does not exist (yet): the sidecar "
                "waits for the queue and the pod fails (exit 3, not found) if it never comes")
    elif joblease_exists is False:
        warnings.append(
            f"JobLease {namespace}/{options.job} does not exist (yet): the sidecar waits for "
            "its registration and the pod fails (exit 3, not registered) if it never comes")
    _check_conflicts(spec, containers + inits, options)
    signals = options.on_loss in SIGNALLING_ACTIONS
    if signals and spec.get("shareProcessNamespace") is False:
        raise InjectionRefused(
            f"{ON_LOSS_ANNOTATION}: {options.on_loss} needs spec.shareProcessNamespace (the "
            "sidecar signals the worker), but the pod sets it to false; set the annotation "
            "to none (the worker must then poll the lease API), or drop "
            "shareProcessNamespace: false")
    if options.on_loss == "exit":
        warnings.append(
            f"{ON_LOSS_ANNOTATION}: exit: the injected sidecar is a native sidecar, whose exit "
            "does not end the pod (the kubelet restarts it); what stops the worker is the "
            "SIGTERM the sidecar sends before exiting, through the shared process namespace "
            "this webhook turns on; on-loss signal does the same without the restart")
    if spec.get("hostNetwork"):
        raise InjectionRefused(
            "spec.hostNetwork is true: the sidecar's lease API (port "
            f"{options.api_port} on 127.0.0.1, token and completion) would listen in the "
            "node's network namespace, reachable by every process and hostNetwork pod on "
            "the node; run the pod without hostNetwork")
    warnings += [_missing_secret_warning(name, namespace, settings)
                 for name in installation_secrets(settings) if name in missing_secrets]

    pod_sc = spec.get("securityContext") or {}
    pod_uid = pod_sc.get("runAsUser")
    inherit_uid = isinstance(pod_uid, int) and pod_uid != 0
    sidecar_uid = pod_uid if inherit_uid else settings.run_as_user
    if signals:
        for c in containers:
            uid = (c.get("securityContext") or {}).get("runAsUser", pod_uid)
            if uid != sidecar_uid:
                warnings.append(
                    f"{ON_LOSS_ANNOTATION}: {options.on_loss}: container {c.get('name')!r} runs as "
                    f"{'the image user' if uid is None else f'uid {uid}'} and the sidecar as "
                    f"uid {sidecar_uid}; the sidecar can signal it only if both are the "
                    "same user (set spec.securityContext.runAsUser)")

    ops: list[dict[str, Any]] = []
    hint = lease_ttl if not options.queue else None
    sidecar = _sidecar(settings, options, namespace, inherit_uid=inherit_uid, lease_ttl=hint)
    if inits:
        ops.append({"op": "add", "path": "/spec/initContainers/0", "value": sidecar})
    else:
        ops.append({"op": "add", "path": "/spec/initContainers", "value": [sidecar]})
    # the other init containers now sit one index further down
    ops += _complete_workers(spec, options, init_offset=1)
    volumes = _volumes(settings, options)
    if spec.get("volumes"):
        ops += [{"op": "add", "path": "/spec/volumes/-", "value": v} for v in volumes]
    else:
        ops.append({"op": "add", "path": "/spec/volumes", "value": volumes})
    if signals and not spec.get("shareProcessNamespace"):
        ops.append({"op": "add", "path": "/spec/shareProcessNamespace", "value": True})
    ops.append({"op": "add", "path": "/metadata/annotations/" + escape_pointer(INJECTED_ANNOTATION),
                "value": "true"})
    return Injection(ops, warnings)


def _queue_warnings(spec: Mapping[str, Any], options: PodOptions) -> list[str]:
    """What a queue-mode pod's shape makes of it, where it is likely not what was meant."""
    drains = not (options.item or options.indexed)
    restart = spec.get("restartPolicy", "Always")
    if drains and not options.exit_when_empty and restart != "Always":
        return [f"pod drains queue {options.queue} (no {ITEM_ANNOTATION}, not an Indexed Job) "
                f"with restartPolicy {restart} and without {EXIT_WHEN_EMPTY_ANNOTATION}: true: "
                "it waits for new items forever, so a Job of such pods never completes; set "
                f"{EXIT_WHEN_EMPTY_ANNOTATION}: \"true\" to end once the queue is empty"]
    if options.exit_when_empty and restart == "Always":
        return [f"{EXIT_WHEN_EMPTY_ANNOTATION}: true with restartPolicy Always (a Deployment's "
                "pod): the kubelet restarts what exits, so the pod never ends; a Deployment "
                "drains without it"]
    return []


def installation_secrets(settings: SidecarSettings) -> list[str]:
    """The etcd credential Secrets every injected pod mounts from its namespace (it
    cannot start without them). The installation provides them, so the chart lets
    the webhook read these names, and only these (a pod's own
    ``joblease.io/api-token-secret`` is not looked up)."""
    names = [settings.etcd_tls_secret] if settings.etcd_tls_secret else []
    if settings.tenant_credentials and TENANT_SECRET not in names:
        names.append(TENANT_SECRET)
    return names


def _missing_secret_warning(name: str, namespace: str, settings: SidecarSettings) -> str:
    if name == TENANT_SECRET and settings.tenant_credentials:
        provider = ("the operator creates it, with the namespace's own etcd user, once the "
                    "namespace is labelled for injection (tenantCredentials; usually within "
                    "seconds: the pod starts when it appears; if it does not, see the "
                    "operator's log)")
    elif name == settings.etcd_tls_secret:
        provider = (
            "with the chart's bundled etcd, list the namespace in etcd.workerSecret.namespaces "
            f"(helm upgrade ... --set 'etcd.workerSecret.namespaces[0]={namespace}', keeping "
            "the namespaces listed before); with your own etcd, copy its client Secret there "
            "under that name (webhook.sidecar.etcdClientSecret)")
    else:
        provider = "create it"
    return (f"Secret {namespace}/{name} does not exist: the pod cannot start (Pending, "
            f"FailedMount) until it does; {provider}")


def _check_conflicts(spec: Mapping[str, Any], containers: list[dict[str, Any]],
                     options: PodOptions) -> None:
    ours = {RUN_VOLUME, ETCD_TLS_VOLUME, ETCD_AUTH_VOLUME, API_TOKEN_VOLUME}
    for v in spec.get("volumes") or []:
        if v.get("name") in ours:
            raise InjectionRefused(
                f"the pod already has a volume named {v.get('name')!r}, which the joblease "
                f"sidecar injection adds; rename it (reserved: {', '.join(sorted(ours))})")
    for c in containers:
        for m in c.get("volumeMounts") or []:
            if m.get("mountPath", "").rstrip("/") in (RUN_DIR, API_TOKEN_DIR):
                raise InjectionRefused(
                    f"container {c.get('name')!r} already mounts {m.get('mountPath')}, where "
                    "the joblease sidecar injection mounts its token volume; use another path")
        for p in c.get("ports") or []:
            if p.get("containerPort") in (options.api_port, options.probe_port):
                raise InjectionRefused(
                    f"container {c.get('name')!r} uses port {p.get('containerPort')}, which the "
                    f"joblease sidecar needs; choose others with {API_PORT_ANNOTATION} / "
                    f"{PROBE_PORT_ANNOTATION}")


def _complete_workers(spec: Mapping[str, Any], options: PodOptions, *,
                      init_offset: int = 0) -> list[dict[str, Any]]:
    """Mount and variables for every container (and init container) but the sidecar,
    where missing."""
    ops: list[dict[str, Any]] = []
    groups = (("containers", 0), ("initContainers", init_offset))
    for key, offset in groups:
        for i, c in enumerate(spec.get(key) or []):
            if c.get("name") == SIDECAR_NAME:
                continue
            base = f"/spec/{key}/{i + offset}"
            ops += _append(c, "env", base, _worker_env(options, c))
            ops += _append(c, "volumeMounts", base, _worker_mounts(options, c))
    return ops


def _append(container: Mapping[str, Any], key: str, base: str, items: list[dict[str, Any]]
            ) -> list[dict[str, Any]]:
    if not items:
        return []
    if container.get(key):
        return [{"op": "add", "path": f"{base}/{key}/-", "value": item} for item in items]
    return [{"op": "add", "path": f"{base}/{key}", "value": items}]


def _worker_env(options: PodOptions, container: Mapping[str, Any]) -> list[dict[str, Any]]:
    present = {e.get("name") for e in container.get("env") or []}
    env = [{"name": "JOBLEASE_SIDECAR_URL", "value": f"http://127.0.0.1:{options.api_port}"},
           {"name": "JOBLEASE_TOKEN_FILE", "value": TOKEN_FILE}]
    if options.on_loss != "none":
        env.append({"name": "JOBLEASE_WORKER_PID_FILE", "value": PID_FILE})
    if options.api_token_secret:
        env.append({"name": "JOBLEASE_API_TOKEN_FILE",
                    "value": f"{API_TOKEN_DIR}/{API_TOKEN_KEY}"})
    return [e for e in env if e["name"] not in present]


def _worker_mounts(options: PodOptions, container: Mapping[str, Any]) -> list[dict[str, Any]]:
    present = {m.get("name") for m in container.get("volumeMounts") or []}
    mounts: list[dict[str, Any]] = [{"name": RUN_VOLUME, "mountPath": RUN_DIR}]
    if options.api_token_secret:
        mounts.append({"name": API_TOKEN_VOLUME, "mountPath": API_TOKEN_DIR, "readOnly": True})
    return [m for m in mounts if m["name"] not in present]


def _sidecar(settings: SidecarSettings, options: PodOptions, namespace: str, *,
             inherit_uid: bool, lease_ttl: int | None = None) -> dict[str, Any]:
    def field_ref(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}}

    env: list[dict[str, Any]] = [
        *_work_env(options),
        # a hint, safe when stale: see plan()
        *([{"name": "JOBLEASE_LEASE_TTL", "value": str(lease_ttl)}]
          if lease_ttl is not None else []),
        field_ref("JOBLEASE_JOB_NAMESPACE", "metadata.namespace"),
        field_ref("POD_NAME", "metadata.name"),
        field_ref("POD_UID", "metadata.uid"),
        {"name": "JOBLEASE_ETCD_ENDPOINTS", "value": settings.etcd_endpoints},
        {"name": "JOBLEASE_ROOT", "value": settings.etcd_root},
    ]
    if settings.etcd_server_name:
        env.append({"name": "JOBLEASE_ETCD_SERVER_NAME", "value": settings.etcd_server_name})
    mounts: list[dict[str, Any]] = [{"name": RUN_VOLUME, "mountPath": RUN_DIR}]
    if settings.etcd_tls_secret:
        env.append({"name": "JOBLEASE_ETCD_CA_FILE",
                    "value": f"{ETCD_TLS_DIR}/{settings.etcd_ca_key}"})
        if settings.etcd_cert_key and settings.etcd_key_key:
            env += [{"name": "JOBLEASE_ETCD_CERT_FILE",
                     "value": f"{ETCD_TLS_DIR}/{settings.etcd_cert_key}"},
                    {"name": "JOBLEASE_ETCD_KEY_FILE",
                     "value": f"{ETCD_TLS_DIR}/{settings.etcd_key_key}"}]
        mounts.append({"name": ETCD_TLS_VOLUME, "mountPath": ETCD_TLS_DIR, "readOnly": True})
    if settings.tenant_credentials:
        # Both as files, never variables: a rotation moves the Secret to the namespace's
        # other etcd user, and the sidecar re-reads them when etcd refuses its token. One
        # Secret for TLS and credentials (the chart's bundled etcd): one volume.
        auth_dir = ETCD_TLS_DIR if _one_secret(settings) else ETCD_AUTH_DIR
        env += [{"name": "JOBLEASE_ETCD_USERNAME_FILE", "value": f"{auth_dir}/username"},
                {"name": "JOBLEASE_ETCD_PASSWORD_FILE", "value": f"{auth_dir}/password"}]
        if not _one_secret(settings):
            mounts.append({"name": ETCD_AUTH_VOLUME, "mountPath": ETCD_AUTH_DIR,
                           "readOnly": True})
    env += [
        {"name": "JOBLEASE_TOKEN_FILE", "value": TOKEN_FILE},
        {"name": "JOBLEASE_SIDECAR_ON_LOSS", "value": options.on_loss},
        {"name": "JOBLEASE_SIDECAR_ON_FINAL", "value": "serve"},
        {"name": "JOBLEASE_SIDECAR_PORT", "value": str(options.api_port)},
        {"name": "JOBLEASE_SIDECAR_PROBE_PORT", "value": str(options.probe_port)},
    ]
    if options.on_loss != "none":
        env.append({"name": "JOBLEASE_WORKER_PID_FILE", "value": PID_FILE})
    if options.worker_process_name:
        env.append({"name": "JOBLEASE_WORKER_PROCESS_NAME",
                    "value": options.worker_process_name})
    if options.api_token_secret:
        env.append({"name": "JOBLEASE_SIDECAR_API_TOKEN_FILE",
                    "value": f"{API_TOKEN_DIR}/{API_TOKEN_KEY}"})
        mounts.append({"name": API_TOKEN_VOLUME, "mountPath": API_TOKEN_DIR, "readOnly": True})
    security: dict[str, Any] = {
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"}}
    if not inherit_uid:
        security["runAsUser"] = settings.run_as_user
        security["runAsGroup"] = settings.run_as_group
    probe = {"httpGet": {"path": "/readyz", "port": options.probe_port}}
    container: dict[str, Any] = {
        "name": SIDECAR_NAME,
        "image": settings.image,
        "imagePullPolicy": settings.image_pull_policy,
        **({"args": list(settings.args)} if settings.args else {}),  # none: the entrypoint
        "restartPolicy": "Always",
        "env": env,
        "ports": [{"name": "joblease-probe", "containerPort": options.probe_port}],
        # the lease is held (or the final answer is ready) before the worker starts
        "startupProbe": {**probe, "periodSeconds": 1,
                         "failureThreshold": options.startup_wait_seconds},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": options.probe_port},
                          "periodSeconds": 10},
        "securityContext": security,
        "resources": dict(settings.resources),
        "volumeMounts": mounts,
    }
    return container


def _work_env(options: PodOptions) -> list[dict[str, Any]]:
    """What the sidecar works on: the JobLease, or the queue and which of its items."""
    if not options.queue:
        return [{"name": "JOBLEASE_JOB_NAME", "value": options.job}]
    env: list[dict[str, Any]] = [{"name": "JOBLEASE_QUEUE", "value": options.queue}]
    if options.indexed:
        # the downward API, not a copy: the value is the pod's own annotation, whoever
        # reads the pod spec sees where it comes from
        env.append({"name": "JOBLEASE_ITEM", "valueFrom": {"fieldRef": {
            "fieldPath": f"metadata.annotations['{COMPLETION_INDEX_ANNOTATION}']"}}})
    elif options.item:
        env.append({"name": "JOBLEASE_ITEM", "value": options.item})
    if options.item_create:
        env.append({"name": "JOBLEASE_ITEM_CREATE", "value": "true"})
    if options.exit_when_empty:
        env.append({"name": "JOBLEASE_EXIT_WHEN_EMPTY", "value": "true"})
    return env


def _volumes(settings: SidecarSettings, options: PodOptions) -> list[dict[str, Any]]:
    volumes: list[dict[str, Any]] = [
        {"name": RUN_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}}]
    if settings.etcd_tls_secret:
        items = [{"key": k, "path": k} for k in (settings.etcd_ca_key, settings.etcd_cert_key,
                                                 settings.etcd_key_key) if k]
        if _one_secret(settings):
            items += [{"key": "username", "path": "username"},
                      {"key": "password", "path": "password"}]
        volumes.append({"name": ETCD_TLS_VOLUME, "secret": {
            "secretName": settings.etcd_tls_secret, "items": items}})
    if settings.tenant_credentials and not _one_secret(settings):
        volumes.append({"name": ETCD_AUTH_VOLUME, "secret": {
            "secretName": TENANT_SECRET, "items": [{"key": "username", "path": "username"},
                                                   {"key": "password", "path": "password"}]}})
    if options.api_token_secret:
        volumes.append({"name": API_TOKEN_VOLUME, "secret": {
            "secretName": options.api_token_secret,
            "items": [{"key": API_TOKEN_KEY, "path": API_TOKEN_KEY}]}})
    return volumes


def _one_secret(settings: SidecarSettings) -> bool:
    """The tenant Secret is also the TLS Secret (the chart's bundled etcd)."""
    return settings.tenant_credentials and settings.etcd_tls_secret == TENANT_SECRET


def escape_pointer(key: str) -> str:
    """A JSON pointer token (RFC 6901): ``~`` → ``~0``, ``/`` → ``~1``."""
    return key.replace("~", "~0").replace("/", "~1")
