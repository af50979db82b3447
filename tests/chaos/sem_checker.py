"""Judge a semaphore run: the guarantees of docs/semaphores.md ("Fencing on a
slot") on etcd's own history of the semaphore, the workers' history and the
destinations' entries.

Every job rule of ``checker.check`` applies to the run's jobs as in the job
workload. The semaphore's rules, each a function of its own:

* ``slots-over-limit`` / ``slot-above-limit`` (:func:`check_limit`): replayed
  revision by revision from etcd's history of ``S/`` (the spec and every slot
  key, from before the semaphore was created), a revision that grants a slot
  (creates a slot key) leaves more slot keys live than the limit in force at
  that revision, or grants an index at or above it. Without a limit change
  that is exactly "never more than ``limit`` slot keys live at one revision"
  (only a grant adds a live slot); a lowered limit revokes nobody
  (docs/semaphores.md), so the slots granted before it may stay live above
  it, but nothing may be granted until they drained.
* ``slot-token-order`` / ``slot-grant-unknown`` (:func:`check_slot_tokens`):
  the successive grants of one slot, in etcd's order, have strictly
  increasing tokens (a slot key's create revision; a put over a live slot key
  keeps the old one: two holders of one slot); and every grant a worker was
  handed (its ok claim's ``extra.slots``) is a grant of etcd's history, for
  that job, with that token.
* ``slot-token-backwards`` / ``slot-superseded-effect`` / ``slot-foreign-token``
  (:func:`check_slot_fences`): at every destination, per slot resource
  (``semaphore/<ns>/<name>/slot/<index>``), in the destination's own commit
  order, an accepted effect whose token is below one it had already accepted
  for that slot; an accepted effect of a grant that a later grant of the slot
  (etcd's order) had superseded, after the resource had accepted that
  successor's effect; an accepted effect under a token etcd never granted for
  that slot.
* ``job-not-completed`` / ``slot-leaked`` (:func:`check_nothing_lost`): after
  the faults and the drain, a registered job is not ``Completed`` in etcd, or
  a slot key is still live although every job completed (a slot outliving its
  claim).

Like ``checker``, nothing here reads a clock.
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tests.chaos.checker import Entry, FinalJob, Violation
from tests.chaos.history import Op, Operation, pair


@dataclass(frozen=True)
class SlotEvent:
    """One event of etcd's history of a semaphore's keys, in revision order.

    ``kind``: ``put`` / ``delete`` of the slot key ``index``, or ``limit`` (the
    spec was put: ``limit`` is the new one)."""

    revision: int                 # the event's revision (mod revision; a delete's own)
    kind: str
    index: int = -1
    create_revision: int = 0      # put: the slot key's create revision, the grant's token
    holder: str | None = None     # put: the slot record's holder (the job) and owner
    owner: str | None = None
    limit: int = 0


@dataclass(frozen=True)
class Grant:
    """A slot key created: one grant of slot ``index``, as etcd's history shows it."""

    index: int
    revision: int                 # the revision that put it
    token: int                    # its create revision (== revision for a fresh key)
    holder: str | None
    owner: str | None


def grants(events: Sequence[SlotEvent]) -> dict[int, list[Grant]]:
    """Per slot, every put of its key in etcd's order (each put is a grant: a claim
    puts a slot key only when it takes the slot)."""
    out: dict[int, list[Grant]] = defaultdict(list)
    for e in sorted(events, key=lambda e: e.revision):
        if e.kind == "put":
            out[e.index].append(Grant(e.index, e.revision, e.create_revision, e.holder,
                                      e.owner))
    return dict(out)


def replay(events: Sequence[SlotEvent]) -> list[tuple[int, int, set[int], list[int]]]:
    """``(revision, limit, live indexes, indexes granted)`` after each revision."""
    out = []
    live: set[int] = set()
    limit = 0
    by_revision: dict[int, list[SlotEvent]] = defaultdict(list)
    for e in events:
        by_revision[e.revision].append(e)
    for revision in sorted(by_revision):
        granted = []
        for e in by_revision[revision]:
            if e.kind == "limit":
                limit = e.limit
            elif e.kind == "put":
                live.add(e.index)
                granted.append(e.index)
            else:
                live.discard(e.index)
        out.append((revision, limit, set(live), granted))
    return out


def max_live(events: Sequence[SlotEvent]) -> int:
    return max((len(live) for _, _, live, _ in replay(events)), default=0)


def check_limit(events: Sequence[SlotEvent], semaphore: str) -> list[Violation]:
    found = []
    for revision, limit, live, granted in replay(events):
        if not granted:
            continue
        if len(live) > limit:
            found.append(Violation(
                "slots-over-limit",
                f"revision {revision} granted slot(s) {sorted(granted)} and left {len(live)} "
                f"slots live {sorted(live)}; the limit at that revision is {limit}",
                resource=semaphore))
        above = [i for i in granted if i >= limit]
        if above:
            found.append(Violation(
                "slot-above-limit",
                f"revision {revision} granted slot(s) {above}, at or above the limit {limit}",
                resource=semaphore))
    return found


def _handed(operations: Iterable[Operation], semaphore: str
            ) -> list[tuple[Operation, int, int]]:
    """``(claim, slot index, token)`` for every slot of ``semaphore`` an ok claim got."""
    out = []
    for c in operations:
        if c.kind != "claim" or c.phase != "ok" or c.outcome is None:
            continue
        for g in c.outcome.extra.get("slots", ()):
            if g.get("semaphore") == semaphore:
                out += [(c, int(i), int(g["token"])) for i in g.get("slots", ())]
    return out


def check_slot_tokens(operations: Sequence[Operation], events: Sequence[SlotEvent],
                      semaphore: str) -> list[Violation]:
    found = []
    by_slot = grants(events)
    for index, gs in sorted(by_slot.items()):
        for a, b in itertools.pairwise(gs):
            if not a.token < b.token:
                found.append(Violation(
                    "slot-token-order",
                    f"slot {index}: the grant at revision {b.revision} ({b.holder}, "
                    f"{b.owner}) has token {b.token}, not above the previous grant's "
                    f"{a.token} (revision {a.revision}, {a.holder}, {a.owner})",
                    job=b.holder, resource=semaphore))
    known = {(g.index, g.token, g.holder) for gs in by_slot.values() for g in gs}
    for c, index, token in _handed(operations, semaphore):
        if (index, token, c.job) not in known:
            found.append(Violation(
                "slot-grant-unknown",
                f"a worker was handed slot {index} with token {token}, which etcd's history "
                f"never granted to {c.job}: {c.describe()}",
                job=c.job, resource=semaphore, ops=(c.invoke.op,)))
    return found


def check_slot_fences(destinations: Mapping[str, Sequence[Entry]], events: Sequence[SlotEvent],
                      semaphore: str) -> list[Violation]:
    """Per destination resource naming a slot of ``semaphore`` (``.../semaphore/<ns>/
    <name>/slot/<index>``, or the ledger's and the /direct gates' ``semaphore-<ns>-<name>
    -slot-<index>``), in the destination's order (``seq``)."""
    found = []
    by_slot = grants(events)
    plain = f"semaphore/{semaphore}/slot/"
    dashed = plain.replace("/", "-")
    for resource, entries in sorted(destinations.items()):
        name = resource.split("/", 1)[1] if "/" in resource else resource
        name = name.removeprefix("ledger/")
        if name.startswith(plain):
            tail = name[len(plain):]
        elif name.startswith(dashed):
            tail = name[len(dashed):]
        else:
            continue
        if not tail.isdigit():
            continue
        order = {g.token: n for n, g in enumerate(by_slot.get(int(tail), []))}
        high: Entry | None = None
        newest: tuple[int, Entry] | None = None  # the latest grant accepted so far
        for e in sorted(entries, key=lambda x: x.seq):
            if high is not None and e.token < high.token:
                found.append(Violation(
                    "slot-token-backwards",
                    f"seq {e.seq} accepted slot token {e.token} (key {e.key}) after seq "
                    f"{high.seq} had accepted slot token {high.token} (key {high.key})",
                    resource=resource))
            if high is None or e.token > high.token:
                high = e
            nth = order.get(e.token)
            if nth is None:
                found.append(Violation(
                    "slot-foreign-token",
                    f"seq {e.seq} accepted token {e.token} (key {e.key}), which etcd never "
                    f"granted for slot {tail}", resource=resource))
                continue
            if newest is not None and nth < newest[0]:
                found.append(Violation(
                    "slot-superseded-effect",
                    f"seq {e.seq} accepted an effect of the slot's grant #{nth + 1} (token "
                    f"{e.token}, key {e.key}), superseded by grant #{newest[0] + 1} whose "
                    f"effect seq {newest[1].seq} (token {newest[1].token}) the resource had "
                    "already accepted", resource=resource))
            if newest is None or nth > newest[0]:
                newest = (nth, e)
    return found


def check_nothing_lost(jobs: Iterable[str], final: Mapping[str, FinalJob],
                       live_at_end: Mapping[int, str | None], semaphore: str
                       ) -> list[Violation]:
    """``live_at_end``: the slot keys etcd holds after the drain (index -> holder)."""
    found = []
    jobs = sorted(jobs)
    for job in jobs:
        state = final.get(job)
        if state is None or state.result_token is None:
            found.append(Violation(
                "job-not-completed", "not Completed after the drain" if state else
                "registered, but etcd has no such job", job=job))
    if all(final.get(j) and final[j].result_token is not None for j in jobs):
        for index, holder in sorted(live_at_end.items()):
            found.append(Violation(
                "slot-leaked", f"slot {index} is still live (holder {holder}) although every "
                "job completed", job=holder, resource=semaphore))
    return found


def check_semaphore(ops: Sequence[Op], *, semaphore: str, events: Sequence[SlotEvent],
                    jobs: Iterable[str], final: Mapping[str, FinalJob],
                    live_at_end: Mapping[int, str | None],
                    destinations: Mapping[str, Sequence[Entry]] | None = None,
                    ) -> list[Violation]:
    """The semaphore's rules (the job rules are ``checker.check``'s, run by the runner)."""
    operations = pair(ops)
    found = (check_limit(events, semaphore)
             + check_slot_tokens(operations, events, semaphore)
             + check_nothing_lost(jobs, final, live_at_end, semaphore))
    if destinations is not None:
        found += check_slot_fences(destinations, events, semaphore)
    return found

