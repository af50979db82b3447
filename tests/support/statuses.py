"""Every JobLease status the API server serves in one namespace, in order, and the
never-backwards rule over them.

:class:`StatusWatch` runs ``kubectl get jobleases --watch`` (a real watch,
restarted with a fresh list whenever it ends) in a thread and keeps each served
status per JobLease. :func:`backwards` lists every place where a status moved
backwards: ``etcdRevision``, ``generation`` or ``fencingToken`` decreased, or
``Completed`` was left. Used by the operator high-availability tests (host
processes in tests/kube, pods in tests/cluster).
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MONOTONIC_FIELDS = ("etcdRevision", "generation", "fencingToken")


class StatusWatch:
    """``kubectl --kubeconfig <kubeconfig> -n <namespace> get jobleases --watch``."""

    def __init__(self, kubectl: str, kubeconfig: Path | str, namespace: str) -> None:
        self.argv = [kubectl, "--kubeconfig", str(kubeconfig), "-n", namespace, "get",
                     "jobleases", "--watch", "--output-watch-events", "-o", "json"]
        self.served: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.events = 0
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> StatusWatch:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self._proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL, text=True)
            assert self._proc.stdout is not None
            buf = ""
            for line in self._proc.stdout:
                buf += line  # one event per line, or pretty-printed over several
                try:
                    event = json.loads(buf)
                except ValueError:
                    continue
                buf = ""
                obj = event.get("object") or {}
                name = (obj.get("metadata") or {}).get("name")
                if not name:
                    continue
                with self._lock:
                    self.served[name].append(obj.get("status") or {})
                    self.events += 1
            self._proc.wait()
            self._stop.wait(0.2)

    def last(self, name: str) -> dict[str, Any]:
        with self._lock:
            return next((s for s in reversed(self.served.get(name, [])) if s), {})

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {k: list(v) for k, v in self.served.items()}

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait(10)
        self._thread.join(10)


def backwards(served: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """Each served status that moved backwards from the one served before it."""
    found = []
    for name, statuses in sorted(served.items()):
        prev: Mapping[str, Any] | None = None
        for i, s in enumerate(statuses):
            if not s:
                continue  # the API server's before the operator wrote any
            if prev is not None:
                for f in MONOTONIC_FIELDS:
                    a, b = prev.get(f), s.get(f)
                    if a is not None and b is not None and int(b) < int(a):
                        found.append(f"{name}: served status #{i} has {f} {b} after {a}")
                if prev.get("phase") == "Completed" and s.get("phase") != "Completed":
                    found.append(f"{name}: served status #{i} has phase {s.get('phase')} "
                                 "after Completed")
            prev = s
    return found
