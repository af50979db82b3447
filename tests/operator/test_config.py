"""The operator's configuration: read one way (``OperatorConfig.from_env``), flags over
variables, defaults only on the dataclasses, bad values refused before anything starts.

Real: ``OperatorConfig.from_env``, the ``joblease operator`` click command (through
click's ``CliRunner``), the chart's Deployment template as text. Faked: the operator
it would start (``run_operator`` is replaced by a function recording its config),
because only the reading of the configuration is under test; nothing connects.
"""

from __future__ import annotations

import inspect
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from joblease.errors import InvalidInputError
from joblease.etcd_store import EtcdConfig
from joblease.operator import command
from joblease.operator.injection import SidecarSettings
from joblease.operator.kube import KUBE_API_CONNECTIONS, api_connections
from joblease.operator.main import ENV, OperatorConfig, kube_api
from joblease.operator.periodic_mirror import PeriodicMirror
from joblease.operator.webhook import WebhookConfig
from tests.support.chart import CHART

Check = Callable[[OperatorConfig], bool]


def _settings_file(directory: Path, image: str) -> str:
    path = directory / f"settings-{image.replace('/', '-').replace(':', '-')}.json"
    path.write_text(json.dumps({"image": image}))
    return str(path)


def _cases(tmp: Path) -> dict[str, tuple[dict[str, str], Check]]:
    """Each variable the operator reads: an environment setting it (and what it
    needs beside it) and what the config must then say."""
    password = tmp / "etcd-password"
    password.write_text("s3cret\n")
    username = tmp / "etcd-username"
    username.write_text("joblease-ns-a\n")
    webhook = {"JOBLEASE_WEBHOOK_PORT": "9443"}
    return {
        "JOBLEASE_NAMESPACES": ({"JOBLEASE_NAMESPACES": " team-a, team-b*,,"},
                                lambda c: c.namespaces == ("team-a", "team-b*")),
        "JOBLEASE_METRICS_PORT": ({"JOBLEASE_METRICS_PORT": "9090"},
                                  lambda c: c.metrics_port == 9090),
        "JOBLEASE_METRICS_HOST": ({"JOBLEASE_METRICS_HOST": "127.0.0.1"},
                                  lambda c: c.metrics_host == "127.0.0.1"),
        "JOBLEASE_TENANT_CREDENTIALS": ({"JOBLEASE_TENANT_CREDENTIALS": "1"},
                                        lambda c: c.tenant_credentials is True),
        "JOBLEASE_TENANT_RESYNC_INTERVAL": ({"JOBLEASE_TENANT_RESYNC_INTERVAL": "2.5"},
                                            lambda c: c.tenant_resync_interval == 2.5),
        "JOBLEASE_TENANT_NAMESPACE_LABEL": (
            {"JOBLEASE_TENANT_NAMESPACE_LABEL": "joblease.io/inject=enabled"},
            lambda c: c.tenant_namespace_label == "joblease.io/inject=enabled"),
        "JOBLEASE_TENANT_TLS_DIR": ({"JOBLEASE_TENANT_TLS_DIR": "/etc/worker-tls"},
                                    lambda c: c.tenant_tls_dir == "/etc/worker-tls"),
        "JOBLEASE_TENANT_ROTATION_GRACE": ({"JOBLEASE_TENANT_ROTATION_GRACE": "30"},
                                           lambda c: c.tenant_rotation_grace == 30.0),
        "JOBLEASE_ETCD_ENABLE_AUTH": (
            {"JOBLEASE_ETCD_ENABLE_AUTH": "1", "JOBLEASE_ETCD_USERNAME": "root",
             "JOBLEASE_ETCD_PASSWORD_FILE": str(password)},
            lambda c: c.etcd_enable_auth is True),
        "JOBLEASE_QUEUE_INTERVAL": ({"JOBLEASE_QUEUE_INTERVAL": "1.5"},
                                    lambda c: c.queue_interval == 1.5),
        "JOBLEASE_LEADER_ELECTION": ({"JOBLEASE_LEADER_ELECTION": "False"},
                                     lambda c: c.leader_election is False),
        "JOBLEASE_LEADER_ELECTION_TTL": ({"JOBLEASE_LEADER_ELECTION_TTL": "5"},
                                         lambda c: c.leader_election_ttl == 5),
        "JOBLEASE_LEADER_ELECTION_NAME": ({"JOBLEASE_LEADER_ELECTION_NAME": "blue"},
                                          lambda c: c.leader_election_name == "blue"),
        "JOBLEASE_WEBHOOK_PORT": (webhook, lambda c: c.webhook is not None
                                  and c.webhook.port == 9443
                                  and c.webhook.cert_file == WebhookConfig().cert_file),
        "JOBLEASE_WEBHOOK_CERT_DIR": (
            {**webhook, "JOBLEASE_WEBHOOK_CERT_DIR": "/certs"},
            lambda c: c.webhook is not None and (c.webhook.cert_file, c.webhook.key_file)
            == ("/certs/tls.crt", "/certs/tls.key")),
        "JOBLEASE_WEBHOOK_SETTINGS": (
            {**webhook, "JOBLEASE_WEBHOOK_SETTINGS": _settings_file(tmp, "example/side:1")},
            lambda c: c.webhook is not None and c.webhook.settings.image == "example/side:1"),
        "JOBLEASE_LOG_LEVEL": ({"JOBLEASE_LOG_LEVEL": "debug"},
                               lambda c: c.log_level == "DEBUG"),
        # the etcd connection, through EtcdConfig.from_env
        "JOBLEASE_ETCD_ENDPOINTS": ({"JOBLEASE_ETCD_ENDPOINTS": "a:2379, https://b:2379"},
                                    lambda c: c.etcd.endpoints == ("a:2379", "https://b:2379")),
        "JOBLEASE_ROOT": ({"JOBLEASE_ROOT": "/elsewhere"}, lambda c: c.etcd.root == "/elsewhere"),
        "JOBLEASE_ETCD_SERVER_NAME": ({"JOBLEASE_ETCD_SERVER_NAME": "etcd.example"},
                                      lambda c: c.etcd.server_name == "etcd.example"),
        "JOBLEASE_ETCD_CA_FILE": ({"JOBLEASE_ETCD_CA_FILE": "/tls/ca.crt"},
                                  lambda c: c.etcd.ca_file == "/tls/ca.crt" and c.etcd.tls),
        "JOBLEASE_ETCD_CERT_FILE": ({"JOBLEASE_ETCD_CERT_FILE": "/tls/tls.crt"},
                                    lambda c: c.etcd.cert_file == "/tls/tls.crt"),
        "JOBLEASE_ETCD_KEY_FILE": ({"JOBLEASE_ETCD_KEY_FILE": "/tls/tls.key"},
                                   lambda c: c.etcd.key_file == "/tls/tls.key"),
        "JOBLEASE_ETCD_USERNAME": ({"JOBLEASE_ETCD_USERNAME": "operator"},
                                   lambda c: c.etcd.username == "operator"),
        "JOBLEASE_ETCD_USERNAME_FILE": ({"JOBLEASE_ETCD_USERNAME_FILE": str(username)},
                                        lambda c: c.etcd.username == "joblease-ns-a"),
        "JOBLEASE_ETCD_PASSWORD": ({"JOBLEASE_ETCD_PASSWORD": "pw"},
                                   lambda c: c.etcd.password == "pw"),
        "JOBLEASE_ETCD_PASSWORD_FILE": ({"JOBLEASE_ETCD_PASSWORD_FILE": str(password)},
                                        lambda c: c.etcd.password == "s3cret"),
    }


#: The operator's own variables (the etcd connection's are EtcdConfig's).
OPERATOR_VARIABLES = {
    "JOBLEASE_NAMESPACES", "JOBLEASE_METRICS_PORT", "JOBLEASE_METRICS_HOST",
    "JOBLEASE_TENANT_CREDENTIALS", "JOBLEASE_TENANT_RESYNC_INTERVAL", "JOBLEASE_QUEUE_INTERVAL",
    "JOBLEASE_TENANT_NAMESPACE_LABEL", "JOBLEASE_TENANT_TLS_DIR",
    "JOBLEASE_TENANT_ROTATION_GRACE", "JOBLEASE_ETCD_ENABLE_AUTH",
    "JOBLEASE_LEADER_ELECTION", "JOBLEASE_LEADER_ELECTION_TTL",
    "JOBLEASE_LEADER_ELECTION_NAME", "JOBLEASE_WEBHOOK_PORT", "JOBLEASE_WEBHOOK_CERT_DIR",
    "JOBLEASE_WEBHOOK_SETTINGS", "JOBLEASE_LOG_LEVEL",
}
#: The etcd connection's, read through EtcdConfig.from_env.
ETCD_VARIABLES = {
    "JOBLEASE_ETCD_ENDPOINTS", "JOBLEASE_ROOT", "JOBLEASE_ETCD_SERVER_NAME",
    "JOBLEASE_ETCD_CA_FILE", "JOBLEASE_ETCD_CERT_FILE", "JOBLEASE_ETCD_KEY_FILE",
    "JOBLEASE_ETCD_USERNAME", "JOBLEASE_ETCD_USERNAME_FILE", "JOBLEASE_ETCD_PASSWORD",
    "JOBLEASE_ETCD_PASSWORD_FILE",
}
VARIABLES = sorted(OPERATOR_VARIABLES | ETCD_VARIABLES)


@pytest.fixture
def cases(tmp_path: Path) -> dict[str, tuple[dict[str, str], Check]]:
    return _cases(tmp_path)


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[OperatorConfig]:
    """No ``JOBLEASE_*`` variable of this process leaks in; the configs the command
    would start the operator with, in order."""
    for name in list(os.environ):
        if name.startswith("JOBLEASE_"):
            monkeypatch.delenv(name)
    seen: list[OperatorConfig] = []

    async def fake_run(config: OperatorConfig) -> None:
        seen.append(config)

    monkeypatch.setattr(command, "run_operator", fake_run)
    return seen


def invoke(argv: list[str], env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(command.operator_command, argv, env=env)


# -- from_env ---------------------------------------------------------------------------


def test_the_operators_variables_are_the_documented_set(
        cases: dict[str, tuple[dict[str, str], Check]]) -> None:
    assert set(ENV.values()) == OPERATOR_VARIABLES
    assert cases.keys() == set(VARIABLES)


@pytest.mark.parametrize("variable", VARIABLES)
def test_every_variable_is_read(variable: str,
                                cases: dict[str, tuple[dict[str, str], Check]]) -> None:
    env, check = cases[variable]
    config = OperatorConfig.from_env(env)
    assert check(config), config
    # and without the variable (what it needs beside it kept), the config does not say so
    assert not check(OperatorConfig.from_env({k: v for k, v in env.items() if k != variable}))


def test_no_variable_means_the_dataclass_defaults() -> None:
    assert OperatorConfig.from_env({}) == OperatorConfig()
    assert OperatorConfig().etcd == EtcdConfig() and OperatorConfig().webhook is None
    # an empty variable of the operator's counts as unset (as click's envvar= did),
    # never as false or "" (EtcdConfig's own are not under test here)
    assert OperatorConfig.from_env({name: "" for name in OPERATOR_VARIABLES}) == OperatorConfig()
    # port 0: the webhook is not served
    assert OperatorConfig.from_env({"JOBLEASE_WEBHOOK_PORT": "0"}).webhook is None


def test_overrides_win_when_given_and_none_means_not_given() -> None:
    env = {"JOBLEASE_METRICS_PORT": "9090", "JOBLEASE_LEADER_ELECTION": "true",
           "JOBLEASE_NAMESPACES": "a", "JOBLEASE_WEBHOOK_PORT": "9443"}
    config = OperatorConfig.from_env(env, metrics_port=0, leader_election=False,
                                     namespaces=("b",), webhook_port=0)
    assert (config.metrics_port, config.leader_election, config.namespaces,
            config.webhook) == (0, False, ("b",), None)
    kept = OperatorConfig.from_env(env, metrics_port=None, leader_election=None,
                                   namespaces=None, webhook_port=None)
    assert (kept.metrics_port, kept.leader_election, kept.namespaces) == (9090, True, ("a",))
    assert kept.webhook == WebhookConfig(port=9443)
    etcd = EtcdConfig(endpoints=("given:2379",))
    assert OperatorConfig.from_env({"JOBLEASE_ETCD_ENDPOINTS": "env:2379"}, etcd=etcd).etcd == etcd


def test_with_makes_a_checked_copy() -> None:
    config = OperatorConfig.from_env({"JOBLEASE_NAMESPACES": "a"})
    copy = config.with_(metrics_port=0, leader_election_ttl=20)
    assert (copy.metrics_port, copy.leader_election_ttl, copy.namespaces) == (0, 20, ("a",))
    assert config.metrics_port == 8080  # the original is unchanged
    with pytest.raises(InvalidInputError, match="JOBLEASE_LEADER_ELECTION_TTL"):
        config.with_(leader_election_ttl=0)
    assert WebhookConfig().with_(port=1).port == 1


# -- the command: flags over variables ---------------------------------------------------


@pytest.mark.parametrize("variable", VARIABLES)
def test_each_variable_reaches_the_command(
        variable: str, cases: dict[str, tuple[dict[str, str], Check]],
        started: list[OperatorConfig]) -> None:
    env, check = cases[variable]
    result = invoke([], env)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert check(config), config


def test_no_flag_no_variable_starts_the_dataclass_defaults(
        started: list[OperatorConfig]) -> None:
    result = invoke([])
    assert result.exit_code == 0, result.output
    assert started == [OperatorConfig()]


@pytest.mark.parametrize("argv, env, check", [
    (["-n", "x", "--namespace", "y"], {"JOBLEASE_NAMESPACES": "a,b"},
     lambda c: c.namespaces == ("x", "y")),
    (["--metrics-port", "9100"], {"JOBLEASE_METRICS_PORT": "9090"},
     lambda c: c.metrics_port == 9100),
    (["--metrics-port", "0"], {"JOBLEASE_METRICS_PORT": "9090"}, lambda c: c.metrics_port == 0),
    (["--metrics-host", "::1"], {"JOBLEASE_METRICS_HOST": "127.0.0.1"},
     lambda c: c.metrics_host == "::1"),
    (["--no-tenant-credentials"], {"JOBLEASE_TENANT_CREDENTIALS": "1"},
     lambda c: c.tenant_credentials is False),
    (["--tenant-credentials"], {"JOBLEASE_TENANT_CREDENTIALS": "0"},
     lambda c: c.tenant_credentials is True),
    (["--tenant-resync-interval", "0"], {"JOBLEASE_TENANT_RESYNC_INTERVAL": "5"},
     lambda c: c.tenant_resync_interval == 0),
    (["--queue-interval", "2"], {"JOBLEASE_QUEUE_INTERVAL": "5"},
     lambda c: c.queue_interval == 2),
    (["--no-leader-election"], {"JOBLEASE_LEADER_ELECTION": "true"},
     lambda c: c.leader_election is False),
    (["--leader-election"], {"JOBLEASE_LEADER_ELECTION": "false"},
     lambda c: c.leader_election is True),
    (["--leader-election-ttl", "7"], {"JOBLEASE_LEADER_ELECTION_TTL": "5"},
     lambda c: c.leader_election_ttl == 7),
    (["--leader-election-name", "green"], {"JOBLEASE_LEADER_ELECTION_NAME": "blue"},
     lambda c: c.leader_election_name == "green"),
    (["--webhook-port", "0"], {"JOBLEASE_WEBHOOK_PORT": "9443"}, lambda c: c.webhook is None),
    (["--webhook-port", "9444"], {"JOBLEASE_WEBHOOK_PORT": "9443"},
     lambda c: c.webhook is not None and c.webhook.port == 9444),
    (["--webhook-cert-dir", "/flag"], {"JOBLEASE_WEBHOOK_PORT": "9443",
                                       "JOBLEASE_WEBHOOK_CERT_DIR": "/env"},
     lambda c: c.webhook is not None and c.webhook.key_file == "/flag/tls.key"),
    (["--log-level", "warning"], {"JOBLEASE_LOG_LEVEL": "debug"},
     lambda c: getattr(c, "log_level", "WARNING") == "WARNING"),
    # the flags without a variable are passed on too
    (["--watch-timeout", "60", "--result-limit", "10"], {},
     lambda c: (c.server_timeout, c.result_limit) == (60, 10)),
])
def test_each_flag_beats_its_variable(argv: list[str], env: dict[str, str], check: Check,
                                      started: list[OperatorConfig]) -> None:
    result = invoke(argv, env)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert check(config), config


def test_the_settings_flag_beats_its_variable(tmp_path: Path,
                                              started: list[OperatorConfig]) -> None:
    env = {"JOBLEASE_WEBHOOK_PORT": "9443",
           "JOBLEASE_WEBHOOK_SETTINGS": _settings_file(tmp_path, "example/env:1")}
    result = invoke(["--webhook-settings", _settings_file(tmp_path, "example/flag:1")], env)
    assert result.exit_code == 0, result.output
    (config,) = started
    assert config.webhook is not None
    assert config.webhook.settings == SidecarSettings(image="example/flag:1")


def _bad_settings(tmp: Path) -> str:
    path = tmp / "bad-settings.json"
    path.write_text(json.dumps({"imag": "typo"}))
    return str(path)


@pytest.mark.parametrize("argv, env, named", [
    ([], {"JOBLEASE_METRICS_PORT": "http"}, "JOBLEASE_METRICS_PORT"),
    ([], {"JOBLEASE_METRICS_PORT": "70000"}, "JOBLEASE_METRICS_PORT"),
    (["--metrics-port", "70000"], {}, "--metrics-port"),
    (["--metrics-port", "many"], {}, "--metrics-port"),
    ([], {"JOBLEASE_WEBHOOK_PORT": "https"}, "JOBLEASE_WEBHOOK_PORT"),
    ([], {"JOBLEASE_WEBHOOK_PORT": "-1"}, "JOBLEASE_WEBHOOK_PORT"),
    (["--webhook-port", "65536"], {}, "--webhook-port"),
    ([], {"JOBLEASE_LEADER_ELECTION_TTL": "ten"}, "JOBLEASE_LEADER_ELECTION_TTL"),
    ([], {"JOBLEASE_LEADER_ELECTION_TTL": "0"}, "JOBLEASE_LEADER_ELECTION_TTL"),
    # 1 passed the old flag's range but etcd refuses a 1 s lease: the election failed late
    ([], {"JOBLEASE_LEADER_ELECTION_TTL": "1"}, "JOBLEASE_LEADER_ELECTION_TTL"),
    ([], {"JOBLEASE_LEADER_ELECTION_TTL": "3601"}, "JOBLEASE_LEADER_ELECTION_TTL"),
    (["--leader-election-ttl", "0"], {}, "--leader-election-ttl"),
    ([], {"JOBLEASE_LEADER_ELECTION": "maybe"}, "JOBLEASE_LEADER_ELECTION"),
    ([], {"JOBLEASE_TENANT_CREDENTIALS": "2"}, "JOBLEASE_TENANT_CREDENTIALS"),
    ([], {"JOBLEASE_TENANT_RESYNC_INTERVAL": "soon"}, "JOBLEASE_TENANT_RESYNC_INTERVAL"),
    ([], {"JOBLEASE_TENANT_RESYNC_INTERVAL": "nan"}, "JOBLEASE_TENANT_RESYNC_INTERVAL"),
    ([], {"JOBLEASE_QUEUE_INTERVAL": "0"}, "JOBLEASE_QUEUE_INTERVAL"),
    ([], {"JOBLEASE_QUEUE_INTERVAL": "inf"}, "JOBLEASE_QUEUE_INTERVAL"),
    (["--queue-interval", "-1"], {}, "--queue-interval"),
    ([], {"JOBLEASE_LEADER_ELECTION_NAME": "a/b"}, "JOBLEASE_LEADER_ELECTION_NAME"),
    (["--leader-election-name", "a/b"], {}, "--leader-election-name"),
    (["-A", "-n", "x"], {}, "--namespace"),
    (["--all-namespaces"], {"JOBLEASE_NAMESPACES": "x"}, "JOBLEASE_NAMESPACES"),
    ([], {"JOBLEASE_LOG_LEVEL": "chatty"}, "JOBLEASE_LOG_LEVEL"),
    (["--log-level", "chatty"], {}, "--log-level"),
    ([], {"JOBLEASE_WEBHOOK_PORT": "9443", "JOBLEASE_WEBHOOK_SETTINGS": "/no/such/file.json"},
     "JOBLEASE_WEBHOOK_SETTINGS"),
    (["--webhook-port", "9443", "--webhook-settings", "BAD"], {}, "--webhook-settings"),
])
def test_each_bad_value_is_refused_naming_it_before_anything_starts(
        argv: list[str], env: dict[str, str], named: str, tmp_path: Path,
        started: list[OperatorConfig]) -> None:
    argv = [_bad_settings(tmp_path) if a == "BAD" else a for a in argv]
    result = invoke(argv, env)
    assert result.exit_code == 2, result.output  # a usage error, no traceback
    assert named in result.output, result.output
    assert "Traceback" not in result.output
    assert started == []


def test_from_env_refuses_bad_values_with_the_projects_error() -> None:
    for env in ({"JOBLEASE_METRICS_PORT": "x"}, {"JOBLEASE_LEADER_ELECTION_TTL": "0"},
                {"JOBLEASE_LEADER_ELECTION": "maybe"}, {"JOBLEASE_LOG_LEVEL": "chatty"},
                {"JOBLEASE_LEADER_ELECTION_NAME": "a/b"}):
        (variable,) = env
        with pytest.raises(InvalidInputError, match=variable):
            OperatorConfig.from_env(env)
    with pytest.raises(InvalidInputError, match="--all-namespaces"):
        OperatorConfig.from_env({}, all_namespaces=True, namespaces=("a",))
    assert OperatorConfig.from_env({}, all_namespaces=True) == OperatorConfig()


# -- help and chart ----------------------------------------------------------------------


def test_help_documents_each_variable() -> None:
    result = CliRunner().invoke(command.operator_command, ["--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    missing = {v for v in OPERATOR_VARIABLES | {"JOBLEASE_ETCD_ENDPOINTS", "JOBLEASE_ROOT"}
               if v not in result.output}
    assert missing == set()
    config = OperatorConfig()
    for shown in (f"[JOBLEASE_METRICS_PORT; default: {config.metrics_port}]",
                  f"[JOBLEASE_LEADER_ELECTION_TTL; default: {config.leader_election_ttl}]",
                  f"[JOBLEASE_LOG_LEVEL; default: {config.log_level}]",
                  f"[default: {config.server_timeout}]"):
        assert shown in result.output


def _operator_container_template() -> str:
    text = (CHART / "templates" / "deployment.yaml").read_text()
    assert text.count("kind: Deployment") == 1 and "- name: operator" in text
    return text


def test_every_variable_and_flag_the_chart_sets_is_understood(
        cases: dict[str, tuple[dict[str, str], Check]]) -> None:
    """The chart's operator Deployment, read as text (no helm): each ``JOBLEASE_*``
    variable it sets is one ``from_env`` reads (test_every_variable_is_read shows
    what each does), and each flag it passes is one of the command's."""
    text = _operator_container_template()
    variables = set(re.findall(r"- name: (JOBLEASE_[A-Z0-9_]+)", text))
    assert {"JOBLEASE_ETCD_ENDPOINTS", "JOBLEASE_TENANT_CREDENTIALS"} <= variables  # parsed
    assert variables - cases.keys() == set()
    for variable in variables:
        env, check = cases[variable]
        assert check(OperatorConfig.from_env(env)), variable
    flags = set(re.findall(r"^\s*- (--[a-z][a-z-]*)", text, re.MULTILINE))
    assert {"--metrics-port", "--leader-election", "--webhook-port"} <= flags  # parsed
    known = {o for p in command.operator_command.params for o in p.opts + p.secondary_opts}
    assert flags - known == set()


def test_kopf_lists_jobleases_in_pages() -> None:
    """A restart at 10,000 JobLeases must not parse one 10,000-object list at once
    (docs/operator.md, kopf settings): kopf pages its initial list and hands on each
    page before reading the next."""
    from joblease.operator.main import LIST_CHUNK, build_settings

    assert build_settings(OperatorConfig()).watching.chunk_size == LIST_CHUNK == 500


@pytest.mark.parametrize("concurrency", [1, 8, 32, 100])
def test_the_operators_api_connections_follow_its_concurrency(concurrency: int) -> None:
    """``--concurrency`` status writes at once and the periodic mirrors' own (their
    defaults) each find a connection: a raised ``--concurrency`` is not held back by a
    connection pool sized for the default. Nothing connects (the session is lazy)."""
    each = inspect.signature(PeriodicMirror.__init__).parameters["concurrency"].default
    mirrors = 2 * each  # the queue and the semaphore mirror, both at the default
    api = kube_api(OperatorConfig(concurrency=concurrency), login_fn=lambda: None)  # type: ignore[arg-type, return-value]
    assert api.connections == concurrency + mirrors
    assert api_connections(OperatorConfig().concurrency) == KUBE_API_CONNECTIONS
