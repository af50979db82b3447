"""Each CLI verb against a real etcd, as a real process: output, errors, exit codes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from joblease import EtcdConfig
from joblease.cli import main
from tests.support.cli import LONG_TTL, as_json, jl
from tests.support.waiting import wait_until


def test_register_claim_complete_get_list_cycle(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "register", "nightly", "-n", "team-a", "--ttl", LONG_TTL, "--max-attempts", "2",
       "--parameters", '{"date": "2026-11-29"}')
    claimed = as_json(jl(etcd_config, "claim", "team-a/nightly", "--owner", "w1", "-o", "json"))
    assert claimed["generation"] == 1 and claimed["owner"] == "w1"
    token = claimed["token"]
    # the lease outlives the claiming process (not revoked) until its TTL
    state = as_json(jl(etcd_config, "get", "nightly", "-n", "team-a", "-o", "json"))
    assert state["phase"] == "Claimed" and state["holder"]["token"] == token
    assert state["parameters"] == {"date": "2026-11-29"}
    done = as_json(jl(etcd_config, "complete", "team-a/nightly", "--owner", "w1",
                      "--token", str(token), "--result", '{"rows": 3}', "-o", "json"))
    assert done["token"] == token and done["result"] == {"rows": 3}
    listed = as_json(jl(etcd_config, "list", "-o", "json"))
    assert [s["phase"] for s in listed] == ["Completed"]
    table = jl(etcd_config, "list").stdout
    assert "team-a/nightly" in table and "Completed" in table
    yaml_out = jl(etcd_config, "get", "team-a/nightly", "-o", "yaml").stdout
    assert "phase: Completed" in yaml_out


@pytest.mark.parametrize(("args", "code", "word"), [
    (("get", "missing"), 3, "not_found"),
    (("claim", "missing", "--owner", "w"), 3, "not_found"),
    (("register", "Bad_Name", "--ttl", "10"), 2, "invalid"),
    (("register", "ok", "--ttl", "1"), 2, "invalid"),
    (("register", "ok", "--ttl", "10", "--parameters", "[1]"), 2, "invalid"),
])
def test_errors_are_one_line_with_distinct_exit_codes(
    etcd_config: EtcdConfig, args: tuple[str, ...], code: int, word: str
) -> None:
    done = jl(etcd_config, *args, check=code)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"joblease: {word}"), done.stderr


@pytest.mark.parametrize(("option", "value", "why"), [
    ("--result", '"\\ud800"', "lone UTF-16 surrogate"),
    ("--result", '{"k": ["\\udc00"]}', "lone UTF-16 surrogate"),
    ("--result", '"\udced\udca0\udc80"', "lone UTF-16 surrogate"),  # raw bytes ED A0 80
    ("--result", "[" * 3000 + "]" * 3000, "nested deeper than 64"),
    ("--data", "[" * 65 + "]" * 65, "nested deeper than 64"),
    ("--data", '{"\\ud83d": 1}', "lone UTF-16 surrogate"),
    ("--data", '"' + "x" * 65535 + '"', "too large"),
])
def test_a_result_or_checkpoint_outside_the_stored_value_rule_exits_2_and_writes_nothing(
    etcd_config: EtcdConfig, option: str, value: str, why: str,
) -> None:
    """docs/protocol.md#stored-values, checked before anything is sent: one
    stderr line naming the option and why, exit 2, the job untouched."""
    jl(etcd_config, "register", "rule", "--ttl", LONG_TTL)
    claimed = as_json(jl(etcd_config, "claim", "rule", "--owner", "w", "-o", "json"))
    verb = "complete" if option == "--result" else "checkpoint"
    done = jl(etcd_config, verb, "rule", "--owner", "w", "--token", str(claimed["token"]),
              option, value, check=2)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"joblease: invalid: {option}: "), done.stderr
    assert why in lines[0]
    state = as_json(jl(etcd_config, "get", "rule", "-o", "json"))
    assert state["phase"] == "Claimed" and state["result"] is None and state["checkpoint"] is None


def test_held_completed_stale_and_exhausted_have_their_own_codes(
    etcd_config: EtcdConfig,
) -> None:
    jl(etcd_config, "register", "job", "--ttl", LONG_TTL, "--max-attempts", "2")
    first = as_json(jl(etcd_config, "claim", "job", "--owner", "a", "-o", "json"))
    held = jl(etcd_config, "claim", "job", "--owner", "b", check=4)
    assert "held by 'a'" in held.stderr and str(first["token"]) in held.stderr
    stale = jl(etcd_config, "complete", "job", "--owner", "a", "--token",
               str(first["token"] + 1), check=7)
    assert "stale" in stale.stderr
    jl(etcd_config, "release", "job", "--owner", "a", "--token", str(first["token"]))
    second = as_json(jl(etcd_config, "claim", "job", "--owner", "b", "-o", "json"))
    late = jl(etcd_config, "complete", "job", "--owner", "a", "--token", str(first["token"]),
              check=7)
    assert f"current token is {second['token']}" in late.stderr
    jl(etcd_config, "release", "job", "--owner", "b", "--token", str(second["token"]))
    exhausted = jl(etcd_config, "claim", "job", "--owner", "c", check=6)
    assert "2 of 2 attempts" in exhausted.stderr
    jl(etcd_config, "register", "done", "--ttl", LONG_TTL)
    d = as_json(jl(etcd_config, "claim", "done", "--owner", "a", "-o", "json"))
    jl(etcd_config, "complete", "done", "--owner", "a", "--token", str(d["token"]))
    jl(etcd_config, "claim", "done", "--owner", "b", check=5)


def test_claim_wait_shows_progress_then_succeeds_after_release(
    etcd_config: EtcdConfig,
) -> None:
    jl(etcd_config, "register", "queued", "--ttl", LONG_TTL)
    first = as_json(jl(etcd_config, "claim", "queued", "--owner", "a", "-o", "json"))
    env = {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    waiter = subprocess.Popen([sys.executable, "-m", "joblease.cli", "claim", "queued",
                               "--owner", "b", "--wait", "30", "-o", "json"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert waiter.stderr is not None
        line = waiter.stderr.readline()
        assert line.startswith("waiting: default/queued is held by 'a'"), line
        jl(etcd_config, "release", "queued", "--owner", "a", "--token", str(first["token"]))
        out, _ = waiter.communicate(timeout=30)
        assert waiter.returncode == 0
        assert json.loads(out)["generation"] == 2
    finally:
        if waiter.poll() is None:
            waiter.kill()


def test_unreachable_store_exits_10(etcd_config: EtcdConfig) -> None:
    from joblease.embedded import free_port

    dead = etcd_config.with_(endpoints=(f"127.0.0.1:{free_port()}",))
    done = jl(dead, "get", "job", "--timeout", "1", check=10)
    assert done.stderr.startswith("joblease: unavailable")


def test_claim_hold_keeps_the_lease_until_interrupted(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "register", "held", "--ttl", "2")
    env = {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    proc = subprocess.Popen([sys.executable, "-m", "joblease.cli", "claim", "held", "--owner",
                             "holder", "--hold", "-o", "json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        lines = []
        while not lines or lines[-1] != "}\n":
            lines.append(proc.stdout.readline())
        token = json.loads("".join(lines))["token"]
        # still held well past the TTL: the process keeps it alive
        wait_until(lambda: as_json(jl(etcd_config, "get", "held", "-o", "json"))["holder"],
                   5, "holder visible")
        t_end = time.monotonic() + 4  # two TTLs
        while time.monotonic() < t_end:
            state = as_json(jl(etcd_config, "get", "held", "-o", "json"))
            assert state["holder"] and state["holder"]["token"] == token
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=10) == 0
        state = as_json(jl(etcd_config, "get", "held", "-o", "json"))
        assert state["holder"] is None and state["phase"] == "Pending"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_watch_prints_changes_as_json_lines(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "register", "w", "--ttl", LONG_TTL)
    env = {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
           "JOBLEASE_ROOT": etcd_config.root}
    proc = subprocess.Popen([sys.executable, "-m", "joblease.cli", "watch", "--count", "3"],
                            env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = json.loads(proc.stdout.readline())
    assert first["phase"] == "Pending"
    c = as_json(jl(etcd_config, "claim", "w", "--owner", "x", "-o", "json"))
    jl(etcd_config, "complete", "w", "--owner", "x", "--token", str(c["token"]))
    out, _ = proc.communicate(timeout=30)
    phases = [json.loads(line)["phase"] for line in out.splitlines()]
    assert phases == ["Claimed", "Completed"]


def test_dev_starts_etcd_and_stops_on_sigterm() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "joblease.cli", "dev"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "JOBLEASE_ETCD_ENDPOINTS=127.0.0.1:" in line
        endpoint = line.strip().split("=", 1)[1]
        cfg = EtcdConfig(endpoints=(endpoint,), root="/dev-check")
        jl(cfg, "register", "x", "--ttl", "5")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        jl(cfg, "get", "x", "--timeout", "1", check=10)  # etcd is gone
    finally:
        if proc.poll() is None:
            proc.kill()


def test_completion_script_is_printed() -> None:
    done = subprocess.run([sys.executable, "-m", "joblease.cli", "completion", "bash"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and "_JOBLEASE_COMPLETE" in done.stdout


def test_the_retired_sidecar_command_is_gone_and_names_its_replacement() -> None:
    """``joblease sidecar`` was retired with the Python sidecar (issue 25): a usage
    error (exit 2), and ``joblease --help`` no longer lists it; docs/cli.md points
    to the ``joblease-sidecar`` binary instead."""
    r = CliRunner().invoke(main, ["sidecar", "--help"])
    assert r.exit_code == 2 and "No such command 'sidecar'" in r.output, r.output
    listed = CliRunner().invoke(main, ["--help"]).output
    assert not any(line.split()[:1] == ["sidecar"] for line in listed.splitlines()
                   if line.startswith("  ")), listed
    cli_doc = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    assert "`joblease-sidecar`" in cli_doc


# The commands with heavy imports load only when used (joblease.cli._Commands): run in
# a fresh interpreter each, since this one has imported kopf already.
_PROBE = ("import sys\n{block}from click.testing import CliRunner\n"
          "from joblease.cli import main\n"
          "r = CliRunner().invoke(main, sys.argv[1:])\n"
          "print(r.exit_code, 'kopf' in sys.modules, 'aiohttp' in sys.modules)\n"
          "print(r.output, file=sys.stderr)\n")


def _probe(*argv: str, block: str = "") -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-c", _PROBE.format(block=block), *argv],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout.split(), done.stderr


@pytest.mark.parametrize(("argv", "loaded"), [
    (["--help"], False), (["get", "--help"], False), (["queue", "get", "--help"], False),
    (["operator", "--help"], True)])
def test_the_operator_and_ledger_modules_load_only_when_their_command_runs(
        argv: list[str], loaded: bool) -> None:
    (code, kopf, aiohttp), output = _probe(*argv)
    assert code == "0", output
    assert (kopf, aiohttp) == (str(loaded), str(loaded)), (argv, output)


def test_the_lazy_commands_are_listed_with_their_own_help() -> None:
    from joblease.cli import LAZY_COMMANDS, _load_optional

    for name, (_, summary) in LAZY_COMMANDS.items():
        command = _load_optional(name)
        assert command.help is not None and command.short_help is None, name
        first = " ".join(command.help.split("\n\n")[0].split())
        assert summary == first, (name, summary, first)
    listed = CliRunner().invoke(main, ["--help"], terminal_width=200).output
    for name in LAZY_COMMANDS:
        assert f"  {name} " in listed, listed


def test_the_operator_without_its_extra_says_what_to_install() -> None:
    (code, _, _), output = _probe("operator", "--namespace", "a",
                                  block="sys.modules['kopf'] = None\n")
    assert code == "1", output
    assert "joblease: operator needs an optional dependency" in output, output
    assert "pip install 'joblease[operator]'" in output, output
