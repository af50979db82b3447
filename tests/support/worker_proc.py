"""Real worker processes for the core tests."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from joblease import EtcdConfig, JobRef
from joblease.keys import ItemRef

ROOT = Path(__file__).resolve().parents[2]


class WorkerProc:
    """``tests/core/worker_process.py`` in its own process; events read as JSON lines."""

    def __init__(self, config: EtcdConfig, job: JobRef | ItemRef, owner: str,
                 wrapper: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        self.owner = owner
        cmd = [*wrapper, sys.executable, "-m", "tests.core.worker_process",
               ",".join(config.endpoints), config.root, str(job), owner]
        self.proc = subprocess.Popen(
            cmd, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.history: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_err, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                self.stderr.append(line)

    def _read_err(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr.append(line)

    def next_event(self, kind: str, timeout: float = 20.0) -> dict[str, Any]:
        """The next event of ``kind`` (earlier events of other kinds are kept in history)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"{self.owner}: no {kind!r} event in {timeout}s; "
                                     f"stderr:\n{''.join(self.stderr[-30:])}")
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            self.history.append(event)
            if event["event"] == kind:
                return event

    def drain(self) -> None:
        while not self.events.empty():
            self.history.append(self.events.get_nowait())

    def last_renewal(self) -> float:
        self.drain()
        times = [e["at"] for e in self.history if e["event"] in ("renewed", "claimed")]
        return max(times)

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
