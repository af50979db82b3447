"""A session's local safety deadline on a clock the test moves: ``remaining()``
reads the clock once, says 0 from the deadline on, and expires the session
there itself (as ``alive`` does), so no caller sees time left on a session
past its deadline, and the session pool takes no claim on it."""

from __future__ import annotations

from typing import cast

from joblease.background import BackgroundTasks
from joblease.session import Session
from joblease.session_pool import SessionPool
from joblease.store import Store


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0
        self.reads = 0

    def __call__(self) -> float:
        self.reads += 1
        return self.now


def _session(clock: _Clock) -> Session[object]:
    # never started: no etcd is needed to read the local deadline
    s: Session[object] = Session(cast(Store, object()), 10, margin=2, clock=clock)
    s.deadline = 108.0
    return s


async def test_remaining_is_the_time_to_the_deadline_from_one_clock_read() -> None:
    clock = _Clock()
    s = _session(clock)
    assert s.remaining() == 8.0 and clock.reads == 1
    clock.now = 107.75
    assert s.remaining() == 0.25 and s.alive and s.lost_reason is None


async def test_remaining_expires_the_session_at_its_deadline_and_never_revives_it() -> None:
    clock = _Clock()
    s = _session(clock)
    lost: list[str] = []
    s.on_loss(lost.append)
    clock.now = 108.0  # the deadline itself: no time left
    assert s.remaining() == 0.0
    assert s.lost_reason is not None and lost == [s.lost_reason]  # expired by remaining()
    clock.now = 50.0  # a clock read before the deadline again changes nothing
    assert s.remaining() == 0.0 and not s.alive and len(lost) == 1


async def test_the_pool_takes_no_claim_on_a_session_short_of_time_or_lost() -> None:
    clock = _Clock()
    pool = SessionPool(cast(Store, object()), BackgroundTasks(), margin=None,
                       revoke_on_loss=False, revoke_timeout=1)
    s = _session(clock)
    assert pool._usable(s)  # type: ignore[arg-type]
    clock.now = 108.0 - pool.min_session_left / 2
    assert not pool._usable(s) and s.lost_reason is None  # type: ignore[arg-type]
    pool.min_session_left = 0.0  # even with no minimum, a lost session is not usable
    assert pool._usable(s)  # type: ignore[arg-type]
    s.lose("lost for the test")
    clock.now = 100.0
    assert not pool._usable(s)  # type: ignore[arg-type]
