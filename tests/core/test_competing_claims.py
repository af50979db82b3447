"""Competing claims and clock differences, with real processes and a real etcd.

Several processes, each running independent claimers (own client, own etcd
lease), race for one job. Exactly one claimer wins each generation and tokens
strictly increase with the generation. Under libfaketime (wall clocks hours
apart, clocks running at other rates) the outcomes are the same, because no
ownership decision reads a worker's clock.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from joblease import JobLeaseClient, JobRef, JobSpec

ROOT = Path(__file__).resolve().parents[2]


def run_racers(client: JobLeaseClient, job: JobRef, envs: Sequence[dict[str, str]],
               claimers: int, target: int) -> tuple[list[dict[str, object]], list[float]]:
    """One racer process per entry of ``envs`` (extra environment for that process),
    started together once all are connected: ``(wins, each process's wall clock)``."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.core.racer_process",
             ",".join(client.config.endpoints), client.config.root, str(job), f"p{i}",
             str(claimers), str(target)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, **env})
        for i, env in enumerate(envs)
    ]
    walls = []
    for p in procs:  # each says "ready WALL" once its clients are connected
        assert p.stderr is not None
        line = p.stderr.readline()
        assert line.startswith("ready "), (line, p.poll())
        walls.append(float(line.split()[1]))
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    wins: list[dict[str, object]] = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-3000:]
        wins += [json.loads(line) for line in out.splitlines() if line.strip()]
    return wins, walls


def check_one_winner_per_generation(wins: list[dict[str, object]], target: int) -> None:
    generations = sorted(int(str(w["generation"])) for w in wins)
    # claimers racing when the target is reached may win a few more generations
    assert generations[-1] >= target
    assert generations == list(range(1, generations[-1] + 1)), (
        "a generation was won twice or skipped")
    by_generation = sorted(wins, key=lambda w: int(str(w["generation"])))
    tokens = [int(str(w["token"])) for w in by_generation]
    assert all(a < b for a, b in itertools.pairwise(tokens)), tokens


async def test_exactly_one_claimer_wins_each_generation(client: JobLeaseClient) -> None:
    job = JobRef("default", "race")
    await client.register(job, JobSpec(lease_duration_seconds=5, max_attempts=0))
    target = 40
    wins, _ = run_racers(client, job, [{}] * 4, claimers=10, target=target)
    check_one_winner_per_generation(wins, target)
    assert len({w["owner"] for w in wins}) > 1, "no race happened"
    state = await client.get(job)
    assert state.generation == max(int(str(w["generation"])) for w in wins)


def _libfaketime() -> str | None:
    for candidate in ("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
                      "/usr/lib/faketime/libfaketime.so.1"):
        if os.path.exists(candidate):
            return candidate
    return None


FAKETIME = _libfaketime()


def faketime_env(spec: str) -> dict[str, str]:
    """Preload libfaketime into the worker itself (not via the ``faketime``
    wrapper, which forks: a SIGSTOP must reach the worker, not the wrapper)."""
    assert FAKETIME is not None, "libfaketime missing: apt-get install faketime"
    return {"LD_PRELOAD": FAKETIME, "FAKETIME": spec, "FAKETIME_NO_CACHE": "1"}


async def test_clock_differences_do_not_change_ownership(client: JobLeaseClient) -> None:
    job = JobRef("default", "skewed")
    await client.register(job, JobSpec(lease_duration_seconds=5, max_attempts=0))
    target = 30
    envs = [
        faketime_env("-7h"),       # seven hours behind
        faketime_env("+5h"),       # five hours ahead
        faketime_env("+1d x2"),    # a day ahead, running twice as fast
        faketime_env("-2h x0.5"),  # behind and running at half speed
    ]
    wins, walls = run_racers(client, job, envs, claimers=10, target=target)
    check_one_winner_per_generation(wins, target)
    # every racer's own clock, not only the winners' (one process may win them all)
    assert max(walls) - min(walls) > 3600, f"faketime did not skew the workers' clocks: {walls}"


async def test_slow_clock_holder_is_still_fenced_by_the_store(client: JobLeaseClient) -> None:
    """A holder whose clock runs at half speed (so its own safety deadline is
    late) and is paused past its TTL may still *believe* it holds the job;
    the store rejects its completion anyway, because etcd decided the expiry."""
    import time

    from tests.support.worker_proc import WorkerProc

    assert FAKETIME is not None
    job = JobRef("default", "slow-clock")
    await client.register(job, JobSpec(lease_duration_seconds=2, max_attempts=0))
    a = WorkerProc(client.config, job, "slow-a", env=faketime_env("-3h x0.5"))
    b = None
    try:
        claimed_a = a.next_event("claimed")
        a.pause()
        b = WorkerProc(client.config, job, "fast-b")
        claimed_b = b.next_event("claimed", timeout=15)
        assert claimed_b["token"] > claimed_a["token"]
        assert abs(claimed_a["wall"] - (time.time() - 3 * 3600)) < 600  # really skewed
        a.resume()
        a.send('complete {"by": "slow-a"}')
        late = a.next_event("completed")
        assert late["ok"] is False and late["error"] == "stale"
        assert late["currentToken"] == claimed_b["token"]
        b.send('complete {"by": "fast-b"}')
        assert b.next_event("completed")["ok"] is True
        state = await client.get(job)
        assert state.result is not None and state.result.owner == "fast-b"
    finally:
        a.stop()
        if b is not None:
            b.stop()
