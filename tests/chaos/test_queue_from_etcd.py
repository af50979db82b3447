"""The pod-level verdict's reading of etcd and the ledger (tests/chaos/queue_from_etcd.py),
judged by the queue checker: a good run passes, and each rule fails on a history built
to break it. Pure functions over purpose-built records: no etcd is needed, the events
have the shapes etcd's watch gives (tests/cluster/test_pod_chaos.py reads the real ones).
"""

from __future__ import annotations

from typing import Any

from joblease.records import ResultRecord
from tests.chaos.queue_checker import check_queue
from tests.chaos.queue_from_etcd import (
    Event,
    Kv,
    check_entry_tokens,
    final_items,
    ledger_entries,
    queue_ops,
)

Q = "ns/q"


def result(token: int, generation: int) -> bytes:
    return ResultRecord(owner="pod/uid", claim_id="c", token=token, generation=generation,
                        result={"ok": True}, completed_at=0.0).encode()


class Run:
    """A queue's etcd history, written as its transactions were, and the final keys."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.keys: dict[str, dict[str, Kv]] = {}
        self.books: dict[str, dict[str, Any]] = {}
        self.seq = 0

    def put(self, rev: int, field: str, item: str, value: bytes = b"{}") -> None:
        old = self.keys.setdefault(field, {}).get(item)
        kv = Kv(old.create_revision if old else rev, rev, (old.version if old else 0) + 1, value)
        self.keys[field][item] = kv
        self.events.append(Event("put", field, item, kv))

    def delete(self, rev: int, field: str, item: str) -> None:
        self.keys[field].pop(item)
        self.events.append(Event("delete", field, item, Kv(0, rev, 0)))

    def enqueue(self, rev: int, *items: str) -> None:
        for i in items:
            self.put(rev, "items", i)
            self.put(rev, "pending", i)

    def claim(self, rev: int, item: str) -> None:
        self.put(rev, "held", item)
        self.put(rev, "claims", item)

    def expire(self, rev: int, item: str) -> None:
        self.delete(rev, "held", item)

    def complete(self, rev: int, item: str, token: int, generation: int) -> None:
        self.put(rev, "results", item, result(token, generation))
        self.delete(rev, "held", item)
        self.delete(rev, "pending", item)

    def write(self, item: str, token: int) -> None:
        self.seq += 1
        book = self.books.setdefault(f"q-{item}", {"entries": []})
        book["entries"].append({"seq": self.seq, "token": token, "job": f"{Q}/{item}"})

    def verdict(self, enqueued: list[list[str]]) -> list[str]:
        ops = queue_ops(Q, self.events, enqueued)
        dest = ledger_entries(self.books, ops)
        found = check_queue(ops, final=final_items(Q, self.keys), max_attempts=0,
                            destinations=dest) + check_entry_tokens(ops, dest)
        return sorted({v.kind for v in found})


def good() -> Run:
    """a: claimed and completed. b: claimed at 14 and written, its lease expired, claimed
    again at 17 (generation 2), written and completed."""
    r = Run()
    r.enqueue(10, "a", "b")
    r.claim(12, "a")
    r.write("a", 12)
    r.complete(13, "a", 12, 1)
    r.claim(14, "b")
    r.write("b", 14)
    r.expire(16, "b")
    r.claim(17, "b")
    r.write("b", 17)
    r.complete(18, "b", 17, 2)
    return r


def test_a_good_run_read_from_etcd_has_no_violations() -> None:
    r = good()
    ops = queue_ops(Q, r.events, [["a", "b"]])
    claims = sorted((o.job, o.token, o.generation) for o in ops
                    if o.kind == "claim" and o.phase == "ok")
    assert claims == [(f"{Q}/a", 12, 1), (f"{Q}/b", 14, 1), (f"{Q}/b", 17, 2)]
    assert r.verdict([["a", "b"]]) == []


def test_an_item_completed_twice_in_etcd_is_found() -> None:
    r = good()
    r.put(19, "results", "b", result(17, 2))  # a second put of the result
    assert "item-completed-twice" in r.verdict([["a", "b"]])


def test_a_stale_write_accepted_after_the_successors_is_found() -> None:
    r = good()
    r.write("b", 14)  # generation 1's write, accepted after generation 2's
    assert {"item-token-backwards", "item-superseded-effect"} <= set(r.verdict([["a", "b"]]))


def test_a_write_under_a_token_no_claim_had_is_found() -> None:
    r = good()
    r.write("a", 15)  # token 15 was never a claim of a
    assert "unclaimed-token" in r.verdict([["a", "b"]])


def test_an_enqueued_item_never_completed_is_found() -> None:
    r = good()
    assert "item-lost" in r.verdict([["a", "b", "c"]])  # c acknowledged, never in etcd
    r.enqueue(20, "d")  # in etcd, pending at the end
    assert "item-lost" in r.verdict([["a", "b"], ["d"]])


def test_a_completion_under_a_superseded_claim_is_found() -> None:
    r = Run()
    r.enqueue(10, "a")
    r.claim(12, "a")
    r.expire(14, "a")
    r.claim(15, "a")
    r.complete(16, "a", 12, 1)  # generation 1's token accepted after generation 2's claim
    assert "stale-completion" in r.verdict([["a"]])
