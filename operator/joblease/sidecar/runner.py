"""The sidecar's life: claim (with backoff), hold, notice loss, act, shut down.

One asyncio loop runs the lease (its keep-alive lives in the client's
session), the HTTP servers and the signal handlers (wired together by
:mod:`joblease.sidecar.serve`), so the API can never
disagree with the lease: every API call asks :meth:`SidecarRunner.current`,
which re-checks the lease's validity on the monotonic clock *synchronously*
before answering. A sidecar that was paused past its deadline therefore
answers "lost" on the very first request after it resumes, even before its
keep-alive task has run.

A final answer to the claim (the job already completed, or the claim
refused for good: no attempts left, not registered in time, ...) is served,
not exited on: phase ``completed`` or ``failed``, ``GET /v1/lease`` says why,
and ``/readyz`` lets the worker start once to read it (see :meth:`ready`), so
a native sidecar's pod always ends (docs/sidecar.md, "Terminal cases").

Loss is one-way: the phase flips to ``lost``, the token files are removed,
the worker is signalled (or the sidecar exits) and no request is ever sent
to etcd under the old token again.

A completion ends the lease too: it deletes the holder key. So when the
lease ends while a completion of this sidecar is in flight (or ended with an
unknown outcome), the end is not yet a loss: the phase becomes
``completing`` (no token is handed out, the token files are removed, the
worker is not signalled) and the job's result decides. A result that
carries this claim's id and token is completion; a holder key that is no
longer ours without such a result is loss. Until etcd can say which, the
sidecar keeps asking.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from joblease.client import JobLeaseClient
from joblease.errors import (
    AlreadyCompletedError,
    AttemptsExhaustedError,
    HeldError,
    InvalidInputError,
    JobLeaseError,
    LeaseLostError,
    NotRegisteredError,
    StaleTokenError,
    StoreUnavailableError,
)
from joblease.lease import Lease, LeaseState
from joblease.records import JobState, ResultRecord
from joblease.sidecar.config import SidecarConfig
from joblease.sidecar.metrics import SidecarMetrics
from joblease.sidecar.state import Answer, NothingToRelease, Phase, Released, Stale, Unsettled

log = logging.getLogger("joblease.sidecar")


# -- token files ---------------------------------------------------------------------------------

def write_atomic(path: Path, data: bytes, mode: int = 0o644,
                 publish_if: Callable[[], bool] | None = None) -> bool:
    """Readers see the old file or the new one, never a torn write: write a
    temporary file in the same directory, fsync it, rename over, fsync the dir.

    ``publish_if`` is asked right before the rename (the moment the file
    appears): if it says no, the temporary file is removed and nothing is
    published. Returns whether the file was published.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    if publish_if is not None and not publish_if():
        remove_quietly(tmp)
        return False
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return True


def remove_quietly(path: Path | None) -> None:
    if path is not None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


# -- the worker ----------------------------------------------------------------------------------

def find_worker_pids(pid_file: Path | None, process_name: str | None) -> list[int]:
    """The worker's pid(s): from the pid file, else by name in the (shared)
    process namespace, matching ``comm`` or the basename of argv[0]/argv[1]
    (so ``python worker.py`` is found as ``worker.py``)."""
    if pid_file is not None:
        try:
            text = pid_file.read_text().strip()
            return [int(text)] if text else []
        except (OSError, ValueError) as exc:
            log.warning("cannot read worker pid file", extra={"path": str(pid_file),
                                                              "reason": str(exc)})
    if not process_name:
        return []
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in (me, 1):
            continue
        try:
            comm = (entry / "comm").read_text().strip()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        names = {comm} | {os.path.basename(a.decode(errors="replace")) for a in argv[:2] if a}
        if process_name in names:
            found.append(int(entry.name))
    return found


def signal_worker(config: SidecarConfig, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to the configured worker; return the pids signalled."""
    signalled = []
    for pid in find_worker_pids(config.worker_pid_file, config.worker_process_name):
        try:
            os.kill(pid, sig)
            signalled.append(pid)
        except ProcessLookupError:
            log.info("worker already gone", extra={"pid": pid})
        except PermissionError:
            log.error("not permitted to signal the worker", extra={"pid": pid})
    return signalled


# -- the runner ----------------------------------------------------------------------------------

class SidecarRunner:
    """Owns the lease and the sidecar's phase: a state machine the HTTP app calls
    into. It neither serves nor listens; :mod:`joblease.sidecar.serve` runs the
    servers around it."""

    def __init__(self, config: SidecarConfig, client: JobLeaseClient | None = None) -> None:
        self.config = config
        self.client = client or JobLeaseClient(config.etcd)
        self.metrics = SidecarMetrics()
        self.phase = Phase.CLAIMING
        self.lease: Lease | None = None
        self.lost_reason: str | None = None
        self.result: ResultRecord | None = None
        #: the job was already completed (by anyone) when this sidecar tried to claim it
        self.completed_before_claim = False
        #: why the claim was refused for good (the error body), in phase ``failed``
        self.failure: dict[str, Any] | None = None
        #: ``/readyz`` has answered 200 once: the startup probe let the worker in
        self._gate_opened = False
        #: the lease was lost and the on-loss action found no worker to signal
        self._loss_found_no_worker = False
        self._stop = asyncio.Event()
        self._stop_signal: str | None = None
        self._exit_code: int | None = None
        self._op_lock = asyncio.Lock()
        #: A completion was sent under ``self.lease`` and is not known to have
        #: failed: if the lease ends now, the job's result says whether it ended
        #: by that completion or was lost.
        self._completion_sent = False
        self._end_reason: str | None = None  # why the lease ended, while COMPLETING
        #: A release under ``self.lease`` is in flight: if the lease ends now, the
        #: job is given back either way (by the release, or by expiry).
        self._release_sent = False
        self._settle_task: asyncio.Task[None] | None = None

    # -- state -----------------------------------------------------------------------------

    def _set_phase(self, phase: Phase) -> None:
        self.phase = phase
        self.metrics.set_state(phase)

    def current(self) -> Phase:
        """The phase, after re-checking a held lease against the monotonic clock."""
        lease = self.lease
        if self.phase is Phase.HELD and lease is not None:
            if lease.state is not LeaseState.HELD or not lease.valid:
                self._lease_ended(lease.lost_reason or "lease no longer valid")
        return self.phase

    def remaining(self) -> float:
        if self.current() is Phase.HELD and self.lease is not None:
            return self.lease.remaining()
        return 0.0

    def ready(self) -> bool:
        """``/readyz``: should the worker run now?

        While the lease is held, yes. In a final state reached before ``/readyz``
        ever said 200 (the startup probe has not let the worker in yet) also yes
        when the worker must start to learn the outcome and end the pod with it:
        the job was already completed, the claim was refused for good, or the
        lease was lost before there was a worker to signal (on-loss ``signal`` or
        ``exit``). A startup probe that never passes would hang the pod. In every
        other case no: the worker, if any, has been let in already.
        """
        phase = self.current()
        ok = phase is Phase.HELD or (not self._gate_opened and (
            phase is Phase.FAILED
            or (phase is Phase.COMPLETED and self.completed_before_claim)
            or (phase is Phase.LOST and self._loss_found_no_worker)))
        if ok:
            self._gate_opened = True
        return ok

    def _held(self, lease: Lease) -> None:
        self.lease = lease
        self._set_phase(Phase.HELD)
        self.metrics.claims.inc()
        log.info("lease held", extra={"job": str(lease.job), "token": lease.token,
                                      "generation": lease.generation, "ttl": lease.ttl})
        # A claim that took longer than its TTL is already lost: check before
        # publishing anything, and again right before each file appears.
        if self.current() is not Phase.HELD:
            return
        cfg = self.config
        if cfg.token_file is not None and cfg.token_json_file is not None:
            info = {"job": str(lease.job), "namespace": lease.job.namespace,
                    "name": lease.job.name, "owner": lease.owner, "token": lease.token,
                    "generation": lease.generation, "ttl": lease.ttl}

            def still_held() -> bool:
                return self.current() is Phase.HELD

            # token.json first: whoever sees the token file finds its companion.
            if write_atomic(cfg.token_json_file, json.dumps(info).encode() + b"\n",
                            publish_if=still_held):
                write_atomic(cfg.token_file, f"{lease.token}\n".encode(),
                             publish_if=still_held)
        # The writes fsync and can be slow: if the deadline passed meanwhile,
        # this removes what was published.
        self.current()

    def _drop_token_files(self) -> None:
        remove_quietly(self.config.token_file)
        remove_quietly(self.config.token_json_file)

    def _lease_ended(self, reason: str) -> None:
        """The held lease is no longer valid. If a completion of ours may have
        committed, the job's result decides between completion and loss
        (``completing`` until it does); otherwise this is loss."""
        if self.phase is not Phase.HELD:
            return
        if self._release_sent:
            # The re-check saw the holder key our release deleted, or the lease
            # expired while the release was on its way: what the worker asked for
            # is true either way. Not a loss; the release's answer follows.
            self._set_phase(Phase.RELEASED)
            self._drop_token_files()
            log.info("lease ended while its release was in flight",
                     extra={"job": str(self.config.job), "reason": reason})
            return
        if not self._completion_sent:
            self._on_loss(reason)
            return
        self._end_reason = reason
        self._set_phase(Phase.COMPLETING)
        self._drop_token_files()
        log.info("lease ended while a completion may have committed; reading the result",
                 extra={"job": str(self.config.job), "reason": reason,
                        "token": self.lease.token if self.lease else None})
        if self._settle_task is None or self._settle_task.done():
            self._settle_task = asyncio.get_running_loop().create_task(
                self._settle_until_known(), name="sidecar-settle-completion")

    def _on_loss(self, reason: str, *, act: bool = True) -> None:
        """Flip to lost at once: files gone, worker signalled, maybe exit
        (not with ``act=False``: the worker itself gave the job up)."""
        if self.phase not in (Phase.HELD, Phase.COMPLETING) and act:
            return
        if self.phase is Phase.LOST:
            return
        self.lost_reason = reason
        self._set_phase(Phase.LOST)
        self._drop_token_files()
        self.metrics.losses.inc()
        token = self.lease.token if self.lease else None
        log.warning("lease lost", extra={"job": str(self.config.job), "token": token,
                                         "reason": reason,
                                         "action": self.config.on_loss if act else "none"})
        if not act:
            return
        if self.config.on_loss in ("signal", "exit"):
            pids = signal_worker(self.config)
            self._loss_found_no_worker = not pids
            if pids:
                log.warning("sent SIGTERM to the worker", extra={"pids": pids})
            elif self.config.on_loss == "signal":
                log.warning("no worker process found to signal",
                            extra={"pidFile": str(self.config.worker_pid_file or ""),
                                   "workerProcessName": self.config.worker_process_name})
        if self.config.on_loss == "exit":
            self._exit_code = self.config.loss_exit_code
            self._stop.set()

    def _completed(self, lease: Lease, record: ResultRecord) -> ResultRecord:
        """The job is completed under our token (``record`` carries our claim id)."""
        first = self.phase is not Phase.COMPLETED
        self.result = record
        self._completion_sent = False
        self._set_phase(Phase.COMPLETED)
        self._drop_token_files()
        if first:
            self.metrics.completions.inc()
            log.info("job completed", extra={"job": str(lease.job), "token": lease.token,
                                             "generation": lease.generation})
        return record

    def request_stop(self, signame: str = "SIGTERM") -> None:
        if not self._stop.is_set():
            log.info("stop requested", extra={"signal": signame})
            self._stop_signal = signame
            self._stop.set()

    # -- reading what etcd decided --------------------------------------------------------------

    async def _read_state(self) -> JobState | None:
        """The job's state per etcd (a read: it never writes); ``None`` if unreadable."""
        try:
            return await asyncio.wait_for(self.client.get(self.config.job), timeout=3.0)
        except (JobLeaseError, TimeoutError) as exc:
            log.info("could not read the job's state", extra={"reason": str(exc)})
        except (ValueError, KeyError, TypeError) as exc:  # a stored value we cannot decode
            log.warning("could not decode the job's state", extra={"reason": repr(exc)})
        return None

    @staticmethod
    def _own_result(state: JobState, lease: Lease) -> ResultRecord | None:
        """The job's result if our completion wrote it (our claim id and token)."""
        r = state.result
        if r is not None and r.claim_id == lease.claim_id and r.token == lease.token:
            return r
        return None

    async def _settle(self) -> JobState | None:
        """Decide a ``completing`` phase from etcd: ``completed`` if the result
        carries our claim id, ``lost`` if the holder key is no longer ours
        without such a result. Returns the state it decided on, or ``None``
        while etcd cannot say (unreadable, or the holder key is still ours, so
        our completion could still commit)."""
        lease = self.lease
        assert lease is not None and self.phase is Phase.COMPLETING
        state = await self._read_state()
        if state is None:
            return None
        own = self._own_result(state, lease)
        if own is not None:
            self._completed(lease, own)
            return state
        if state.holder is not None and state.holder.token == lease.token:
            return None  # still ours in etcd (its expiry is near): nothing decided yet
        self._completion_sent = False
        self._on_loss(f"{self._end_reason or 'lease ended'}; the job has no result of ours")
        return state

    async def _settled_answer(self, token: int, state: JobState) -> Answer:
        """The API's answer once :meth:`_settle` decided."""
        if self.phase is Phase.COMPLETED and self.result is not None:
            return self.result
        return await self._stale(token, f"token {token} is not current; the lease is lost: "
                                        f"{self.lost_reason}", state.token, known=True)

    async def _settle_until_known(self) -> None:
        attempt = 0
        rng = random.Random()
        while not self._stop.is_set():
            async with self._op_lock:
                if self.phase is not Phase.COMPLETING or await self._settle() is not None:
                    return
            await self._sleep_or_stop(self.config.backoff.delay(attempt, rng.random()))
            attempt += 1

    # -- operations the API calls ------------------------------------------------------------

    async def _stale(self, token: int, message: str, current: int | None = None,
                     *, known: bool = False) -> Stale:
        """Stale. ``current`` is the current token when ``known``; otherwise
        it is read from etcd (the sidecar no longer holds a token of its own)."""
        self.metrics.stale_rejections.inc()
        if not known:
            state = await self._read_state()
            current = state.token if state is not None else None
        log.warning("refused a stale token",
                    extra={"token": token, "currentToken": current, "why": message})
        return Stale(token, message, current, self.phase)

    async def _not_current(self, token: int, why: str) -> Answer:
        """The answer for ``token`` when the lease is not held. If ``token`` is
        our own and the job's result carries our claim id, the job was completed
        by us (e.g. the retry of a completion that was answered 503): say so."""
        lease = self.lease
        state = await self._read_state()
        if lease is not None and lease.token == token and state is not None:
            own = self._own_result(state, lease)
            if own is not None:
                return self._completed(lease, own)
        return await self._stale(token, f"token {token} is not current; {why}",
                                 state.token if state is not None else None, known=True)

    async def complete(self, token: int, result: Any) -> Answer:
        """Complete under ``token`` if and only if it is this sidecar's live token."""
        async with self._op_lock:
            phase = self.current()
            lease = self.lease
            if (phase is Phase.COMPLETED and lease is not None and lease.token == token
                    and self.result is not None):
                return self.result  # a retried completion
            if phase is Phase.COMPLETING and lease is not None and lease.token == token:
                settled = await self._settle()
                if settled is not None:
                    return await self._settled_answer(token, settled)
                return Unsettled(token, phase)
            if phase is not Phase.HELD or lease is None:
                why = (f"the lease is {phase.value}"
                       + (f": {self.lost_reason}" if self.lost_reason else ""))
                return await self._not_current(token, why)
            if token != lease.token:
                return await self._stale(
                    token, f"token {token} is not the current token {lease.token}", lease.token,
                    known=True)
            self._completion_sent = True
            try:
                record = await lease.complete(result)
            except StaleTokenError as exc:
                # Lease.complete already accepted a result carrying our claim id:
                # this refusal is definite.
                self._completion_sent = False
                self._on_loss(f"etcd refused the completion: {exc}")
                return await self._stale(token, str(exc), exc.current_token, known=True)
            except LeaseLostError as exc:
                self._completion_sent = False
                self._on_loss(str(exc))
                return await self._stale(token, str(exc))
            except InvalidInputError as exc:  # refused before anything was sent
                self._completion_sent = False
                return exc
            except JobLeaseError as exc:
                # Unavailable, outcome unknown, permission denied...: the completion
                # may have committed. While the lease is held the same request may be
                # retried safely (it commits at most once); if the lease ended
                # meanwhile, the result decides.
                if self.current() is Phase.COMPLETING:
                    settled = await self._settle()
                    if settled is not None:
                        return await self._settled_answer(token, settled)
                return exc
            return self._completed(lease, record)

    async def checkpoint(self, token: int, data: Any) -> Answer:
        """Store ``data`` as the job's checkpoint under ``token`` if and only if
        it is this sidecar's live token (``Lease.checkpoint``: fenced in etcd)."""
        async with self._op_lock:
            phase = self.current()
            lease = self.lease
            if phase is not Phase.HELD or lease is None:
                why = (f"the lease is {phase.value}"
                       + (f": {self.lost_reason}" if self.lost_reason else ""))
                return await self._stale(token, f"token {token} is not current; {why}")
            if token != lease.token:
                return await self._stale(
                    token, f"token {token} is not the current token {lease.token}", lease.token,
                    known=True)
            try:
                record = await lease.checkpoint(data)
            except StaleTokenError as exc:
                self._on_loss(f"etcd refused the checkpoint: {exc}")
                return await self._stale(token, str(exc), exc.current_token, known=True)
            except InvalidInputError as exc:  # refused before anything was sent
                return exc
            except JobLeaseError as exc:
                return exc
            return record

    async def release(self, token: int) -> Answer:
        """Give the job back under ``token`` (same condition as completion)."""
        async with self._op_lock:
            phase = self.current()
            lease = self.lease
            if phase is Phase.RELEASED and lease is not None and lease.token == token:
                return Released(token)
            if (phase is Phase.COMPLETED and lease is not None and lease.token == token
                    and self.result is not None):
                # Not "stale" (which would name this very token as the current one).
                return NothingToRelease(token, phase, self.result)
            if phase is not Phase.HELD or lease is None:
                return await self._stale(token, f"token {token} is not current; "
                                                f"the lease is {phase.value}")
            if token != lease.token:
                return await self._stale(
                    token, f"token {token} is not the current token {lease.token}", lease.token,
                    known=True)
            self._release_sent = True
            try:
                await lease.release()
            except StaleTokenError as exc:
                # Someone else took the job before the release: lost, but the worker
                # is giving it up anyway (if the lease ended meanwhile, it is not
                # signalled for it).
                self._on_loss(f"etcd refused the release: {exc}",
                              act=self.phase is not Phase.RELEASED)
                return await self._stale(token, str(exc), exc.current_token, known=True)
            except JobLeaseError as exc:
                # Unavailable or outcome unknown: while the lease is held the same
                # request may be retried; once it has ended, the job is given back.
                if self.current() is Phase.RELEASED:
                    return Released(token)
                return exc
            finally:
                self._release_sent = False
            self._set_phase(Phase.RELEASED)
            self._drop_token_files()
            log.info("lease released by the worker", extra={"token": token})
            return Released(token)

    # -- lifecycle -------------------------------------------------------------------------

    async def _sleep_or_stop(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def _wait_or_stop(self, waiting: Awaitable[bool]) -> bool:
        """``waiting``'s answer, or False as soon as the sidecar is told to stop."""
        task = asyncio.ensure_future(waiting)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in (task, stop):
                t.cancel()
            await asyncio.gather(task, stop, return_exceptions=True)
        return not task.cancelled() and task.exception() is None and task.result()

    async def claim(self) -> Lease | int:
        """Claim with backoff; a lease, or the exit code of a final answer
        (0 if the job is already completed; the phase is then ``completed``
        or ``failed``), or 0 when stopped while claiming."""
        cfg = self.config
        registration_deadline = time.monotonic() + cfg.registration_wait
        attempt = 0
        rng = random.Random()
        while not self._stop.is_set():
            self.metrics.claim_attempts.inc()
            try:
                return await self.client.claim(cfg.job, cfg.owner)
            except AlreadyCompletedError as exc:
                log.info("job already completed; nothing to do", extra={
                    "job": str(cfg.job), "completedBy": exc.owner, "token": exc.token})
                state = await self._read_state()
                self.result = state.result if state is not None else None
                self.completed_before_claim = True
                self._set_phase(Phase.COMPLETED)
                return 0
            except AttemptsExhaustedError as exc:
                log.error("job has no attempts left", extra={**exc.details(),
                                                             "exitCode": exc.exit_code})
                return self._failed(exc, str(exc))
            except NotRegisteredError as exc:
                if time.monotonic() >= registration_deadline:
                    log.error("job is not registered", extra={
                        "job": str(cfg.job), "waited": cfg.registration_wait,
                        "exitCode": exc.exit_code})
                    return self._failed(exc, f"job {cfg.job} is not registered (waited "
                                             f"{cfg.registration_wait:g} s): is there a "
                                             "JobLease of that name in this namespace?")
                log.info("job not registered yet; waiting", extra={"job": str(cfg.job)})
            except HeldError as exc:
                log.info("job held by another owner; backing off", extra={
                    "holder": exc.owner, "token": exc.token, "generation": exc.generation})
                # Wake when the holder key changes (released, expired), not a backoff
                # later; the backoff stays the longest wait, and a little jitter keeps
                # the waiters of one job from claiming in lock step.
                if await self._wait_or_stop(self.client.wait_for_holder_change(
                        cfg.job, exc.revision, cfg.backoff.delay(attempt, rng.random()))):
                    await self._sleep_or_stop(cfg.backoff.initial / 2 * rng.random())
                attempt += 1
                continue
            except StoreUnavailableError as exc:
                log.warning("etcd unavailable; retrying", extra={"reason": str(exc)})
            except LeaseLostError as exc:
                # An ambiguous claim that committed, but whose etcd lease was gone
                # before anyone could use it: nobody holds the job (the attempt is
                # counted). Not a lost lease of ours to act on: claim again.
                log.warning("the claim committed but its lease was already gone; claiming "
                            "again", extra={"reason": str(exc)})
            except JobLeaseError as exc:
                log.error("cannot claim", extra={"reason": str(exc), "exitCode": exc.exit_code})
                return self._failed(exc, f"cannot claim job {cfg.job}: {exc}")
            await self._sleep_or_stop(cfg.backoff.delay(attempt, rng.random()))
            attempt += 1
        return 0

    def _failed(self, exc: JobLeaseError, message: str) -> int:
        """The claim was refused for good: phase ``failed``; returns the exit code."""
        self.failure = {"error": "failed", "reason": exc.reason, "message": message,
                        "exitCode": exc.exit_code, **exc.details()}
        self._set_phase(Phase.FAILED)
        return exc.exit_code

    async def _lifecycle(self) -> int | None:
        """Claim, then hold until the lease ends. An exit code means "exit now"."""
        outcome = await self.claim()
        if isinstance(outcome, int):
            if self._stop.is_set() or self.config.on_final == "exit":
                return outcome
            # "serve": stay up with the final answer (the worker reads it and ends
            # the pod; see ready()), until stopped.
            log.info("serving the final answer until stopped", extra={
                "job": str(self.config.job), "state": self.phase.value,
                "exitCode": outcome})
            return None
        self._held(outcome)
        state = await outcome.wait_done()
        if state is LeaseState.LOST:
            self._lease_ended(outcome.lost_reason or "lease lost")
        return self._exit_code

    async def shutdown(self) -> None:
        """Before the servers stop: end settling, release the lease if configured
        (the API still answers meanwhile, under the same lock), remove the token
        files."""
        cfg = self.config
        if self._settle_task is not None:
            self._settle_task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._settle_task
        async with self._op_lock:
            phase = self.current()
            lease = self.lease
            if phase is Phase.COMPLETING:
                log.warning("stopping before etcd could say whether the completion committed",
                            extra={"job": str(cfg.job), "reason": self._end_reason,
                                   "token": lease.token if lease else None})
            if phase is Phase.HELD and lease is not None and cfg.release_on_term:
                try:
                    # asyncio.timeout, not wait_for: the release runs in this task, so
                    # no request sees the handle released before the phase says so.
                    async with asyncio.timeout(10):
                        await lease.release()
                    log.info("lease released on shutdown", extra={"token": lease.token})
                    self._set_phase(Phase.RELEASED)
                except (JobLeaseError, TimeoutError) as exc:
                    log.warning("release on shutdown failed", extra={"reason": str(exc)})
            self._drop_token_files()
            if self.phase in (Phase.HELD, Phase.COMPLETING):
                self._set_phase(Phase.STOPPING)

    async def close(self) -> None:
        """After the servers stopped: close the client (revoking the etcd lease
        when the lease is to be released on stop)."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.client.close(revoke=self.config.release_on_term),
                                   timeout=10)

    async def run_until_stopped(self) -> int | None:
        """Claim and hold until stopped or told to exit; the exit code, if one
        was decided (``None``: stopped, exit 0 unless :meth:`exit_code` says
        otherwise). The servers must be up: the worker is waiting on them."""
        lifecycle = asyncio.create_task(self._lifecycle(), name="sidecar-lifecycle")
        stop = asyncio.create_task(self._stop.wait())
        code: int | None = None
        try:
            await asyncio.wait({lifecycle, stop}, return_when=asyncio.FIRST_COMPLETED)
            if lifecycle.done():
                try:
                    code = lifecycle.result()
                except Exception:
                    log.exception("sidecar failed")
                    code = 1
                if code is None:  # completed, released, or lost with "signal": keep serving
                    await stop
        finally:
            lifecycle.cancel()
            stop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lifecycle
        return code

    def exit_code(self, code: int | None) -> int:
        """The process exit code: a loss with on-loss ``exit`` wins over ``code``."""
        if self._exit_code is not None:
            return self._exit_code
        return 0 if code is None else code

    def fail_to_start(self) -> int:
        """The servers could not listen: exit 1, nothing claimed."""
        self._exit_code = 1
        return 1
