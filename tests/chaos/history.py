"""An append-only history of operations, one JSON object per line.

Every worker *process* appends to its own file (``O_APPEND``, one ``write``
per line, no buffering: a SIGKILL loses at most the line being written, never
a line already returned), and the runner merges the files afterwards.

An operation is recorded twice: an ``invoke`` line before it is sent, then
one outcome line with the same ``op`` id: ``ok`` (the system said yes),
``fail`` (it said no: ``reason`` is the error word, e.g. ``stale``, ``held``)
or ``unknown`` (no answer: timeout, dropped connection, dead sidecar). An
invoke without an outcome line (the process was killed) counts as unknown.

In queue runs ``job`` is the item (``<namespace>/<queue>/<id>``): an item is a
job of its queue. A next-item claim's invoke names no item (``extra.queue``
says which queue); its ``ok`` outcome carries the item it got.

``lost`` is not an operation but an observation: the worker found its lease
lost (``reason`` is the library's or the sidecar's loss reason), recorded as
an invoke and an ``ok`` line like everything else.

Times are the worker's own ``wall`` (``time.time()``) and ``mono``
(``time.monotonic()``). Under libfaketime both are fake, so the checker never
orders operations of different processes by them; it orders by tokens,
generations and the destinations' own sequence numbers.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: ``enqueue`` (queue runs, tests/chaos/queue_runner.py): the runner's own operation;
#: ``job`` is the queue, ``extra.ids`` the batch's item ids, ``extra.poison`` the ones
#: no worker ever completes. An acknowledged enqueue promises every id of its batch.
KINDS = ("claim", "complete", "write", "release", "lost", "enqueue")
PHASES = ("invoke", "ok", "fail", "unknown")


@dataclass
class Op:
    """One line of a history."""

    op: str                      # "<process>:<n>", shared by an invoke and its outcome
    process: str
    kind: str                    # claim / complete / write / release / lost
    phase: str                   # invoke / ok / fail / unknown
    job: str | None = None
    token: int | None = None
    generation: int | None = None
    resource: str | None = None  # writes: "<destination>/<resource>"
    key: str | None = None       # writes: the idempotency key
    reason: str | None = None    # fail / unknown: "stale", "held", "timeout", ...
    checked: bool | None = None  # writes: ensure_valid() passed just before
    wall: float = 0.0
    mono: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        d = asdict(self)
        return json.dumps({k: v for k, v in d.items() if v not in (None, {})},
                          separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Op:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})


class History:
    """The history writer of one process (thread-safe)."""

    def __init__(self, path: str | Path, process: str) -> None:
        self.path = Path(path)
        self.process = process
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._n = 0
        self._lock = threading.Lock()

    def _write(self, op: Op) -> Op:
        op.wall, op.mono = time.time(), time.monotonic()
        os.write(self._fd, (op.to_json() + "\n").encode())
        return op

    def invoke(self, kind: str, **fields: Any) -> Op:
        assert kind in KINDS, kind
        with self._lock:
            self._n += 1
            n = self._n
        return self._write(Op(op=f"{self.process}:{n}", process=self.process, kind=kind,
                              phase="invoke", **fields))

    def _outcome(self, inv: Op, phase: str, fields: dict[str, Any]) -> Op:
        base = {k: getattr(inv, k) for k in ("job", "token", "generation", "resource", "key",
                                             "checked")}
        base.update(fields)
        return self._write(Op(op=inv.op, process=self.process, kind=inv.kind, phase=phase,
                              **base))

    def ok(self, inv: Op, **fields: Any) -> Op:
        return self._outcome(inv, "ok", fields)

    def fail(self, inv: Op, reason: str, **fields: Any) -> Op:
        return self._outcome(inv, "fail", {"reason": reason, **fields})

    def unknown(self, inv: Op, reason: str, **fields: Any) -> Op:
        return self._outcome(inv, "unknown", {"reason": reason, **fields})

    def close(self) -> None:
        os.close(self._fd)


def read(path: str | Path) -> list[Op]:
    """One history file; a torn last line (SIGKILL mid-write) is skipped."""
    ops = []
    for line in Path(path).read_text().splitlines():
        try:
            ops.append(Op.from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return ops


def merge(paths: Iterable[str | Path]) -> list[Op]:
    """All files' operations; each process's own order is kept."""
    ops: list[Op] = []
    for p in sorted(Path(x) for x in paths):
        ops.extend(read(p))
    return ops


def write(path: str | Path, ops: Iterable[Op]) -> None:
    Path(path).write_text("".join(op.to_json() + "\n" for op in ops))


@dataclass
class Operation:
    """An invoke paired with its outcome (``phase`` is the outcome's)."""

    invoke: Op
    outcome: Op | None

    @property
    def phase(self) -> str:
        return self.outcome.phase if self.outcome is not None else "unknown"

    def get(self, name: str) -> Any:
        if self.outcome is not None and getattr(self.outcome, name) is not None:
            return getattr(self.outcome, name)
        return getattr(self.invoke, name)

    @property
    def kind(self) -> str:
        return self.invoke.kind

    @property
    def job(self) -> str | None:
        return self.get("job")  # type: ignore[no-any-return]

    @property
    def token(self) -> int | None:
        return self.get("token")  # type: ignore[no-any-return]

    @property
    def generation(self) -> int | None:
        return self.get("generation")  # type: ignore[no-any-return]

    @property
    def reason(self) -> str | None:
        if self.outcome is None:
            return "no outcome recorded (process died)"
        return self.outcome.reason

    def describe(self) -> str:
        o = self.outcome or self.invoke
        return (f"{self.invoke.op} {self.kind} {self.phase} job={self.job} token={self.token} "
                f"gen={self.generation}" + (f" resource={o.resource}" if o.resource else "")
                + (f" key={o.key}" if o.key else "")
                + (f" reason={self.reason}" if self.phase != "ok" else ""))


def pair(ops: Iterable[Op]) -> list[Operation]:
    """Invokes matched with their outcomes, in invoke order (per process)."""
    invokes: dict[str, Op] = {}
    outcomes: dict[str, Op] = {}
    order: list[str] = []
    for op in ops:
        if op.phase == "invoke":
            if op.op not in invokes:
                order.append(op.op)
            invokes[op.op] = op
        else:
            outcomes[op.op] = op
    return [Operation(invokes[i], outcomes.get(i)) for i in order]
