"""Idempotency keys are unique per incarnation of a job, not just per generation.

The generation counts the claims of one registration: after ``unregister`` and
``register`` (a JobLease deleted and re-applied) it starts again at 1. Real etcd
for the claims, the real ledger destination over real HTTP with its durable
SQLite gate (the keys of the first incarnation are still recorded there).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.fencing.destination import create_app
from joblease.fencing.http import HEADER_IDEMPOTENCY_KEY, HEADER_REPLAYED, fencing_headers
from tests.support.served import Served


async def test_a_reregistered_jobs_effects_are_not_taken_for_the_old_incarnations(
        etcd_config: EtcdConfig, serve: Callable[[Any], Served], tmp_path: Path) -> None:
    job = JobRef("default", "reborn")
    served = serve(create_app(db=str(tmp_path / "ledger.sqlite")))
    async with JobLeaseClient(etcd_config) as c, httpx.AsyncClient(timeout=30) as http:
        await c.register(job, JobSpec(lease_duration_seconds=5))
        first = await c.claim(job, "worker-a")
        h1 = fencing_headers(first, "append")
        r1 = await http.post(f"{served.url}/resources/out", json={"n": 1}, headers=h1)
        assert r1.status_code == 201, r1.text
        await first.complete({"n": 1})

        await c.unregister(job)  # the JobLease is deleted ...
        await c.register(job, JobSpec(lease_duration_seconds=5))  # ... and applied again
        second = await c.claim(job, "worker-b")
        assert second.generation == first.generation  # the generation started again
        assert second.token > first.token
        h2 = fencing_headers(second, "append")
        r2 = await http.post(f"{served.url}/resources/out", json={"n": 2}, headers=h2)
        assert r2.status_code == 201, r2.text
        assert h2[HEADER_IDEMPOTENCY_KEY] != h1[HEADER_IDEMPOTENCY_KEY]
        assert HEADER_REPLAYED not in r2.headers
        # and a retry of the new incarnation's request is still applied once
        again = await http.post(f"{served.url}/resources/out", json={"n": 2}, headers=h2)
        assert again.status_code == 201 and again.headers.get(HEADER_REPLAYED) == "true"
        await second.release()
        entries = (await http.get(f"{served.url}/resources/out")).json()["entries"]
    assert [(e["token"], e["data"]) for e in entries] == [(first.token, {"n": 1}),
                                                          (second.token, {"n": 2})]
