"""``joblease operator``: run the kopf operator in this process."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import click

from joblease.errors import InvalidInputError
from joblease.operator.election import MAX_TTL, MIN_TTL
from joblease.operator.main import (
    ENV,
    EXIT_LEADERSHIP_LOST,
    LeadershipLostError,
    OperatorConfig,
    run_operator,
)
from joblease.operator.webhook import DEFAULT_CERT_DIR

#: Defaults shown in --help are OperatorConfig's own (defined there once); every
#: flag defaults to None, "not given", so the variable or the dataclass default applies.
_DEFAULTS = OperatorConfig()


def _help(text: str, attr: str, default: object) -> str:
    """``text [VARIABLE; default]``, as ``joblease sidecar --help`` has it."""
    variable = f"{ENV[attr]}; " if attr in ENV else ""
    return f"{text} [{variable}default: {default}]"


@click.command("operator")
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help=_help("Serve only this namespace (repeatable; globs allowed; the "
                         "variable is comma separated).", "namespaces", "every namespace"))
@click.option("--all-namespaces", "-A", is_flag=True,
              help="Serve every namespace (the default when no --namespace is given).")
@click.option("--metrics-port", type=int,
              help=_help("Port for /metrics, /healthz and /readyz (0 disables).",
                         "metrics_port", _DEFAULTS.metrics_port))
@click.option("--metrics-host", help=_help("Address of the metrics port.", "metrics_host",
                                           _DEFAULTS.metrics_host))
@click.option("--watch-timeout", type=int,
              help=_help("Seconds the API server keeps a kopf watch open before it re-lists.",
                         "server_timeout", _DEFAULTS.server_timeout))
@click.option("--result-limit", type=int,
              help=_help("Bytes of result JSON copied into status.result (the rest is "
                         "truncated).", "result_limit", _DEFAULTS.result_limit))
@click.option("--tenant-credentials/--no-tenant-credentials", default=None,
              help=_help("Give each namespace with JobLeases its own etcd user (access to its "
                         "own keys only) in the Secret joblease-etcd-credentials; needs etcd "
                         "root.", "tenant_credentials",
                         str(_DEFAULTS.tenant_credentials).lower()))
@click.option("--tenant-resync-interval", type=float,
              help=_help("Seconds between re-checks of the tenant Secrets (repairs them and "
                         "performs rotations requested with joblease.io/rotate=true; "
                         "0 disables).", "tenant_resync_interval",
                         f"{_DEFAULTS.tenant_resync_interval:g}"))
@click.option("--tenant-namespace-label",
              help=_help("key=value: give tenants to the namespaces with this label (the "
                         "injection webhook's opt-in) and remove them when it goes, instead "
                         "of following JobLeases.", "tenant_namespace_label",
                         "JobLeases"))
@click.option("--tenant-tls-dir",
              help=_help("Directory whose ca.crt, tls.crt and tls.key (a client "
                         "certificate that names no etcd user) are copied into each tenant "
                         "Secret.", "tenant_tls_dir", "none"))
@click.option("--tenant-rotation-grace", type=float,
              help=_help("Seconds both etcd users of a tenant rotation stay valid.",
                         "tenant_rotation_grace", f"{_DEFAULTS.tenant_rotation_grace:g}"))
@click.option("--etcd-enable-auth/--no-etcd-enable-auth", default=None,
              help=_help("Turn etcd auth on (the configured user, root, with its password) "
                         "if it is off, before connecting.", "etcd_enable_auth",
                         str(_DEFAULTS.etcd_enable_auth).lower()))
@click.option("--queue-interval", type=float,
              help=_help("Seconds between two reads of each JobQueue's counts and each "
                         "JobSemaphore's state from etcd (their metrics and at most one "
                         "status write each).", "queue_interval",
                         f"{_DEFAULTS.queue_interval:g}"))
@click.option("--leader-election/--no-leader-election", default=None,
              help=_help("Elect one active replica through etcd; the others stand by (probes, "
                         "metrics, webhook) and take over when it goes. --no-leader-election "
                         "makes this process active whatever other replicas do: only for "
                         "tests that force overlapping operators, never with several "
                         "replicas.", "leader_election",
                         str(_DEFAULTS.leader_election).lower()))
@click.option("--leader-election-ttl", type=int,
              help=_help(f"Seconds of the leader's etcd lease ({MIN_TTL}-{MAX_TTL}): a dead or "
                         "partitioned leader is replaced within about this long.",
                         "leader_election_ttl", _DEFAULTS.leader_election_ttl))
@click.option("--leader-election-name",
              help=_help("Replicas with the same name elect one leader. Give installs "
                         "separate names only if their namespaces never overlap.",
                         "leader_election_name", "all-namespaces, one election per key root"))
@click.option("--webhook-port", type=int,
              help=_help("Serve the sidecar-injection webhook (HTTPS) on this port.",
                         "webhook_port", "0, not served"))
@click.option("--webhook-cert-dir",
              help=_help("Directory with the webhook's serving certificate tls.crt and key "
                         "tls.key.", "webhook_cert_dir", DEFAULT_CERT_DIR))
@click.option("--webhook-settings",
              help=_help("JSON file with the injected sidecar's settings (image, etcd, ...; "
                         "docs/sidecar.md#injection).", "webhook_settings",
                         "the built-in defaults"))
@click.option("--log-level", help=_help("Log level.", "log_level", _DEFAULTS.log_level))
def operator_command(**opts: Any) -> None:
    """Register JobLeases in etcd and mirror etcd's decisions into their status.

    Each flag overrides its variable. etcd connection: JOBLEASE_ETCD_ENDPOINTS,
    JOBLEASE_ETCD_CA_FILE/_CERT_FILE/_KEY_FILE, JOBLEASE_ETCD_SERVER_NAME,
    JOBLEASE_ETCD_USERNAME/_PASSWORD(_FILE), JOBLEASE_ROOT. Kubernetes: KUBECONFIG if
    set, else the pod's service account.
    """
    try:
        config = _config(opts)
    except InvalidInputError as exc:
        raise click.UsageError(str(exc)) from None
    logging.basicConfig(level=config.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        asyncio.run(run_operator(config))
    except LeadershipLostError as exc:
        # Exit non-zero so that Kubernetes restarts the container: the new process
        # stands by (another replica leads by now) instead of acting on stale leadership.
        logging.getLogger(__name__).error("%s; exiting (a restart stands by)", exc)
        raise SystemExit(EXIT_LEADERSHIP_LOST) from exc


def _config(opts: dict[str, Any]) -> OperatorConfig:
    """Flags over environment: the flags are overrides of ``OperatorConfig.from_env``."""
    return OperatorConfig.from_env(
        all_namespaces=opts["all_namespaces"], webhook_port=opts["webhook_port"],
        webhook_cert_dir=opts["webhook_cert_dir"], webhook_settings=opts["webhook_settings"],
        namespaces=opts["namespaces"] or None, metrics_port=opts["metrics_port"],
        metrics_host=opts["metrics_host"], server_timeout=opts["watch_timeout"],
        result_limit=opts["result_limit"], tenant_credentials=opts["tenant_credentials"],
        tenant_resync_interval=opts["tenant_resync_interval"],
        tenant_namespace_label=opts["tenant_namespace_label"],
        tenant_tls_dir=opts["tenant_tls_dir"],
        tenant_rotation_grace=opts["tenant_rotation_grace"],
        etcd_enable_auth=opts["etcd_enable_auth"],
        queue_interval=opts["queue_interval"],
        leader_election=opts["leader_election"],
        leader_election_ttl=opts["leader_election_ttl"],
        leader_election_name=opts["leader_election_name"], log_level=opts["log_level"])
