"""The judge of a fenced destination's history: what concurrent writers were told
against what the destination committed.

Used by every gate's concurrency test (etcd, SQLite, PostgreSQL, the HTTP
middleware): accepted tokens never decrease in commit order, nothing accepted
is lost or doubled, and every refusal names a mark an accepted effect set.
"""

from __future__ import annotations

from collections import Counter

#: writer, token, accepted, highest token when refused
Outcome = tuple[int, int, bool, int | None]


def check_fenced_history(outcomes: list[Outcome], committed: list[tuple[int, int]]) -> None:
    """``committed``: (writer, token) of the destination's effects in commit order."""
    assert len(outcomes) == len({o[0] for o in outcomes})
    tokens = [t for _, t in committed]
    assert tokens == sorted(tokens), f"accepted tokens decreased in commit order: {tokens}"
    accepted = {(w, t) for w, t, ok, _ in outcomes if ok}
    assert Counter(committed) == Counter(accepted), "accepted effects lost or extra ones applied"
    for writer, token, ok, highest in outcomes:
        if not ok:
            assert highest is not None and highest > token, (writer, token, highest)
            assert highest in tokens, "refused by a mark no accepted effect set"
    assert max(o[1] for o in outcomes) in tokens
    # Every write below the mark at its commit was refused: each accepted effect was
    # >= every effect committed before it (checked above), and nothing else committed.
    assert len(committed) + sum(1 for o in outcomes if not o[2]) == len(outcomes)
