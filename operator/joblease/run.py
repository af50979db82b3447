"""``joblease run JOB -- COMMAND...``: hold a job's lease around any process.

Like ``etcdctl lock NAME cmd`` (which exports ``ETCD_LOCK_REV``), with fencing
and completion semantics:

1. claim the job (with ``wait`` > 0, retry while someone else holds it);
2. start the command with ``JOBLEASE_JOB``, ``JOBLEASE_TOKEN``,
   ``JOBLEASE_GENERATION`` and ``JOBLEASE_OWNER`` (and ``JOBLEASE_CHECKPOINT``, the
   last checkpoint as JSON, when there is one) in its environment, in its
   own process group (signals go to the whole group, so ``sh -c`` pipelines
   are reached too);
3. keep the lease alive (the client session's keep-alive) while it runs;
4. end:

   - **lease lost** (keep-alive failed past the safety deadline, the holder key
     changed, the wrapper was paused past its TTL): SIGTERM the child's group,
     SIGKILL it after ``grace`` seconds, exit with ``LeaseLostError.exit_code``;
     nothing is completed or released under the old token;
   - **child exits 0** while the lease is valid: complete the job with the
     result (below) and exit 0; a completion the store refuses exits with
     that error's code (7 stale), a result that cannot be used is refused
     (``InvalidInputError``, exit 2) after releasing the job;
   - **child exits non-zero** (or is killed by a signal: ``128 + N``): release
     the job (the attempt stays counted) and exit with the child's code;
   - a child that cannot be started: release, exit 127.

   SIGINT/SIGTERM sent to the wrapper are forwarded to the child's group; the
   child's exit status then decides as above.

The result: with ``result_file``, the file's contents parsed as JSON (the
path is also exported as ``JOBLEASE_RESULT_FILE``; a missing or non-JSON file
is refused). Otherwise the child's stdout is passed through to the wrapper's
stdout unchanged and the **last line that parses as JSON** (at most
``MAX_RESULT_BYTES``; longer lines are not candidates) is the result, ``null``
when there is none.

Waiting (``wait`` > 0) is polling: no request sits queued in etcd. While it
waits the wrapper keeps a session (an etcd lease of the job's TTL) of its own
as proof that it is still connected and running; if that session is lost
(etcd unreachable for a TTL, the wrapper paused), it gives up with
:class:`WaitSessionLostError` (exit 9) instead of claiming later as though
nothing had happened (the trap of etcd#19597, where a waiting lock request
outlives its session).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from joblease import validation
from joblease.client import JobLeaseClient
from joblease.errors import (
    HeldError,
    InvalidInputError,
    JobLeaseError,
    LeaseLostError,
    StaleTokenError,
)
from joblease.keys import JobRef
from joblease.lease import Lease
from joblease.session import Session

log = logging.getLogger(__name__)

#: Exit code of a child that could not be started (as a shell uses).
EXIT_CANNOT_RUN = 127


class WaitSessionLostError(JobLeaseError):
    """``--wait`` gave up: the wrapper's own session ended while it was waiting."""

    reason = "wait_session_lost"
    exit_code = 9
    http_status = 503

    def __init__(self, job: str, why: str) -> None:
        super().__init__(f"gave up waiting for job {job}: the wrapper's session was lost ({why})")
        self.job, self.why = job, why

    def details(self) -> dict[str, Any]:
        return {"job": self.job, "why": self.why}


@dataclass(frozen=True)
class RunOptions:
    """What ``joblease run`` was asked to do."""

    job: JobRef
    owner: str
    command: Sequence[str]
    wait: float = 0.0  # seconds to keep retrying while the job is held (inf: forever)
    grace: float = 10.0  # seconds between SIGTERM and SIGKILL once the lease is lost
    result_file: Path | None = None
    poll_interval: float = 0.2
    extra_env: dict[str, str] = field(default_factory=dict)


Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"joblease run: {message}", file=sys.stderr, flush=True)


def exit_code_of(returncode: int) -> int:
    """A child's status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


async def claim(client: JobLeaseClient, opts: RunOptions, *, say: Say = _stderr) -> Lease:
    """Claim ``opts.job``; with ``opts.wait`` retry while it is held.

    Raises what ``JobLeaseClient.claim`` raises (held once the wait is over,
    completed, exhausted, not registered) or :class:`WaitSessionLostError`.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + opts.wait
    waiting: Session | None = None
    shown: tuple[str, int] | None = None
    try:
        while True:
            if waiting is not None and not waiting.alive:
                raise WaitSessionLostError(str(opts.job), waiting.lost_reason
                                           or "no keep-alive succeeded before its deadline")
            try:
                return await client.claim(opts.job, opts.owner)
            except HeldError as held:
                if loop.time() >= deadline:
                    raise
                if waiting is None:
                    state = await client.get(opts.job)
                    ttl = state.spec.lease_duration_seconds if state.spec else 2
                    waiting = await Session(client.store, ttl).start()
                if shown != (held.owner, held.token):  # progress, once per holder
                    shown = (held.owner, held.token)
                    say(f"waiting: {opts.job} is held by {held.owner!r} (token {held.token})")
            await asyncio.sleep(opts.poll_interval)
    finally:
        if waiting is not None:
            await waiting.close(revoke=True)


class _ResultTap:
    """Copies the child's stdout to ours and remembers its last JSON line."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.result: Any = None
        self._pending = bytearray()
        self._overlong = False

    def _consider(self, line: bytes) -> None:
        text = line.strip()
        if not text:
            return
        try:
            self.result = json.loads(text)
        except (ValueError, RecursionError):
            pass

    def _write(self, chunk: bytes) -> None:
        self.out.write(chunk)
        self.out.flush()

    def feed(self, chunk: bytes) -> None:
        *lines, rest = chunk.split(b"\n")
        for line in lines:
            if not self._overlong and len(self._pending) + len(line) <= validation.MAX_RESULT_BYTES:
                self._consider(bytes(self._pending) + line)
            self._pending.clear()
            self._overlong = False
        if not self._overlong:
            self._pending += rest
            if len(self._pending) > validation.MAX_RESULT_BYTES:
                self._pending.clear()
                self._overlong = True

    def finish(self) -> None:
        if self._pending and not self._overlong:
            self._consider(bytes(self._pending))
        self._pending.clear()

    async def pump(self, stream: asyncio.StreamReader) -> None:
        # Writing happens in a thread: a slow reader of our stdout must not
        # stall the event loop (and with it the keep-alive).
        while chunk := await stream.read(65536):
            await asyncio.to_thread(self._write, chunk)
            self.feed(chunk)
        self.finish()


def _read_result_file(path: Path) -> Any:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise InvalidInputError(f"result file {path} cannot be read: {e.strerror}") from e
    if len(data) > validation.MAX_RESULT_BYTES:
        raise InvalidInputError(f"result file {path} is larger than "
                                f"{validation.MAX_RESULT_BYTES} bytes")
    return validation.json_text(data, f"result file {path}", validation.MAX_RESULT_BYTES)


class Runner:
    """One ``joblease run``: the child, the lease and the signals between them."""

    def __init__(self, client: JobLeaseClient, opts: RunOptions, *,
                 stdout: BinaryIO | None = None, say: Say = _stderr) -> None:
        self.client = client
        self.opts = opts
        self.say = say
        self.stdout = stdout if stdout is not None else sys.stdout.buffer
        self.lease: Lease | None = None
        self.process: asyncio.subprocess.Process | None = None
        self.forwarded: list[int] = []
        self._stopped = asyncio.Event()  # a signal arrived before the child started

    # -- signals ---------------------------------------------------------------------------

    def _signal_child(self, sig: int) -> None:
        proc = self.process
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)  # the child leads its own process group

    def _on_wrapper_signal(self, sig: int) -> None:
        if self.process is None:
            self._stopped.set()
            self.forwarded.append(sig)
            return
        self.forwarded.append(sig)
        self.say(f"forwarding {signal.Signals(sig).name} to the command (pid "
                 f"{self.process.pid})")
        self._signal_child(sig)

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handled = (signal.SIGINT, signal.SIGTERM)
        for sig in handled:
            loop.add_signal_handler(sig, self._on_wrapper_signal, sig)
        try:
            return await self._run()
        finally:
            for sig in handled:
                loop.remove_signal_handler(sig)

    async def _run(self) -> int:
        opts = self.opts
        claiming = asyncio.create_task(claim(self.client, opts, say=self.say))
        stop = asyncio.create_task(self._stopped.wait())
        await asyncio.wait({claiming, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not claiming.done():  # a signal arrived while claiming: give up at once
            claiming.cancel()
            with contextlib.suppress(asyncio.CancelledError, JobLeaseError):
                lease = await claiming
                await lease.release()
            return 128 + self.forwarded[0]
        lease = claiming.result()
        self.lease = lease
        if self._stopped.is_set():  # signalled just as the claim succeeded
            await self._give_back(lease)
            return 128 + self.forwarded[0]
        self.say(f"claimed {opts.job}: generation {lease.generation}, token {lease.token}")
        env = {**os.environ, **opts.extra_env,
               "JOBLEASE_JOB": str(opts.job), "JOBLEASE_TOKEN": str(lease.token),
               "JOBLEASE_GENERATION": str(lease.generation), "JOBLEASE_OWNER": opts.owner}
        if opts.result_file is not None:
            env["JOBLEASE_RESULT_FILE"] = str(opts.result_file)
        checkpoint = lease.checkpoint_dict()  # where the previous holder got to
        if checkpoint is not None:
            env["JOBLEASE_CHECKPOINT"] = json.dumps(checkpoint, separators=(",", ":"))
        tap = _ResultTap(self.stdout) if opts.result_file is None else None
        try:
            self.process = await asyncio.create_subprocess_exec(
                *opts.command, env=env, process_group=0,
                stdout=asyncio.subprocess.PIPE if tap is not None else None)
        except OSError as e:
            self.say(f"cannot run {opts.command[0]!r}: {e.strerror or e}")
            await self._give_back(lease)
            return EXIT_CANNOT_RUN
        proc = self.process
        for sig in self.forwarded:  # arrived between the claim and the start
            self._signal_child(sig)
        pump = (asyncio.create_task(tap.pump(proc.stdout))
                if tap is not None and proc.stdout is not None else None)
        exited = asyncio.create_task(proc.wait())
        ended = asyncio.create_task(lease.wait_done())
        await asyncio.wait({exited, ended}, return_when=asyncio.FIRST_COMPLETED)
        # Whatever finished first, the lease decides: a child that exited while
        # the wrapper was paused past its deadline must not be completed.
        if not lease.valid:
            ended.cancel()
            return await self._lost(lease, exited, pump)
        if not exited.done():  # the lease ended otherwise (never expected here)
            await exited
        ended.cancel()
        if pump is not None:
            await self._drain(pump)
        code = exit_code_of(proc.returncode if proc.returncode is not None else 1)
        if not lease.valid:  # lost while the output drained: no effect under the old token
            return await self._lost(lease, exited, None)
        if code != 0:
            self.say(f"command exited {code}; releasing {opts.job} (the attempt stays counted)")
            return await self._release(lease, code)
        return await self._complete(lease, tap)

    async def _drain(self, pump: asyncio.Task[None]) -> None:
        """Wait for the child's stdout to close (a grandchild may keep it open:
        bounded by the lease's remaining safety time)."""
        try:
            await asyncio.wait_for(asyncio.shield(pump), timeout=max(0.5, self._remaining()))
        except TimeoutError:
            self.say("the command's stdout is still open after it exited; not waiting for it")
            pump.cancel()

    def _remaining(self) -> float:
        return self.lease.remaining() if self.lease is not None else 0.0

    async def _lost(self, lease: Lease, exited: asyncio.Task[int],
                    pump: asyncio.Task[None] | None) -> int:
        why = lease.lost_reason or "lease lost"
        self.say(f"lease on {self.opts.job} (token {lease.token}) lost: {why}")
        if not exited.done():
            self.say(f"sending SIGTERM to the command; SIGKILL in {self.opts.grace:g}s")
            self._signal_child(signal.SIGTERM)
            try:
                await asyncio.wait_for(asyncio.shield(exited), timeout=self.opts.grace)
            except TimeoutError:
                self.say("the command outlived the grace period; sending SIGKILL")
                self._signal_child(signal.SIGKILL)
                await exited
        if pump is not None:
            try:
                await asyncio.wait_for(asyncio.shield(pump), timeout=1.0)
            except TimeoutError:
                pump.cancel()
        return LeaseLostError.exit_code

    async def _give_back(self, lease: Lease) -> None:
        try:
            await lease.release()
        except JobLeaseError as e:
            self.say(f"release of {self.opts.job} failed: {e}")

    async def _release(self, lease: Lease, code: int) -> int:
        try:
            await lease.release()
        except StaleTokenError as e:
            self.say(f"release refused: {e}")
            return LeaseLostError.exit_code
        except JobLeaseError as e:
            # Closing the client revokes the session's etcd lease, which frees
            # the job too; the command's status is still what to report.
            self.say(f"release of {self.opts.job} failed ({e.reason}: {e}); "
                      "the session's etcd lease is revoked on exit")
        return code

    async def _complete(self, lease: Lease, tap: _ResultTap | None) -> int:
        try:
            if self.opts.result_file is not None:
                result = _read_result_file(self.opts.result_file)
            else:
                assert tap is not None
                result = tap.result
            validation.json_payload(result, "result", validation.MAX_RESULT_BYTES)
        except InvalidInputError as e:
            self.say(f"{e}; releasing {self.opts.job} without completing it")
            await self._give_back(lease)
            return InvalidInputError.exit_code
        try:
            record = await lease.complete(result)
        except JobLeaseError as e:
            self.say(f"completion refused: {e.reason}: {e}")
            return e.exit_code
        self.say(f"completed {self.opts.job} (generation {record.generation}, "
                 f"token {record.token})")
        return 0


async def run_job(client: JobLeaseClient, opts: RunOptions, *, stdout: BinaryIO | None = None,
                  say: Say = _stderr) -> int:
    """Run ``opts.command`` under the job's lease; return the wrapper's exit code.

    Claim errors (held, completed, exhausted, not registered, wait given up)
    are raised as their :class:`JobLeaseError`; everything after the claim is
    an exit code (see the module docstring).
    """
    if not opts.command:
        raise InvalidInputError("no command given (joblease run JOB -- COMMAND...)")
    if opts.grace < 0 or opts.wait < 0:
        raise InvalidInputError("--grace and --wait must not be negative")
    validation.job_ref(opts.job)
    validation.owner(opts.owner)
    return await Runner(client, opts, stdout=stdout, say=say).run()


async def run_with_config(make_client: Callable[[], JobLeaseClient], opts: RunOptions
                          ) -> int:
    """``run_job`` with a client of its own, closed (and its etcd lease revoked) after."""
    client = make_client()
    try:
        return await run_job(client, opts)
    finally:
        await client.close()


__all__ = ["EXIT_CANNOT_RUN", "RunOptions", "Runner", "WaitSessionLostError", "claim",
           "exit_code_of", "run_job", "run_with_config"]
