"""Stand-ins for the operator mirror's two neighbours, for tests of its logic alone.

What is faked and why: :class:`FakeKube` is just enough of ``KubeApi`` (a
JobLease object with resourceVersion-conditional status writes, events
recorded) and :class:`FakeClient` just enough of ``JobLeaseClient`` (a lease's
remaining TTL) to drive :class:`joblease.operator.mirror.Mirror` without I/O,
so a test decides exactly which etcd states arrive in which order. The real
API server and etcd are exercised by tests/kube. :func:`state` builds the
etcd states.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
from typing import Any

from joblease.keys import JobRef, KeySpace
from joblease.records import Holder, JobSpec, JobState, ResultRecord

JOB = JobRef("ns", "job")
T0 = dt.datetime(2025, 1, 1, 12, 0, 0, tzinfo=dt.UTC)
SPEC = JobSpec(lease_duration_seconds=10, max_attempts=2, history_limit=10)


def state(revision: int, *, generation: int = 0, holder: tuple[str, int] | None = None,
          result: Any = ..., spec: JobSpec | None = SPEC) -> JobState:
    h = None
    if holder is not None:
        h = Holder(owner=holder[0], claim_id="c", token=holder[1], generation=generation,
                   lease_id=7, claimed_at=T0.timestamp())
    r = None
    if result is not ...:
        r = ResultRecord(owner="a", claim_id="c", token=40, generation=generation,
                         result=result, completed_at=T0.timestamp() + 5, revision=revision)
    return JobState(job=JOB, revision=revision, spec=spec, spec_revision=3 if spec else 0,
                    holder=h, generation=generation, last_claim_owner=None, result=r)


class FakeKube:
    """Just enough of KubeApi: resourceVersion-conditional status writes."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] = {
            "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
            "metadata": {"name": JOB.name, "namespace": JOB.namespace, "uid": "u1",
                         "generation": 1, "resourceVersion": "1"},
            "spec": {"leaseDurationSeconds": 10, "maxAttempts": 2}}
        self.writes: list[int] = []
        self.events: list[str] = []  # reasons of the Events created
        self.patches: list[int] = []  # the counts of repeats patched

    def bump(self, status: dict[str, Any]) -> None:
        self.obj = {**self.obj, "status": status, "metadata": {
            **self.obj["metadata"], "resourceVersion": str(
                int(self.obj["metadata"]["resourceVersion"]) + 1)}}

    async def get(self, job: JobRef) -> dict[str, Any]:
        return json.loads(json.dumps(self.obj))

    async def replace_status(self, obj: dict[str, Any], status: dict[str, Any]
                             ) -> dict[str, Any]:
        from joblease.operator.kube import ConflictError
        if obj["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise ConflictError(409, "changed")
        self.bump(status)
        self.writes.append(status["etcdRevision"])
        return await self.get(JOB)

    instance = "fake"

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        assert body["involvedObject"]["uid"] == "u1"
        self.events.append(body["reason"])
        return {"metadata": {"name": f"{JOB.name}.{len(self.events)}"}}

    async def patch_event(self, namespace: str, name: str, patch: dict[str, Any]
                          ) -> dict[str, Any]:
        self.patches.append(patch["count"])
        return {"metadata": {"name": name}}


class FakeStore:
    async def time_to_live(self, lease_id: int) -> int:
        return 5

    async def get(self, key: bytes, **kw: Any) -> tuple[int, list[Any]]:
        return 0, []  # the job's history: no tenure recorded


class FakeClient:
    store = FakeStore()
    keys = KeySpace()


async def settle(mirror: Any) -> None:
    """Until no status write is pending and every Event write so far has ended."""
    while mirror._writers:
        await asyncio.gather(*list(mirror._writers.values()))
    await mirror.events.wait()
