"""The sidecar's composition root: one runner, its HTTP apps on uvicorn, the signals.

The runner (:mod:`joblease.sidecar.runner`) is the state machine and knows
nothing of HTTP servers; the API (:mod:`joblease.sidecar.api`) turns requests
into calls on it. This module is the only one that knows both, so the import
graph stays a tree: ``serve -> api -> runner -> state``.

Order matters and lives here: the servers listen before the claim (the worker
waits on ``/readyz``), and on stop the lease is released while the API still
answers, then the servers stop, then the etcd client closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from pathlib import Path
from typing import Any

import uvicorn

from joblease.client import JobLeaseClient
from joblease.sidecar.api import build_app, build_probe_app
from joblease.sidecar.config import SidecarConfig
from joblease.sidecar.runner import SidecarRunner, write_atomic

log = logging.getLogger("joblease.sidecar")


class _Server(uvicorn.Server):
    """uvicorn without its own signal handling: the sidecar owns SIGTERM (it must
    release the lease before the server stops)."""

    @contextlib.contextmanager
    def capture_signals(self):  # type: ignore[no-untyped-def]
        yield


def bind(host: str, port: int) -> socket.socket:
    """Bind before serving, so port 0 resolves to a known port up front."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto must say TCP explicitly: asyncio sets TCP_NODELAY on accepted
    # connections only when the socket's proto is IPPROTO_TCP, and without it
    # Nagle plus delayed ACKs add ~40 ms to every response.
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(False)
    return sock


class Sidecar:
    """A runner with its listeners: what ``joblease sidecar`` runs.

    ``ports`` holds each listener's bound port (``api``, ``probe``) once it
    serves, which is how port 0 is learnt in-process.
    """

    def __init__(self, config: SidecarConfig, client: JobLeaseClient | None = None) -> None:
        self.config = config
        self.runner = SidecarRunner(config, client)
        self.ports: dict[str, int] = {}
        self._servers: list[tuple[_Server, asyncio.Task[None]]] = []

    def request_stop(self, signame: str = "SIGTERM") -> None:
        self.runner.request_stop(signame)

    async def start_servers(self) -> None:
        cfg = self.config
        if not cfg.loopback:
            log.warning("the lease API listens beyond loopback; set a bearer token",
                        extra={"host": cfg.host})
        listeners: list[tuple[str, Any, str, int, Path | None]] = [
            ("api", build_app(self.runner), cfg.host, cfg.port, cfg.port_file)]
        if cfg.probe_port is not None:
            listeners.append(("probe", build_probe_app(self.runner), cfg.probe_host,
                              cfg.probe_port, cfg.probe_port_file))
        for name, app, host, port, port_file in listeners:
            sock = bind(host, port)
            bound = sock.getsockname()[1]
            server = _Server(uvicorn.Config(app, log_config=None, access_log=False,
                                            lifespan="off", timeout_graceful_shutdown=2))
            task = asyncio.create_task(server.serve(sockets=[sock]), name=f"sidecar-{name}")
            self._servers.append((server, task))
            while not server.started:
                if task.done():
                    task.result()
                    raise RuntimeError(f"{name} server stopped during startup")
                await asyncio.sleep(0.01)
            self.ports[name] = bound
            if port_file is not None:
                write_atomic(port_file, f"{bound}\n".encode())
            log.info("listening", extra={"listener": name, "host": host, "port": bound})

    async def _stop_servers(self) -> None:
        for server, _ in self._servers:
            server.should_exit = True
        for _, task in self._servers:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def run(self) -> int:
        """Serve, claim, hold; return the process exit code."""
        runner = self.runner
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, runner.request_stop, sig.name)
        log.info("sidecar starting", extra={"config": self.config.describe()})
        code: int | None = None
        try:
            try:
                await self.start_servers()
            except OSError as exc:  # e.g. the port is taken: say so, exit non-zero
                log.error("cannot listen", extra={"reason": str(exc)})
                return runner.fail_to_start()
            code = await runner.run_until_stopped()
        finally:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
            await runner.shutdown()
            await self._stop_servers()
            await runner.close()
        code = runner.exit_code(code)
        log.info("sidecar exiting", extra={"exitCode": code, "state": runner.phase.value})
        return code


async def run_sidecar(config: SidecarConfig) -> int:
    """Run the sidecar until SIGTERM (exit 0) or, with ``on_loss="exit"``, loss
    of the lease (exit 8). A final answer to the claim (already completed,
    refused for good) is served until SIGTERM; with ``on_final="exit"`` the
    sidecar exits with its code instead (0 if the job is already completed)."""
    return await Sidecar(config).run()
