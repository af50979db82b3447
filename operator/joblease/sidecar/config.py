"""Sidecar configuration: one frozen dataclass, filled from flags or the environment.

Everything a pod spec can set comes in through environment variables (the
downward API gives the job's namespace, the pod's name and UID), so the same
image runs unchanged in every pod; flags exist for local runs and tests. Each
flag of ``joblease sidecar`` overrides the variable of the same meaning.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from joblease import validation
from joblease.envvars import parse_bool, read_float, read_int, read_path
from joblease.errors import InvalidInputError
from joblease.etcd_store import EtcdConfig
from joblease.keys import JobRef

#: Actions on loss of the lease.
ON_LOSS_ACTIONS = ("signal", "exit", "none")
#: What to do with a final answer to the claim (already completed, refused for good):
#: ``serve`` it until stopped (a native sidecar: the worker reads it and ends the
#: pod), or ``exit`` with its code (a plain process, e.g. under a supervisor).
ON_FINAL_ACTIONS = ("serve", "exit")

DEFAULT_PORT = 8470
DEFAULT_PROBE_PORT = 8471
DEFAULT_TOKEN_FILE = "/run/joblease/token"
#: Requests per second the lease API (``/v1/*``) answers before 429.
DEFAULT_RATE_LIMIT = 50.0
RATE_LIMIT_ENV = "JOBLEASE_SIDECAR_RATE_LIMIT"

log = logging.getLogger("joblease.sidecar")

def parse_rate_limit(raw: str) -> float | None:
    """``JOBLEASE_SIDECAR_RATE_LIMIT`` as requests/s; ``None`` when disabled
    (``0``, ``off``, ``none``, ``false``).

    An unusable value is logged and the default is used (a typo must not
    turn the limit off, nor stop the sidecar after it has claimed).
    """
    raw = raw.strip().lower()
    if raw == "":
        return DEFAULT_RATE_LIMIT
    if raw in ("0", "off", "none", "false"):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        log.error("invalid rate limit; using the default", extra={
            "variable": RATE_LIMIT_ENV, "value": raw, "default": DEFAULT_RATE_LIMIT})
        return DEFAULT_RATE_LIMIT
    return value


@dataclass(frozen=True)
class Backoff:
    """Exponential claim backoff with jitter, so sidecars racing for one job
    (or waiting out a holder) do not retry in lock step."""

    initial: float = 0.2
    maximum: float = 5.0
    multiplier: float = 2.0

    def delay(self, attempt: int, rand: float) -> float:
        """Delay before retry ``attempt`` (0-based): half fixed, half jitter
        ("equal jitter"), so it never collapses to zero. ``rand`` is in [0, 1)."""
        base = min(self.maximum, self.initial * self.multiplier ** min(attempt, 32))
        return base / 2 + base / 2 * rand


@dataclass(frozen=True)
class SidecarConfig:
    """What the sidecar needs. See ``docs/sidecar.md`` for each setting's variable."""

    job: JobRef
    owner: str
    etcd: EtcdConfig = field(default_factory=EtcdConfig)
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    port_file: Path | None = None
    #: The probe listener (``/healthz``, ``/readyz``, ``/metrics`` only) on the
    #: pod IP: kubelet's httpGet probes dial the pod IP, never its loopback,
    #: while the lease API must stay loopback-only. ``None`` disables it.
    probe_host: str = "0.0.0.0"
    probe_port: int | None = DEFAULT_PROBE_PORT
    probe_port_file: Path | None = None
    token_file: Path | None = Path(DEFAULT_TOKEN_FILE)
    on_loss: str = "signal"
    on_final: str = "serve"
    worker_pid_file: Path | None = None
    worker_process_name: str | None = None
    release_on_term: bool = True
    api_token: str | None = field(default=None, repr=False)
    max_result_bytes: int = validation.MAX_RESULT_BYTES
    #: requests/s the lease API answers (bursts of one second's worth); ``None``: unlimited
    rate_limit: float | None = DEFAULT_RATE_LIMIT
    backoff: Backoff = field(default_factory=Backoff)
    registration_wait: float = 30.0
    loss_exit_code: int = 8  # LeaseLostError.exit_code
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        validation.job_ref(self.job)
        validation.owner(self.owner)
        if self.on_loss not in ON_LOSS_ACTIONS:
            raise InvalidInputError(
                f"invalid on-loss action {self.on_loss!r}: one of {', '.join(ON_LOSS_ACTIONS)}")
        if self.on_final not in ON_FINAL_ACTIONS:
            raise InvalidInputError(
                f"invalid on-final action {self.on_final!r}: one of {', '.join(ON_FINAL_ACTIONS)}")
        if not 0 <= self.port < 65536:
            raise InvalidInputError(f"invalid port {self.port}")
        if self.probe_port is not None and not 0 <= self.probe_port < 65536:
            raise InvalidInputError(f"invalid probe port {self.probe_port}")
        if self.max_result_bytes <= 0:
            raise InvalidInputError("max result bytes must be positive")
        if self.registration_wait < 0:
            raise InvalidInputError("registration wait must be >= 0")
        if self.rate_limit is not None and (not self.rate_limit > 0
                                            or math.isinf(self.rate_limit)):
            raise InvalidInputError(
                f"rate limit must be a positive finite number or None, got {self.rate_limit!r}")

    @property
    def token_json_file(self) -> Path | None:
        """``token.json`` beside the token file: job, owner, generation, token."""
        if self.token_file is None:
            return None
        return self.token_file.with_name(self.token_file.name + ".json")

    @property
    def loopback(self) -> bool:
        """Whether the API listens on loopback only (the safe default)."""
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return self.host == "localhost"

    def with_(self, **changes: Any) -> SidecarConfig:
        """A copy with ``changes`` (the one copy-with-changes name of every config)."""
        return dataclasses.replace(self, **changes)

    def describe(self) -> dict[str, Any]:
        """A log-safe summary: no passwords, no bearer token."""
        return {
            "job": str(self.job), "owner": self.owner,
            "etcdEndpoints": list(self.etcd.endpoints), "etcdTLS": self.etcd.tls,
            "etcdAuth": self.etcd.username is not None, "root": self.etcd.root,
            "listen": f"{self.host}:{self.port}",
            "probeListen": None if self.probe_port is None
            else f"{self.probe_host}:{self.probe_port}",
            "tokenFile": str(self.token_file) if self.token_file else None,
            "onLoss": self.on_loss, "onFinal": self.on_final, "releaseOnTerm": self.release_on_term,
            "apiAuth": self.api_token is not None, "maxResultBytes": self.max_result_bytes,
            "registrationWait": self.registration_wait,
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, *,
                 namespace: str | None = None, **overrides: Any) -> SidecarConfig:
        """Read ``JOBLEASE_*`` variables (``docs/sidecar.md`` lists them); what no
        variable sets keeps the dataclass default.

        ``overrides`` (flags) win over the environment when not ``None``. A
        ``job`` given as a string (``name`` or ``namespace/name``) and a
        ``namespace`` fill in from the environment like the variables do; a
        negative ``probe_port`` disables the probe listener, as ``-1`` does in
        ``JOBLEASE_SIDECAR_PROBE_PORT``.
        """
        env = os.environ if environ is None else environ
        default_namespace = (namespace or env.get("JOBLEASE_JOB_NAMESPACE")
                             or env.get("POD_NAMESPACE") or "default")
        job = overrides.pop("job", None)
        if isinstance(job, str) or (job is None and namespace):
            job = JobRef.parse(job or env.get("JOBLEASE_JOB_NAME", ""), default_namespace)
        elif job is None:
            job = JobRef(default_namespace, env.get("JOBLEASE_JOB_NAME", ""))
        # Variables whose empty value means "not set": absent keys keep the default.
        unset_if_none: dict[str, Any] = {
            "owner": env.get("JOBLEASE_OWNER") or None,
            "host": env.get("JOBLEASE_SIDECAR_HOST"),
            "port": read_int(env, "JOBLEASE_SIDECAR_PORT", None),
            "port_file": read_path(env, "JOBLEASE_SIDECAR_PORT_FILE"),
            "probe_host": env.get("JOBLEASE_SIDECAR_PROBE_HOST"),
            "probe_port_file": read_path(env, "JOBLEASE_SIDECAR_PROBE_PORT_FILE"),
            "on_loss": env.get("JOBLEASE_SIDECAR_ON_LOSS"),
            "on_final": env.get("JOBLEASE_SIDECAR_ON_FINAL"),
            "worker_pid_file": read_path(env, "JOBLEASE_WORKER_PID_FILE"),
            "worker_process_name": env.get("JOBLEASE_WORKER_PROCESS_NAME") or None,
            "max_result_bytes": read_int(env, "JOBLEASE_SIDECAR_MAX_RESULT_BYTES", None),
            "registration_wait": read_float(env, "JOBLEASE_SIDECAR_REGISTRATION_WAIT", None),
        }
        values: dict[str, Any] = {k: v for k, v in unset_if_none.items() if v is not None}
        values["job"] = job
        values["etcd"] = EtcdConfig.from_env(env)
        # Variables whose every value means something (an empty token file or
        # probe port disables it; "off" disables the rate limit).
        if "JOBLEASE_TOKEN_FILE" in env:
            values["token_file"] = read_path(env, "JOBLEASE_TOKEN_FILE")
        if "JOBLEASE_SIDECAR_PROBE_PORT" in env:
            raw = env["JOBLEASE_SIDECAR_PROBE_PORT"].strip()
            values["probe_port"] = None if raw.lower() in ("", "off", "none", "-1") \
                else read_int({"p": raw}, "p", None)
        if "JOBLEASE_SIDECAR_RELEASE_ON_TERM" in env:
            values["release_on_term"] = parse_bool(env["JOBLEASE_SIDECAR_RELEASE_ON_TERM"],
                                                   "JOBLEASE_SIDECAR_RELEASE_ON_TERM")
        if env.get("JOBLEASE_SIDECAR_API_TOKEN_FILE"):
            values["api_token"] = read_secret(Path(env["JOBLEASE_SIDECAR_API_TOKEN_FILE"]))
        if RATE_LIMIT_ENV in env:
            values["rate_limit"] = parse_rate_limit(env[RATE_LIMIT_ENV])
        backoff = {attr: read_float(env, variable, None) for attr, variable in (
            ("initial", "JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL"),
            ("maximum", "JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX"))}
        if any(v is not None for v in backoff.values()):
            values["backoff"] = Backoff(**{k: v for k, v in backoff.items() if v is not None})
        if "JOBLEASE_LOG_LEVEL" in env:
            values["log_level"] = env["JOBLEASE_LOG_LEVEL"].upper()
        values.update({k: v for k, v in overrides.items() if v is not None})
        if values.get("probe_port") is not None and values["probe_port"] < 0:
            values["probe_port"] = None
        values.setdefault("owner", default_owner(env))
        if not values["job"].name:
            raise InvalidInputError("no job name: set JOBLEASE_JOB_NAME (or --job)")
        return cls(**values)


def default_owner(env: Mapping[str, str]) -> str:
    """``<POD_NAME>/<POD_UID>``: the name is readable, the UID makes a recreated
    pod with the same name a different owner (its claim id differs anyway)."""
    pod, uid = env.get("POD_NAME"), env.get("POD_UID")
    if pod and uid:
        return f"{pod}/{uid}"
    if pod:
        return pod
    import socket

    return f"{socket.gethostname()}/{os.getpid()}"


def read_secret(path: Path) -> str:
    """A mounted secret's value, without the trailing newline editors add."""
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise InvalidInputError(f"cannot read secret file {path}: {exc.strerror}") from None
    if not value:
        raise InvalidInputError(f"secret file {path} is empty")
    return value
