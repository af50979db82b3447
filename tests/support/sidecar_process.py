"""Sidecars and workers as real processes against a real etcd.

Each sidecar is started as a separate process (the Go binary built from
``sidecar-go/``: see :mod:`tests.support.sidecar_impls`),
configured through its environment, listening on port 0 and reporting the
bound port in a port file. Logs go to files that the fixtures attach to the
report when a test fails. Waits are polls with deadlines, never bare sleeps.

Everything here talks to a sidecar the way a worker does (HTTP, the token
file, signals, exit codes, JSON log lines on stdout/stderr); nothing reaches
into a sidecar's internals.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
WORKER_PY = ROOT / "examples" / "workers" / "worker.py"
WORKER_SH = ROOT / "examples" / "workers" / "worker.sh"


class Proc:
    """A child process with its output in a log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.name, self.log = name, log
        self._log_f = log.open("wb")
        self.popen = subprocess.Popen(argv, env=env, stdout=self._log_f,
                                      stderr=subprocess.STDOUT, cwd=ROOT)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def signal(self, sig: int) -> None:
        self.popen.send_signal(sig)

    def returncode(self) -> int | None:
        return self.popen.poll()

    async def wait_exit(self, timeout: float) -> int:
        await poll(lambda: self.popen.poll() is not None, timeout, f"{self.name} to exit")
        code = self.popen.returncode
        assert code is not None
        return code

    def output(self) -> str:
        """Everything the child wrote so far; readable after ``stop()`` too (the
        fixtures attach logs after stopping, when the log is complete)."""
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """Kill the child (if still running) and reap it, then close our copy of the
        log file: in that order, and only once."""
        try:
            if self.popen.poll() is None:
                self.popen.send_signal(signal.SIGCONT)
                self.popen.kill()
                self.popen.wait(10)
        finally:
            self._log_f.close()


class Sidecar(Proc):
    """A running sidecar process and an HTTP client for its API.

    ``argv`` is the sidecar's command line (``sidecar_argv``: the Go binary).
    """

    def __init__(self, name: str, workdir: Path, env: dict[str, str],
                 argv: list[str]) -> None:
        self.workdir = workdir
        self.port_file = workdir / "port"
        self.token_file = workdir / "token"
        self.api_token: str | None = None
        super().__init__(name, list(argv), env, workdir / "sidecar.log")
        self.url = ""

    async def started(self, timeout: float = 30) -> Sidecar:
        def port() -> int | None:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited early:\n{self.output()}")
            try:
                return int(self.port_file.read_text())
            except (OSError, ValueError):
                return None
        self.url = f"http://127.0.0.1:{await poll(port, timeout, f'{self.name} port file')}"
        return self

    async def request(self, method: str, path: str, **kw: Any) -> httpx.Response:
        headers = kw.pop("headers", {})
        timeout = kw.pop("timeout", 10)
        if self.api_token and "Authorization" not in headers:
            headers["Authorization"] = f"Bearer {self.api_token}"
        async with httpx.AsyncClient(base_url=self.url, timeout=timeout) as http:
            return await http.request(method, path, headers=headers, **kw)

    async def status(self, path: str) -> int:
        try:
            return (await self.request("GET", path)).status_code
        except httpx.TransportError:
            return 0

    async def lease(self) -> dict[str, Any]:
        r = await self.request("GET", "/v1/lease")
        return {"status": r.status_code, **r.json()}

    async def held(self, timeout: float = 30) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            if self.popen.poll() is not None:
                raise AssertionError(f"{self.name} exited:\n{self.output()}")
            lease = await self.lease()
            return lease if lease["status"] == 200 else None
        result: dict[str, Any] = await poll(check, timeout, f"{self.name} to hold the lease")
        return result

    async def metrics(self) -> dict[str, float]:
        """``GET /metrics`` parsed: sample name with its labels -> value."""
        return parse_metrics((await self.request("GET", "/metrics")).text)

    def log_records(self) -> list[dict[str, Any]]:
        out = []
        for line in self.output().splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if isinstance(record, dict):
                out.append(record)
        return out

    def logged(self, msg: str) -> bool:
        """Whether the sidecar logged a JSON record whose ``msg`` is ``msg``."""
        return any(r.get("msg") == msg for r in self.log_records())


def swap_file(path: Path, text: str) -> None:
    """Replace a file the way the kubelet updates a mounted Secret: atomically (what a
    sidecar reading ``JOBLEASE_ETCD_*_FILE`` again sees is the old or the new text)."""
    tmp = path.with_suffix(".new")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text exposition -> ``{'name{label="v"}': value}`` (labels sorted).

    Compared by value, not by spelling (``1`` and ``1.0`` are the same sample).
    """
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


class Env:
    """Starts sidecars and workers for one test; the fixture stops them all afterwards."""

    def __init__(self, tmp_path: Path, etcd_config: EtcdConfig,
                 sidecar_argv: list[str], impl: str = "go") -> None:
        self.tmp = tmp_path
        self.etcd_config = etcd_config
        self.impl = impl
        self.sidecar_argv = list(sidecar_argv)
        self.procs: list[Proc] = []
        self.job = JobRef("default", "job-" + uuid.uuid4().hex[:8])

    def base_env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
        env.update({"PYTHONUNBUFFERED": "1",
                    "JOBLEASE_ETCD_ENDPOINTS": ",".join(self.etcd_config.endpoints),
                    "JOBLEASE_ROOT": self.etcd_config.root})
        return env

    async def register(self, client: JobLeaseClient, ttl: int = 2, max_attempts: int = 0,
                       history_limit: int = 0) -> None:
        await client.register(self.job, JobSpec(lease_duration_seconds=ttl,
                                                max_attempts=max_attempts,
                                                history_limit=history_limit))

    def sidecar_env(self, name: str, workdir: Path, **extra: str) -> dict[str, str]:
        env = self.base_env()
        env.update({
            "JOBLEASE_JOB_NAME": self.job.name, "JOBLEASE_JOB_NAMESPACE": self.job.namespace,
            "POD_NAME": f"pod-{name}", "POD_UID": uuid.uuid4().hex[:8],
            "JOBLEASE_SIDECAR_PORT": "0",
            "JOBLEASE_SIDECAR_PORT_FILE": str(workdir / "port"),
            "JOBLEASE_SIDECAR_PROBE_PORT": "off",
            "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
            "JOBLEASE_SIDECAR_CLAIM_BACKOFF_INITIAL": "0.05",
            "JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX": "0.2",
            "JOBLEASE_SIDECAR_ON_LOSS": "none",
        })
        env.update(extra)
        return env

    def sidecar(self, name: str, **extra: str) -> Sidecar:
        workdir = self.tmp / name
        workdir.mkdir()
        s = Sidecar(name, workdir, self.sidecar_env(name, workdir, **extra), self.sidecar_argv)
        self.procs.append(s)
        return s

    def worker(self, sidecar: Sidecar, name: str, **extra: str) -> Proc:
        env = self.base_env()
        env.update({"JOBLEASE_SIDECAR_URL": sidecar.url,
                    "JOBLEASE_TOKEN_FILE": str(sidecar.token_file),
                    "JOBLEASE_WAIT_SECONDS": "30"})
        env.update(extra)
        p = Proc(name, [sys.executable, str(WORKER_PY)], env, self.tmp / f"{name}.log")
        self.procs.append(p)
        return p

    def spawn(self, name: str, argv: list[str]) -> Proc:
        return self.spawn_with(name, argv, {})

    def spawn_with(self, name: str, argv: list[str], extra: dict[str, str]) -> Proc:
        p = Proc(name, argv, {**self.base_env(), **extra}, self.tmp / f"{name}.log")
        self.procs.append(p)
        return p

    def stop(self) -> None:
        for p in self.procs:
            p.stop()

    def logs(self) -> str:
        return "\n".join(f"===== {p.name} (rc={p.returncode()})\n{p.output()}"
                         for p in self.procs)
