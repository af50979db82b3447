"""A sidecar run in the test's process, on a real etcd, with faults injected around its store.

Faults that must hit one request and not another (the completion's reply but
not the keep-alive's) cannot be made with a TCP proxy: gRPC multiplexes every
call on one connection. So :class:`FaultyStore` wraps the real
:class:`~joblease.etcd_store.EtcdStore`: every call still goes to etcd, and the
wrapper only delays or loses *replies* (after etcd committed) or refuses to
send (etcd "unreachable"). The sidecar itself is the real
:class:`~joblease.sidecar.runner.SidecarRunner`, serving its real HTTP API on
a loopback port; the worker it signals is a real process.

:class:`FileEvents` watches a directory with Linux inotify, so a token file
that exists for a microsecond is still seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import struct
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.errors import OutcomeUnknownError, StoreUnavailableError
from joblease.etcd_store import EtcdStore
from joblease.sidecar.config import Backoff, SidecarConfig
from joblease.sidecar.runner import SidecarRunner
from joblease.store import Compare, Delete, KeepAlive, Put, TxnOp, TxnResult
from tests.sidecar.conftest import poll


def _is_completion(success: Sequence[TxnOp]) -> bool:
    return any(isinstance(op, Put) and op.key.endswith(b"/result") for op in success)


def _is_release(success: Sequence[TxnOp]) -> bool:
    return (len(success) == 1 and isinstance(success[0], Delete)
            and success[0].key.endswith(b"/holder"))


def _is_claim(success: Sequence[TxnOp]) -> bool:
    return any(isinstance(op, Put) and op.key.endswith(b"/holder") and op.lease
               for op in success)


def _is_holder_check(compares: Sequence[Compare], success: Sequence[TxnOp]) -> bool:
    return not success and any(c.key.endswith(b"/holder") and c.target == "create"
                               for c in compares)


class _KeepAlive:
    def __init__(self, inner: KeepAlive, store: FaultyStore) -> None:
        self.inner, self.store = inner, store

    async def renew(self, timeout: float) -> int:
        if self.store.unreachable:
            raise StoreUnavailableError("injected: etcd unreachable (keep-alive)")
        return await self.inner.renew(timeout)

    async def close(self) -> None:
        await self.inner.close()


class FaultyStore:
    """The real etcd store with switchable faults (see the module doc)."""

    def __init__(self, inner: EtcdStore) -> None:
        self.inner = inner
        #: every call fails with StoreUnavailableError before reaching etcd
        self.unreachable = False
        #: the completion's reply is held until this event is set (it has committed)
        self.hold_completion_reply: asyncio.Event | None = None
        #: the release's reply is held until this event is set (it has committed)
        self.hold_release_reply: asyncio.Event | None = None
        #: the completion commits, then etcd becomes unreachable and its reply is lost
        self.lose_completion_reply = False
        #: the claim's reply arrives only after the session's safety deadline,
        #: and no keep-alive gets through meanwhile
        self.claim_reply_after_deadline = False
        #: the claim commits, its etcd lease is gone before the reply, the reply is lost
        self.claim_lease_gone_before_reply = False
        self.completion_committed = asyncio.Event()
        self.release_committed = asyncio.Event()
        #: a holder re-check found the holder gone after our completion or release committed
        self.recheck_after_commit = asyncio.Event()
        self._granted: tuple[float, int] | None = None  # (monotonic send time, granted TTL)

    def _check(self, what: str) -> None:
        if self.unreachable:
            raise StoreUnavailableError(f"injected: etcd unreachable ({what})")

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        self._check("txn")
        r = await self.inner.txn(compares, success, failure)
        if _is_completion(success) and r.succeeded:
            self.completion_committed.set()
            if self.lose_completion_reply:
                self.unreachable = True
                raise OutcomeUnknownError("injected: the completion's reply was lost")
            if self.hold_completion_reply is not None:
                await self.hold_completion_reply.wait()
        elif _is_release(success) and r.succeeded:
            self.release_committed.set()
            if self.hold_release_reply is not None:
                await self.hold_release_reply.wait()
        elif _is_claim(success) and r.succeeded and self.claim_lease_gone_before_reply:
            self.claim_lease_gone_before_reply = False
            lease_id = next(op.lease for op in success if isinstance(op, Put) and op.lease)
            await self.inner.revoke(lease_id)  # as if it expired before the reply came
            raise OutcomeUnknownError("injected: the claim's reply was lost")
        elif _is_claim(success) and r.succeeded and self.claim_reply_after_deadline:
            assert self._granted is not None
            sent, ttl = self._granted
            self.unreachable = True  # keep-alives fail: the deadline is not pushed back
            await asyncio.sleep(max(0.0, sent + ttl + 0.2 - time.monotonic()))  # the slow reply
            self.unreachable = False
        elif (_is_holder_check(compares, success) and not r.succeeded
              and (self.completion_committed.is_set() or self.release_committed.is_set())):
            self.recheck_after_commit.set()
        return r

    async def get(self, key: bytes, *, prefix: bool = False, revision: int = 0,
                  keys_only: bool = False) -> Any:
        self._check("get")
        return await self.inner.get(key, prefix=prefix, revision=revision, keys_only=keys_only)

    async def grant(self, ttl: int) -> tuple[int, int]:
        self._check("grant")
        sent = time.monotonic()
        lease_id, granted = await self.inner.grant(ttl)
        self._granted = (sent, granted)
        return lease_id, granted

    def keep_alive(self, lease_id: int) -> _KeepAlive:
        return _KeepAlive(self.inner.keep_alive(lease_id), self)

    def __getattr__(self, name: str) -> Any:  # revoke, time_to_live, watch, close
        return getattr(self.inner, name)


@dataclass
class InProcessSidecar:
    runner: SidecarRunner
    store: FaultyStore
    url: str
    token_file: Path
    task: asyncio.Task[int]

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        async with httpx.AsyncClient(base_url=self.url, timeout=60) as http:
            return await http.request(method, path, **kw)

    async def lease(self) -> dict[str, Any]:
        r = await self.request("GET", "/v1/lease")
        return {"status": r.status_code, **r.json()}

    async def held(self, timeout: float = 30) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            try:
                lease = await self.lease()
            except httpx.TransportError:
                lease = {"status": 0}
            if self.task.done():
                raise AssertionError(f"the sidecar stopped (exit code {self.task.result()})")
            return lease if lease["status"] == 200 else None
        found: dict[str, Any] = await poll(check, timeout, "the sidecar to hold the lease")
        return found


@contextlib.asynccontextmanager
async def sidecar_in_process(etcd_config: EtcdConfig, job: JobRef, workdir: Path,
                             **config: Any) -> AsyncIterator[InProcessSidecar]:
    """Run the real sidecar runner on its own real HTTP port, in this event loop."""
    workdir.mkdir(parents=True, exist_ok=True)
    store = FaultyStore(EtcdStore(etcd_config))
    client = JobLeaseClient(etcd_config, store=store)
    settings: dict[str, Any] = {
        "job": job, "owner": "pod-a/uid-a", "etcd": etcd_config, "port": 0,
        "port_file": workdir / "port", "probe_port": None, "token_file": workdir / "token",
        "on_loss": "none", "backoff": Backoff(initial=0.05, maximum=0.2),
        **config}
    runner = SidecarRunner(SidecarConfig(**settings), client=client)
    task = asyncio.create_task(runner.run())
    try:
        port = await poll(lambda: runner.ports.get("api"), 30, "the sidecar's port")
        yield InProcessSidecar(runner, store, f"http://127.0.0.1:{port}", workdir / "token",
                               task)
    finally:
        store.unreachable = False
        for held in (store.hold_completion_reply, store.hold_release_reply):
            if held is not None:
                held.set()
        runner.request_stop()
        await asyncio.wait_for(task, 60)


# -- inotify -------------------------------------------------------------------------------------

_IN_MOVED_TO, _IN_CREATE = 0x80, 0x100
_EVENT = struct.Struct("iIII")


class FileEvents:
    """The names that appeared in ``directory`` (created or renamed into it)."""

    def __init__(self, directory: Path) -> None:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        self._fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self._fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        if libc.inotify_add_watch(self._fd, str(directory).encode(),
                                  _IN_MOVED_TO | _IN_CREATE) < 0:
            raise OSError(ctypes.get_errno(), "inotify_add_watch")
        self.appeared: list[str] = []

    def read(self) -> list[str]:
        """Everything seen so far (drains the kernel's queue)."""
        while True:
            try:
                data = os.read(self._fd, 65536)
            except BlockingIOError:
                return self.appeared
            offset = 0
            while offset < len(data):
                _, _, _, length = _EVENT.unpack_from(data, offset)
                offset += _EVENT.size
                name = data[offset:offset + length].rstrip(b"\0").decode()
                offset += length
                self.appeared.append(name)

    def close(self) -> None:
        os.close(self._fd)
