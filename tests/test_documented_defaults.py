"""The defaults the docs promise are the defaults the code has.

Each default is defined once, on its config dataclass (``EtcdConfig``,
``OperatorConfig``) or, for the sidecar, in the Go binary's config package;
the readers (``from_env``, the click flags) fall back to it. This reads the
real docs (docs/sidecar.md's settings table, docs/cli.md, docs/operator.md)
and the real commands' ``--help``-level defaults (the Go sidecar's own
``--help``), and compares: users' configs keep meaning what the docs say.
Nothing is faked; no etcd is needed (nothing connects).
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import click
import pytest

from joblease.cli import main as cli_main
from joblease.etcd_store import EtcdConfig
from joblease.operator.command import _config as operator_flags_to_config
from joblease.operator.command import operator_command
from joblease.operator.main import ENV, OperatorConfig
from joblease.operator.webhook import WebhookConfig
from joblease.validation import MAX_RESULT_BYTES

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _sidecar_table() -> dict[str, str]:
    """docs/sidecar.md's settings table: variable -> documented default."""
    rows = {}
    for line in (DOCS / "sidecar.md").read_text().splitlines():
        m = re.match(r"\| `(JOBLEASE_[A-Z_]+)`[^|]*\|[^|]*\| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def _go_help_defaults(sidecar_argv: list[str]) -> dict[str, str]:
    """The Go sidecar's ``--help``: variable -> the default it states (``[VAR; default]``)."""
    out = subprocess.run([*sidecar_argv, "--help"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    return dict(re.findall(r"\[(JOBLEASE_[A-Z_]+); ([^\]]+)\]", out))


def test_sidecar_defaults_are_the_documented_ones(sidecar_argv: list[str]) -> None:
    """docs/sidecar.md's table states the defaults the Go sidecar's ``--help`` states.

    The defaults ``--help`` leaves unstated (probe host, backoff, registration
    wait, rate limit) are held to the docs by sidecar-go/internal/config's tests
    and, for the rate limit, tests/security/test_hostile_input.py."""
    documented = _sidecar_table()
    stated = _go_help_defaults(sidecar_argv)
    for var in ("JOBLEASE_SIDECAR_HOST", "JOBLEASE_SIDECAR_PORT", "JOBLEASE_SIDECAR_PROBE_PORT",
                "JOBLEASE_TOKEN_FILE", "JOBLEASE_SIDECAR_ON_LOSS", "JOBLEASE_SIDECAR_ON_FINAL",
                "JOBLEASE_SIDECAR_RELEASE_ON_TERM", "JOBLEASE_LOG_LEVEL"):
        assert documented.get(var) == f"`{stated.get(var)}`", var
    # the result limit is the library's: what the sidecar accepts, the library reads back
    assert documented["JOBLEASE_SIDECAR_MAX_RESULT_BYTES"] == str(MAX_RESULT_BYTES)


def _defaults(command: click.Command) -> dict[str, Any]:
    ctx = click.Context(command)
    return {p.name: p.get_default(ctx) for p in command.params if isinstance(p, click.Option)}


def test_cli_etcd_defaults_are_etcd_configs() -> None:
    assert isinstance(cli_main, click.Group)
    flags = _defaults(cli_main.commands["get"])
    etcd = EtcdConfig()
    assert (tuple(flags["endpoints"].split(",")), flags["root"], flags["request_timeout"]) == (
        etcd.endpoints, etcd.root, etcd.request_timeout)
    assert f"`--root` | `JOBLEASE_ROOT` | key prefix, default `{etcd.root}`" in (
        DOCS / "cli.md").read_text()
    assert EtcdConfig.from_env({}) == etcd


def _operator_table() -> dict[str, str]:
    """docs/operator.md's configuration table: flag or variable -> documented default."""
    rows = {}
    for line in (DOCS / "operator.md").read_text().splitlines():
        m = re.match(r"\| (`--[a-z-]+|—)[^|]*\| (`JOBLEASE_[A-Z_]+|—)[^|]*\| ([^|]*) \|", line)
        if m:
            for key in (m.group(1), m.group(2)):
                if key != "—":
                    rows[key.strip("`")] = m.group(3).strip()
    return rows


def test_operator_defaults_are_the_documented_ones() -> None:
    documented, config = _operator_table(), OperatorConfig()
    assert OperatorConfig.from_env({}) == config  # from_env adds no defaults
    expected = {
        "JOBLEASE_METRICS_PORT": f"`{config.metrics_port}`",
        "JOBLEASE_METRICS_HOST": f"`{config.metrics_host}`",
        "--watch-timeout": f"`{config.server_timeout}`",
        "--result-limit": f"`{config.result_limit}`",
        "JOBLEASE_TENANT_CREDENTIALS": f"`{str(config.tenant_credentials).lower()}`",
        "JOBLEASE_TENANT_RESYNC_INTERVAL": f"`{config.tenant_resync_interval:g}`",
        "JOBLEASE_LEADER_ELECTION": f"`{str(config.leader_election).lower()}`",
        "JOBLEASE_LEADER_ELECTION_TTL": f"`{config.leader_election_ttl}`",
        "JOBLEASE_LOG_LEVEL": f"`{config.log_level}`",
        "JOBLEASE_WEBHOOK_CERT_DIR": f"`{os.path.dirname(WebhookConfig().cert_file)}`",
        "JOBLEASE_ETCD_ENDPOINTS": f"`{','.join(config.etcd.endpoints)}`",
        "JOBLEASE_ROOT": f"`{config.etcd.root}`",
    }
    assert {k: documented.get(k) for k in expected} == expected
    assert config.namespaces == () and documented["JOBLEASE_NAMESPACES"] == "every namespace"
    assert config.webhook is None and documented["JOBLEASE_WEBHOOK_PORT"].startswith("`0`")
    assert config.leader_election_name is None
    # every operator variable and flag has its row
    assert set(ENV.values()) <= documented.keys()
    flags = {o for p in operator_command.params if isinstance(p, click.Option)
             for o in p.opts if o.startswith("--") and o != "--help"}
    assert flags - documented.keys() == {"--all-namespaces"}  # a row without a default
    text = (DOCS / "operator.md").read_text()
    assert "| `--all-namespaces`" in text
    assert f"`--metrics-port` (default {config.metrics_port};" in text
    assert f"`--watch-timeout`, {config.server_timeout} s" in text
    assert f"`--result-limit` bytes of JSON (default {config.result_limit})" in text
    assert f"`--tenant-resync-interval` seconds (default {config.tenant_resync_interval:g}," in text


def test_operator_flags_add_no_defaults_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """No flag given: the command's config is exactly what ``from_env`` reads."""
    monkeypatch.setenv("JOBLEASE_METRICS_PORT", "9999")
    given = operator_command.make_context("operator", []).params  # parsed, not run
    assert {k: v for k, v in given.items() if v not in (None, (), False)} == {}
    assert operator_flags_to_config(given) == OperatorConfig.from_env()
    assert operator_flags_to_config(given).metrics_port == 9999
