"""Judge a queue run: the rules of docs/queues.md ("What is guaranteed") on the
history, etcd's final state of every item and the destinations' entries.

An item is a job of its queue, so everything ``checker.check`` judges for jobs
is judged for items too (the history's ``job`` is the item): one ok claim per
generation, holder exclusivity at each claim's token, stale completions, the
destinations' duplicate, lost and foreign-token effects, re-sends, auth losses.
The queue's own rules, each a function of its own:

* ``item-completed-twice`` (:func:`check_single_completion`): more than one
  accepted completion of an item, in the history (two ``ok`` completions) or in
  etcd (the item's ``results`` key was put more than once, or its result is not
  the acknowledged completion's).
* ``item-lost`` / ``item-state-torn`` (:func:`check_nothing_lost`): after the
  faults stopped and the workers drained the queue (within a deadline), an
  item whose enqueue was acknowledged, or that etcd holds, is not ``Completed``
  or ``Failed`` (absent, still pending, still held); or it is both, or settled
  with its pending key still there.
* ``item-failed-early`` / ``item-attempts-exceeded`` / ``poison-completed``
  (:func:`check_failures`): an item ``Failed`` before it used ``maxAttempts``
  claims; more than ``maxAttempts`` claims of an item; a poison item (which no
  worker ever completes) ``Completed``. :func:`failures` says which failed
  items were poison and which the nemesis exhausted.
* ``item-token-backwards`` / ``item-superseded-effect``
  (:func:`check_item_fences`): at a destination resource (one item's), an
  accepted effect whose token is below one the resource had already accepted;
  or an accepted effect of a claim that a later claim of the item (a higher
  generation, etcd's own order of claims) had superseded, after the resource
  had accepted that successor's effect.
* ``item-token-order`` (:func:`check_claim_tokens`): the tokens of an item's
  successive ok claims (by generation) do not increase.

With the operator (tests/chaos/test_chaos_queue.py's operator run), every
JobQueue status the API server served, in served order
(:func:`check_queue_statuses`; docs/operator.md, "JobQueues"):

* ``queue-status-backwards``: ``etcdRevision`` (the operator never applies
  counts read at an older revision, and the CRD refuses a decreasing one),
  ``observedGeneration``, ``total``, ``completed`` or ``failed`` decreased from
  one served status to the next. The counts only grow in these runs because
  nothing prunes or retries an item (retention and ``joblease queue retry``
  lower them, documented; a run that used them would need another rule).
* ``queue-status-torn``: ``pending + held + completed + failed != total`` in one
  status (its counts are one read at one revision, so they add up).
* ``queue-status-counts``: a status's ``total``, ``completed`` or ``failed`` is
  not what etcd held at the status's ``etcdRevision``: the items, results and
  failed keys created at or before it (those keys are never deleted in these
  runs, so their create revisions say exactly when each count grew).
* ``queue-status-final``: no status was served, or the last one's counts are
  not etcd's final ones (every item settled: ``pending`` and ``held`` 0).

Like ``checker``, nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tests.chaos import checker
from tests.chaos.checker import Entry, HolderAt, Violation
from tests.chaos.history import Op, Operation, pair


@dataclass(frozen=True)
class FinalItem:
    """An item's keys in etcd at the end of the run (``Q/<field>/<id>``)."""

    generation: int = 0                    # version of claims/<id>
    result_token: int | None = None        # results/<id>'s token, if completed
    result_generation: int | None = None
    result_version: int = 0                # puts of results/<id>: 1 for one completion
    failed_generation: int | None = None   # failed/<id>'s generation, if failed
    pending: bool = False                  # pending/<id> exists
    held: bool = False                     # held/<id> exists
    # create revisions (0: no such key): when each count of the queue's grew
    item_revision: int = 0                 # items/<id>
    result_revision: int = 0               # results/<id>
    failed_revision: int = 0               # failed/<id>

    @property
    def phase(self) -> str:
        if self.result_token is not None:
            return "Completed"
        if self.failed_generation is not None:
            return "Failed"
        return "Claimed" if self.held else "Pending"

    def as_job(self) -> checker.FinalJob:
        return checker.FinalJob(self.generation, self.result_token, self.result_generation)


def _by_item(operations: Iterable[Operation], kind: str) -> dict[str, list[Operation]]:
    out: dict[str, list[Operation]] = defaultdict(list)
    for o in operations:
        if o.kind == kind and o.job is not None:
            out[o.job].append(o)
    return out


def enqueued(operations: Iterable[Operation]) -> dict[str, str]:
    """Item (``<queue>/<id>``) -> the op id of the acknowledged enqueue that promised it."""
    out: dict[str, str] = {}
    for o in operations:
        if o.kind == "enqueue" and o.phase == "ok" and o.job:
            for item_id in o.invoke.extra.get("ids", ()):
                out.setdefault(f"{o.job}/{item_id}", o.invoke.op)
    return out


def check_single_completion(operations: Sequence[Operation],
                            final: Mapping[str, FinalItem]) -> list[Violation]:
    found = []
    completions = _by_item(operations, "complete")
    for item in sorted(set(completions) | set(final)):
        ok = [c for c in completions.get(item, []) if c.phase == "ok"]
        if len(ok) > 1:
            found.append(Violation(
                "item-completed-twice",
                f"{len(ok)} accepted completions in the history: "
                + "; ".join(c.describe() for c in ok),
                job=item, ops=tuple(c.invoke.op for c in ok)))
        state = final.get(item)
        if state is None:
            continue
        if state.result_version > 1:
            found.append(Violation(
                "item-completed-twice",
                f"etcd's results key of the item was written {state.result_version} times "
                f"(last token {state.result_token})", job=item))
        other = [c for c in ok if state.result_token is not None
                 and c.token != state.result_token]
        if other:
            found.append(Violation(
                "item-completed-twice",
                f"etcd's result has token {state.result_token}, but a completion with "
                "another token was accepted too: " + "; ".join(c.describe() for c in other),
                job=item, ops=tuple(c.invoke.op for c in other)))
    return found


def check_nothing_lost(operations: Sequence[Operation],
                       final: Mapping[str, FinalItem]) -> list[Violation]:
    found = []
    promised = enqueued(operations)
    for item in sorted(set(promised) | set(final)):
        state = final.get(item)
        ops = (promised[item],) if item in promised else ()
        if state is None:
            found.append(Violation(
                "item-lost", "its enqueue was acknowledged, but etcd has no such item",
                job=item, ops=ops))
            continue
        if state.result_token is None and state.failed_generation is None:
            found.append(Violation(
                "item-lost",
                f"neither Completed nor Failed after the drain: {state.phase} "
                f"(generation {state.generation}"
                + ("" if item in promised else "; enqueue not acknowledged, but etcd has it")
                + ")", job=item, ops=ops))
            continue
        torn = []
        if state.result_token is not None and state.failed_generation is not None:
            torn.append("both a result and a failed record")
        if state.pending:
            torn.append("its pending key is still there")
        if torn:
            found.append(Violation("item-state-torn", f"{state.phase}, but "
                                   + " and ".join(torn), job=item, ops=ops))
    return found


def check_failures(operations: Sequence[Operation], final: Mapping[str, FinalItem],
                   max_attempts: int, poison: Iterable[str]) -> list[Violation]:
    """``max_attempts`` is the queue's (0: unlimited; the runner never retries an
    item, so every round starts at 0 claims)."""
    found = []
    poisoned = set(poison)
    claims = _by_item(operations, "claim")
    for item in sorted(set(final) | set(claims)):
        state = final.get(item)
        ok = [c for c in claims.get(item, []) if c.phase == "ok"]
        if state is not None and state.failed_generation is not None and (
                not max_attempts or state.failed_generation < max_attempts
                or state.generation < max_attempts):
            found.append(Violation(
                "item-failed-early",
                f"Failed after {state.failed_generation} claims (etcd's generation "
                f"{state.generation}); maxAttempts is {max_attempts or 'unlimited'}",
                job=item))
        if max_attempts:
            over = [c for c in ok if (c.generation or 0) > max_attempts]
            if over or (state is not None and state.generation > max_attempts):
                found.append(Violation(
                    "item-attempts-exceeded",
                    f"maxAttempts is {max_attempts}, but etcd's generation is "
                    f"{state.generation if state else '?'}"
                    + (": " + "; ".join(c.describe() for c in over) if over else ""),
                    job=item, ops=tuple(c.invoke.op for c in over)))
        if item in poisoned and state is not None and state.result_token is not None:
            found.append(Violation(
                "poison-completed",
                f"a poison item (never completed by its workers) has a result with token "
                f"{state.result_token}", job=item))
    return found


def failures(final: Mapping[str, FinalItem], poison: Iterable[str]) -> dict[str, list[str]]:
    """The Failed items: ``poison`` (failed on purpose) and ``exhausted`` (others: the
    nemesis cost them every attempt)."""
    poisoned = set(poison)
    failed = sorted(i for i, s in final.items() if s.failed_generation is not None)
    return {"poison": [i for i in failed if i in poisoned],
            "exhausted": [i for i in failed if i not in poisoned]}


def check_item_fences(operations: Sequence[Operation],
                      destinations: Mapping[str, Sequence[Entry]]) -> list[Violation]:
    """Per destination resource, in its own commit order (``seq``). A claim's
    generation comes from the history's ok claim with the entry's token (etcd's
    order of the item's claims), else from the entry itself."""
    found = []
    generation_of: dict[tuple[str, int], int] = {}
    for c in operations:
        if c.kind == "claim" and c.phase == "ok" and c.job and c.token and c.generation:
            generation_of[(c.job, c.token)] = c.generation
    for resource, entries in sorted(destinations.items()):
        high: Entry | None = None
        newest: tuple[int, Entry] | None = None  # the highest generation accepted so far
        for e in sorted(entries, key=lambda x: x.seq):
            if high is not None and e.token < high.token:
                found.append(Violation(
                    "item-token-backwards",
                    f"seq {e.seq} accepted token {e.token} (key {e.key}) after seq "
                    f"{high.seq} had accepted token {high.token} (key {high.key})",
                    job=e.job, resource=resource))
            if high is None or e.token > high.token:
                high = e
            gen = generation_of.get((e.job or "", e.token), e.generation)
            if gen is None:
                continue
            if newest is not None and gen < newest[0]:
                found.append(Violation(
                    "item-superseded-effect",
                    f"seq {e.seq} accepted an effect of generation {gen} (token {e.token}, "
                    f"key {e.key}), superseded by generation {newest[0]} whose effect seq "
                    f"{newest[1].seq} (token {newest[1].token}) the resource had already "
                    "accepted", job=e.job, resource=resource))
            if newest is None or gen > newest[0]:
                newest = (gen, e)
    return found


def check_claim_tokens(operations: Sequence[Operation]) -> list[Violation]:
    found = []
    for item, claims in sorted(_by_item(operations, "claim").items()):
        ok = sorted((c for c in claims if c.phase == "ok"),
                    key=lambda c: (c.generation or 0, c.token or 0))
        for a, b in itertools.pairwise(ok):
            if (a.generation or 0) < (b.generation or 0) and not (a.token or 0) < (b.token or 0):
                found.append(Violation(
                    "item-token-order",
                    f"claim of generation {b.generation} has token {b.token}, not above "
                    f"generation {a.generation}'s token {a.token}: {a.describe()} / "
                    f"{b.describe()}", job=item, ops=(a.invoke.op, b.invoke.op)))
    return found


#: JobQueue status fields that never decrease in a run without prune or retry.
MONOTONE_STATUS_FIELDS = ("etcdRevision", "observedGeneration", "total", "completed", "failed")
COUNT_FIELDS = ("total", "pending", "held", "completed", "failed")


def final_counts(final: Mapping[str, FinalItem]) -> dict[str, int]:
    """The counts a JobQueue status must show for etcd's final state (docs/queues.md,
    "Counts": ``pending`` is the pending keys minus the held ones)."""
    states = list(final.values())
    held = sum(1 for s in states if s.held)
    return {"total": sum(1 for s in states if s.item_revision),
            "pending": sum(1 for s in states if s.pending) - held, "held": held,
            "completed": sum(1 for s in states if s.result_revision),
            "failed": sum(1 for s in states if s.failed_revision)}


def counts_at(final: Mapping[str, FinalItem], revision: int) -> dict[str, int]:
    """``total``, ``completed`` and ``failed`` as etcd had them at ``revision``."""
    def upto(rev: int) -> bool:
        return 0 < rev <= revision
    states = list(final.values())
    return {"total": sum(1 for s in states if upto(s.item_revision)),
            "completed": sum(1 for s in states if upto(s.result_revision)),
            "failed": sum(1 for s in states if upto(s.failed_revision))}


def check_queue_statuses(served: Sequence[Mapping[str, Any]], queue: str,
                         final: Mapping[str, FinalItem] | None = None) -> list[Violation]:
    """The JobQueue ``queue``'s statuses, as the API server served them in order
    (empty ones, before the operator's first write, are skipped); ``final``: etcd's
    items at the end (None: only the rules that need no etcd state)."""
    found = []
    statuses = [(i, s) for i, s in enumerate(served) if s]
    prev: tuple[int, Mapping[str, Any]] | None = None
    for i, status in statuses:
        if prev is not None:
            for f in MONOTONE_STATUS_FIELDS:
                a, b = prev[1].get(f), status.get(f)
                if a is not None and b is not None and int(b) < int(a):
                    found.append(Violation(
                        "queue-status-backwards",
                        f"served status #{i}: {f} {b} after {a} (status #{prev[0]})",
                        job=queue))
        prev = (i, status)
        counts = {f: status.get(f) for f in COUNT_FIELDS}
        if all(isinstance(v, int) for v in counts.values()):
            parts = sum(int(counts[f] or 0) for f in COUNT_FIELDS if f != "total")
            if parts != counts["total"]:
                found.append(Violation(
                    "queue-status-torn",
                    f"served status #{i}: pending + held + completed + failed = {parts}, "
                    f"total {counts['total']} ({counts})", job=queue))
        revision = status.get("etcdRevision")
        if final is not None and isinstance(revision, int):
            want = counts_at(final, revision)
            got = {f: status.get(f) for f in want}
            if got != want:
                found.append(Violation(
                    "queue-status-counts",
                    f"served status #{i} at etcdRevision {revision} says {got}; etcd had "
                    f"{want} at that revision", job=queue))
    if final is not None:
        want_final = final_counts(final)
        if prev is None:
            found.append(Violation("queue-status-final",
                                   f"no status was served; etcd's counts are {want_final}",
                                   job=queue))
        else:
            got_final = {f: prev[1].get(f) for f in COUNT_FIELDS}
            if got_final != want_final:
                found.append(Violation(
                    "queue-status-final",
                    f"the last status served (#{prev[0]}) says {got_final}; etcd's final "
                    f"counts are {want_final}", job=queue))
    return found


def check_queue(ops: Sequence[Op], *, final: Mapping[str, FinalItem],
                max_attempts: int, poison: Iterable[str] = (),
                destinations: Mapping[str, Sequence[Entry]] | None = None,
                holders: Mapping[tuple[str, int], HolderAt | None] | None = None,
                statuses: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
                ) -> list[Violation]:
    """Every violation of a queue run: the job rules per item, then the queue's;
    ``statuses`` (runs with the operator): every JobQueue's served statuses, by
    ``<namespace>/<name>``, each judged with ``final``'s items of that queue."""
    operations = pair(ops)
    poison = list(poison)
    found = checker.check(ops, final={i: s.as_job() for i, s in final.items()},
                          destinations=destinations, holders=holders)
    found += (check_single_completion(operations, final)
              + check_nothing_lost(operations, final)
              + check_failures(operations, final, max_attempts, poison)
              + check_claim_tokens(operations))
    if destinations is not None:
        found += check_item_fences(operations, destinations)
    for queue, served in sorted((statuses or {}).items()):
        items = {i: st for i, st in final.items() if i.rpartition("/")[0] == queue}
        found += check_queue_statuses(served, queue, items)
    return found
