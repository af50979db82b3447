"""A queue run in the checker's terms when its workers keep no history: from etcd's own
history of the queue's keys and a destination's books.

The process-level chaos runs (tests/chaos/queue_runner.py) judge histories their
workers record, invoke by invoke. Worker pods (tests/cluster/test_pod_chaos.py) keep
none a test could trust (a killed or deleted pod takes its logs with it), so the
history comes from the two records that outlive every pod:

- **etcd's history of the queue** (a watch replayed from the queue's creation): a
  claim is the transaction that creates ``held/<id>`` (the token is that revision) and
  puts ``claims/<id>`` (its ``version`` after the put is the generation); a completion
  is a put of ``results/<id>`` (its record names the token and generation). Only
  committed claims and completions are there: attempts that etcd refused leave no
  trace, so the rules about refused or unknown outcomes have nothing to judge, and the
  ones about what etcd committed (one completion per item, tokens increasing with the
  generation, nothing lost) are judged on the authority itself.
- **the destination's books** (examples/ledger.yaml): every accepted write with its
  commit order (``seq``) and token, per resource.

:func:`queue_ops` turns the first into :class:`~tests.chaos.history.Op` records;
:func:`final_items` reads etcd's final keys into
:class:`~tests.chaos.queue_checker.FinalItem` (the process-level runner uses it too);
:func:`ledger_entries` turns the books into :class:`~tests.chaos.checker.Entry` lists;
``queue_checker.check_queue`` judges them, and :func:`check_entry_tokens` adds the one
rule a recorded history would have judged through its writes: every accepted write
carries the token of a committed claim of its item.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from joblease.records import FailedRecord, ResultRecord
from tests.chaos.checker import Entry, Violation
from tests.chaos.history import Op
from tests.chaos.queue_checker import FinalItem

#: the item fields a queue keeps under ``<queue prefix><field>/<id>`` that the verdict reads
FIELDS = ("items", "claims", "results", "failed", "pending", "held")


@dataclass(frozen=True)
class Kv:
    """One key as etcd reported it (in a read, or in a watch event's ``kv``)."""

    create_revision: int
    mod_revision: int
    version: int
    value: bytes = b""

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Kv:
        return cls(int(d["createRevision"]), int(d["modRevision"]), int(d["version"]),
                   str(d.get("value") or "").encode())


@dataclass(frozen=True)
class Event:
    """One watch event on an item field: ``kind`` is ``put`` or ``delete``."""

    kind: str
    field: str
    item: str
    kv: Kv

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Event:
        return cls(str(d["kind"]), str(d["field"]), str(d["item"]), Kv.from_dict(d["kv"]))


def final_items(queue: str, by_field: Mapping[str, Mapping[str, Kv]]) -> dict[str, FinalItem]:
    """Every item's final state, keyed ``<queue>/<id>``, from one read of each field
    (``by_field[field][id]``; ``items``, ``pending`` and ``held`` may be keys only)."""
    out = {}
    ids: set[str] = set().union(*(set(by_field.get(f, {})) for f in FIELDS))
    for item_id in ids:
        get = {f: by_field.get(f, {}).get(item_id) for f in FIELDS}
        result, failed, claims, item = (get["results"], get["failed"], get["claims"],
                                        get["items"])
        rec = ResultRecord.decode(result.value) if result else None
        state = FinalItem(
            generation=claims.version if claims else 0,
            result_token=rec.token if rec else None,
            result_generation=rec.generation if rec else None,
            result_version=result.version if result else 0,
            failed_generation=FailedRecord.decode(failed.value).generation
            if failed else None,
            pending=get["pending"] is not None, held=get["held"] is not None,
            item_revision=item.create_revision if item else 0,
            result_revision=result.create_revision if result else 0,
            failed_revision=failed.create_revision if failed else 0)
        if item is not None or state != FinalItem():
            out[f"{queue}/{item_id}"] = state
    return out


def queue_ops(queue: str, events: Iterable[Event], enqueued: Sequence[Sequence[str]]
              ) -> list[Op]:
    """The committed claims and completions of etcd's history as ok operations (process
    ``etcd``; the revision is the op's order), after one acknowledged enqueue per batch
    of ``enqueued`` (the test's own enqueues, each acknowledged by the CLI)."""
    ops: list[Op] = []

    def done(kind: str, n: int, **fields: Any) -> None:
        op = f"etcd:{n}"
        ops.append(Op(op=op, process="etcd", kind=kind, phase="invoke", **fields))
        ops.append(Op(op=op, process="etcd", kind=kind, phase="ok", **fields))

    for n, ids in enumerate(enqueued):
        done("enqueue", n, job=queue, extra={"ids": list(ids)})
    by_revision: dict[int, list[Event]] = defaultdict(list)
    for e in events:
        by_revision[e.kv.mod_revision].append(e)
    for revision in sorted(by_revision):
        txn = by_revision[revision]
        claims = {e.item: e.kv.version for e in txn if e.kind == "put" and e.field == "claims"}
        for e in txn:
            job = f"{queue}/{e.item}"
            if e.kind != "put":
                continue
            if e.field == "held" and e.kv.create_revision == revision:
                done("claim", revision, job=job, token=revision,
                     generation=claims.get(e.item))
            elif e.field == "results":
                rec = ResultRecord.decode(e.kv.value)
                done("complete", revision, job=job, token=rec.token,
                     generation=rec.generation)
    return ops


def _claim_generations(ops: Iterable[Op]) -> dict[tuple[str, int], int | None]:
    """(job, token) -> generation of every ok claim in ``ops``."""
    return {(o.job, o.token): o.generation for o in ops
            if o.kind == "claim" and o.phase == "ok" and o.job and o.token}


def ledger_entries(books: Mapping[str, Mapping[str, Any]], ops: Iterable[Op]
                   ) -> dict[str, list[Entry]]:
    """The ledger's books (``GET /resources/<name>`` per name) as the checker's entries:
    per resource, every accepted write with its commit order, token and job, and the
    generation of the claim whose token it carries (etcd's, from ``ops``)."""
    generation = _claim_generations(ops)
    return {name: [Entry(seq=int(e["seq"]), token=int(e["token"]), job=str(e["job"]),
                         generation=generation.get((str(e["job"]), int(e["token"]))))
                   for e in book.get("entries", [])]
            for name, book in books.items()}


def check_entry_tokens(ops: Sequence[Op], destinations: Mapping[str, Sequence[Entry]]
                       ) -> list[Violation]:
    """``unclaimed-token``: an accepted write whose token is no committed claim of its job
    (the checker's other destination rules take every entry's token for a claim's)."""
    claimed = _claim_generations(ops)
    return [Violation("unclaimed-token",
                      f"seq {e.seq} was accepted under token {e.token}, which no committed "
                      f"claim of {e.job} has", job=e.job, resource=resource)
            for resource, entries in sorted(destinations.items()) for e in entries
            if (e.job, e.token) not in claimed]
