"""CPU per cycle, the client's and etcd's, beside wall time: on/off ratios that a
busy machine moves less than it moves cycles/s.

A side's cycles/s on a shared 2-core machine swings with whatever else runs
(the same side's rounds of one run have differed 3x); the CPU a cycle costs
swings much less, because time spent waiting for a core is not counted. Each
timed round records, beside its wall time:

- the **client's** CPU seconds (``time.process_time``: every thread of this
  process, gRPC's included);
- **etcd's** CPU seconds (``/proc/<pid>/stat`` utime + stime of the etcd the
  bench started, all its threads; clock ticks, so 10 ms resolution);
- a **reference**: a fixed pure-Python loop run just before and just after the
  round, timed with ``time.thread_time`` (this thread only). A host that runs
  slower (a busy sibling hyperthread, frequency, cache pressure) shows as a
  slower reference, and each cost is also reported relative to it (cost /
  reference, "reference loops per cycle"), which takes that out of the ratio.

Sides run in alternating rounds (on, off, off, on, ...); round k of one side is
paired with round k of the other (they ran next to each other), each pair gives
a ratio, and a row's ratio is the **median of its paired ratios**. Every ratio
is oriented like the wall one, "on/off, higher is better": cycles/s on/off,
and for CPU, cycles per CPU second on/off (= CPU per cycle off / on), so the
issues' ">= 0.9x" target reads the same on each.

Used by bench/auth_claims.py, bench/queues.py (``--parts history``) and the
history side of bench/claims.py.
"""

from __future__ import annotations

import os
import statistics
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")

#: Iterations of the reference loop: about 20-40 ms of one core on this machine.
REFERENCE_ITERATIONS = 200_000


def parse_stat_cpu(text: str, clk_tck: int = CLK_TCK) -> float:
    """utime + stime, in seconds, from the text of ``/proc/<pid>/stat``.

    The second field (the command, in parentheses) may itself hold spaces and
    parentheses, so the fields are counted from the *last* ``)``: after it come
    field 3 (state) onwards; utime and stime are fields 14 and 15 (proc(5))."""
    rest = text[text.rindex(")") + 1:].split()
    return (int(rest[11]) + int(rest[12])) / clk_tck


def proc_cpu_seconds(pid: int) -> float:
    """CPU seconds process ``pid`` has used so far, all its threads, exited ones
    included (Linux; clock-tick resolution)."""
    return parse_stat_cpu(Path(f"/proc/{pid}/stat").read_text())


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Nanoseconds on a CPU of each live thread of ``pid``
    (``/proc/<pid>/task/<tid>/schedstat``, first field): finer than
    :func:`proc_cpu_seconds`' ticks, but a thread that exits takes its time with it."""
    out: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            out[int(task.name)] = int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue  # exited while we looked
    return out


def threads_delta_s(earlier: Mapping[Any, int], later: Mapping[Any, int]) -> float:
    """CPU seconds the threads used between two :func:`thread_cpu_ns` readings:
    the growth of those alive at both, all of those born in between (a thread that
    exited in between is missed: the Go runtime rarely ends a thread)."""
    return sum(ns - earlier.get(key, 0) for key, ns in later.items()) / 1e9


@dataclass(frozen=True)
class Snapshot:
    """Wall clock, this process's CPU and the etcd processes' CPU at one moment."""

    wall: float
    client_cpu: float
    #: etcd's threads' CPU ns (:func:`thread_cpu_ns`), keyed by (pid, tid)
    etcd_threads: dict[tuple[int, int], int] | None
    #: etcd's CPU seconds from /proc/<pid>/stat (ticks): a cross-check
    etcd_cpu: float | None

    @classmethod
    def take(cls, etcd_pids: Sequence[int] = ()) -> Snapshot:
        if not etcd_pids:
            return cls(time.perf_counter(), time.process_time(), None, None)
        threads = {(p, t): ns for p in etcd_pids for t, ns in thread_cpu_ns(p).items()}
        etcd = sum(proc_cpu_seconds(p) for p in etcd_pids)
        return cls(time.perf_counter(), time.process_time(), threads, etcd)

    def until(self, later: Snapshot) -> dict[str, float | None]:
        """What the interval from this snapshot to ``later`` cost: ``etcd_cpu_s``
        from the threads' ns, ``etcd_cpu_ticks_s`` from the ticks."""
        etcd = ticks = None
        if self.etcd_threads is not None and later.etcd_threads is not None:
            etcd = threads_delta_s(self.etcd_threads, later.etcd_threads)
        if self.etcd_cpu is not None and later.etcd_cpu is not None:
            ticks = later.etcd_cpu - self.etcd_cpu
        return {"wall_s": later.wall - self.wall,
                "client_cpu_s": later.client_cpu - self.client_cpu,
                "etcd_cpu_s": etcd, "etcd_cpu_ticks_s": ticks}


def _reference_work(n: int) -> int:
    acc = 0
    table: dict[int, int] = {}
    for i in range(n):
        acc = (acc * 31 + i) & 0xFFFFFFFF
        table[i & 1023] = acc
    return acc + len(table)


@dataclass(frozen=True)
class Reference:
    """One run of the reference loop: its CPU (this thread) and wall seconds."""

    cpu_s: float
    wall_s: float

    @classmethod
    def run(cls, iterations: int = REFERENCE_ITERATIONS) -> Reference:
        w, c = time.perf_counter(), time.thread_time()
        _reference_work(iterations)
        return cls(time.thread_time() - c, time.perf_counter() - w)


@dataclass(frozen=True)
class RoundCost:
    """One timed round of one side: its cycles, what they cost, the reference
    around it (the mean of the runs before and after)."""

    side: str
    cycles: int
    wall_s: float
    client_cpu_s: float
    etcd_cpu_s: float | None
    reference_cpu_s: float
    reference_wall_s: float

    @classmethod
    def of(cls, side: str, cycles: int, cost: dict[str, Any], before: Reference,
           after: Reference) -> RoundCost:
        """``cost``: :meth:`Snapshot.until`'s answer for the timed part of the round."""
        return cls(side, cycles, cost["wall_s"], cost["client_cpu_s"], cost["etcd_cpu_s"],
                   (before.cpu_s + after.cpu_s) / 2, (before.wall_s + after.wall_s) / 2)

    def per_cycle_ms(self) -> dict[str, float | None]:
        """Wall, client, etcd and total CPU ms per cycle; ``*_ref``: the same over
        the reference loop's CPU ms (unitless: reference loops per cycle)."""
        n = max(self.cycles, 1)
        out: dict[str, float | None] = {
            "wall_ms": 1000 * self.wall_s / n,
            "client_cpu_ms": 1000 * self.client_cpu_s / n,
            "etcd_cpu_ms": None if self.etcd_cpu_s is None else 1000 * self.etcd_cpu_s / n,
        }
        etcd, client = out["etcd_cpu_ms"], out["client_cpu_ms"]
        out["total_cpu_ms"] = None if etcd is None or client is None else client + etcd
        ref_ms = 1000 * self.reference_cpu_s
        for key in ("wall_ms", "client_cpu_ms", "etcd_cpu_ms", "total_cpu_ms"):
            v = out[key]
            out[key.replace("_ms", "_ref")] = None if v is None or ref_ms <= 0 else v / ref_ms
        return out

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), **{k: _round(v) for k, v in self.per_cycle_ms().items()}}


#: The per-cycle measures a ratio is taken of, and what the ratio is called.
#: Wall uses the raw ms (cycles/s on/off); CPU the reference-relative cost, and
#: ``total_cpu_unscaled`` the plain ms (to show what the reference changes).
RATIOS = {"wall": "wall_ms", "client_cpu": "client_cpu_ref", "etcd_cpu": "etcd_cpu_ref",
          "total_cpu": "total_cpu_ref", "total_cpu_unscaled": "total_cpu_ms"}


def pairs(rounds: Iterable[RoundCost], off: str, on: str) -> list[tuple[RoundCost, RoundCost]]:
    """Round k of side ``off`` with round k of side ``on``, in the order they ran."""
    by_side: dict[str, list[RoundCost]] = {off: [], on: []}
    for r in rounds:
        if r.side in by_side:
            by_side[r.side].append(r)
    if len(by_side[off]) != len(by_side[on]):
        raise ValueError(f"unpaired rounds: {len(by_side[off])} {off!r}, "
                         f"{len(by_side[on])} {on!r}")
    return list(zip(by_side[off], by_side[on], strict=True))


def pair_ratios(off_round: RoundCost, on_round: RoundCost) -> dict[str, float | None]:
    """on/off, higher is better: per-cycle cost off / on for each of :data:`RATIOS`."""
    a, b = off_round.per_cycle_ms(), on_round.per_cycle_ms()
    out: dict[str, float | None] = {}
    for name, key in RATIOS.items():
        x, y = a[key], b[key]
        out[name] = None if x is None or y is None or y <= 0 else x / y
    return out


def _median(values: Iterable[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def summarize(rounds: Sequence[RoundCost], off: str, on: str) -> dict[str, Any]:
    """A row's CPU report: per side the median of its rounds' per-cycle costs; the
    median of the paired ratios (``ratio_wall``, ``ratio_client_cpu``, ...); the
    paired ratios themselves and every round."""
    paired = pairs(rounds, off, on)
    ratios = [pair_ratios(a, b) for a, b in paired]
    out: dict[str, Any] = {}
    for side in (off, on):
        costs = [r.per_cycle_ms() for r in rounds if r.side == side]
        out[side] = {k: _round(_median(c[k] for c in costs)) for k in costs[0]} if costs else {}
        out[side]["reference_cpu_ms"] = _round(_median(
            1000 * r.reference_cpu_s for r in rounds if r.side == side))
    for name in RATIOS:
        out[f"ratio_{name}"] = _round(_median(p[name] for p in ratios), 3)
    out["pairs"] = [{k: _round(v, 3) for k, v in p.items()} for p in ratios]
    out["rounds"] = [r.as_dict() for r in rounds]
    return out


async def measured(side: str, run: Callable[[], Awaitable[dict[str, Any]]]
                   ) -> tuple[dict[str, Any], RoundCost]:
    """Run one round, bracketed by the reference loop. ``run``'s result holds
    ``cycles`` and ``cpu`` (:meth:`Snapshot.until` around its timed part only, so
    set-up such as registering jobs or filling a queue is not counted)."""
    before = Reference.run()
    result = await run()
    after = Reference.run()
    return result, RoundCost.of(side, result["cycles"], result["cpu"], before, after)


def pids_of(cluster: Any) -> list[int]:
    """The pids of a :class:`joblease.embedded.EtcdCluster`'s running members."""
    return [m.process.pid for m in cluster.members if m.process is not None]


def format_row(label: str, summary: dict[str, Any], off: str, on: str) -> str:
    """Two lines: per side the ms per cycle (wall, client CPU, etcd CPU); then the
    median paired ratios on/off (higher is better), wall and CPU side by side."""
    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    def ratio(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    lines = []
    for side in (off, on):
        s = summary[side]
        lines.append(f"{label:>6}  {side:<5} per cycle: wall {ms(s.get('wall_ms'))} ms, "
                     f"client CPU {ms(s.get('client_cpu_ms'))} ms, "
                     f"etcd CPU {ms(s.get('etcd_cpu_ms'))} ms "
                     f"(reference loop {ms(s.get('reference_cpu_ms'))} ms)")
    lines.append(f"{label:>6}  median of {len(summary['pairs'])} paired rounds, {on}/{off} "
                 f"(higher is better): cycles/s {ratio(summary['ratio_wall'])}, per CPU-s: "
                 f"client {ratio(summary['ratio_client_cpu'])}, "
                 f"etcd {ratio(summary['ratio_etcd_cpu'])}, "
                 f"total {ratio(summary['ratio_total_cpu'])} "
                 f"({ratio(summary['ratio_total_cpu_unscaled'])} without the reference)")
    return "\n".join(lines)


def parse_rpc_counts(metrics: str) -> dict[str, int]:
    """gRPC calls etcd has handled, by method (all codes), from its ``/metrics``
    text (``grpc_server_handled_total{...,grpc_method="Txn",...} 42``)."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if not line.startswith("grpc_server_handled_total{"):
            continue
        labels, _, value = line.rpartition(" ")
        method = labels.split('grpc_method="', 1)[1].split('"', 1)[0]
        counts[method] = counts.get(method, 0) + int(float(value))
    return counts


def etcd_rpc_counts(endpoint: str) -> dict[str, int]:
    """:func:`parse_rpc_counts` of the etcd serving ``endpoint`` (``host:port``, plain
    HTTP): e.g. how many ``Authenticate`` calls a round made."""
    with urllib.request.urlopen(f"http://{endpoint}/metrics", timeout=5) as resp:
        return parse_rpc_counts(resp.read().decode())
