"""A steady, bounded claim/complete load, run *inside* a pod of the project image.

``kubectl exec -i <tools pod> -- python - [--until PATH] NAMESPACE OWNER PAUSE RELEASES
DEADLINE JOB...``
with this file on stdin (tests/support/load.py does that): it imports only the
standard library and ``joblease`` (the image's own package), and reaches etcd with
the pod's ``JOBLEASE_ETCD_*`` environment, as a worker's sidecar would.

For each job in turn: claim, wait ``PAUSE`` s, release (``RELEASES`` times, each a
new claim and so a new generation and token), then claim once more and complete
with ``{"by": OWNER, "token": <token>}``. With ``--until PATH`` the test decides
when the load ends, not a fixed pause: a job with RELEASES > 0 is released again and
again until the file PATH exists (in the pod: the test creates it), and no job is
completed before it exists (with RELEASES 0: the one claim is held until then).
Every operation's outcome is printed as a JSON line as soon as etcd answered:
``{"op": "claim"|"release"|"complete", "ok": true, "job", "generation", "token", "t"}``
for acknowledged ones, ``"ok": false`` with the
error class for refused or unanswered ones (those count as not acknowledged). After
an error the job is retried (a claim whose outcome is unknown may have used an
attempt, so the JobLeases need spare attempts) until it completes or ``DEADLINE``
seconds have passed since the start. Finally one ``{"op": "final", ...}`` line per
job with etcd's state, read after the load, and ``{"op": "done"}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

from joblease import (
    AlreadyCompletedError,
    HeldError,
    JobLeaseClient,
    JobLeaseError,
    JobRef,
    Lease,
    StoreUnavailableError,
)


def emit(**record: Any) -> None:
    record["t"] = round(time.time(), 3)
    print(json.dumps(record, sort_keys=True), flush=True)


async def settle(client: JobLeaseClient, lease: Lease, pause: float, deadline: float) -> bool:
    """After an unanswered release or completion: True if etcd holds our completion;
    otherwise make sure our claim ends (release until etcd says it is not ours), so
    the next claim is not refused as held by ourselves."""
    while time.monotonic() < deadline:
        try:
            state = await client.get(lease.job)
            if state.result is not None:
                return state.result.token == lease.token
            if state.holder is None or state.holder.token != lease.token:
                return False
            await lease.release()
            return False
        except StoreUnavailableError:
            await asyncio.sleep(pause)
        except JobLeaseError:
            return False  # refused: the claim is no longer ours
    return False


def ended(until: str | None) -> bool:
    return until is None or os.path.exists(until)


async def one_job(client: JobLeaseClient, job: JobRef, owner: str, pause: float,
                  releases: int, deadline: float, until: str | None) -> None:
    released = 0
    while time.monotonic() < deadline:
        try:
            lease = await client.claim(job, owner)
        except AlreadyCompletedError:
            return  # an unanswered completion did commit (settle said so, or will)
        except (HeldError, StoreUnavailableError) as exc:
            # held: an unsettled claim of ours still runs out its TTL
            emit(op="claim", ok=False, job=job.name, error=type(exc).__name__)
            await asyncio.sleep(pause)
            continue
        emit(op="claim", ok=True, job=job.name, generation=lease.generation, token=lease.token)
        await asyncio.sleep(pause)
        again = releases > 0 and not ended(until)
        what = "release" if released < releases or again else "complete"
        while what == "complete" and not ended(until) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)  # held until the test says the load ends
        try:
            if what == "release":
                await lease.release()
                released += 1
            else:
                await lease.complete({"by": owner, "token": lease.token})
        except JobLeaseError as exc:
            emit(op=what, ok=False, job=job.name, generation=lease.generation,
                 token=lease.token, error=type(exc).__name__)
            if await settle(client, lease, pause, deadline):
                return  # completed after all, but never acknowledged: not counted
            await asyncio.sleep(pause)
            continue
        emit(op=what, ok=True, job=job.name, generation=lease.generation, token=lease.token)
        if what == "complete":
            return
        await asyncio.sleep(pause)


async def final_state(client: JobLeaseClient, job: JobRef) -> None:
    for _ in range(60):
        try:
            state = await client.get(job)
        except StoreUnavailableError:
            await asyncio.sleep(1)
            continue
        emit(op="final", job=job.name, phase=state.phase.value, generation=state.generation,
             token=state.token, holder=state.holder.owner if state.holder else "",
             result_token=state.result.token if state.result else None,
             result_generation=state.result.generation if state.result else None)
        return
    emit(op="final", job=job.name, error="etcd unreachable")


async def main(argv: list[str]) -> None:
    until = None
    if argv[:1] == ["--until"]:
        until, argv = argv[1], argv[2:]
    namespace, owner, pause, releases, limit, *names = argv
    deadline = time.monotonic() + float(limit)
    async with JobLeaseClient() as client:
        for name in names:
            await one_job(client, JobRef(namespace, name), owner, float(pause),
                          int(releases), deadline, until)
        for name in names:
            await final_state(client, JobRef(namespace, name))
    emit(op="done")


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
