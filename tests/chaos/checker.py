"""Judge a history: pure functions from (history, final etcd state, destination
state) to a list of :class:`Violation`.

What is checked (see docs/fault-tests.md):

* ``duplicate-generation``: two ok claims of one job with the same generation.
* ``holder-not-exclusive`` / ``holder-missing`` / ``holder-owner``: holder
  exclusivity, judged in etcd's own order. For each ok claim with token ``T``
  the runner reads the job's holder key *at revision T* (etcd's MVCC history;
  the chaos cluster never compacts). The claim transaction requires "no live
  holder", so at ``T`` the holder must have been created at ``T`` (create
  revision == mod revision == ``T``) by this claim's owner. A holder created
  earlier and still there at ``T`` means the claim overwrote a live holder:
  two ok claims overlap with no release, expiry or completion between them.
* ``token-order``: ok claims' tokens do not strictly increase with generation.
* ``multiple-completions``: more than one accepted completion of a job.
* ``stale-completion``: an accepted completion whose token is not the job's
  last ok claim's token (a completion commits only while the holder key still
  has that token, and a later claim needs the holder gone, so the accepted
  token is always the newest claim's).
* ``result-mismatch``: etcd's final result disagrees with the history
  (another token, or a result no completion in the history could have written,
  or an acknowledged completion etcd does not have).
* ``generation-regressed``: etcd's final generation is below an ok claim's.
* ``token-backwards`` / ``generation-backwards``: at one destination resource
  the accepted effects' tokens (or generations) decrease in the destination's
  own commit order (its sequence numbers).
* ``foreign-token``: an accepted effect whose (generation, token) contradicts
  the ok claim of that generation.
* ``duplicate-effect``: one idempotency key applied twice.
* ``duplicate-not-replayed``: a write re-sent with the idempotency key of an
  earlier acknowledged write was acknowledged as *newly applied* instead of
  as a duplicate (the workers re-send some writes on purpose, see workload.py).
* ``auth-loss``: a lease was lost because etcd refused the client's auth
  token (an etcd restart with auth on must not cost anyone their lease: the
  client re-authenticates; issue 20 item 15).
* ``lost-write``: a write the history says was acknowledged is not in the
  destination's final state.
* ``liveness``: once faults stopped, a job did not complete within the bound.
* ``status-backwards`` / ``status-final`` (runs with the operator): every
  JobLease status the API server served (a watch records them in order) never
  moves backwards -- ``etcdRevision``, ``generation`` and ``fencingToken`` never
  decrease, ``Completed`` is never left -- and the last one equals etcd's final
  state (``Completed``, the result's token, etcd's generation).

Nothing here reads a clock or assumes a TTL upper bound: etcd restarts lease
countdowns on leader change, so "expired after TTL" is never a fact to rely on.
"""

from __future__ import annotations

import itertools
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import Op, Operation, pair
from tests.support.status_history import steps_back


@dataclass(frozen=True)
class Violation:
    kind: str
    message: str
    job: str | None = None
    resource: str | None = None
    ops: tuple[str, ...] = ()

    def __str__(self) -> str:
        where = self.job or self.resource or "-"
        return f"[{self.kind}] {where}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "message": self.message, "job": self.job,
                "resource": self.resource, "ops": list(self.ops)}


@dataclass
class FinalJob:
    """A job's state in etcd at the end of the run."""

    generation: int
    result_token: int | None = None
    result_generation: int | None = None
    result_owner: str | None = None


@dataclass
class Entry:
    """One accepted effect in a destination, in the destination's commit order."""

    seq: int
    token: int
    key: str | None = None
    job: str | None = None
    generation: int | None = None


@dataclass(frozen=True)
class HolderAt:
    """A job's holder key as etcd had it at one revision (the claim's token)."""

    create_revision: int
    mod_revision: int
    owner: str | None = None


@dataclass
class Liveness:
    """Runner-side observations (the runner's own monotonic clock)."""

    faults_stopped_at: float
    bound: float
    completed_at: Mapping[str, float | None] = field(default_factory=dict)


def _by_job(ops: Iterable[Operation], kind: str) -> dict[str, list[Operation]]:
    out: dict[str, list[Operation]] = defaultdict(list)
    for o in ops:
        if o.kind == kind and o.job is not None:
            out[o.job].append(o)
    return out


def check_claims(operations: Sequence[Operation]) -> list[Violation]:
    found = []
    for job, claims in _by_job(operations, "claim").items():
        ok = [c for c in claims if c.phase == "ok"]
        gens = Counter(c.generation for c in ok)
        for gen, n in gens.items():
            if n > 1:
                dup = [c for c in ok if c.generation == gen]
                found.append(Violation(
                    "duplicate-generation",
                    f"{n} ok claims share generation {gen}: "
                    + "; ".join(c.describe() for c in dup),
                    job=job, ops=tuple(c.invoke.op for c in dup)))
        ordered = sorted(ok, key=lambda c: (c.generation or 0, c.token or 0))
        for a, b in itertools.pairwise(ordered):
            if a.generation != b.generation and not (a.token or 0) < (b.token or 0):
                found.append(Violation(
                    "token-order",
                    f"generation {b.generation} has token {b.token}, not above generation "
                    f"{a.generation}'s token {a.token}: {a.describe()} / {b.describe()}",
                    job=job, ops=(a.invoke.op, b.invoke.op)))
    return found


def check_holders(operations: Sequence[Operation],
                  holders: Mapping[tuple[str, int], HolderAt | None]) -> list[Violation]:
    """Holder exclusivity: each ok claim's token is the create revision of a holder
    that did not exist before it (``holders[(job, token)]``: the holder key read at
    revision ``token``; claims missing from the mapping were not read, e.g. an
    unknown revision, and are not judged)."""
    found = []
    for job, claims in sorted(_by_job(operations, "claim").items()):
        for c in claims:
            if c.phase != "ok" or c.token is None or (job, c.token) not in holders:
                continue
            h = holders[(job, c.token)]
            if h is None:
                found.append(Violation(
                    "holder-missing", f"etcd had no holder at revision {c.token}, the token "
                    f"of an ok claim: {c.describe()}", job=job, ops=(c.invoke.op,)))
                continue
            if h.create_revision != c.token or h.mod_revision != c.token:
                earlier = [x for x in claims if x.phase == "ok" and x.token == h.create_revision]
                found.append(Violation(
                    "holder-not-exclusive",
                    f"ok claim with token {c.token} wrote over a live holder created at "
                    f"revision {h.create_revision} (holder mod revision {h.mod_revision}): "
                    f"{c.describe()}"
                    + (f"; the live holder's claim: {earlier[0].describe()}" if earlier else ""),
                    job=job, ops=(c.invoke.op, *(x.invoke.op for x in earlier))))
                continue
            owner = c.outcome.extra.get("owner") if c.outcome is not None else None
            if owner is not None and h.owner is not None and owner != h.owner:
                found.append(Violation(
                    "holder-owner", f"the holder created at revision {c.token} names owner "
                    f"{h.owner!r}, but the ok claim was {owner!r}'s: {c.describe()}",
                    job=job, ops=(c.invoke.op,)))
    return found


def check_resends(operations: Sequence[Operation]) -> list[Violation]:
    """A re-send of an acknowledged write's key must be answered as a duplicate."""
    found = []
    acked: dict[tuple[str | None, str | None], Operation] = {}
    for w in operations:  # per process in invoke order: a re-send follows its original
        if w.kind != "write" or w.phase != "ok":
            continue
        ident = (w.get("resource"), w.get("key"))
        first = acked.get(ident)
        resend = w.invoke.extra.get("resend")
        if first is not None and resend and w.outcome is not None \
                and not w.outcome.extra.get("duplicate"):
            found.append(Violation(
                "duplicate-not-replayed",
                f"re-sent write was acknowledged as newly applied although "
                f"{first.invoke.op} had been acknowledged with the same key: {w.describe()}",
                job=w.job, resource=w.get("resource"), ops=(first.invoke.op, w.invoke.op)))
        acked.setdefault(ident, w)
    return found


# What etcd and joblease say when a token or the credentials are refused
# (PermissionDeniedError's messages, etcd's "invalid auth token").
AUTH_LOSS_WORDS = ("auth token", "refused the credentials", "permission denied",
                   "unauthenticated", "user name is empty")


def check_losses(operations: Sequence[Operation]) -> list[Violation]:
    """No lease is lost because etcd refused the client's credentials or token."""
    found = []
    for o in operations:
        if o.kind != "lost":
            continue
        reason = (o.reason or "").lower()
        if any(w in reason for w in AUTH_LOSS_WORDS):
            found.append(Violation(
                "auth-loss", f"lease lost to an auth refusal ({o.reason}): {o.describe()}",
                job=o.job, ops=(o.invoke.op,)))
    return found


def check_completions(operations: Sequence[Operation],
                      final: Mapping[str, FinalJob] | None = None) -> list[Violation]:
    found = []
    claims = _by_job(operations, "claim")
    completions = _by_job(operations, "complete")
    jobs = set(completions) | set(final or {})
    for job in sorted(jobs):
        mine = completions.get(job, [])
        ok = [c for c in mine if c.phase == "ok"]
        if len(ok) > 1:
            found.append(Violation(
                "multiple-completions",
                f"{len(ok)} accepted completions: " + "; ".join(c.describe() for c in ok),
                job=job, ops=tuple(c.invoke.op for c in ok)))
        ok_claims = [c for c in claims.get(job, []) if c.phase == "ok"]
        last = max((c.token or 0 for c in ok_claims), default=None)
        for c in ok:
            if last is None or c.token != last:
                newer = [x for x in ok_claims if (x.token or 0) > (c.token or 0)]
                found.append(Violation(
                    "stale-completion",
                    f"completion with token {c.token} was accepted but the job's last ok "
                    f"claim has token {last}: {c.describe()}"
                    + (f"; newer claims: {'; '.join(x.describe() for x in newer)}"
                       if newer else ""),
                    job=job, ops=(c.invoke.op, *(x.invoke.op for x in newer))))
        if final is None:
            continue
        state = final.get(job)
        if state is None:
            if ok:
                found.append(Violation("result-mismatch",
                                       "an acknowledged completion, but etcd has no such job",
                                       job=job, ops=tuple(c.invoke.op for c in ok)))
            continue
        max_gen = max((c.generation or 0 for c in ok_claims), default=0)
        if state.generation < max_gen:
            found.append(Violation("generation-regressed",
                                   f"etcd's generation is {state.generation} but an ok claim "
                                   f"had generation {max_gen}", job=job))
        if state.result_token is None:
            if ok:
                found.append(Violation(
                    "result-mismatch", "completion acknowledged but etcd has no result: "
                    + "; ".join(c.describe() for c in ok),
                    job=job, ops=tuple(c.invoke.op for c in ok)))
            continue
        if ok and any(c.token != state.result_token for c in ok):
            found.append(Violation(
                "result-mismatch",
                f"etcd's result has token {state.result_token}, the acknowledged completion "
                + "; ".join(c.describe() for c in ok), job=job,
                ops=tuple(c.invoke.op for c in ok)))
        if not ok and not any(c.token == state.result_token and c.phase != "fail"
                              for c in mine):
            found.append(Violation(
                "result-mismatch",
                f"etcd's result has token {state.result_token} (generation "
                f"{state.result_generation}) but no completion with that token was sent "
                "without being refused", job=job))
    return found


def check_destinations(operations: Sequence[Operation],
                       destinations: Mapping[str, Sequence[Entry]]) -> list[Violation]:
    found = []
    claim_token: dict[tuple[str, int], int] = {}
    for c in operations:
        if c.kind == "claim" and c.phase == "ok" and c.job and c.generation:
            claim_token[(c.job, c.generation)] = c.token or 0
    for resource, entries in sorted(destinations.items()):
        ordered = sorted(entries, key=lambda e: e.seq)
        high: Entry | None = None
        seen: dict[str, Entry] = {}
        for e in ordered:
            if high is not None and e.token < high.token:
                found.append(Violation(
                    "token-backwards",
                    f"seq {e.seq} accepted token {e.token} (gen {e.generation}, key {e.key}) "
                    f"after seq {high.seq} had accepted token {high.token} "
                    f"(gen {high.generation}, key {high.key})", resource=resource))
            if (high is not None and e.job == high.job and e.generation is not None
                    and high.generation is not None and e.generation < high.generation):
                found.append(Violation(
                    "generation-backwards",
                    f"seq {e.seq} accepted an effect of generation {e.generation} after seq "
                    f"{high.seq} accepted generation {high.generation}", resource=resource))
            if high is None or e.token >= high.token:
                high = e
            if e.key is not None:
                if e.key in seen:
                    found.append(Violation(
                        "duplicate-effect",
                        f"idempotency key {e.key} applied twice (seq {seen[e.key].seq} and "
                        f"{e.seq})", resource=resource))
                seen[e.key] = e
            if e.job and e.generation:
                expected = claim_token.get((e.job, e.generation))
                if expected is not None and expected != e.token:
                    found.append(Violation(
                        "foreign-token",
                        f"seq {e.seq} carries token {e.token} for generation {e.generation}, "
                        f"whose ok claim had token {expected}", resource=resource,
                        job=e.job))
    for w in operations:
        if w.kind != "write" or w.phase != "ok":
            continue
        resource = w.get("resource")
        keys = {e.key for e in destinations.get(resource, ())}
        if w.get("key") not in keys:
            found.append(Violation(
                "lost-write", f"acknowledged write is not in the destination: {w.describe()}",
                job=w.job, resource=resource, ops=(w.invoke.op,)))
    return found


def check_liveness(jobs: Iterable[str], liveness: Liveness) -> list[Violation]:
    found = []
    limit = liveness.faults_stopped_at + liveness.bound
    for job in sorted(jobs):
        at = liveness.completed_at.get(job)
        if at is None or at > limit:
            late = ("never completed" if at is None
                    else f"completed {at - liveness.faults_stopped_at:.1f}s after faults stopped")
            found.append(Violation(
                "liveness", f"{late}; the bound is {liveness.bound:.0f}s", job=job))
    return found


def check_statuses(served: Mapping[str, Sequence[Mapping[str, Any]]],
                   final: Mapping[str, FinalJob]) -> list[Violation]:
    """The operator's statuses, as served in order per JobLease: never a step back
    (the rule of tests/support/status_history.py), and the last one is etcd's
    completion."""
    found = [Violation("status-backwards", f"served status #{step.index}: {step.why}",
                       job=step.name) for step in steps_back(served)]
    for job, state in sorted(final.items()):
        last = next((s for s in reversed(served.get(job, ())) if s), None)
        want = {"phase": "Completed" if state.result_token is not None else None,
                "fencingToken": state.result_token, "generation": state.generation}
        if state.result_token is None:
            continue  # not completed: the liveness rule reports it
        got = {k: (last or {}).get(k) for k in want}
        if got != want:
            found.append(Violation(
                "status-final", f"the last status the API server served is {got}, etcd says "
                f"{want}", job=job))
    return found


def check(ops: Sequence[Op], *, final: Mapping[str, FinalJob] | None = None,
          destinations: Mapping[str, Sequence[Entry]] | None = None,
          liveness: Liveness | None = None, jobs: Iterable[str] | None = None,
          holders: Mapping[tuple[str, int], HolderAt | None] | None = None,
          statuses: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
          ) -> list[Violation]:
    """Every violation the history, etcd's final state and the destinations show."""
    operations = pair(ops)
    found = (check_claims(operations) + check_completions(operations, final)
             + check_resends(operations) + check_losses(operations))
    if holders is not None:
        found += check_holders(operations, holders)
    if statuses is not None:
        found += check_statuses(statuses, final or {})
    if destinations is not None:
        found += check_destinations(operations, destinations)
    if liveness is not None:
        found += check_liveness(jobs if jobs is not None else (final or {}).keys(), liveness)
    return found


def summarize(ops: Sequence[Op]) -> dict[str, dict[str, int]]:
    """Counts per kind: attempted, ok, fail by reason, unknown."""
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for o in pair(ops):
        c = out[o.kind]
        c["attempted"] += 1
        if o.invoke.extra.get("resend"):
            c["resent"] += 1
        if o.phase == "ok":
            c["accepted"] += 1
            if o.outcome is not None and o.outcome.extra.get("duplicate"):
                c["duplicate"] += 1
        elif o.phase == "unknown":
            c["unknown"] += 1
        else:
            c[f"rejected_{o.reason}"] += 1
        if o.kind == "write" and o.invoke.checked is False:
            c["unchecked"] += 1
            if o.phase == "fail" and o.reason == "stale":
                c["unchecked_rejected_stale"] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}
