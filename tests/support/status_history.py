"""Every JobLease status the API server served, and the rule that it never goes back.

The one watcher and the one rule of the test suite: the operator tests (host
processes in tests/kube, pods in tests/cluster) and the chaos runner all judge the
operator's statuses with them.

:class:`StatusWatch` records them with the real API watch (``kubectl get --raw``
on ``...?watch=1&resourceVersion=R``): a list first, then every change in order.
When a watch ends (the server's timeout), it resumes from the last resourceVersion
it saw, so the record has no gap; a ``410 Gone`` (history compacted) would be a gap
and is reported as ``gaps``, making :func:`regressions`' verdict incomplete.

"Never moves backwards", per JobLease, over its statuses in served order (empty
statuses, before the operator's first write, are skipped), for a history in which
the spec and the registration do not change:

* ``etcdRevision``, ``generation``, ``attempts`` and ``fencingToken`` never decrease;
* the progress key ``(generation, rank(phase))`` never decreases, with
  ``Claimed`` 0 < ``Pending`` 1 < ``Failed`` = ``Completed`` 2. A claim raises the
  generation, so within one generation a JobLease goes ``Claimed`` → ``Pending``
  (released or expired) or → ``Completed``/``Failed``, never back to ``Claimed``;
  ``NotRegistered`` and ``Pending`` at generation 0 are before every claim, in that
  order;
* ``Completed`` and ``Failed`` are never left (nor swapped for each other);
* ``recentTenures``: its newest token never decreases, and a tenure shown in both
  (same token) never reads ``open`` again once ended, nor counts fewer
  checkpoints or refused completions.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from tests.support.binaries import kubectl_binary

PHASE_RANK = {"NotRegistered": -1, "Claimed": 0, "Pending": 1, "Failed": 2, "Completed": 2}
TERMINAL = ("Completed", "Failed")
MONOTONIC_FIELDS = ("etcdRevision", "generation", "attempts", "fencingToken")


@dataclass(frozen=True)
class StepBack:
    """Status number ``index`` served for ``name`` moved backwards, ``why``."""

    name: str
    index: int
    why: str

    def __str__(self) -> str:
        return f"{self.name} #{self.index}: {self.why}"


def steps_back(served: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[StepBack]:
    """Every step backwards in ``served`` (JobLease name → its statuses in served
    order); empty when none."""
    found = []
    for name, statuses in sorted(served.items()):
        prev: Mapping[str, Any] | None = None
        for i, status in enumerate(statuses):
            if not status:
                continue
            if prev is not None:
                found += [StepBack(name, i, why) for why in _step_back(prev, status)]
            prev = status
    return found


def regressions(served: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """:func:`steps_back` as readable lines."""
    return [str(step) for step in steps_back(served)]


def _step_back(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    why = []
    for field in MONOTONIC_FIELDS:
        x, y = a.get(field), b.get(field)
        if x is not None and y is not None and int(y) < int(x):
            why.append(f"{field} {y} after {x}")
    why += _tenures_step_back(a.get("recentTenures"), b.get("recentTenures"))
    pa, pb = a.get("phase"), b.get("phase")
    if pb not in PHASE_RANK:
        why.append(f"unknown phase {pb!r}")
        return why
    if pa in TERMINAL and pb != pa:
        why.append(f"phase {pb} after {pa}")
    elif pa in PHASE_RANK:
        key_a = (int(a.get("generation") or 0), PHASE_RANK[pa])
        key_b = (int(b.get("generation") or 0), PHASE_RANK[pb])
        if key_b < key_a:
            why.append(f"phase {pb} at generation {key_b[0]} after {pa} at "
                       f"generation {key_a[0]}")
    return why


def _tenures_step_back(a: Any, b: Any) -> list[str]:
    if not isinstance(a, list) or not isinstance(b, list) or not a or not b:
        return []
    why = []
    if int(b[0]["token"]) < int(a[0]["token"]):
        why.append(f"recentTenures newest token {b[0]['token']} after {a[0]['token']}")
    before = {int(t["token"]): t for t in a}
    for t in b:
        old = before.get(int(t["token"]))
        if old is None:
            continue
        if t["end"] == "open" and old["end"] != "open":
            why.append(f"tenure {t['token']} open after {old['end']}")
        for count in ("checkpoints", "refusedCompletions"):
            if int(t.get(count) or 0) < int(old.get(count) or 0):
                why.append(f"tenure {t['token']} {count} {t.get(count)} after {old.get(count)}")
    return why


class StatusWatch:
    """The statuses of the JobLeases in ``namespace`` as the API server behind
    ``kubeconfig`` serves them, from construction until :meth:`stop` (of the
    JobQueues with ``plural="jobqueues"``: :func:`regressions` is JobLease's rule,
    a JobQueue test judges its own).

    ``log``: also append each as a JSON line ``{"name", "resourceVersion",
    "status"}`` (the chaos runner keeps it with a run's other records)."""

    def __init__(self, kubeconfig: Path | str, namespace: str, *,
                 log: Path | None = None, plural: str = "jobleases") -> None:
        self.kubeconfig, self.namespace = str(kubeconfig), namespace
        self._log: IO[str] | None = open(log, "a") if log is not None else None
        self.served: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.events = 0
        self.restarts = 0
        self.gaps: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc: subprocess.Popen[str] | None = None
        self._path = f"/apis/joblease.io/v1alpha1/namespaces/{namespace}/{plural}"
        listed = self._kubectl_raw(self._path)
        for item in listed.get("items", []):
            self._record(item)
        self._rv = str(listed["metadata"]["resourceVersion"])
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _kubectl_raw(self, path: str) -> dict[str, Any]:
        result = subprocess.run(
            [kubectl_binary(), "--kubeconfig", self.kubeconfig, "get", "--raw", path],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        listed: dict[str, Any] = json.loads(result.stdout)
        return listed

    def _record(self, obj: Mapping[str, Any]) -> None:
        meta, status = obj["metadata"], dict(obj.get("status") or {})
        with self._lock:
            self.served[meta["name"]].append(status)
            self.events += 1
            if self._log is not None:
                self._log.write(json.dumps({"name": meta["name"], "status": status,
                                            "resourceVersion": meta.get("resourceVersion")})
                                + "\n")
                self._log.flush()

    def _run(self) -> None:
        while not self._stop.is_set():
            url = (f"{self._path}?watch=1&allowWatchBookmarks=true&timeoutSeconds=300"
                   f"&resourceVersion={self._rv}")
            self._proc = subprocess.Popen(
                [kubectl_binary(), "--kubeconfig", self.kubeconfig, "get", "--raw", url],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
            assert self._proc.stdout is not None
            for line in self._proc.stdout:  # one watch event per line
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    self.gaps.append(f"watch error after {self._rv}: {obj.get('message')}")
                    self._stop.set()
                    break
                self._rv = str(obj["metadata"]["resourceVersion"])
                if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                    self._record(obj)
            self._proc.wait()
            if not self._stop.is_set():
                self.restarts += 1
                self._stop.wait(0.2)  # the server ended the watch: resume right away

    def snapshot(self) -> dict[str, list[dict[str, Any]]]:
        with self._lock:
            return {k: list(v) for k, v in self.served.items()}

    def last(self, name: str) -> dict[str, Any]:
        with self._lock:
            return next((s for s in reversed(self.served.get(name, [])) if s), {})

    def stop(self) -> None:
        self._stop.set()
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            self._proc.wait()
        self._thread.join(timeout=10)
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
