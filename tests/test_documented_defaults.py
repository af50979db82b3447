"""The defaults the docs promise are the defaults the code has.

Each default is defined once, on its config dataclass (``EtcdConfig``,
``SidecarConfig``, ``OperatorConfig``); the readers (``from_env``, the
click flags) fall back to it. This reads the real docs (docs/sidecar.md's
settings table, docs/cli.md, docs/operator.md) and the real commands'
``--help``-level defaults, and compares: users' configs keep meaning what the
docs say. Nothing is faked; no etcd is needed (nothing connects).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import pytest

from joblease.cli import main as cli_main
from joblease.etcd_store import EtcdConfig
from joblease.operator.command import operator_command
from joblease.operator.main import OperatorConfig
from joblease.sidecar.command import _config as sidecar_flags_to_config
from joblease.sidecar.command import sidecar_command
from joblease.sidecar.config import SidecarConfig

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _sidecar_table() -> dict[str, str]:
    """docs/sidecar.md's settings table: variable -> documented default."""
    rows = {}
    for line in (DOCS / "sidecar.md").read_text().splitlines():
        m = re.match(r"\| `(JOBLEASE_[A-Z_]+)`[^|]*\|[^|]*\| ([^|]*) \|", line)
        if m:
            rows[m.group(1)] = m.group(2).strip()
    return rows


def _number(text: str) -> float:
    m = re.search(r"[\d.]+", text)
    assert m, text
    return float(m.group(0))


def test_sidecar_defaults_are_the_documented_ones() -> None:
    documented = _sidecar_table()
    config = SidecarConfig.from_env({"JOBLEASE_JOB_NAME": "j", "JOBLEASE_OWNER": "o"})
    assert config == SidecarConfig(job=config.job, owner="o")  # from_env adds no defaults
    expected: dict[str, Any] = {
        "JOBLEASE_SIDECAR_HOST": f"`{config.host}`",
        "JOBLEASE_SIDECAR_PORT": f"`{config.port}`",
        "JOBLEASE_SIDECAR_PROBE_HOST": f"`{config.probe_host}`",
        "JOBLEASE_SIDECAR_PROBE_PORT": f"`{config.probe_port}`",
        "JOBLEASE_TOKEN_FILE": f"`{config.token_file}`",
        "JOBLEASE_SIDECAR_ON_LOSS": f"`{config.on_loss}`",
        "JOBLEASE_SIDECAR_ON_FINAL": f"`{config.on_final}`",
        "JOBLEASE_SIDECAR_RELEASE_ON_TERM": f"`{str(config.release_on_term).lower()}`",
        "JOBLEASE_SIDECAR_MAX_RESULT_BYTES": str(config.max_result_bytes),
        "JOBLEASE_LOG_LEVEL": f"`{config.log_level}`",
    }
    assert {k: documented.get(k) for k in expected} == expected
    assert _number(documented["JOBLEASE_SIDECAR_REGISTRATION_WAIT"]) == config.registration_wait
    initial, maximum = documented["JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL"].split("/")
    assert (_number(initial), _number(maximum)) == (config.backoff.initial,
                                                    config.backoff.maximum)
    rate = re.search(r"`JOBLEASE_SIDECAR_RATE_LIMIT`\s+\(requests per second,\s+default (\d+)",
                     (DOCS / "sidecar.md").read_text())
    assert rate and float(rate.group(1)) == config.rate_limit


def test_sidecar_flags_add_no_defaults_of_their_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """No flag given: the command's config is exactly what ``from_env`` reads."""
    monkeypatch.setenv("JOBLEASE_JOB_NAME", "j")
    monkeypatch.setenv("JOBLEASE_OWNER", "o")
    given = sidecar_command.make_context("sidecar", []).params  # parsed, not run
    assert {k: v for k, v in given.items() if v is not None} == {}
    assert sidecar_flags_to_config(given) == SidecarConfig.from_env()


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


def test_operator_flag_defaults_are_operator_configs() -> None:
    flags, config = _defaults(operator_command), OperatorConfig()
    assert (flags["metrics_port"], flags["metrics_host"], flags["watch_timeout"],
            flags["result_limit"], flags["tenant_credentials"],
            flags["tenant_resync_interval"]) == (
        config.metrics_port, config.metrics_host, config.server_timeout, config.result_limit,
        config.tenant_credentials, config.tenant_resync_interval)
    text = (DOCS / "operator.md").read_text()
    assert f"`--metrics-port` (default {config.metrics_port};" in text
    assert f"`--watch-timeout`, {config.server_timeout} s" in text
    assert f"`--result-limit` bytes of JSON (default {config.result_limit})" in text
    assert f"`--tenant-resync-interval` seconds (default {config.tenant_resync_interval:g}," in text
