"""A session (one etcd lease) takes at most ``holders_per_session`` claims, held or
in flight; further claims of its TTL go to another open session with room, or a
new one. Why: with etcd auth on, each put bound to a lease costs etcd a
permission check per key already attached to it (docs/security.md), so one
lease shared by every holder of a busy client made each claim cost a check per
claim in flight (joblease.session_pool). Against a real etcd: what etcd has
attached to each lease is read from the holder keys' own ``lease`` field."""

from __future__ import annotations

import asyncio
from collections import Counter

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec, Lease
from tests.support.waiting import poll


async def _jobs(client: JobLeaseClient, n: int, prefix: str) -> list[JobRef]:
    jobs = [JobRef("default", f"{prefix}-{i}") for i in range(n)]
    await asyncio.gather(*(client.register(j, JobSpec(20, 0)) for j in jobs))
    return jobs


async def _holders_per_lease(client: JobLeaseClient, jobs: list[JobRef]) -> Counter[int]:
    """Holder keys of ``jobs`` in etcd, counted by the lease etcd has them bound to."""
    counts: Counter[int] = Counter()
    for job in jobs:
        _, kvs = await client.store.get(client.keys.job(job).holder)
        for kv in kvs:
            counts[kv.lease] += 1
    return counts


async def _open_leases(client: JobLeaseClient, leases: set[int]) -> set[int]:
    return {lease for lease in leases if await client.store.time_to_live(lease) > 0}


async def test_claims_beyond_a_sessions_room_are_bound_to_further_leases(
        client: JobLeaseClient) -> None:
    room = client.sessions.holders_per_session
    jobs = await _jobs(client, 2 * room + 4, "room")
    leases = await asyncio.gather(*(client.claim(j, "worker-a") for j in jobs))
    in_etcd = await _holders_per_lease(client, jobs)
    assert sum(in_etcd.values()) == len(jobs)
    assert max(in_etcd.values()) <= room, in_etcd
    assert len(in_etcd) == 3, f"{len(jobs)} claims should need exactly 3 leases: {in_etcd}"
    assert Counter(lease.lease_id for lease in leases) == in_etcd  # handles agree with etcd
    for lease in leases:
        await lease.release()


async def test_a_session_with_room_again_takes_claims_before_a_new_lease_is_granted(
        client: JobLeaseClient) -> None:
    room = client.sessions.holders_per_session
    jobs = await _jobs(client, 2 * room + 3, "refill")
    held: list[Lease] = list(await asyncio.gather(
        *(client.claim(j, "worker-a") for j in jobs[:2 * room])))
    first = held[0].lease_id
    assert len({lease.lease_id for lease in held}) == 2  # both full
    freed = [lease for lease in held if lease.lease_id == first][:3]
    for lease in freed:
        await lease.complete({"done": True})
    more = [await client.claim(j, "worker-a") for j in jobs[2 * room:]]
    assert {lease.lease_id for lease in more} == {first}, "the room made was not used"
    in_etcd = await _holders_per_lease(client, jobs)
    assert in_etcd[first] == room and max(in_etcd.values()) <= room, in_etcd
    assert len(in_etcd) == 2, f"no third lease was needed: {in_etcd}"
    for lease in [*held, *more]:
        if lease not in freed:
            await lease.release()


async def test_sessions_idle_after_a_busy_spell_are_closed_by_later_claims(
        etcd_config: EtcdConfig) -> None:
    """The pool looks at all its sessions only every few claims once it has
    several (``_SWEEP_EVERY``): after a spell of many claims at once, claims one
    at a time still close (revoke) the idle sessions beyond ``idle_sessions``."""
    async with JobLeaseClient(etcd_config) as client:
        room = client.sessions.holders_per_session
        client.sessions.idle_sessions = 1
        jobs = await _jobs(client, 4 * room, "busy")
        spell = await asyncio.gather(*(client.claim(j, "worker-a") for j in jobs))
        granted = {lease.lease_id for lease in spell}
        assert len(granted) == 4
        for lease in spell:
            await lease.complete(None)
        later = await _jobs(client, client.sessions._SWEEP_EVERY + 1, "later")
        for job in later:
            await (await client.claim(job, "worker-a")).complete(None)
        # the one these claims use, and at most one idle one
        await poll(lambda: _fewer_open(client, granted, 2), 5, "idle sessions to be revoked",
                   interval=0.02)


async def _fewer_open(client: JobLeaseClient, leases: set[int], at_most: int) -> bool:
    return len(await _open_leases(client, leases)) <= at_most
