"""``joblease operator``: run the kopf operator in this process."""

from __future__ import annotations

import asyncio
import logging
import os

import click

from joblease.operator.election import DEFAULT_TTL as ELECTION_TTL
from joblease.operator.election import check_name
from joblease.operator.injection import SidecarSettings
from joblease.operator.main import (
    EXIT_LEADERSHIP_LOST,
    LeadershipLostError,
    OperatorConfig,
    run_operator,
)
from joblease.operator.webhook import WebhookConfig

#: The flags' defaults are OperatorConfig's own (defined there once).
_DEFAULTS = OperatorConfig()


@click.command("operator")
@click.option("--namespace", "-n", "namespaces", multiple=True,
              help="Serve only this namespace (repeatable; globs allowed). "
                   "Env: JOBLEASE_NAMESPACES (comma separated).")
@click.option("--all-namespaces", "-A", is_flag=True,
              help="Serve every namespace (the default when no --namespace is given).")
@click.option("--metrics-port", type=int, default=_DEFAULTS.metrics_port, show_default=True,
              envvar="JOBLEASE_METRICS_PORT",
              help="Port for /metrics, /healthz and /readyz (0 disables).")
@click.option("--metrics-host", default=_DEFAULTS.metrics_host, show_default=True,
              envvar="JOBLEASE_METRICS_HOST")
@click.option("--watch-timeout", type=int, default=_DEFAULTS.server_timeout, show_default=True,
              help="Seconds the API server keeps a kopf watch open before it re-lists.")
@click.option("--result-limit", type=int, default=_DEFAULTS.result_limit, show_default=True,
              help="Bytes of result JSON copied into status.result (the rest is truncated).")
@click.option("--tenant-credentials/--no-tenant-credentials",
              default=_DEFAULTS.tenant_credentials, show_default=True,
              envvar="JOBLEASE_TENANT_CREDENTIALS",
              help="Give each namespace with JobLeases its own etcd user (access to its own "
                   "keys only) in the Secret joblease-etcd-credentials; needs etcd root. "
                   "Env: JOBLEASE_TENANT_CREDENTIALS=1.")
@click.option("--tenant-resync-interval", type=float,
              default=_DEFAULTS.tenant_resync_interval, show_default=True,
              envvar="JOBLEASE_TENANT_RESYNC_INTERVAL",
              help="Seconds between re-checks of the tenant Secrets (repairs them and "
                   "performs rotations requested with joblease.io/rotate=true; 0 disables).")
@click.option("--leader-election/--no-leader-election", default=True, show_default=True,
              envvar="JOBLEASE_LEADER_ELECTION",
              help="Elect one active replica through etcd; the others stand by (probes, "
                   "metrics, webhook) and take over when it goes. --no-leader-election makes "
                   "this process active whatever other replicas do: only for tests that "
                   "force overlapping operators, never with several replicas.")
@click.option("--leader-election-ttl", type=click.IntRange(1, 3600), default=ELECTION_TTL,
              show_default=True, envvar="JOBLEASE_LEADER_ELECTION_TTL",
              help="Seconds of the leader's etcd lease: a dead or partitioned leader is "
                   "replaced within about this long.")
@click.option("--leader-election-name", default=None, envvar="JOBLEASE_LEADER_ELECTION_NAME",
              help="Replicas with the same name elect one leader (default: derived from the "
                   "namespaces served).")
@click.option("--webhook-port", type=int, default=0, show_default=True,
              envvar="JOBLEASE_WEBHOOK_PORT",
              help="Serve the sidecar-injection webhook (HTTPS) on this port (0: not served).")
@click.option("--webhook-cert-dir", default="/etc/joblease/webhook", show_default=True,
              envvar="JOBLEASE_WEBHOOK_CERT_DIR",
              help="Directory with the webhook's serving certificate tls.crt and key tls.key.")
@click.option("--webhook-settings", default=None, envvar="JOBLEASE_WEBHOOK_SETTINGS",
              help="JSON file with the injected sidecar's settings (image, etcd, ...; "
                   "docs/sidecar.md#injection); default: the built-in defaults.")
@click.option("--log-level", default=lambda: os.environ.get("JOBLEASE_LOG_LEVEL", "INFO"),
              show_default="INFO")
def operator_command(namespaces: tuple[str, ...], all_namespaces: bool, metrics_port: int,
                     metrics_host: str, watch_timeout: int, result_limit: int,
                     tenant_credentials: bool, tenant_resync_interval: float,
                     leader_election: bool, leader_election_ttl: int,
                     leader_election_name: str | None, webhook_port: int,
                     webhook_cert_dir: str, webhook_settings: str | None,
                     log_level: str) -> None:
    """Register JobLeases in etcd and mirror etcd's decisions into their status.

    etcd connection: JOBLEASE_ETCD_ENDPOINTS, JOBLEASE_ETCD_CA_FILE/_CERT_FILE/_KEY_FILE,
    JOBLEASE_ETCD_USERNAME/_PASSWORD(_FILE), JOBLEASE_ROOT. Kubernetes: KUBECONFIG if
    set, else the pod's service account.
    """
    if not namespaces and os.environ.get("JOBLEASE_NAMESPACES"):
        namespaces = tuple(n.strip() for n in os.environ["JOBLEASE_NAMESPACES"].split(",")
                           if n.strip())
    if all_namespaces and namespaces:
        raise click.UsageError("--all-namespaces and --namespace exclude each other")
    if leader_election_name is not None:
        try:
            check_name(leader_election_name)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--leader-election-name") from exc
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    webhook = None
    if webhook_port:
        try:
            sidecar = (WebhookConfig.settings_from_file(webhook_settings) if webhook_settings
                       else SidecarSettings())
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc), param_hint="--webhook-settings") from exc
        webhook = WebhookConfig(port=webhook_port, settings=sidecar,
                                cert_file=os.path.join(webhook_cert_dir, "tls.crt"),
                                key_file=os.path.join(webhook_cert_dir, "tls.key"))
    config = OperatorConfig(namespaces=namespaces, metrics_port=metrics_port,
                            metrics_host=metrics_host, server_timeout=watch_timeout,
                            result_limit=result_limit, tenant_credentials=tenant_credentials,
                            tenant_resync_interval=tenant_resync_interval,
                            leader_election=leader_election,
                            leader_election_ttl=leader_election_ttl,
                            leader_election_name=leader_election_name, webhook=webhook)
    try:
        asyncio.run(run_operator(config))
    except LeadershipLostError as exc:
        # Exit non-zero so that Kubernetes restarts the container: the new process
        # stands by (another replica leads by now) instead of acting on stale leadership.
        logging.getLogger(__name__).error("%s; exiting (a restart stands by)", exc)
        raise SystemExit(EXIT_LEADERSHIP_LOST) from exc
