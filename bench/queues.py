"""Queues (docs/queues.md) side by side with their baselines, in one run, on one etcd.

Every part runs the library and its baseline in the same process, against the
same etcd, through the same gRPC client (joblease.etcd_store.EtcdStore), in
rounds whose order rotates (so no side always runs on a warmer or quieter
etcd); a side's figure is its total work over its total time across rounds.

1. **enqueue**: ``Queues.enqueue`` in batches of ``--batch`` items, against the
   raw transactions it sends: the same compares and puts (``Q/items/<id>``,
   ``Q/pending/<id>``) in 64-item transactions, records encoded beforehand,
   without the library's read of the batch (the idempotency check) and
   validation. Target: >= 10,000 items/s batched.
2. **claim+complete** on one queue at concurrency 1, 8, 64
   (``Queues.claim_next`` then ``lease.complete``), against (a) **raw**: the
   same claim and completion transactions through EtcdStore on items whose
   keys and pending revisions are known (no candidate read), and (b)
   **jobs**: separate JobLeases (``JobLeaseClient.claim`` + ``complete``,
   ``bench.claims.bench_joblease``). Target: queue >= 0.8x raw at 64.
3. **backlog**: claim+complete cycles/s on a queue with 1,000 pending items
   and on one with 100,000 (``--backlogs``), interleaved; plus the time of one
   candidate read (the read-only transaction ``claim_next`` sends when its
   pool is empty) at each backlog, which explains the difference.
   Target: drop <= 10 %.
4. **sidecar**: items/s through one Go sidecar draining a queue with a trivial
   worker (``GET /v1/lease?wait=10``, or polled 1 ms apart, then
   ``POST /v1/complete``; side ``sidecar_next``: one exchange per item,
   ``POST /v1/complete?next=10`` answering with the next item), against the library's
   ``claim_next`` + ``complete`` at concurrency 1 on a queue of the same size
   (one claimer, as one sidecar is); each way with a raw-socket HTTP/1.1 worker
   too (``sidecar_raw``, ``sidecar_raw_next``: the least a worker can cost) and
   the sidecar's CPU per item. Target: >= 200 items/s per pod. After
   each drain, ``EXCHANGES`` plain ``GET /v1/lease`` of the drained sidecar
   (no etcd behind them) time the worker's HTTP exchange alone ("one GET").
5. **history**: claim+complete cycles/s of items on a queue with
   ``historyLimit`` 3 (each claim also puts the item's tenure and compares its
   generation) against one with none, at ``--history-concurrency``, in
   rotated rounds; and the etcd keys and bytes of one item's history at the
   limit (``limit + 5`` claims, each tenure with a checkpoint, a refused
   completion and a release: all four keys) and of an item claimed once and
   completed, the usual case (docs/history.md, "Queue items"). Beside the
   cycles/s, each round's client and etcd CPU per cycle (bench/cpu_cost.py)
   and the medians of the paired rounds' ratios, which a busy machine moves
   less than it moves cycles/s. Run only when named (``--parts history``).

    python bench/queues.py [--quick] [--json bench/results/queue.json]
    python bench/queues.py --parts history --json bench/results/queue-history.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import inspect
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench import cpu_cost  # noqa: E402
from bench.claims import bench_joblease, pct  # noqa: E402
from bench.cpu_cost import Snapshot  # noqa: E402
from bench.etcd_binary import etcd_binary_or_none  # noqa: E402
from bench.report import save  # noqa: E402
from joblease import EtcdConfig, JobLeaseClient  # noqa: E402
from joblease.embedded import EtcdCluster  # noqa: E402
from joblease.errors import StaleTokenError  # noqa: E402
from joblease.keys import ItemRef, QueueKeys, QueueRef  # noqa: E402
from joblease.queue import Queues  # noqa: E402
from joblease.records import Holder, ItemRecord, PendingRecord, QueueSpec  # noqa: E402
from joblease.store import Compare, Delete, Get, Put  # noqa: E402
from joblease.validation import ENQUEUE_CHUNK  # noqa: E402

TTL = 30
MAX_ATTEMPTS = 3
OWNER = "bench-worker"


def new_queue() -> QueueRef:
    return QueueRef("bench", f"q-{uuid.uuid4().hex[:8]}")


def items(n: int, start: int = 0) -> list[tuple[str, Any]]:
    return [(f"i{i:07d}", {"n": i}) for i in range(start, start + n)]


async def fill(queues: Queues, queue: QueueRef, n: int, start: int = 0,
               batch: int = 1000) -> None:
    """Put ``n`` items in (untimed set-up), several batches in flight."""
    sem = asyncio.Semaphore(4)

    async def one(lo: int) -> None:
        async with sem:
            await queues.enqueue(queue, items(min(batch, n - lo), start + lo))

    await asyncio.gather(*(one(lo) for lo in range(0, n, batch)))


def rotations(sides: list[Any], rounds: int) -> list[list[Any]]:
    """Round r runs ``sides`` rotated by r: each side is first, middle and last in turn."""
    return [sides[r % len(sides):] + sides[:r % len(sides)] for r in range(rounds)]


def combine(runs: list[dict[str, Any]], unit: str) -> dict[str, Any]:
    """Total work over total time across rounds, latencies pooled."""
    done = sum(r["n"] for r in runs)
    seconds = sum(r["seconds"] for r in runs)
    out: dict[str, Any] = {unit: done, "seconds": round(seconds, 3),
                           f"{unit}_per_s": round(done / seconds, 1) if seconds else 0.0,
                           "rounds_per_s": [round(r["n"] / r["seconds"], 1) for r in runs]}
    if all("txns" in r for r in runs) and done:
        out["txns_per_cycle"] = round(sum(r["txns"] for r in runs) / done, 3)
        out["reads_per_cycle"] = round(sum(r["reads"] for r in runs) / done, 3)
    for name in ("claim", "complete", "batch", "exchange"):
        lat = [x for r in runs for x in r.get(name, [])]
        if lat:
            out[f"{name}_p50_ms"] = round(pct(lat, 0.5) * 1000, 2)
            out[f"{name}_p99_ms"] = round(pct(lat, 0.99) * 1000, 2)
    return out


# -- 1. enqueue ----------------------------------------------------------------------------

async def enqueue_library(client: JobLeaseClient, n: int, batch: int, in_flight: int
                          ) -> dict[str, Any]:
    queues = Queues(client)
    queue = new_queue()
    await queues.create(queue, QueueSpec(TTL, MAX_ATTEMPTS))
    batches = [items(min(batch, n - lo), lo) for lo in range(0, n, batch)]
    lat: list[float] = []

    async def worker() -> None:
        while batches:
            b = batches.pop()
            t = time.perf_counter()
            r = await queues.enqueue(queue, b)
            lat.append(time.perf_counter() - t)
            assert len(r.added) == len(b), "a fresh queue: every item is new"

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.perf_counter() - start
    counts = await queues.counts(queue)
    assert counts.pending == n, counts
    return {"n": n, "seconds": seconds, "batch": lat}


async def enqueue_raw(client: JobLeaseClient, n: int, batch: int, in_flight: int
                      ) -> dict[str, Any]:
    """The transactions ``Queues.enqueue`` writes, built before the clock starts."""
    queues = Queues(client)
    queue = new_queue()
    await queues.create(queue, QueueSpec(TTL, MAX_ATTEMPTS))
    keys = queues.keys(queue)
    now = time.time()
    pending = PendingRecord(0, now).encode()
    txns: list[list[tuple[list[Compare], list[Put]]]] = []
    for lo in range(0, n, batch):
        chunks = []
        ids = [i for i, _ in items(min(batch, n - lo), lo)]
        for c in range(0, len(ids), ENQUEUE_CHUNK):
            compares = [Compare(keys.spec, "create", "!=", 0)]
            puts: list[Put] = []
            for item_id in ids[c:c + ENQUEUE_CHUNK]:
                ik = keys.item(item_id)
                compares.append(Compare(ik.item, "create", "==", 0))
                puts += [Put(ik.item, ItemRecord({"n": int(item_id[1:])}, now).encode()),
                         Put(ik.pending, pending)]
            chunks.append((compares, puts))
        txns.append(chunks)
    store = client.store
    lat: list[float] = []

    async def worker() -> None:
        while txns:
            chunks = txns.pop()
            t = time.perf_counter()
            for compares, puts in chunks:  # one transaction at a time, as enqueue sends them
                r = await store.txn(compares, puts, [Get(keys.spec)])
                assert r.succeeded
            lat.append(time.perf_counter() - t)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    seconds = time.perf_counter() - start
    counts = await queues.counts(queue)
    assert counts.pending == n, counts
    return {"n": n, "seconds": seconds, "batch": lat}


async def bench_enqueue(client: JobLeaseClient, n: int, batch: int, in_flight: list[int],
                        rounds: int) -> list[dict[str, Any]]:
    rows = []
    for conc in in_flight:
        runs: dict[str, list[dict[str, Any]]] = {"raw": [], "queue": []}
        for order in rotations(["raw", "queue"], rounds):
            for side in order:
                fn = enqueue_raw if side == "raw" else enqueue_library
                runs[side].append(await fn(client, n, batch, conc))
        row: dict[str, Any] = {"in_flight": conc, "batch": batch,
                               **{s: combine(r, "items") for s, r in runs.items()}}
        row["ratio"] = round(row["queue"]["items_per_s"] / row["raw"]["items_per_s"], 3)
        rows.append(row)
    return rows


# -- 2. claim + complete --------------------------------------------------------------------

async def pool(n: int, concurrency: int, cycle: Any,
               etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    """``n`` cycles by ``concurrency`` workers; latencies of both halves; ``cpu``:
    what they cost (bench/cpu_cost.py; etcd's CPU if its ``etcd_pids`` are given)."""
    left = [n]
    claim: list[float] = []
    complete: list[float] = []

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            c, d = await cycle()
            claim.append(c)
            complete.append(d)

    snap = Snapshot.take(etcd_pids)
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    seconds = time.perf_counter() - start
    return {"n": len(claim), "cycles": len(claim), "seconds": seconds,
            "cpu": snap.until(Snapshot.take(etcd_pids)), "claim": claim, "complete": complete}


async def cycles_queue(client: JobLeaseClient, n: int, concurrency: int, *,
                       backlog: int | None = None, queue: QueueRef | None = None,
                       queues: Queues | None = None, history_limit: int = 0,
                       etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    """``claim_next`` + ``complete`` through one :class:`Queues` (its claimers
    share one candidate pool, as a worker process's do)."""
    queues = queues or Queues(client)
    if queue is None:
        queue = new_queue()
        await queues.create(queue, QueueSpec(TTL, MAX_ATTEMPTS, history_limit=history_limit))
        # more than will be claimed, so the queue never runs dry mid-run
        await fill(queues, queue, (backlog or 0) + n + concurrency)

    async def cycle() -> tuple[float, float]:
        t0 = time.perf_counter()
        lease = await queues.claim_next(queue, OWNER)
        assert lease is not None, "the queue ran dry"
        t1 = time.perf_counter()
        await lease.complete({"ok": True})
        return t1 - t0, time.perf_counter() - t1

    # warm the spec cache and the session the way a running worker has them
    first = await queues.claim_next(queue, OWNER)
    assert first is not None
    await first.complete({"ok": True})
    with TxnCounter(client) as counted:
        out = await pool(n, concurrency, cycle, etcd_pids)
    out["txns"], out["reads"] = counted.txns, counted.reads
    return out


class TxnCounter:
    """Counts the transactions a side sends (read-only ones apart): how many
    round trips a cycle costs beyond the claim and the completion."""

    def __init__(self, client: JobLeaseClient) -> None:
        self.store = client.store
        self.txns = self.reads = 0

    def __enter__(self) -> TxnCounter:
        real = self.store.txn

        async def txn(compares: Any, success: Any, failure: Any = ()) -> Any:
            self.txns += 1
            if not compares and all(isinstance(op, Get) for op in success):
                self.reads += 1
            return await real(compares, success, failure)

        self.store.txn = txn  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        del self.store.txn  # the instance attribute: the class's method again


async def cycles_raw(client: JobLeaseClient, n: int, concurrency: int) -> dict[str, Any]:
    """The claim and completion transactions ``claim_next`` + ``complete``
    send, on items whose keys and pending revisions were read beforehand."""
    queues = Queues(client)
    queue = new_queue()
    await queues.create(queue, QueueSpec(TTL, MAX_ATTEMPTS))
    await fill(queues, queue, n)
    keys: QueueKeys = queues.keys(queue)
    store = client.store
    spec_rev, _ = await queues.spec(queue)
    pending_prefix = keys.field_prefix("pending")
    _, kvs = await store.get(pending_prefix, prefix=True)
    todo = [(kv.key[len(pending_prefix):].decode(), kv.mod_revision) for kv in kvs]
    lease_id, _ = await store.grant(TTL)
    holder_value = Holder.encode_value(OWNER, "x" * 32, TTL, time.time())
    claim_value = json.dumps({"owner": OWNER, "claimId": "x" * 32},
                             separators=(",", ":")).encode()
    result_value = json.dumps({"owner": OWNER, "claimId": "x" * 32, "token": 0,
                               "generation": 1, "result": {"ok": True},
                               "completedAt": time.time()}).encode()

    async def cycle() -> tuple[float, float]:
        item_id, pending_rev = todo.pop()
        k = keys.item(item_id)
        t0 = time.perf_counter()
        r = await store.txn(
            [Compare(k.spec, "mod", "==", spec_rev), Compare(k.holder, "create", "==", 0),
             Compare(k.result, "version", "==", 0),
             Compare(k.claims, "version", "<", MAX_ATTEMPTS),
             Compare(k.pending, "mod", "==", pending_rev)],
            [Put(k.holder, holder_value, lease=lease_id), Put(k.claims, claim_value),
             Get(k.claims), Get(k.checkpoint), Get(k.item)],
            [Get(k.spec), Get(k.holder), Get(k.result), Get(k.claims), Get(k.pending)])
        assert r.succeeded
        t1 = time.perf_counter()
        r2 = await store.txn(
            [Compare(k.holder, "create", "==", r.revision),
             Compare(k.holder, "value", "==", holder_value)],
            [Put(k.result, result_value), Delete(k.holder), Delete(k.pending)],
            [Get(k.holder), Get(k.result)])
        assert r2.succeeded
        return t1 - t0, time.perf_counter() - t1

    try:
        return await pool(n, concurrency, cycle)
    finally:
        await store.revoke(lease_id)


async def cycles_jobs(config: EtcdConfig, n: int, concurrency: int) -> dict[str, Any]:
    """Separate JobLeases: bench/claims.py's library side, unchanged."""
    r = await bench_joblease(config, n, concurrency)
    # bench_joblease reports percentiles only; keep its figures as they are
    return {"n": r["cycles"], "seconds": r["seconds"], "pcts": r}


def combine_jobs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out = combine(runs, "cycles")
    # pooled latencies are not available from bench_joblease: the worst round's percentiles
    out["claim_p50_ms"] = max(r["pcts"]["claim_p50_ms"] for r in runs)
    out["claim_p99_ms"] = max(r["pcts"]["claim_p99_ms"] for r in runs)
    out["complete_p50_ms"] = max(r["pcts"]["complete_p50_ms"] for r in runs)
    out["complete_p99_ms"] = max(r["pcts"]["complete_p99_ms"] for r in runs)
    return out


async def bench_cycles(client: JobLeaseClient, config: EtcdConfig, n: int,
                       concurrency: list[int], rounds: int) -> list[dict[str, Any]]:
    rows = []
    for conc in concurrency:
        m = n if conc > 1 else max(50, n // 4)
        runs: dict[str, list[dict[str, Any]]] = {"raw": [], "queue": [], "jobs": []}
        for order in rotations(["raw", "queue", "jobs"], rounds):
            for side in order:
                if side == "raw":
                    runs[side].append(await cycles_raw(client, m, conc))
                elif side == "queue":
                    runs[side].append(await cycles_queue(client, m, conc))
                else:
                    runs[side].append(await cycles_jobs(config, m, conc))
        row: dict[str, Any] = {"concurrency": conc,
                               "raw": combine(runs["raw"], "cycles"),
                               "queue": combine(runs["queue"], "cycles"),
                               "jobs": combine_jobs(runs["jobs"])}
        q = row["queue"]["cycles_per_s"]
        row["ratio_raw"] = round(q / row["raw"]["cycles_per_s"], 3)
        row["ratio_jobs"] = round(q / row["jobs"]["cycles_per_s"], 3)
        rows.append(row)
    return rows


# -- 3. backlog -----------------------------------------------------------------------------

async def candidate_read_ms(queues: Queues, queue: QueueRef, reads: int) -> float:
    """The median time of the read ``claim_next`` sends to fill its pool."""
    keys = queues.keys(queue)
    pending = (await queues.counts(queue)).pending
    times = []
    for _ in range(reads):
        t = time.perf_counter()
        if len(inspect.signature(queues._candidates).parameters) == 3:
            await queues._candidates(keys, 0, pending)
        else:  # queue.py before the read-ahead scaled with the backlog
            await queues._candidates(keys, 0)  # type: ignore[call-arg]
        times.append(time.perf_counter() - t)
    return round(pct(times, 0.5) * 1000, 2)


async def bench_backlog(client: JobLeaseClient, backlogs: list[int], n: int,
                        concurrency: int, rounds: int) -> dict[str, Any]:
    queues = Queues(client)
    made: dict[int, QueueRef] = {}
    setup: dict[int, float] = {}
    for b in backlogs:
        q = new_queue()
        await queues.create(q, QueueSpec(TTL, MAX_ATTEMPTS))
        t = time.perf_counter()
        # each round takes n (+1 warm-up) items: the backlog never falls below b
        await fill(queues, q, b + rounds * (n + 1 + concurrency))
        setup[b] = round(time.perf_counter() - t, 2)
        made[b] = q
    runs: dict[int, list[dict[str, Any]]] = {b: [] for b in backlogs}
    # One Queues (one candidate pool) per queue across the rounds, as a
    # long-running worker has: a fresh one pays a short first read (it has
    # not counted the backlog yet) and then a full one, which would weigh on
    # a short round as no running worker feels it.
    workers = {b: Queues(client) for b in backlogs}
    for order in rotations(list(backlogs), rounds):
        for b in order:
            runs[b].append(await cycles_queue(client, n, concurrency, queue=made[b],
                                              queues=workers[b]))
    rows = []
    for b in backlogs:
        row = {"backlog": b, "enqueue_setup_s": setup[b],
               "candidate_read_ms": await candidate_read_ms(queues, made[b], 9),
               **combine(runs[b], "cycles")}
        rows.append(row)
    base = rows[0]["cycles_per_s"]
    for row in rows:
        row["drop"] = round(1 - row["cycles_per_s"] / base, 3) if base else None
    for q in made.values():
        await queues.delete(q)
    return {"concurrency": concurrency, "rows": rows}


# -- 5. item history on vs off ---------------------------------------------------------------

#: The JobQueue default (validation.DEFAULT_QUEUE_HISTORY_LIMIT), measured on the history side.
QUEUE_HISTORY_LIMIT = 3


async def bench_history(client: JobLeaseClient, n: int, concurrency: list[int],
                        rounds: int, etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    rows = []
    for conc in concurrency:
        m = n if conc > 1 else max(50, n // 4)
        runs: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        costs: list[cpu_cost.RoundCost] = []
        for order in rotations(["off", "on"], rounds):
            for side in order:
                limit = QUEUE_HISTORY_LIMIT if side == "on" else 0
                result, cost = await cpu_cost.measured(side, functools.partial(
                    cycles_queue, client, m, conc, history_limit=limit, etcd_pids=etcd_pids))
                runs[side].append(result)
                costs.append(cost)
        row: dict[str, Any] = {"concurrency": conc,
                               **{side: combine(r, "cycles") for side, r in runs.items()}}
        row["ratio"] = round(row["on"]["cycles_per_s"] / row["off"]["cycles_per_s"], 3)
        row["cpu"] = cpu_cost.summarize(costs, "off", "on")
        rows.append(row)
    return {"limit": QUEUE_HISTORY_LIMIT, "rows": rows,
            "at_limit": await item_history_at_limit(client, QUEUE_HISTORY_LIMIT)}


def _size(kvs: list[Any]) -> int:
    return sum(len(kv.key) + len(kv.value) for kv in kvs)


async def item_history_at_limit(client: JobLeaseClient, limit: int) -> dict[str, Any]:
    """etcd keys and bytes (key + value) of one item's history at its limit,
    against the item's own keys; and of an item claimed once and completed."""
    queues = Queues(client)
    queue = new_queue()
    await queues.create(queue, QueueSpec(TTL, 0, history_limit=limit))
    item = "i0000001"
    await queues.enqueue(queue, [(item, {"file": "s3://bucket/part-000001"})])
    ref = ItemRef(queue, item)
    for _ in range(limit + 5):
        lease = await queues.claim(ref, "bench-worker-7d9f-x2k4q")
        await lease.checkpoint({"offset": 123456})
        await lease.release()
        with contextlib.suppress(StaleTokenError):  # a late completion, counted as refused
            await queues.complete_for(ref, "bench-worker-7d9f-x2k4q", lease.token)
    keys = queues.keys(queue).item(item)
    _, history = await client.store.get(keys.history.prefix, prefix=True)
    r = await client.store.txn([], [Get(k) for k in keys.fields().values() if k != keys.spec])
    own = [kv for i in range(len(keys.fields()) - 1) if (kv := r.kv(i)) is not None]
    once = "i0000002"
    await queues.enqueue(queue, [(once, {"file": "s3://bucket/part-000002"})])
    lease = await queues.claim(ItemRef(queue, once), "bench-worker-7d9f-x2k4q")
    await lease.complete({"rows": 1000})
    _, once_history = await client.store.get(queues.keys(queue).item(once).history.prefix,
                                             prefix=True)
    tenures = len((await queues.history(ref)).tenures)
    await queues.delete(queue)
    return {"limit": limit, "claims": limit + 5, "tenures": tenures,
            "history_keys": len(history), "history_bytes": _size(history),
            "item_keys": len(own), "item_bytes": _size(own),
            "once_history_keys": len(once_history), "once_history_bytes": _size(once_history)}


# -- 4. one Go sidecar draining a queue ---------------------------------------------------------

#: The sidecar's token files go to tmpfs where there is one, as in an injected
#: pod (its /run/joblease is an emptyDir with medium Memory): a disk would
#: measure the disk.
#: GET /v1/lease exchanges timed after each drain (the worker's HTTP cost alone).
EXCHANGES = 200

TOKEN_DIR = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


def sidecar_queue_mode() -> tuple[str | None, str]:
    """``(binary, "")`` if the Go sidecar can be had (built from this
    checkout by ``hack/build-sidecar``, or ``JOBLEASE_SIDECAR_GO``), else
    ``(None, why)``."""
    try:
        from tests.support.binaries import BinaryNotFound, go_sidecar_binary
    except ImportError as exc:
        return None, f"tests.support is not importable: {exc}"
    try:
        return go_sidecar_binary(), ""
    except BinaryNotFound as exc:
        return None, f"no Go sidecar binary: {exc}"


class RawHTTP:
    """The least a worker can be: one keep-alive HTTP/1.1 connection over a raw
    socket, requests written as bytes, answers read by ``Content-Length`` and
    parsed with ``json.loads`` (no HTTP library). Beside the ``httpx`` worker it
    shows what the sidecar costs without the cost of a Python HTTP client:
    ``httpx`` spends about 0.8 ms of the worker's CPU per exchange
    (docs/benchmarks.md, "Where an item's time goes"), this one a fraction."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> RawHTTP:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        """The status and the JSON body of one exchange on the connection."""
        assert self.reader is not None and self.writer is not None
        head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if body:
            head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        self.writer.write(head.encode() + b"\r\n" + body)
        status_line = await self.reader.readline()
        if not status_line:
            raise RuntimeError("the sidecar closed the connection")
        status, length = int(status_line.split()[1]), 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        data = await self.reader.readexactly(length) if length else b""
        return status, json.loads(data) if data else None


class HttpxWorker:
    """The ``httpx`` worker's exchanges, as :meth:`RawHTTP.request` answers them."""

    def __init__(self, port: int) -> None:
        self.http = httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=10)

    async def __aenter__(self) -> HttpxWorker:
        await self.http.__aenter__()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.http.__aexit__(None, None, None)

    async def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, Any]:
        r = await self.http.request(method, path, content=body or None,
                                    headers={"Content-Type": "application/json"} if body else None)
        return r.status_code, r.json() if r.content else None


#: the workers a sidecar side can have: ``httpx`` (the bench's first) and ``raw`` (RawHTTP)
WORKERS = {"httpx": HttpxWorker, "raw": RawHTTP}


def cpu_seconds(pid: int) -> float | None:
    """The process's user + system CPU time so far (/proc), or None where it cannot say."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


async def drain_sidecar(config: EtcdConfig, binary: str, n: int, *, poll: bool = False,
                        next_in_answer: bool = False, worker: str = "httpx") -> dict[str, Any]:
    """``n`` items through one Go sidecar draining a queue (docs/sidecar.md,
    "Queue mode") with a trivial worker: ``GET /v1/lease?wait=10`` (a long
    poll; with ``poll``, ``GET /v1/lease`` 1 ms apart) until it holds an item
    not seen yet, then ``POST /v1/complete`` under its token. With
    ``next_in_answer`` the completion is ``POST /v1/complete?next=10``, whose
    answer carries the next item (a GET only when it does not). ``worker``
    names its HTTP client (``WORKERS``). The queue has
    ``n + 1`` items: the first is worked untimed, as ``cycles_queue`` warms
    its side. ``complete`` is the POST's latency, ``claim`` the time from its
    answer until the next item is seen held (the sidecar's claim of the next
    item plus the worker's GETs; with ``next_in_answer`` the claim is inside
    the POST, and ``claim`` is only the GETs it still took). ``sidecar_cpu``:
    the sidecar process's CPU seconds over the timed items."""
    async with JobLeaseClient(config) as client:
        queues = Queues(client)
        queue = new_queue()
        await queues.create(queue, QueueSpec(TTL, MAX_ATTEMPTS))
        await fill(queues, queue, n + 1)
    with tempfile.TemporaryDirectory(dir=TOKEN_DIR) as tmp:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
        env.update({
            "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints),
            "JOBLEASE_ROOT": config.root, "JOBLEASE_QUEUE": str(queue),
            "POD_NAME": "bench-sidecar", "POD_UID": uuid.uuid4().hex[:8],
            "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PORT_FILE": f"{tmp}/port",
            "JOBLEASE_SIDECAR_PROBE_PORT": "-1", "JOBLEASE_TOKEN_FILE": f"{tmp}/token",
            "JOBLEASE_SIDECAR_ON_LOSS": "none", "JOBLEASE_SIDECAR_RATE_LIMIT": "off"})
        proc = subprocess.Popen([binary], env=env, stdout=subprocess.DEVNULL,  # noqa: ASYNC220
                                stderr=subprocess.DEVNULL)
        try:
            port_file = Path(tmp) / "port"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().strip()):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"sidecar exited ({proc.poll()}) or wrote no port")
                await asyncio.sleep(0.005)
            async with WORKERS[worker](int(port_file.read_text().strip())) as http:
                lease_path = "/v1/lease" if poll else "/v1/lease?wait=10"

                async def next_item(seen: set[str]) -> tuple[dict[str, Any], int]:
                    """The next item held (its GET /v1/lease body) and the polls it took."""
                    polls = 0
                    while True:
                        if proc.poll() is not None or time.monotonic() > deadline + 600:
                            raise RuntimeError(f"sidecar exited ({proc.poll()}) or stalled")
                        status, answer = await http.request("GET", lease_path)
                        body = answer if status == 200 else {}
                        if body.get("item") is not None and body["item"] not in seen:
                            return body, polls
                        polls += 1
                        await asyncio.sleep(0.001)  # between items: the next claim

                async def complete(body: dict[str, Any]) -> dict[str, Any] | None:
                    """Complete under its token; with ``next_in_answer``, the next
                    item held if the answer carries one. The last item's completion
                    asks for none: the queue stays open (no JOBLEASE_EXIT_WHEN_EMPTY,
                    as for the other sides), so it would wait out ``next``."""
                    ask = next_in_answer and len(done) < n
                    status, answer = await http.request(
                        "POST", "/v1/complete?next=10" if ask else "/v1/complete",
                        b'{"token": %d, "result": {"ok": true}}' % body["token"])
                    assert status == 200, answer
                    if ask and answer["nextStatus"] == 200:
                        held: dict[str, Any] = answer["next"]
                        return held
                    return None

                done: set[str] = set()
                body, _ = await next_item(done)  # the warm-up item (the sidecar's first claim)
                ahead = await complete(body)
                done.add(body["item"])
                claim: list[float] = []
                completion: list[float] = []
                polls = 0
                cpu0 = cpu_seconds(proc.pid)
                start = t = time.perf_counter()
                while len(done) < n + 1:
                    if ahead is not None and ahead["item"] not in done:
                        body, p = ahead, 0
                    else:
                        body, p = await next_item(done)
                    t1 = time.perf_counter()
                    ahead = await complete(body)
                    t2 = time.perf_counter()
                    claim.append(t1 - t)
                    completion.append(t2 - t1)
                    polls += p
                    done.add(body["item"])
                    t = t2
                seconds = time.perf_counter() - start
                cpu1 = cpu_seconds(proc.pid)
                # The worker's HTTP exchange alone: GET /v1/lease with no
                # etcd behind it (the queue is drained, the sidecar waiting: it
                # answers 503 at once), what each of the items' requests cost
                # the worker and the sidecar besides the transactions.
                exchange: list[float] = []
                for _ in range(EXCHANGES):
                    t0 = time.perf_counter()
                    await http.request("GET", "/v1/lease")
                    exchange.append(time.perf_counter() - t0)
                rss_kib = vm_rss_kib(proc.pid)
        finally:
            proc.terminate()
            await asyncio.to_thread(proc.wait, 10)
    return {"n": n, "seconds": seconds, "claim": claim, "complete": completion,
            "polls": polls, "exchange": exchange, "rss_kib": rss_kib,
            "sidecar_cpu": None if cpu0 is None or cpu1 is None else cpu1 - cpu0}


def vm_rss_kib(pid: int) -> int | None:
    """The process's resident set (VmRSS, KiB), or None where /proc cannot say."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


#: the sidecar sides: (worker, poll, next_in_answer, run the compare binary)
SIDECAR_SIDES: dict[str, tuple[str, bool, bool, bool]] = {
    "sidecar": ("httpx", False, False, False),
    "sidecar_next": ("httpx", False, True, False),
    "sidecar_poll": ("httpx", True, False, False),
    "sidecar_raw": ("raw", False, False, False),
    "sidecar_raw_next": ("raw", False, True, False),
    "sidecar_compare": ("httpx", False, False, True),
    "sidecar_compare_raw_next": ("raw", False, True, True),
}


async def bench_sidecar(config: EtcdConfig, binary: str, n: int, rounds: int,
                        compare: str | None = None) -> dict[str, Any]:
    """Items/s through one sidecar against its baseline in the same run: the
    library's ``claim_next`` + ``complete`` at concurrency 1 (one claimer, as
    one sidecar is) on a queue of the same size, rounds rotated. The sidecar
    sides (``SIDECAR_SIDES``) differ by worker: ``httpx``, or ``raw``
    (:class:`RawHTTP`, the least a worker can be), waiting (``?wait=10``),
    polling or taking the next item in the completion's answer. ``compare``:
    another sidecar binary (e.g. an earlier build) run the same way, as sides
    ``sidecar_compare`` (httpx, wait) and ``sidecar_compare_raw_next`` (raw,
    next) (a build without ``?wait`` answers at once: its worker polls)."""
    sides = [s for s, (_, _, _, other) in SIDECAR_SIDES.items() if compare or not other]
    sides.append("library")
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    async with JobLeaseClient(config) as client:
        for order in rotations(sides, rounds):
            for side in order:
                if side == "library":
                    runs[side].append(await cycles_queue(client, n, 1))
                    continue
                worker, poll, next_in_answer, other = SIDECAR_SIDES[side]
                runs[side].append(await drain_sidecar(
                    config, compare if other and compare else binary, n, poll=poll,
                    next_in_answer=next_in_answer, worker=worker))
    out: dict[str, Any] = {s: combine(r, "items") for s, r in runs.items()}
    lib = out["library"]["items_per_s"]
    for side in sides:
        out[side]["x_library"] = round(out[side]["items_per_s"] / lib, 3)
        out[side]["x_sidecar"] = round(out[side]["items_per_s"] / out["sidecar"]["items_per_s"], 3)
        if side != "library":
            out[side]["polls_per_item"] = round(
                sum(r["polls"] for r in runs[side]) / sum(r["n"] for r in runs[side]), 3)
            rss = [r["rss_kib"] for r in runs[side] if r.get("rss_kib")]
            if rss:
                out[side]["rss_mib_max"] = round(max(rss) / 1024, 1)
            cpu = [r["sidecar_cpu"] for r in runs[side]]
            if all(c is not None for c in cpu):
                out[side]["sidecar_cpu_ms_per_item"] = round(
                    1000 * sum(cpu) / sum(r["n"] for r in runs[side]), 3)
    for base, other in (("sidecar", "sidecar_compare"),
                        ("sidecar_raw_next", "sidecar_compare_raw_next")):
        if other in out:
            out[base]["x_compare"] = round(
                out[base]["items_per_s"] / out[other]["items_per_s"], 3)
    if compare:
        out["compare_binary"] = compare
    return out


# -- the run --------------------------------------------------------------------------------

async def run(args: argparse.Namespace, endpoints: tuple[str, ...],
              etcd_pids: Sequence[int] = ()) -> dict[str, Any]:
    config = EtcdConfig(endpoints=endpoints, root=f"/bench/queue-{uuid.uuid4().hex[:6]}")
    report: dict[str, Any] = {"benchmark": "queue", "etcd_endpoints": list(endpoints),
                              "args": {k: v for k, v in vars(args).items() if k != "json"}}
    parts = set(args.parts)
    async with JobLeaseClient(config) as client:
        if "enqueue" in parts:
            report["enqueue"] = await bench_enqueue(client, args.enqueue_items, args.batch,
                                                    args.enqueue_in_flight, args.rounds)
        if "cycles" in parts:
            report["cycles"] = await bench_cycles(client, config, args.cycles,
                                                  args.concurrency, args.rounds)
        if "backlog" in parts:
            report["backlog"] = await bench_backlog(client, args.backlogs, args.backlog_cycles,
                                                    args.backlog_concurrency, args.rounds)
        if "history" in parts:
            report["history"] = await bench_history(client, args.cycles,
                                                    args.history_concurrency, args.rounds,
                                                    etcd_pids)
    if "sidecar" in parts:
        binary, why = sidecar_queue_mode()
        if binary is None:
            print(f"sidecar part skipped: {why}", file=sys.stderr)
            report["sidecar"] = {"skipped": why}
        else:
            report["sidecar"] = await bench_sidecar(config, binary, args.sidecar_items,
                                                    args.rounds, args.sidecar_compare)
    return report


def print_report(report: dict[str, Any]) -> None:
    if "enqueue" in report:
        print(f"\nenqueue (batches of {report['enqueue'][0]['batch']}; raw = the same "
              f"{ENQUEUE_CHUNK}-item transactions)")
        print(f"{'in flight':>9}  {'raw items/s':>11} {'queue items/s':>13} {'ratio':>6} "
              f"{'queue batch p50/p99 ms':>22}")
        for r in report["enqueue"]:
            q = r["queue"]
            print(f"{r['in_flight']:>9}  {r['raw']['items_per_s']:>11} {q['items_per_s']:>13} "
                  f"{r['ratio']:>6} {q['batch_p50_ms']:>10} / {q['batch_p99_ms']:<9}")
    if "cycles" in report:
        print("\nclaim+complete cycles/s (claim p50/p99 ms)")
        print(f"{'conc':>4}  {'raw':>20} {'queue':>20} {'jobs':>20} {'q/raw':>6} "
              f"{'q/jobs':>6} {'q txns/cycle (reads)':>20}")
        for r in report["cycles"]:
            cells = [f"{r[s]['cycles_per_s']} ({r[s]['claim_p50_ms']}/{r[s]['claim_p99_ms']})"
                     for s in ("raw", "queue", "jobs")]
            q = r["queue"]
            print(f"{r['concurrency']:>4}  {cells[0]:>20} {cells[1]:>20} {cells[2]:>20} "
                  f"{r['ratio_raw']:>6} {r['ratio_jobs']:>6} "
                  f"{q['txns_per_cycle']:>12} ({q['reads_per_cycle']})")
    if "backlog" in report:
        b = report["backlog"]
        print(f"\nbacklog (claim_next + complete, concurrency {b['concurrency']})")
        print(f"{'pending':>8} {'cycles/s':>9} {'drop':>6} {'claim p50/p99 ms':>17} "
              f"{'candidate read ms':>17} {'txns/cycle (reads)':>18}")
        for r in b["rows"]:
            print(f"{r['backlog']:>8} {r['cycles_per_s']:>9} {r['drop']:>6} "
                  f"{r['claim_p50_ms']:>8}/{r['claim_p99_ms']:<8} {r['candidate_read_ms']:>17} "
                  f"{r['txns_per_cycle']:>10} ({r['reads_per_cycle']})")
    if "history" in report:
        h = report["history"]
        print(f"\nitem history: claim+complete cycles/s, historyLimit {h['limit']} vs none "
              "(claim p50/p99 ms)")
        print(f"{'conc':>4}  {'off':>20} {'on':>20} {'on/off':>6}")
        for r in h["rows"]:
            cells = [f"{r[s]['cycles_per_s']} ({r[s]['claim_p50_ms']}/{r[s]['claim_p99_ms']})"
                     for s in ("off", "on")]
            print(f"{r['concurrency']:>4}  {cells[0]:>20} {cells[1]:>20} {r['ratio']:>6}")
        for r in h["rows"]:
            print(cpu_cost.format_row(f"c={r['concurrency']}", r["cpu"], "off", "on"))
        at = h["at_limit"]
        print(f"one item's history at its limit ({at['tenures']} tenures after {at['claims']} "
              f"claims, every tenure with all 4 keys): {at['history_keys']} keys, "
              f"{at['history_bytes']} bytes (the item's own keys: {at['item_keys']}, "
              f"{at['item_bytes']} bytes); claimed once and completed: "
              f"{at['once_history_keys']} key, {at['once_history_bytes']} bytes")
    if "sidecar" in report:
        s = report["sidecar"]
        if "skipped" in s:
            print(f"\nsidecar (queue mode): SKIPPED: {s['skipped']}")
        else:
            print("\none Go sidecar draining a queue (worker: GET /v1/lease?wait=10, or polled "
                  "1 ms apart; *_next: POST /v1/complete?next=10 answers with the next "
                  "item; *_raw*: a raw-socket HTTP/1.1 worker, the others httpx) vs the "
                  "library's claim_next + complete at concurrency 1")
            print(f"{'side':>24} {'items/s':>8} {'x library':>9} {'x sidecar':>9} "
                  f"{'claim p50/p99 ms':>17} "
                  f"{'complete p50/p99 ms':>20} {'GETs/item that found none':>26} "
                  f"{'one GET p50/p99 ms':>18} {'RSS MiB':>7} {'sidecar CPU ms/item':>19}")
            for name in (*SIDECAR_SIDES, "library"):
                if name not in s:
                    continue
                side = s[name]
                print(f"{name:>24} {side['items_per_s']:>8} {side['x_library']:>9} "
                      f"{side['x_sidecar']:>9} "
                      f"{side['claim_p50_ms']:>8}/{side['claim_p99_ms']:<8} "
                      f"{side['complete_p50_ms']:>9}/{side['complete_p99_ms']:<10} "
                      f"{side.get('polls_per_item', ''):>26} "
                      + (f"{side['exchange_p50_ms']:>9}/{side['exchange_p99_ms']:<8}"
                         if "exchange_p50_ms" in side else f"{'':>18}")
                      + f" {side.get('rss_mib_max', ''):>7}"
                      + f" {side.get('sidecar_cpu_ms_per_item', ''):>19}")
            print("(a sidecar's claim: from the completion's answer until the worker saw the "
                  "next item held; one GET: GET /v1/lease of the drained sidecar, no etcd "
                  "behind it, the worker's HTTP exchange alone; RSS: the sidecar's resident "
                  "set after its drain, the largest of the rounds; sidecar CPU: the sidecar "
                  "process's user+system time over the timed items, per item)")
            for base, other in (("sidecar", "sidecar_compare"),
                                ("sidecar_raw_next", "sidecar_compare_raw_next")):
                if "x_compare" in s[base]:
                    print(f"{base} / {other}: {s[base]['x_compare']}")
            if "compare_binary" in s:
                print(f"sidecar_compare: {s['compare_binary']}")


def ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",")]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small counts (smoke run)")
    parser.add_argument("--parts", type=lambda s: s.split(","),
                        default=["enqueue", "cycles", "backlog", "sidecar"],
                        help="enqueue,cycles,backlog,sidecar (default); history only when named")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side, order rotated")
    parser.add_argument("--enqueue-items", type=int, default=20_000, help="per round and side")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--enqueue-in-flight", type=ints, default=[1, 4])
    parser.add_argument("--cycles", type=int, default=2000, help="per round and side")
    parser.add_argument("--concurrency", type=ints, default=[1, 8, 64])
    parser.add_argument("--backlogs", type=ints, default=[1000, 100_000])
    parser.add_argument("--backlog-cycles", type=int, default=1000)
    parser.add_argument("--backlog-concurrency", type=int, default=8)
    parser.add_argument("--history-concurrency", type=ints, default=[1, 8])
    parser.add_argument("--sidecar-items", type=int, default=500)
    parser.add_argument("--sidecar-compare", metavar="BINARY",
                        help="another sidecar build to run beside this checkout's (e.g. an "
                             "earlier one)")
    parser.add_argument("--endpoints", help="use this etcd instead of starting one")
    parser.add_argument("--json", default=str(HERE / "results" / "queue.json"))
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.enqueue_items, args.cycles = 2, 4000, 300
        args.backlogs, args.backlog_cycles, args.sidecar_items = [1000, 20_000], 300, 100
    started = time.time()
    load_before = os.getloadavg()
    if args.endpoints:
        report = asyncio.run(run(args, tuple(args.endpoints.split(","))))
    else:
        with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
            report = asyncio.run(run(args, cluster.endpoints, cpu_cost.pids_of(cluster)))
            report["etcd_binary"] = cluster.binary
    report["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                         "loadavg_before": [round(x, 2) for x in load_before],
                         "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                         "wall_s": round(time.time() - started, 1)}
    print_report(report)
    print(f"\nload average before {report['machine']['loadavg_before']}, "
          f"after {report['machine']['loadavg_after']}; {report['machine']['wall_s']} s")
    save(report, args.json)


if __name__ == "__main__":
    main()
