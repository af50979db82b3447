"""``joblease sidecar``: the click command. Flags override the ``JOBLEASE_*``
environment, which is what a pod spec sets (see docs/sidecar.md)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import click

from joblease.errors import InvalidInputError
from joblease.sidecar.config import (
    ON_FINAL_ACTIONS,
    ON_LOSS_ACTIONS,
    Backoff,
    SidecarConfig,
    read_secret,
)
from joblease.sidecar.logs import configure_logging
from joblease.sidecar.serve import run_sidecar

_PATH = click.Path(dir_okay=False, path_type=Path)


@click.command("sidecar")
@click.option("--job", help="Job name [JOBLEASE_JOB_NAME]; 'ns/name' also sets the namespace.")
@click.option("--namespace", help="Job namespace [JOBLEASE_JOB_NAMESPACE].")
@click.option("--owner", help="Owner identity [JOBLEASE_OWNER; default POD_NAME/POD_UID].")
@click.option("--host", help="API listen address [JOBLEASE_SIDECAR_HOST; 127.0.0.1].")
@click.option("--port", type=int, help="API port, 0 = any [JOBLEASE_SIDECAR_PORT; 8470].")
@click.option("--port-file", type=_PATH,
              help="Write the bound API port here [JOBLEASE_SIDECAR_PORT_FILE].")
@click.option("--probe-host", help="Probe listener address [JOBLEASE_SIDECAR_PROBE_HOST].")
@click.option("--probe-port", type=int,
              help="Probe port (-1 = off) [JOBLEASE_SIDECAR_PROBE_PORT; 8471].")
@click.option("--probe-port-file", type=_PATH,
              help="Write the bound probe port here [JOBLEASE_SIDECAR_PROBE_PORT_FILE].")
@click.option("--token-file", type=_PATH,
              help="Token file [JOBLEASE_TOKEN_FILE; /run/joblease/token].")
@click.option("--on-loss", type=click.Choice(ON_LOSS_ACTIONS),
              help="Action on loss [JOBLEASE_SIDECAR_ON_LOSS; signal].")
@click.option("--on-final", type=click.Choice(ON_FINAL_ACTIONS),
              help="On a final claim answer (already completed, refused for good): "
                   "serve it or exit with its code [JOBLEASE_SIDECAR_ON_FINAL; serve].")
@click.option("--worker-pid-file", type=_PATH,
              help="Worker pid file [JOBLEASE_WORKER_PID_FILE].")
@click.option("--worker-process-name",
              help="Worker process name [JOBLEASE_WORKER_PROCESS_NAME].")
@click.option("--release-on-term/--no-release-on-term", default=None,
              help="Release the lease on SIGTERM [JOBLEASE_SIDECAR_RELEASE_ON_TERM; true].")
@click.option("--api-token-file", type=_PATH,
              help="Bearer token file for the API [JOBLEASE_SIDECAR_API_TOKEN_FILE].")
@click.option("--max-result-bytes", type=int,
              help="Result size limit [JOBLEASE_SIDECAR_MAX_RESULT_BYTES].")
@click.option("--claim-backoff-initial", type=float,
              help="First claim retry delay, s [JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL].")
@click.option("--claim-backoff-max", type=float,
              help="Longest claim retry delay, s [JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX].")
@click.option("--registration-wait", type=float,
              help="Wait this long for registration, s [JOBLEASE_SIDECAR_REGISTRATION_WAIT].")
@click.option("--log-level", help="Log level [JOBLEASE_LOG_LEVEL; INFO].")
def sidecar_command(job: str | None, namespace: str | None, owner: str | None,
                    host: str | None, port: int | None, port_file: Path | None,
                    probe_host: str | None, probe_port: int | None,
                    probe_port_file: Path | None, token_file: Path | None,
                    on_loss: str | None, on_final: str | None, worker_pid_file: Path | None,
                    worker_process_name: str | None, release_on_term: bool | None,
                    api_token_file: Path | None, max_result_bytes: int | None,
                    claim_backoff_initial: float | None, claim_backoff_max: float | None,
                    registration_wait: float | None, log_level: str | None) -> None:
    """Claim this pod's job, keep it alive, serve the token to the worker."""
    try:
        config = _config(locals())
    except InvalidInputError as exc:
        raise click.UsageError(str(exc)) from None
    configure_logging(config.log_level)
    sys.exit(asyncio.run(run_sidecar(config)))


def _config(opts: dict[str, Any]) -> SidecarConfig:
    """Flags over environment: the flags are overrides of ``SidecarConfig.from_env``."""
    overrides: dict[str, Any] = {key: opts[key] for key in (
        "job", "owner", "host", "port", "port_file", "probe_host", "probe_port",
        "probe_port_file", "token_file", "on_loss", "on_final", "worker_pid_file",
        "worker_process_name", "release_on_term", "max_result_bytes", "registration_wait")}
    if opts["api_token_file"] is not None:
        overrides["api_token"] = read_secret(opts["api_token_file"])
    if opts["log_level"]:
        overrides["log_level"] = opts["log_level"].upper()
    config = SidecarConfig.from_env(namespace=opts["namespace"], **overrides)
    if opts["claim_backoff_initial"] is not None or opts["claim_backoff_max"] is not None:
        config = config.with_(backoff=Backoff(
            initial=opts["claim_backoff_initial"] or config.backoff.initial,
            maximum=opts["claim_backoff_max"] or config.backoff.maximum))
    return config
