"""``joblease run JOB -- COMMAND...``: hold a job's lease around any process.

Like ``etcdctl lock NAME cmd`` (which exports ``ETCD_LOCK_REV``), with fencing
and completion semantics:

1. claim the job (with ``wait`` > 0, wait while someone else holds it:
   :meth:`JobLeaseClient.claim_waiting`);
2. start the command with ``JOBLEASE_JOB``, ``JOBLEASE_TOKEN``,
   ``JOBLEASE_GENERATION`` and ``JOBLEASE_OWNER`` (and ``JOBLEASE_CHECKPOINT``, the
   last checkpoint as JSON, when there is one; ``TRACEPARENT``, the tenure
   span's W3C trace context, when tracing is on: docs/tracing.md) in its
   environment, in its
   own process group (signals go to the whole group, so ``sh -c`` pipelines
   are reached too);
3. keep the lease alive (the client session's keep-alive) while it runs;
4. end:

   - **lease lost** (keep-alive failed past the safety deadline, the holder key
     changed, the wrapper was paused past its TTL): SIGTERM the child's group
     (even if the child itself has exited: what it left running is stopped
     too), SIGKILL what still runs of it after ``grace`` seconds (default: half
     the lease's margin, so it is dead before etcd can expire the lease:
     invariant ``stopped-before-reclaim``), then revoke the etcd lease; exit
     with ``LeaseLostError.exit_code``; nothing is completed or released
     under the old token;
   - **child exits 0** while the lease is valid (decided on its exit: what it
     wrote before is read until the pipe is quiet, at most ``DRAIN_MAX``, and
     a background process holding its stdout does not delay it): complete the job with the
     result (below) and exit 0; a completion the store refuses exits with
     that error's code (7 stale), a result that cannot be used is refused
     (``InvalidInputError``, exit 2) after releasing the job;
   - **child exits non-zero** (or is killed by a signal: ``128 + N``): release
     the job (the attempt stays counted) and exit with the child's code;
   - a child that cannot be started: release, exit 127.

   Every signal that would otherwise end the wrapper (``STOP_SIGNALS``: HUP,
   INT, QUIT, TERM, USR1, ...) is forwarded to the child's group; the child's
   exit status then decides as above. The wrapper never dies of one leaving
   its command running without a lease.

The result: with ``result_file``, the file's contents parsed as JSON (the
path is also exported as ``JOBLEASE_RESULT_FILE``; a missing or non-JSON file
is refused). Otherwise the child's stdout is passed through to the wrapper's
stdout unchanged and the **last line that parses as JSON** (at most
``MAX_RESULT_BYTES``; longer lines are not candidates) is the result, ``null``
when there is none.

Waiting (``wait`` > 0) is :meth:`JobLeaseClient.claim_waiting`, the loop
``joblease claim --wait`` uses too: a watch of the holder key, and a session
of its own as proof that the waiter is still connected and running; if that
session is lost it gives up with :class:`WaitSessionLostError` (exit 9).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from joblease import tracing, validation
from joblease.client import JobLeaseClient
from joblease.errors import (
    HeldError,
    InvalidInputError,
    JobLeaseError,
    LeaseLostError,
    StaleTokenError,
    WaitSessionLostError,
)
from joblease.keys import ItemRef, JobRef, QueueRef
from joblease.lease import Lease, LeaseState
from joblease.queue import Queues

log = logging.getLogger(__name__)

#: Exit code of a child that could not be started (as a shell uses).
EXIT_CANNOT_RUN = 127


#: Signals that do not go through the stop path: uncatchable (KILL, STOP), job
#: control and notifications that do not end a process by default (CHLD, CONT,
#: WINCH, URG, TSTP, TTIN, TTOU), faults of the wrapper's own code (SEGV, BUS, FPE,
#: ILL, TRAP, SYS) and PIPE (Python ignores it; a write to a closed pipe fails).
_NOT_STOP_SIGNALS = frozenset({
    signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGWINCH,
    signal.SIGURG, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU, signal.SIGSEGV,
    signal.SIGBUS, signal.SIGFPE, signal.SIGILL, signal.SIGTRAP, signal.SIGSYS,
    signal.SIGPIPE})

#: Every signal that would otherwise end the wrapper (HUP, INT, QUIT, ABRT, TERM,
#: USR1, USR2, ALRM, the real-time signals, ...): each is forwarded to the command.
STOP_SIGNALS: tuple[int, ...] = tuple(sorted(
    int(s) for s in signal.valid_signals() if s not in _NOT_STOP_SIGNALS))

#: After the command exits, its output already in the pipe is read until the
#: pipe has been quiet this long (or closed) ...
DRAIN_QUIET = 0.1
#: ... but never longer than this: a background process it left holding
#: stdout must not delay the decision (docs/cli.md).
DRAIN_MAX = 1.0


@dataclass(frozen=True)
class RunOptions:
    """What ``joblease run`` was asked to do."""

    job: JobRef
    owner: str
    command: Sequence[str]
    wait: float = 0.0  # seconds to keep retrying while the job is held (inf: forever)
    #: seconds between SIGTERM and SIGKILL once the lease is lost; ``None``: half
    #: the lease's safety margin, so the command is dead before etcd can expire
    #: the lease (invariant ``stopped-before-reclaim``, docs/protocol.md)
    grace: float | None = None
    result_file: Path | None = None
    extra_env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueRunOptions:
    """What ``joblease queue run`` was asked to do: ``run`` per item of ``queue``."""

    queue: QueueRef
    owner: str
    command: Sequence[str]
    #: only this item (an Indexed Job's index); ``None``: one item after another
    item: str | None = None
    create: bool = False  # with ``item``: enqueue it first if absent (a CronJob slot)
    #: draining: how long to wait for a claimable item before ending (exit 0)
    wait: float = 0.0
    grace: float | None = None
    result_file: Path | None = None


Say = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"joblease run: {message}", file=sys.stderr, flush=True)


def exit_code_of(returncode: int) -> int:
    """A child's status as a shell reports it: killed by signal N is 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def default_grace(margin: float) -> float:
    """The default ``--grace`` for a lease with this safety margin: half of it.

    The margin is the time between the local deadline and the earliest moment
    etcd can expire the lease; the other half is left for noticing the
    deadline and delivering the signals (measured: bench/self_fencing.py)."""
    return margin / 2


async def claim(client: JobLeaseClient, opts: RunOptions, *, say: Say = _stderr) -> Lease:
    """Claim ``opts.job``; with ``opts.wait`` wait while it is held
    (:meth:`JobLeaseClient.claim_waiting`: a watch, guarded by a session of its own).

    Raises what ``JobLeaseClient.claim`` raises (held once the wait is over,
    completed, exhausted, not registered) or :class:`WaitSessionLostError`.
    """
    def held(e: HeldError) -> None:
        say(f"waiting: {opts.job} is held by {e.owner!r} (token {e.token})")

    return await client.claim_waiting(opts.job, opts.owner, opts.wait, on_held=held)


def _group_running(pgid: int) -> bool:
    """True while a process of group ``pgid`` still runs (zombies do not count:
    they run no code, and an init that does not reap would keep them forever)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] not in ("Z", "X"):
            return True
    return False


class _ResultTap:
    """Copies the child's stdout to ours and remembers its last JSON line."""

    def __init__(self, out: BinaryIO) -> None:
        self.out = out
        self.result: Any = None
        self._pending = bytearray()
        self._overlong = False
        #: loop time since which ``pump`` has been waiting for data (None: busy)
        self.idle_since: float | None = None

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
        loop = asyncio.get_running_loop()
        while True:
            self.idle_since = loop.time()
            chunk = await stream.read(65536)
            self.idle_since = None
            if not chunk:
                break
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
                 stdout: BinaryIO | None = None, say: Say = _stderr,
                 claimer: Callable[[], Coroutine[Any, Any, Lease | None]] | None = None) -> None:
        self.client = client
        self.opts = opts
        #: how the lease is got (default: claim ``opts.job``); ``None`` from it
        #: means there was nothing to claim (a drained queue): run nothing, exit 0
        self._claimer = claimer or (lambda: claim(client, opts, say=say))
        self.say = say
        self.stdout = stdout if stdout is not None else sys.stdout.buffer
        self.lease: Lease | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.forwarded: list[int] = []
        self._stopped = asyncio.Event()  # a signal arrived before the child started
        #: the command (the group's leader) has exited and been reaped; unlike
        #: asyncio's ``Process.wait()`` this does not wait for its stdout to close
        self._exited = asyncio.Event()
        self._group_gone = False  # the command's process group is known to be empty
        self._pipe: asyncio.BaseTransport | None = None

    # -- the command's process group -------------------------------------------------------

    def _signal_child(self, sig: int) -> None:
        """Send ``sig`` to the command's whole process group, whether or not its
        leader has exited: what the command started in the background gets it too."""
        proc = self.process
        if proc is None or self._group_gone:
            return
        try:
            os.killpg(proc.pid, sig)  # the child leads its own process group
        except ProcessLookupError:
            self._group_gone = True  # nobody left; never signal that group id again
        except PermissionError:
            pass

    def _running(self) -> bool:
        """True while any process of the command's group runs."""
        if self.process is None or self._group_gone:
            return False
        if not self._exited.is_set():
            return True  # its leader runs: no need to look further
        if not _group_running(self.process.pid):
            self._group_gone = self._exited.is_set()
            return False
        return True

    def _on_wrapper_signal(self, sig: int) -> None:
        self.forwarded.append(sig)
        if self.process is None:
            self._stopped.set()
            return
        self.say(f"forwarding {signal.Signals(sig).name if sig in _SIGNAL_NAMES else sig} "
                 f"to the command (pid {self.process.pid})")
        self._signal_child(sig)

    def _watch_exit(self, proc: subprocess.Popen[bytes]) -> None:
        """Set ``_exited`` once the command has exited (reaped by us, at once)."""
        loop = asyncio.get_running_loop()
        try:
            pidfd = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfds here: a thread waits instead
            task = asyncio.ensure_future(asyncio.to_thread(proc.wait))
            task.add_done_callback(lambda _: self._exited.set())
            return

        def exited() -> None:
            loop.remove_reader(pidfd)
            os.close(pidfd)
            proc.wait()  # it has exited: this reaps it without blocking
            self._exited.set()

        loop.add_reader(pidfd, exited)

    async def _start(self, env: dict[str, str], tap: _ResultTap | None
                     ) -> asyncio.Task[None] | None:
        """Start the command in its own process group; the stdout pump, if any."""
        proc = subprocess.Popen(  # noqa: ASYNC220 -- fork+exec only, it does not wait
            list(self.opts.command), env=env, process_group=0,
            stdout=subprocess.PIPE if tap is not None else None)
        self.process = proc
        self._watch_exit(proc)
        if tap is None or proc.stdout is None:
            return None
        reader = asyncio.StreamReader()
        self._pipe, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), proc.stdout)
        return asyncio.create_task(tap.pump(reader))

    def _close_pipe(self, pump: asyncio.Task[None] | None) -> None:
        if pump is not None:
            pump.cancel()
        if self._pipe is not None:
            self._pipe.close()
            self._pipe = None

    # -- the run ---------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        handled: dict[int, Any] = {}  # signal -> the handler it had before
        for sig in STOP_SIGNALS:
            previous = signal.getsignal(sig)
            try:
                loop.add_signal_handler(sig, self._on_wrapper_signal, sig)
            except (OSError, RuntimeError, ValueError):  # not catchable here
                continue
            handled[sig] = previous
        try:
            return await self._run()
        finally:
            for sig, previous in handled.items():
                loop.remove_signal_handler(sig)
                with contextlib.suppress(OSError, ValueError, TypeError):
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)

    async def _run(self) -> int:
        opts = self.opts
        claiming = asyncio.create_task(self._claimer())
        stop = asyncio.create_task(self._stopped.wait())
        await asyncio.wait({claiming, stop}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if not claiming.done():  # a signal arrived while claiming: give up at once
            claiming.cancel()
            with contextlib.suppress(asyncio.CancelledError, JobLeaseError):
                claimed = await claiming
                if claimed is not None:
                    await claimed.release()
            return 128 + self.forwarded[0]
        lease = claiming.result()
        if lease is None:
            return 0
        self.lease = lease
        if self._stopped.is_set():  # signalled just as the claim succeeded
            await self._give_back(lease)
            return 128 + self.forwarded[0]
        grace = self.grace
        self.say(f"claimed {lease.job}: generation {lease.generation}, token {lease.token}")
        if grace > lease.margin:
            self.say(f"warning: --grace {grace:g}s is longer than the lease's safety margin "
                     f"({lease.margin:g}s): after a loss the command may still run while "
                     "another worker holds the job")
        env = {**os.environ, **opts.extra_env,
               "JOBLEASE_JOB": str(lease.job), "JOBLEASE_TOKEN": str(lease.token),
               "JOBLEASE_GENERATION": str(lease.generation), "JOBLEASE_OWNER": opts.owner,
               **tracing.worker_env(lease.trace)}
        if lease.slots:  # the semaphore slots the claim took, with their tokens
            env["JOBLEASE_SEMAPHORES"] = json.dumps([g.to_dict() for g in lease.slots],
                                                    separators=(",", ":"), sort_keys=True)
        if isinstance(lease.job, ItemRef):
            env.update(JOBLEASE_QUEUE=str(lease.job.queue), JOBLEASE_ITEM=lease.job.id,
                       JOBLEASE_PAYLOAD=json.dumps(
                           None if lease.item is None else lease.item.payload,
                           separators=(",", ":"), sort_keys=True))
        if opts.result_file is not None:
            env["JOBLEASE_RESULT_FILE"] = str(opts.result_file)
        checkpoint = lease.checkpoint_dict()  # where the previous holder got to
        if checkpoint is not None:
            env["JOBLEASE_CHECKPOINT"] = json.dumps(checkpoint, separators=(",", ":"))
        tap = _ResultTap(self.stdout) if opts.result_file is None else None
        try:
            pump = await self._start(env, tap)
        except OSError as e:
            self.say(f"cannot run {opts.command[0]!r}: {e.strerror or e}")
            await self._give_back(lease)
            return EXIT_CANNOT_RUN
        try:
            return await self._hold(lease, tap, pump)
        finally:
            self._close_pipe(pump)

    @property
    def grace(self) -> float:
        """Seconds between SIGTERM and SIGKILL after a loss (default: half the margin)."""
        if self.opts.grace is not None:
            return self.opts.grace
        return default_grace(self.lease.margin if self.lease is not None else 0.0)

    async def _hold(self, lease: Lease, tap: _ResultTap | None,
                    pump: asyncio.Task[None] | None) -> int:
        """The command runs under the lease; its exit (or the lease's end) decides."""
        proc = self.process
        assert proc is not None
        for sig in self.forwarded:  # arrived between the claim and the start
            self._signal_child(sig)
        exited = asyncio.create_task(self._exited.wait())
        ended = asyncio.create_task(lease.wait_done())
        try:
            await asyncio.wait({exited, ended}, return_when=asyncio.FIRST_COMPLETED)
            # Whatever finished first, the lease decides: a child that exited while
            # the wrapper was paused past its deadline must not be completed.
            if not lease.valid:
                return await self._lost(lease)
            await exited  # the lease ended otherwise (never expected here)
            if pump is not None and tap is not None:
                await self._drain(pump, tap)
            if not lease.valid:  # lost while the output drained: no effect under the old token
                return await self._lost(lease)
        finally:
            for t in (exited, ended):
                t.cancel()
        code = exit_code_of(proc.returncode if proc.returncode is not None else 1)
        if code != 0:
            self.say(f"command exited {code}; releasing {lease.job} (the attempt stays "
                     "counted)")
            return await self._release(lease, code)
        return await self._complete(lease, tap.result if tap is not None else None)

    async def _drain(self, pump: asyncio.Task[None], tap: _ResultTap) -> None:
        """The command has exited: read what it wrote (already in the pipe) without
        waiting for the pipe to close, which a background process it left behind
        may hold open for any time. Ends once the pipe is closed or has been quiet
        for ``DRAIN_QUIET``, after ``DRAIN_MAX`` at the latest (never past the
        lease's local deadline)."""
        loop = asyncio.get_running_loop()
        began = loop.time()
        end = began + min(DRAIN_MAX, self._remaining())
        while not pump.done():
            now = loop.time()
            idle = tap.idle_since
            # quiet since the exit at least: what it wrote last may not be read yet
            if (idle is not None and now - max(idle, began) >= DRAIN_QUIET) or now >= end:
                if now >= end:
                    self.say("the command's output is still coming after it exited; "
                             "deciding on what came before")
                return
            await asyncio.wait({pump}, timeout=min(0.02, end - now))

    def _remaining(self) -> float:
        return self.lease.remaining() if self.lease is not None else 0.0

    async def _stop_command(self) -> None:
        """SIGTERM the command's process group; SIGKILL it once ``grace`` has passed
        with any process of it still running; return once the command has exited."""
        if not self._running():
            return
        grace = self.grace
        self._signal_child(signal.SIGTERM)  # first: nothing may delay it (bench/self_fencing.py)
        self.say(f"sent SIGTERM to the command's process group; SIGKILL in {grace:g}s")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        while self._running():
            left = deadline - loop.time()
            if left <= 0:
                self.say("the command's process group outlived the grace period; "
                         "sending SIGKILL")
                self._signal_child(signal.SIGKILL)
                break
            await asyncio.sleep(min(0.02, left))
        await self._exited.wait()  # the leader dies of SIGKILL at the latest

    async def _lost(self, lease: Lease) -> int:
        why = lease.lost_reason or "lease lost"
        self.say(f"lease on {lease.job} (token {lease.token}) lost: {why}")
        await self._stop_command()
        self.say("the command has exited; giving the job back")
        # Only now give the job back (a client made with revoke_on_loss=False has
        # not yet): the command is dead, so the next holder cannot overlap it.
        if lease.lease_id:
            with contextlib.suppress(JobLeaseError):
                await self.client.store.revoke(lease.lease_id)
        return LeaseLostError.exit_code

    async def _give_back(self, lease: Lease) -> None:
        try:
            await lease.release()
        except JobLeaseError as e:
            self.say(f"release of {lease.job} failed: {e}")

    async def _release(self, lease: Lease, code: int) -> int:
        try:
            await lease.release()
        except StaleTokenError as e:
            self.say(f"release refused: {e}")
            return LeaseLostError.exit_code
        except JobLeaseError as e:
            # Closing the client revokes the session's etcd lease, which frees
            # the job too; the command's status is still what to report.
            self.say(f"release of {lease.job} failed ({e.reason}: {e}); "
                      "the session's etcd lease is revoked on exit")
        return code

    async def _complete(self, lease: Lease, stdout_result: Any) -> int:
        try:
            if self.opts.result_file is not None:
                result = _read_result_file(self.opts.result_file)
            else:
                result = stdout_result
            validation.json_payload(result, "result", validation.MAX_RESULT_BYTES)
        except InvalidInputError as e:
            self.say(f"{e}; releasing {lease.job} without completing it")
            await self._give_back(lease)
            return InvalidInputError.exit_code
        try:
            record = await lease.complete(result)
        except JobLeaseError as e:
            self.say(f"completion refused: {e.reason}: {e}")
            return e.exit_code
        self.say(f"completed {lease.job} (generation {record.generation}, "
                 f"token {record.token})")
        return 0


_SIGNAL_NAMES = frozenset(int(s) for s in signal.Signals)


async def run_job(client: JobLeaseClient, opts: RunOptions, *, stdout: BinaryIO | None = None,
                  say: Say = _stderr) -> int:
    """Run ``opts.command`` under the job's lease; return the wrapper's exit code.

    Claim errors (held, completed, exhausted, not registered, wait given up)
    are raised as their :class:`JobLeaseError`; everything after the claim is
    an exit code (see the module docstring).
    """
    if not opts.command:
        raise InvalidInputError("no command given (joblease run JOB -- COMMAND...)")
    if (opts.grace is not None and not opts.grace >= 0) or not opts.wait >= 0:
        raise InvalidInputError("--grace and --wait must be numbers of seconds >= 0")
    validation.job_ref(opts.job)
    validation.owner(opts.owner)
    return await Runner(client, opts, stdout=stdout, say=say).run()


async def run_queue(client: JobLeaseClient, opts: QueueRunOptions, *,
                    stdout: BinaryIO | None = None, say: Say = _stderr) -> int:
    """Run ``opts.command`` once per item, each under that item's lease, with
    ``run_job``'s rules per item (plus ``JOBLEASE_QUEUE``, ``JOBLEASE_ITEM``
    and ``JOBLEASE_PAYLOAD`` in its environment).

    One item (``opts.item``): the exit code of that run. Draining: items one
    after another until none is claimable within ``opts.wait``; a command
    that exits non-zero releases its item (the attempt is counted) and the
    next is claimed; exit 0 if every command succeeded, else the last failing
    command's code. A lost lease, a refused completion or a signal ends the
    drain at once with that run's code.
    """
    if not opts.command:
        raise InvalidInputError("no command given (joblease queue run QUEUE -- COMMAND...)")
    if (opts.grace is not None and not opts.grace >= 0) or not opts.wait >= 0:
        raise InvalidInputError("--grace and --wait must be numbers of seconds >= 0")
    validation.owner(opts.owner)
    queues = Queues(client)
    item = None if opts.item is None else ItemRef(opts.queue, validation.item_id(opts.item))
    per_item = RunOptions(job=JobRef(opts.queue.namespace, opts.queue.name), owner=opts.owner,
                          command=opts.command, grace=opts.grace,
                          result_file=opts.result_file)

    async def claim_item() -> Lease | None:
        assert item is not None
        if opts.create:
            return await queues.claim_or_create(item, opts.owner)
        return await queues.claim(item, opts.owner)

    async def claim_next() -> Lease | None:
        return await queues.claim_next(opts.queue, opts.owner, wait=opts.wait)

    if item is not None:
        return await Runner(client, per_item, stdout=stdout, say=say, claimer=claim_item).run()
    failed = 0
    while True:
        runner = Runner(client, per_item, stdout=stdout, say=say, claimer=claim_next)
        code = await runner.run()
        lease = runner.lease
        if lease is None and not runner.forwarded:
            say(f"no claimable item in {opts.queue} within {opts.wait:g}s; done")
            return failed
        if runner.forwarded or lease is None or lease.state not in (
                LeaseState.COMPLETED, LeaseState.RELEASED):
            return code
        if code != 0:
            failed = code


async def run_with_config(make_client: Callable[[], JobLeaseClient],
                          opts: RunOptions | QueueRunOptions) -> int:
    """``run_job`` (``run_queue``) with a client of its own, closed (and its
    etcd lease revoked) after.

    ``make_client`` should make its client with ``revoke_on_loss=False`` (the
    CLI does): otherwise a lost session gives the job back before the command
    is stopped."""
    client = make_client()
    try:
        if isinstance(opts, QueueRunOptions):
            return await run_queue(client, opts)
        return await run_job(client, opts)
    finally:
        await client.close()


__all__ = ["EXIT_CANNOT_RUN", "STOP_SIGNALS", "QueueRunOptions", "RunOptions", "Runner",
           "WaitSessionLostError", "claim", "default_grace", "exit_code_of", "run_job",
           "run_queue", "run_with_config"]
