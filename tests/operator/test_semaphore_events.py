"""A JobSemaphore's Events from two consecutive statuses (pure: no I/O)."""

from __future__ import annotations

from typing import Any

from joblease.operator.semaphore_events import derive_semaphore_events


def status(holders: list[tuple[int, str, int]], *, limit: int, waiters: int = 0,
           saturated: str | None = None) -> dict[str, Any]:
    s: dict[str, Any] = {
        "limit": limit, "live": len(holders), "waiters": waiters,
        "holders": [{"slot": slot, "holder": f"ns/{job}", "owner": f"pod-{job}", "token": token}
                    for slot, job, token in holders]}
    if saturated is not None:
        s["conditions"] = [{"type": "Registered", "status": "True"},
                           {"type": "Saturated", "status": saturated}]
    return s


def reasons(before: dict[str, Any] | None, after: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e.reason, e.message) for e in derive_semaphore_events(before, after)]


def test_each_new_token_is_one_grant_in_token_order_and_a_kept_holder_is_none() -> None:
    before = status([(0, "a", 10)], limit=3, saturated="False")
    after = status([(0, "a", 10), (1, "c", 14), (2, "b", 12)], limit=3, waiters=2,
                   saturated="True")
    assert reasons(before, after) == [
        ("SlotGranted", "slot 2 granted to ns/b (owner pod-b, token 12)"),
        ("SlotGranted", "slot 1 granted to ns/c (owner pod-c, token 14)"),
        ("Saturated", "every slot is held: 3 of 3 slot(s) live, 2 waiting"),
    ]
    assert [e.type for e in derive_semaphore_events(before, after)] == ["Normal"] * 3


def test_a_slot_taken_again_by_another_claim_is_a_grant_even_in_the_same_slot() -> None:
    before = status([(0, "a", 10)], limit=1, saturated="True")
    after = status([(0, "b", 20)], limit=1, saturated="True")
    assert reasons(before, after) == [
        ("SlotGranted", "slot 0 granted to ns/b (owner pod-b, token 20)")]


def test_room_again_only_after_saturation_and_nothing_for_an_unchanged_status() -> None:
    full = status([(0, "a", 10), (1, "b", 11)], limit=2, saturated="True")
    room = status([(1, "b", 11)], limit=2, saturated="False")
    assert reasons(full, room) == [("HasRoom", "a slot is free again: 1 of 2 slot(s) live, "
                                               "0 waiting")]
    assert reasons(full, full) == [] and reasons(room, room) == []
    # Registered, not saturated: no HasRoom without a saturation before it.
    assert reasons(status([], limit=2), status([], limit=2, saturated="False")) == []
    # Not registered any more (Unknown): neither Saturated nor HasRoom.
    assert reasons(full, status([], limit=0, saturated="Unknown")) == []


def test_the_first_status_reports_its_holders_and_a_restart_does_not_repeat_them() -> None:
    first = status([(0, "a", 10)], limit=1, saturated="True")
    assert [r for r, _ in reasons(None, first)] == ["SlotGranted", "Saturated"]
    # The previous status comes from the API server, so a new operator process
    # compares with what the old one wrote.
    assert reasons(first, dict(first, etcdRevision=99)) == []
