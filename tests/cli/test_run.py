"""``joblease run JOB -- COMMAND``: real wrapper processes, real children, real etcd.

Every wrapper is ``python -m joblease.cli run`` as its own process; its
children are real processes (a small Python program, ``CHILD``, that records
its environment and the signals it gets in files of its own directory and
exits when the test writes its ``go`` file). Pauses are SIGSTOP/SIGCONT of
the wrapper process. Nothing is faked.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from joblease import EtcdConfig
from joblease.errors import HeldError, InvalidInputError, LeaseLostError
from joblease.etcd_store import EtcdStore
from joblease.run import WaitSessionLostError, _read_result_file
from tests.support.waiting import wait_until

# A CLI process can take several seconds to start on a loaded machine.
START = 60.0

CHILD = r"""
import json, os, pathlib, signal, sys, time
d = pathlib.Path(sys.argv[1])
mode = sys.argv[2] if len(sys.argv) > 2 else "normal"
def record(name, value):
    (d / (name + ".tmp")).write_text(value)
    os.replace(d / (name + ".tmp"), d / name)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, lambda s, f: record("terminated", "ignored"))
else:
    def stop(sig, frame):
        record("terminated" if sig == signal.SIGTERM else "interrupted", str(sig))
        sys.exit(128 + sig)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
env = {k: os.environ.get(k) for k in
       ("JOBLEASE_JOB", "JOBLEASE_TOKEN", "JOBLEASE_GENERATION", "JOBLEASE_OWNER")}
env["pid"] = os.getpid()
print("started", flush=True)
record("env.json", json.dumps(env))
while not (d / "go").exists():  # the test says when to finish
    time.sleep(0.02)
code = int((d / "go").read_text() or "0")
print(json.dumps({"token": int(env["JOBLEASE_TOKEN"]), "by": env["JOBLEASE_OWNER"]}),
      flush=True)
print("done: the result is the last JSON line, not this one", flush=True)
sys.exit(code)
"""


def environ(config: EtcdConfig) -> dict[str, str]:
    return {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints),
            "JOBLEASE_ROOT": config.root}


def jl(config: EtcdConfig, *args: str, check: int | None = 0
       ) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "joblease.cli", *args], env=environ(config),
                          capture_output=True, text=True, timeout=START)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def job_state(config: EtcdConfig, job: str) -> dict[str, Any]:
    state: dict[str, Any] = json.loads(jl(config, "get", job, "-o", "json").stdout)
    return state


class Wrapper:
    """One ``joblease run`` process and its child's directory."""

    def __init__(self, config: EtcdConfig, tmp: Path, name: str, job: str, *run_args: str,
                 command: list[str] | None = None, mode: str = "normal") -> None:
        self.dir = tmp / name
        self.dir.mkdir()
        self.out_path, self.err_path = self.dir / "wrapper.out", self.dir / "wrapper.err"
        child = [sys.executable, "-c", CHILD, str(self.dir), mode]
        with self.out_path.open("wb") as out, self.err_path.open("wb") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "joblease.cli", "run", job, "--owner", name,
                 *run_args, "--", *(command or child)],
                env=environ(config), stdout=out, stderr=err)

    @property
    def stdout(self) -> str:
        return self.out_path.read_text()

    @property
    def stderr(self) -> str:
        return self.err_path.read_text()

    def child_env(self) -> dict[str, Any]:
        path = self.dir / "env.json"
        wait_until(path.exists, START, f"the child of {self.dir.name} to start")
        env: dict[str, Any] = json.loads(path.read_text())
        return env

    def finish_child(self, code: int = 0) -> None:
        (self.dir / "go.tmp").write_text(str(code))
        os.replace(self.dir / "go.tmp", self.dir / "go")

    def marker(self, name: str) -> str | None:
        path = self.dir / name
        return path.read_text() if path.exists() else None

    def wait(self, timeout: float = START) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.dir.name} did not exit; stderr:\n{self.stderr}"
                                 ) from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            with_cont = [signal.SIGCONT, signal.SIGKILL]
            for sig in with_cont:
                self.proc.send_signal(sig)
            self.proc.wait(timeout=30)


@pytest.fixture
def wrappers(tmp_path: Path, etcd_config: EtcdConfig) -> Iterator[list[Wrapper]]:
    started: list[Wrapper] = []
    yield started
    for w in started:
        w.kill()
        env = w.dir / "env.json"
        if env.exists():  # never leave a child behind
            pid = json.loads(env.read_text())["pid"]
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def start(wrappers: list[Wrapper], config: EtcdConfig, tmp: Path, name: str, job: str,
          *run_args: str, **kw: Any) -> Wrapper:
    w = Wrapper(config, tmp, name, job, *run_args, **kw)
    wrappers.append(w)
    return w


def pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"  # a zombie no longer runs
    except FileNotFoundError:
        return True


# ----------------------------------------------------------------------------- the seed


def test_seed_example_paused_wrapper_is_stopped_and_never_completes(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """A's wrapper claims, then is paused (SIGSTOP) past the TTL; etcd expires
    its lease; B's wrapper (``--wait``) claims the next generation with a
    higher token and completes. When A resumes, its wrapper signals A's child
    before that child can finish, exits with the lease-lost code, and A's
    completion never happens: the job's result is B's."""
    jl(etcd_config, "register", "seed", "--ttl", "2", "--max-attempts", "5")
    a = start(wrappers, etcd_config, tmp_path, "worker-a", "seed", "--grace", "20")
    env_a = a.child_env()
    assert env_a["JOBLEASE_JOB"] == "default/seed" and env_a["JOBLEASE_GENERATION"] == "1"
    a.proc.send_signal(signal.SIGSTOP)  # A pauses, its child keeps waiting for "go"

    b = start(wrappers, etcd_config, tmp_path, "worker-b", "seed", "--wait", "120")
    env_b = b.child_env()  # B could claim only after etcd expired A's lease
    assert env_b["JOBLEASE_GENERATION"] == "2"
    assert int(env_b["JOBLEASE_TOKEN"]) > int(env_a["JOBLEASE_TOKEN"])
    b.finish_child(0)
    assert b.wait() == 0, b.stderr
    result = {"token": int(env_b["JOBLEASE_TOKEN"]), "by": "worker-b"}
    assert json.dumps(result) in b.stdout.splitlines()  # passed through unchanged
    assert "done: the result" in b.stdout

    a.proc.send_signal(signal.SIGCONT)
    assert a.wait() == LeaseLostError.exit_code, a.stderr
    assert a.marker("terminated") == str(int(signal.SIGTERM)), "A's child was not signalled"
    assert "lost" in a.stderr and "completed" not in a.stderr
    assert "token" not in a.stdout  # A's child never reached its result line

    state = job_state(etcd_config, "seed")
    assert state["phase"] == "Completed"
    assert state["result"]["token"] == int(env_b["JOBLEASE_TOKEN"])
    assert state["result"]["result"] == result and state["result"]["owner"] == "worker-b"


# ----------------------------------------------------------------------------- exit codes


def test_success_completes_with_the_last_json_line_of_stdout(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "ok", "--ttl", "3")
    w = start(wrappers, etcd_config, tmp_path, "w", "ok", command=[
        "sh", "-c", 'echo "{\\"rows\\": 1}"; echo "{\\"rows\\": $JOBLEASE_GENERATION}"; '
                    'echo "not json"; echo "token=$JOBLEASE_TOKEN"'])
    assert w.wait() == 0, w.stderr
    lines = w.stdout.splitlines()
    assert lines[:3] == ['{"rows": 1}', '{"rows": 1}', "not json"]
    token = int(lines[3].removeprefix("token="))
    state = job_state(etcd_config, "ok")
    assert state["phase"] == "Completed"
    assert state["result"]["result"] == {"rows": 1} and state["result"]["token"] == token


def test_the_previous_holders_checkpoint_is_in_the_commands_environment(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """A first holder checkpoints and releases; the wrapper's command (the next
    holder) gets that checkpoint as ``JOBLEASE_CHECKPOINT``."""
    jl(etcd_config, "register", "resume", "--ttl", "600", "--max-attempts", "3")
    first = json.loads(jl(etcd_config, "claim", "resume", "--owner", "w0", "-o", "json").stdout)
    jl(etcd_config, "checkpoint", "resume", "--owner", "w0", "--token", str(first["token"]),
       "--data", '{"step": 3}')
    jl(etcd_config, "release", "resume", "--owner", "w0", "--token", str(first["token"]))
    w = start(wrappers, etcd_config, tmp_path, "w1", "resume", command=[
        "sh", "-c", 'printf "%s\\n" "$JOBLEASE_CHECKPOINT"'])
    assert w.wait() == 0, w.stderr
    checkpoint = json.loads(w.stdout.splitlines()[0])
    assert checkpoint["data"] == {"step": 3}
    assert checkpoint["token"] == first["token"] and checkpoint["generation"] == 1


def test_result_file_is_the_result_when_given(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "file", "--ttl", "3")
    result = tmp_path / "result.json"
    w = start(wrappers, etcd_config, tmp_path, "w", "file", "--result-file", str(result),
              command=["sh", "-c", 'echo "{\\"ignored\\": true}"; '
                                   'echo "{\\"from\\": \\"file\\"}" > "$JOBLEASE_RESULT_FILE"'])
    assert w.wait() == 0, w.stderr
    assert w.stdout == '{"ignored": true}\n'  # stdout goes straight through, unread
    assert job_state(etcd_config, "file")["result"]["result"] == {"from": "file"}


@pytest.mark.parametrize(("content", "why"), [
    (b"[" * 3000 + b"]" * 3000, "nested deeper than 64"),
    (b'{"note": "\\ud800"}', "lone UTF-16 surrogate"),
    (b'"\xed\xa0\x80"', "lone UTF-16 surrogate"),
])
def test_a_result_file_outside_the_stored_value_rule_is_invalid_input(
    tmp_path: Path, content: bytes, why: str,
) -> None:
    """docs/protocol.md#stored-values for ``--result-file`` (read before
    completing; a refusal releases the job, as for a file that is not JSON)."""
    path = tmp_path / "r"
    path.write_bytes(content)
    with pytest.raises(InvalidInputError, match=why):
        _read_result_file(path)


def test_bad_result_file_releases_and_exits_invalid(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "badfile", "--ttl", "3")
    w = start(wrappers, etcd_config, tmp_path, "w", "badfile", "--result-file",
              str(tmp_path / "r"), command=["sh", "-c", f'echo "{{oops" > {tmp_path / "r"}'])
    assert w.wait() == 2, w.stderr
    assert "not JSON" in w.stderr
    state = job_state(etcd_config, "badfile")
    assert state["phase"] == "Pending" and state["attempts"] == 1 and state["result"] is None


def test_child_failure_releases_the_job_and_propagates_its_exit_code(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "fails", "--ttl", "3", "--max-attempts", "3")
    w = start(wrappers, etcd_config, tmp_path, "w", "fails", command=["sh", "-c", "exit 3"])
    assert w.wait() == 3, w.stderr
    state = job_state(etcd_config, "fails")
    # released at once (no holder, no waiting for the TTL), the attempt counted
    assert state["phase"] == "Pending" and state["holder"] is None
    assert state["attempts"] == 1 and state["result"] is None
    killed = start(wrappers, etcd_config, tmp_path, "k", "fails",
                   command=["sh", "-c", "kill -KILL $$"])
    assert killed.wait() == 128 + signal.SIGKILL, killed.stderr
    assert job_state(etcd_config, "fails")["attempts"] == 2


def test_held_job_and_missing_command_have_their_own_codes(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "busy", "--ttl", "3")
    holder = start(wrappers, etcd_config, tmp_path, "holder", "busy")
    holder.child_env()
    other = start(wrappers, etcd_config, tmp_path, "other", "busy",
                  command=["sh", "-c", "echo must-not-run"])
    assert other.wait() == HeldError.exit_code, other.stderr
    assert "must-not-run" not in other.stdout and "held by 'holder'" in other.stderr
    holder.finish_child(0)
    assert holder.wait() == 0

    jl(etcd_config, "register", "nocmd", "--ttl", "3")
    missing = start(wrappers, etcd_config, tmp_path, "m", "nocmd",
                    command=[str(tmp_path / "no-such-program")])
    assert missing.wait() == 127, missing.stderr
    state = job_state(etcd_config, "nocmd")
    assert state["phase"] == "Pending" and state["attempts"] == 1


def test_lease_lost_while_running_stops_the_child_and_exits_lost(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """Unregistering the job deletes its holder key while the etcd lease lives:
    the wrapper's holder re-check after a keep-alive sees it and stops."""
    jl(etcd_config, "register", "gone", "--ttl", "3")
    w = start(wrappers, etcd_config, tmp_path, "w", "gone", "--grace", "20")
    w.child_env()
    jl(etcd_config, "unregister", "gone")
    assert w.wait() == LeaseLostError.exit_code, w.stderr
    assert w.marker("terminated") == str(int(signal.SIGTERM))
    assert "holder key deleted" in w.stderr


def test_child_ignoring_sigterm_is_killed_after_the_grace_period(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "stubborn", "--ttl", "3")
    w = start(wrappers, etcd_config, tmp_path, "w", "stubborn", "--grace", "1",
              mode="ignore-term")
    pid = w.child_env()["pid"]
    jl(etcd_config, "unregister", "stubborn")
    wait_until(lambda: w.marker("terminated"), START, "the child to get SIGTERM")
    assert w.wait() == LeaseLostError.exit_code, w.stderr
    assert w.marker("terminated") == "ignored"
    assert "SIGKILL" in w.stderr
    assert pid_gone(pid)


# ----------------------------------------------------------------------------- signals


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signals_to_the_wrapper_are_forwarded_to_the_child(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper], sig: signal.Signals,
) -> None:
    jl(etcd_config, "register", "fwd", "--ttl", "3", "--max-attempts", "0")
    w = start(wrappers, etcd_config, tmp_path, "w", "fwd")
    w.child_env()
    w.proc.send_signal(sig)
    # the child exits 128 + sig on it; its status is propagated and the job released
    assert w.wait() == 128 + sig, w.stderr
    assert w.marker("terminated" if sig == signal.SIGTERM else "interrupted") == str(int(sig))
    state = job_state(etcd_config, "fwd")
    assert state["phase"] == "Pending" and state["holder"] is None


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1],
                         ids=lambda s: s.name)
def test_every_signal_that_would_end_the_wrapper_goes_to_the_command_first(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper], sig: signal.Signals,
) -> None:
    """A signal whose default would end the wrapper (HUP, QUIT, USR1, ...) goes
    through its stop path like TERM: forwarded to the command's group, whose
    exit then decides. The wrapper never dies leaving its command running
    without a lease (another worker could claim the job while it runs)."""
    jl(etcd_config, "register", "sigs", "--ttl", "3", "--max-attempts", "0")
    w = start(wrappers, etcd_config, tmp_path, "w", "sigs")
    pid = w.child_env()["pid"]
    w.proc.send_signal(sig)
    assert w.wait() == 128 + sig, w.stderr  # the child died of it (its default action)
    assert pid_gone(pid), "the command outlived its wrapper"
    assert f"forwarding {sig.name}" in w.stderr
    state = job_state(etcd_config, "sigs")
    assert state["phase"] == "Pending" and state["holder"] is None


def _read_pid(path: Path) -> int:
    return int(wait_until(lambda: path.exists() and path.read_text().strip(), START,
                          f"{path.name} to be written"))


def _kill_if_running(pid: int) -> None:
    if not pid_gone(pid):
        os.kill(pid, signal.SIGKILL)


def test_loss_after_the_command_exited_kills_the_rest_of_its_process_group(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """The command exits while its wrapper is paused past the TTL, leaving a
    background process that ignores SIGTERM and holds the command's stdout.
    When the wrapper resumes it has lost the lease: it SIGKILLs the rest of
    the group after the grace period and exits 8; it neither completes the job
    nor waits for the stdout to close."""
    jl(etcd_config, "register", "leftover", "--ttl", "2", "--max-attempts", "3")
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = (f'trap "" TERM; echo $$ > {ctl}/sh.pid; sleep 300 & echo $! > {ctl}/bg.pid; '
              f'while [ ! -e {ctl}/go ]; do sleep 0.05; done; echo \'{{"done": 1}}\'; exit 0')
    w = start(wrappers, etcd_config, tmp_path, "w", "leftover", "--grace", "1",
              command=["sh", "-c", script])
    leader, background = _read_pid(ctl / "sh.pid"), _read_pid(ctl / "bg.pid")
    try:
        w.proc.send_signal(signal.SIGSTOP)
        (ctl / "go").write_text("")
        wait_until(lambda: pid_gone(leader), START, "the command to exit")
        asyncio.run(_wait_for_etcd_to_expire_a_probe_lease(etcd_config))
        assert not pid_gone(background)
        w.proc.send_signal(signal.SIGCONT)
        assert w.wait(timeout=START) == LeaseLostError.exit_code, w.stderr
        assert pid_gone(background), "the command's background process outlived the loss"
        assert "sending SIGKILL" in w.stderr and "completed" not in w.stderr
    finally:
        _kill_if_running(background)
    state = job_state(etcd_config, "leftover")
    assert state["result"] is None and state["phase"] != "Completed"


def test_completion_follows_the_commands_exit_not_the_close_of_its_stdout(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """A command that prints its result and exits 0 at once, leaving ``sleep``
    in the background holding its stdout, is completed right after its exit
    (what it printed before is the result), not once the pipe closes."""
    jl(etcd_config, "register", "background", "--ttl", "60")
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    script = (f'sleep 120 & echo $! > {ctl}/bg.pid; echo \'{{"rows": 7}}\'; '
              f'date +%s.%N > {ctl}/exited')
    w = start(wrappers, etcd_config, tmp_path, "w", "background", command=["sh", "-c", script])
    background = _read_pid(ctl / "bg.pid")
    try:
        assert w.wait(timeout=START) == 0, w.stderr
    finally:
        _kill_if_running(background)
    state = job_state(etcd_config, "background")
    assert state["phase"] == "Completed" and state["result"]["result"] == {"rows": 7}
    exited = float((ctl / "exited").read_text())
    # the drain is bounded by 1 s; the rest is slack for a loaded machine
    assert state["result"]["completedAt"] - exited < 10, "completion waited for the pipe"


# ----------------------------------------------------------------------------- --wait


async def _wait_for_etcd_to_expire_a_probe_lease(config: EtcdConfig) -> None:
    """Proof that more than the waiter's TTL passed since its pause began: a
    2 s probe lease granted after the pause has expired on etcd (TTL -1; etcd
    reports 0 for the last second before expiry, so 0 is not enough). The
    waiter's local deadline, its last keep-alive + 2 s - margin, was before."""
    store = EtcdStore(config)
    try:
        lease_id, _ = await store.grant(2)
        deadline = time.monotonic() + START
        while await store.time_to_live(lease_id) >= 0:
            assert time.monotonic() < deadline, "probe lease never expired"
            await asyncio.sleep(0.1)
    finally:
        await store.close()


def test_wait_gives_up_with_its_own_code_when_its_session_is_lost(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    jl(etcd_config, "register", "queued", "--ttl", "2")
    holder = start(wrappers, etcd_config, tmp_path, "holder", "queued")
    holder.child_env()
    waiter = start(wrappers, etcd_config, tmp_path, "waiter", "queued", "--wait", "inf")
    wait_until(lambda: "waiting:" in waiter.stderr, START, "the waiter to wait")
    waiter.proc.send_signal(signal.SIGSTOP)
    asyncio.run(_wait_for_etcd_to_expire_a_probe_lease(etcd_config))
    waiter.proc.send_signal(signal.SIGCONT)
    assert waiter.wait() == WaitSessionLostError.exit_code, waiter.stderr
    assert "wait_session_lost" in waiter.stderr
    assert not (waiter.dir / "env.json").exists()  # it never claimed, never ran
    holder.finish_child(0)
    assert holder.wait() == 0, holder.stderr


def test_claim_wait_gives_up_with_its_own_code_when_its_session_is_lost(
    etcd_config: EtcdConfig, tmp_path: Path, wrappers: list[Wrapper],
) -> None:
    """``joblease claim --wait`` keeps the guard ``run --wait`` has (one loop,
    ``JobLeaseClient.claim_waiting``): a waiter paused past its TTL exits 9
    when it resumes, even though the job became free while it was paused,
    instead of claiming as though it had been waiting all along."""
    jl(etcd_config, "register", "queued", "--ttl", "2", "--max-attempts", "5")
    holder = start(wrappers, etcd_config, tmp_path, "holder", "queued")
    holder.child_env()
    err_path = tmp_path / "waiter.err"
    with err_path.open("wb") as err:
        waiter = subprocess.Popen(
            [sys.executable, "-m", "joblease.cli", "claim", "queued", "--owner", "waiter",
             "--wait", "inf", "-o", "json"],
            env=environ(etcd_config), stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        wait_until(lambda: "waiting:" in err_path.read_text(), START, "the waiter to wait")
        waiter.send_signal(signal.SIGSTOP)
        asyncio.run(_wait_for_etcd_to_expire_a_probe_lease(etcd_config))
        holder.finish_child(3)  # the holder releases: the job is free while the waiter sleeps
        assert holder.wait() == 3, holder.stderr
        waiter.send_signal(signal.SIGCONT)
        out, _ = waiter.communicate(timeout=START)
    finally:
        if waiter.poll() is None:
            waiter.send_signal(signal.SIGCONT)
            waiter.kill()
            waiter.wait()
    assert waiter.returncode == WaitSessionLostError.exit_code, err_path.read_text()
    assert "wait_session_lost" in err_path.read_text() and out == ""
    state = job_state(etcd_config, "queued")
    assert state["holder"] is None and state["attempts"] == 1  # the waiter never claimed


def test_run_help_and_kubectl_plugin_entry_point() -> None:
    """The ``kubectl-joblease`` console script is installed (pyproject's
    ``[project.scripts]``) and is the same CLI: ``kubectl joblease run --help``."""
    from importlib.metadata import entry_points

    scripts = {e.name: e.value for e in entry_points(group="console_scripts")}
    assert scripts.get("kubectl-joblease") == scripts.get("joblease") == "joblease.cli:main"
    exe = Path(sys.executable).parent / "kubectl-joblease"
    assert exe.exists(), "pip install -e . installs the kubectl-joblease script"
    done = subprocess.run([str(exe), "run", "--help"], capture_output=True, text=True,
                          timeout=START)
    assert done.returncode == 0, done.stderr
    assert "JOBLEASE_TOKEN" in done.stdout and "--grace" in done.stdout


def test_result_is_the_last_json_line_across_chunks_and_overlong_lines_are_not_results(
) -> None:
    """The stdout tap in-process (no etcd needed): output passes through byte
    for byte; a line is judged whole however the pipe splits it; a line over
    the result limit is never a result, even if it is JSON."""
    import io

    from joblease import validation
    from joblease.run import _ResultTap

    out = io.BytesIO()
    tap = _ResultTap(out)
    big = b'"' + b"x" * (validation.MAX_RESULT_BYTES + 10) + b'"'
    chunks = [b"log line\n{\"a\"", b": 1}\n", big[:1000], big[1000:], b"\nnot json", b"\n"]

    async def pump() -> None:
        reader = asyncio.StreamReader()
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        await tap.pump(reader)

    asyncio.run(pump())
    assert out.getvalue() == b"".join(chunks)
    assert tap.result == {"a": 1}
    tap.feed(b"[2]")  # a last line without a newline counts too
    tap.finish()
    assert tap.result == [2]
