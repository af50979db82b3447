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
import yaml

from joblease import validation
from joblease.cli import main as cli_main
from joblease.etcd_store import EtcdConfig
from joblease.operator.command import _config as operator_flags_to_config
from joblease.operator.command import operator_command
from joblease.operator.main import ENV, OperatorConfig
from joblease.operator.queue_registration import spec_from_resource
from joblease.operator.webhook import WebhookConfig
from joblease.validation import MAX_RESULT_BYTES
from tests.support import sidecar_impls

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
    """The CLI's etcd flags have no defaults of their own (None: not given) and no click
    ``envvar=``: ``EtcdConfig.from_env`` reads the variables and the defaults, the one
    path every component takes; ``--help`` shows the dataclass's defaults."""
    assert isinstance(cli_main, click.Group)
    get = cli_main.commands["get"]
    flags = _defaults(get)
    assert all(flags[k] is None for k in ("endpoints", "root", "request_timeout", "user"))
    assert not [p.name for p in get.params if getattr(p, "envvar", None)]
    etcd = EtcdConfig()
    help_text = " ".join(get.get_help(click.Context(get)).split())
    for shown in (",".join(etcd.endpoints), etcd.root, str(etcd.request_timeout)):
        assert f"default: {shown}" in help_text
    assert f"`--root` | `JOBLEASE_ROOT` | key prefix, default `{etcd.root}`" in (
        DOCS / "cli.md").read_text()
    assert EtcdConfig.from_env({}) == etcd


def test_cli_reads_the_etcd_environment_through_etcd_config(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags beat variables, variables beat defaults, and an empty variable is unset
    (as in joblease.envvars), for the CLI exactly as for the operator and sidecar."""
    from joblease.cli import make_config

    none = dict.fromkeys(("ca_file", "cert_file", "key_file", "server_name", "user",
                          "password_file"))
    monkeypatch.setenv("JOBLEASE_ETCD_ENDPOINTS", "a:1,b:2")
    monkeypatch.setenv("JOBLEASE_ROOT", "")
    monkeypatch.setenv("JOBLEASE_ETCD_USERNAME", "")
    config = make_config(endpoints=None, root=None, request_timeout=None, **none)
    assert config == EtcdConfig(endpoints=("a:1", "b:2"))
    assert config == EtcdConfig.from_env()
    flagged = make_config(endpoints="c:3", root="/r", request_timeout=2.0, **none)
    assert (flagged.endpoints, flagged.root, flagged.request_timeout) == (("c:3",), "/r", 2.0)
    monkeypatch.setenv("JOBLEASE_ETCD_ENDPOINTS", " ")
    assert make_config(endpoints=None, root=None, request_timeout=None,
                       **none).endpoints == EtcdConfig().endpoints


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


def test_go_sidecar_help_states_the_documented_flags_and_defaults() -> None:
    """The Go sidecar's ``--help`` names every flag of docs/sidecar.md's table with
    its variable, and states each documented default as the table does; the Go
    test ``TestHelpStatesTheDefaultsParseUses`` (sidecar-go/internal/config) holds
    ``--help`` to the defaults the Go code uses. Runs the real binary (``--help``
    exits before anything connects)."""
    out = subprocess.run([*sidecar_impls.argv("go"), "--help"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    flags: dict[str, tuple[str, str | None]] = {}  # --flag -> (variable, stated default)
    for entry in re.split(r"\n(?=  --)", out):  # an option and its continuation lines
        flag = re.match(r"\s*(--[a-z-]+)", entry)
        stated = re.search(r"\[(JOBLEASE_[A-Z_]+)(?:; (?:default )?([^\]]+))?\]", entry)
        if flag and stated:
            flags[flag.group(1)] = (stated.group(1), stated.group(2))
    bad: list[str] = []
    for line in (DOCS / "sidecar.md").read_text().splitlines():
        m = re.match(r"\| `(JOBLEASE_[A-Z_]+)`( / `_MAX`)? "
                     r"\|\s*([^|]*?)\s*\|\s*([^|]*?)\s*\|", line)
        if not m or not m.group(3).strip():
            continue
        variable, documented = m.group(1), m.group(4).strip()
        names = re.findall(r"--(?:\[no-\])?([a-z-]+)", m.group(3))
        pairs = [(names[0], variable, documented)]
        if m.group(2):  # `_INITIAL` / `_MAX`, "0.2 s / 5 s"
            first, second = documented.split("/")
            stem = variable.removesuffix("_INITIAL")
            pairs = [(names[0], variable, first),
                     (names[0].rsplit("-", 1)[0] + "-max", stem + "_MAX", second)]
        for name, var, default in pairs:
            helped = flags.get(f"--{name}")
            if helped is None or helped[0] != var:
                bad.append(f"--{name}: --help says {helped}, the table {var}")
                continue
            want = default.replace("`", "").removesuffix(" s").strip()
            if re.fullmatch(r"[\w./:-]+", want) and want != "(required)" and helped[1] != want:
                bad.append(f"--{name}: --help's default {helped[1]!r}, the table's {want!r}")
    assert not bad, "\n".join(bad)


def test_no_cli_option_reads_the_environment_through_click() -> None:
    """Every variable the CLI honours is read one way (joblease.envvars / from_env),
    so no option of any verb carries a click ``envvar=`` (issue 31)."""
    assert isinstance(cli_main, click.Group)
    with_envvar = [f"{name} {p.name}" for name, command in cli_main.commands.items()
                   for p in command.params if getattr(p, "envvar", None)]
    assert with_envvar == []


def test_cli_owner_comes_from_the_flag_then_the_variable(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--owner`` beats ``JOBLEASE_OWNER``; an empty variable is unset, and a verb
    that needs an owner without either is a usage error (exit 2) naming both."""
    from click.testing import CliRunner

    from joblease.cli import owner_of, required_owner

    monkeypatch.setenv("JOBLEASE_OWNER", "from-env")
    assert (owner_of("flag"), owner_of(None)) == ("flag", "from-env")
    monkeypatch.setenv("JOBLEASE_OWNER", "")
    assert owner_of(None) is None
    with pytest.raises(click.UsageError, match="JOBLEASE_OWNER"):
        required_owner(None)
    done = CliRunner().invoke(cli_main, ["release", "j", "--token", "1"])
    assert done.exit_code == 2 and "JOBLEASE_OWNER" in done.output


def test_the_queue_history_limit_is_one_default_and_one_bound_everywhere() -> None:
    """The JobQueue CRD, ``joblease queue create`` and the operator (for a spec
    without the field) keep the same number of tenures per item, and the CRD's
    bound is the library's (docs/history.md, "Queue items")."""
    crd = yaml.safe_load((Path(__file__).resolve().parents[1] / "crds" /
                          "jobqueues.joblease.io.yaml").read_text())
    field = (crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
             ["properties"]["historyLimit"])
    assert (field["default"], field["minimum"], field["maximum"]) == (
        validation.DEFAULT_QUEUE_HISTORY_LIMIT, 0, validation.MAX_QUEUE_HISTORY_LIMIT)
    queue_group = main_commands()["queue"]
    assert isinstance(queue_group, click.Group)
    create = queue_group.commands["create"]
    [option] = [p for p in create.params if p.name == "history_limit"]
    assert option.default == validation.DEFAULT_QUEUE_HISTORY_LIMIT
    assert spec_from_resource({"leaseDurationSeconds": 5}).history_limit == field["default"]


def main_commands() -> dict[str, click.Command]:
    assert isinstance(cli_main, click.Group)
    return dict(cli_main.commands)
