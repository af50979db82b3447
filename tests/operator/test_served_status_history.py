"""The "no status ever moves backwards" rule of tests/support/status_history.py,
fed good and bad histories (the cluster tests rely on it to complain)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.status_history import regressions


def s(phase: str, generation: int, revision: int, token: int | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "generation": generation,
                              "attempts": generation, "etcdRevision": revision}
    if token is not None:
        status["fencingToken"] = token
    return status


#: empty (before the operator wrote), registered, claimed, released, claimed again,
#: the same status served twice (a metadata-only change), completed
FORWARD = [{}, s("Pending", 0, 5), s("Claimed", 1, 7, 7), s("Pending", 1, 9, 7),
           s("Claimed", 2, 11, 11), s("Claimed", 2, 11, 11), s("Completed", 2, 12, 11)]


def test_a_history_that_only_moves_forward_passes() -> None:
    assert regressions({"a": FORWARD, "b": [s("Pending", 0, 3), s("Failed", 3, 20)],
                        "c": [s("NotRegistered", 0, 2), *FORWARD[1:]]}) == []


@pytest.mark.parametrize(("index", "status", "complaint"), [
    # an old operator's write of a claim after the completion
    (7, s("Claimed", 2, 11, 11), "phase Claimed after Completed"),
    (7, s("Pending", 1, 9, 7), "generation 1 after 2"),
    (3, s("Pending", 1, 6, 7), "etcdRevision 6 after 7"),
    (4, s("Claimed", 2, 11, 5), "fencingToken 5 after 7"),
    # a Claimed of the generation that was already released
    (4, s("Claimed", 1, 10, 7), "phase Claimed at generation 1 after Pending at generation 1"),
    (7, s("Failed", 2, 13, 11), "phase Failed after Completed"),
    (7, s("Running", 2, 13, 11), "unknown phase 'Running'"),
    # registration is never undone in these histories
    (2, s("NotRegistered", 0, 6), "phase NotRegistered at generation 0 after Pending"),
])
def test_each_step_backwards_is_reported(index: int, status: dict[str, Any],
                                         complaint: str) -> None:
    """``status`` served right after the first ``index`` statuses of FORWARD."""
    history = [*FORWARD[:index], status]
    found = regressions({"a": history, "b": FORWARD})
    assert found and all(line.startswith(f"a #{index}: ") for line in found), found
    assert any(complaint in line for line in found), found


def tenures(*rows: tuple[int, str, int]) -> list[dict[str, Any]]:
    """``recentTenures`` from ``(token, end, refusedCompletions)``, newest first."""
    return [{"generation": 1, "token": token, "holder": "w", "end": end, "checkpoints": 0,
             "refusedCompletions": refused} for token, end, refused in rows]


def test_recent_tenures_that_only_move_forward_pass_and_each_step_back_is_reported() -> None:
    claimed = {**s("Claimed", 1, 7, 7), "recentTenures": tenures((7, "open", 0))}
    expired = {**s("Pending", 1, 9, 7), "recentTenures": tenures((7, "expired", 0))}
    refused = {**s("Pending", 1, 12, 7), "recentTenures": tenures((7, "expired", 1))}
    again = {**s("Claimed", 2, 15, 15),
             "recentTenures": tenures((15, "open", 0), (7, "expired", 1))}
    assert regressions({"a": [claimed, expired, refused, again]}) == []
    for bad, complaint in [
            ({**refused, "recentTenures": tenures((7, "open", 0))}, "tenure 7 open after expired"),
            ({**refused, "recentTenures": tenures((7, "expired", 0))},
             "tenure 7 refusedCompletions 0 after 1"),
            ({**again, "recentTenures": tenures((5, "open", 0))},
             "recentTenures newest token 5 after 7")]:
        found = regressions({"a": [claimed, expired, refused, bad]})
        assert any(complaint in line for line in found), found
