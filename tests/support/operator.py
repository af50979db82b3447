"""The operator as a real process in tests, and kubectl helpers around it.

One home for what several test modules need: ``OperatorProcess`` (``python -m
joblease.operator`` with its log in a file; subclasses add TLS, auth, a chart's
ServiceAccount or another user), ``running_operator`` (start, wait until ready,
stop, attach the log on failure), ``Kube`` (kubectl in a thread) and
``wait_for`` (poll a condition with a deadline).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import pytest

from joblease import EtcdConfig
from tests.support.controlplane import ControlPlane, free_port
from tests.support.failure_logs import attach_on_failure

T = TypeVar("T")
Op = TypeVar("Op", bound="OperatorProcess")


async def wait_for(what: str, probe: Callable[[], Awaitable[T | None]], timeout: float = 30.0,
                   interval: float = 0.1) -> T:
    """Poll ``probe`` until it returns something truthy; fail with ``what`` at the deadline."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = await probe()
        except (AssertionError, KeyError, subprocess.SubprocessError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return cast(T, last)
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}; "
                                 f"last: {last!r}")
        await asyncio.sleep(interval)


def joblease(name: str, spec: dict[str, Any]) -> str:
    return json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
                       "metadata": {"name": name}, "spec": spec})


class Kube:
    """kubectl in a thread, so the test's event loop keeps renewing its leases."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.cp, self.ns = cp, namespace

    async def run(self, *args: str, input: str | None = None
                  ) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self.cp.kubectl, "-n", self.ns, *args, input=input)

    async def apply(self, name: str, spec: dict[str, Any]) -> None:
        r = await self.run("apply", "-f", "-", input=joblease(name, spec))
        assert r.returncode == 0, r.stderr

    async def get(self, name: str) -> dict[str, Any] | None:
        return await self.get_object("jl", name)

    async def get_object(self, kind: str, name: str) -> dict[str, Any] | None:
        """The object as JSON, or ``None`` if the API server says NotFound."""
        r = await self.run("get", kind, name, "-o", "json")
        if r.returncode != 0:
            assert "NotFound" in r.stderr, r.stderr
            return None
        obj: dict[str, Any] = json.loads(r.stdout)
        return obj

    async def status(self, name: str) -> dict[str, Any]:
        obj = await self.get(name)
        return dict((obj or {}).get("status") or {})

    async def status_where(self, name: str, what: str, check: Callable[[dict[str, Any]], bool],
                           timeout: float = 30.0) -> dict[str, Any]:
        async def probe() -> dict[str, Any] | None:
            s = await self.status(name)
            return s if s and check(s) else None
        return await wait_for(f"{self.ns}/{name} status {what}", probe, timeout)

    async def events(self, name: str) -> list[dict[str, Any]]:
        """The Events of the object ``name``, in the order of their names."""
        r = await self.run("get", "events", "-o", "json",
                           "--field-selector", f"involvedObject.name={name}")
        items: list[dict[str, Any]] = json.loads(r.stdout)["items"] if r.returncode == 0 else []
        return sorted(items, key=lambda e: e["metadata"]["name"])

    async def event_reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in await self.events(name)]


class OperatorProcess:
    """``python -m joblease.operator`` with its log in a file (attached on failure)."""

    #: The module run with ``python -m`` (a benchmark runs a traced wrapper instead).
    module = "joblease.operator"

    def __init__(self, cp: ControlPlane, etcd: EtcdConfig, namespace: str, log: Path) -> None:
        self.cp, self.etcd, self.namespace, self.log = cp, etcd, namespace, log
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def environment(self) -> dict[str, str]:
        """The operator's environment; subclasses add etcd TLS/auth or feature flags."""
        # A 5 s election TTL (not the default 10 s): a test that SIGKILLs and restarts the
        # operator waits for the dead process's leader key to expire before it leads again.
        return dict(os.environ, KUBECONFIG=str(self.cp.kubeconfig),
                    JOBLEASE_ETCD_ENDPOINTS=",".join(self.etcd.endpoints),
                    JOBLEASE_ROOT=self.etcd.root, PYTHONUNBUFFERED="1",
                    JOBLEASE_LEADER_ELECTION_TTL="5")

    def start(self) -> OperatorProcess:
        env = self.environment()
        self.starts += 1
        with self.log.open("ab") as out:
            out.write(f"===== operator start #{self.starts} =====\n".encode())
            out.flush()
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, "--namespace", self.namespace,
                 "--metrics-host", "127.0.0.1", "--metrics-port", str(self.port),
                 "--watch-timeout", "60"],
                env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        return self

    def _get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}",
                                        timeout=2) as r:
                return r.status, r.read().decode()
        except OSError as exc:
            return getattr(exc, "code", 0) or 0, str(exc)

    async def wait_ready(self, timeout: float = 60.0) -> None:
        async def probe() -> bool:
            assert self.proc is not None and self.proc.poll() is None, "operator exited"
            return (await asyncio.to_thread(self._get, "/readyz"))[0] == 200
        await wait_for("operator /readyz", probe, timeout, interval=0.2)

    def probe(self, path: str) -> int:
        return self._get(path)[0]

    def metrics(self) -> str:
        return self._get("/metrics")[1]

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 150) -> str:
        text = self.log.read_text(errors="replace").splitlines() if self.log.exists() else []
        return "\n".join(text[-lines:])


@contextlib.asynccontextmanager
async def running_operator(op: Op, request: pytest.FixtureRequest, *, start: bool = True,
                           ready: bool = True, log_lines: int = 150) -> AsyncIterator[Op]:
    """``op`` started (unless ``start=False``: the test starts it) and, with ``ready``,
    serving ``/readyz``; stopped afterwards, its log attached to a failed test's
    report (or to every report with ``JOBLEASE_TEST_OPERATOR_LOG`` set)."""
    if start:
        op.start()
    try:
        if start and ready:
            await op.wait_ready()
        yield op
    finally:
        op.stop()
        attach_on_failure(request, "operator log", lambda: op.log_tail(log_lines),
                          always=bool(os.environ.get("JOBLEASE_TEST_OPERATOR_LOG")))
