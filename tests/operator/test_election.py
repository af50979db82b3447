"""Leader election through etcd (joblease.operator.election), against the session's
real etcd. Nothing is faked except, in the partition test, the network between
one candidate and etcd (tests/support/proxy.py's LossyProxy swallowing its
requests): a leader that is cut off must give up before a standby can win."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest

from joblease import EtcdConfig
from joblease.etcd_store import EtcdStore
from joblease.operator.election import Election, Leadership, check_name, election_key
from joblease.operator.main import OperatorConfig, election_name
from joblease.store import Delete
from tests.support.proxy import LossyProxy

TTL = 2


@pytest.fixture
async def stores(etcd_config: EtcdConfig) -> AsyncIterator[list[EtcdStore]]:
    """Two separate connections: two replicas."""
    opened = [EtcdStore(etcd_config), EtcdStore(etcd_config)]
    yield opened
    for store in opened:
        await store.close()


def candidates(stores: list[EtcdStore], root: str, ttl: int = TTL) -> list[Election]:
    return [Election(s, root, "all-namespaces", f"replica-{i}", ttl=ttl)
            for i, s in enumerate(stores)]


async def lead_after(election: Election) -> tuple[Leadership, float]:
    leadership = await election.campaign()
    return leadership, time.monotonic()


async def test_one_leader_the_other_stands_by_and_takes_over_at_once_on_resign(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    a, b = candidates(stores, etcd_config.root)
    first = await asyncio.wait_for(a.campaign(), 10)
    standby = asyncio.create_task(lead_after(b))
    await asyncio.sleep(3 * TTL)  # several keep-alive rounds: the leader keeps the key
    assert not standby.done(), "a second leader was elected while the first was alive"
    assert first.alive
    assert (await b.leader()).identity == "replica-0"

    resigned = time.monotonic()
    await first.resign()
    second, at = await asyncio.wait_for(standby, 10)
    assert at - resigned < 1.0, f"takeover after a resign took {at - resigned:.2f}s"
    assert second.term > first.term  # a new term: a larger fencing token
    assert not first.alive and first.lost_reason == "resigned"
    assert (await a.leader()).identity == "replica-1"
    await second.resign()


async def test_a_dead_leader_is_replaced_when_its_etcd_lease_expires(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    a, b = candidates(stores, etcd_config.root)
    first = await asyncio.wait_for(a.campaign(), 10)
    standby = asyncio.create_task(lead_after(b))
    await asyncio.sleep(0.5)
    # A crash: keep-alives stop, nothing is revoked; only etcd's TTL frees the key.
    died = time.monotonic()
    await first.session.close(revoke=False)
    second, at = await asyncio.wait_for(standby, 10 * TTL)
    assert at - died <= TTL + 1.0, f"takeover took {at - died:.2f}s with a {TTL}s TTL"
    assert second.term > first.term
    await second.resign()


async def test_a_restarted_process_of_the_same_pod_takes_its_key_back_at_once(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    """A stable identity (the pod's name, ``POD_ID``): the crashed process's key, still
    alive in etcd, is its own and is replaced at once instead of after the 30 s TTL
    (another identity waits for the TTL: test_a_dead_leader_is_replaced_...)."""
    before = Election(stores[0], etcd_config.root, "all-namespaces", "pod-a", ttl=30,
                      stable_identity=True)
    first = await asyncio.wait_for(before.campaign(), 10)
    await first.session.close(revoke=False)  # the container crashed: its lease lives on
    restarted = Election(stores[1], etcd_config.root, "all-namespaces", "pod-a", ttl=30,
                         stable_identity=True)
    started = time.monotonic()
    second = await asyncio.wait_for(restarted.campaign(), 10)
    assert time.monotonic() - started < 5, "waited for the old lease instead"
    assert second.term > first.term and second.alive
    await second.resign()


async def test_a_partitioned_leader_steps_down_before_a_standby_is_elected(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    host, port = etcd_config.endpoints[0].rsplit(":", 1)
    proxy = await LossyProxy(host, int(port)).start()
    cut_off = EtcdStore(etcd_config.with_(endpoints=(proxy.endpoint,)))
    try:
        a = Election(cut_off, etcd_config.root, "all-namespaces", "partitioned", ttl=TTL)
        b = candidates(stores, etcd_config.root)[1]
        first = await asyncio.wait_for(a.campaign(), 10)
        standby = asyncio.create_task(lead_after(b))
        lost = asyncio.create_task(first.wait_lost())
        proxy.mode = "drop_requests"
        second, _ = await asyncio.wait_for(standby, 10 * TTL)
        # The old leader knew it had lost before etcd let anyone else win.
        assert lost.done(), "the partitioned leader still believed it led"
        assert not first.alive
        assert second.term > first.term
        await second.resign()
        proxy.mode = "pass"
        await first.resign()
    finally:
        await cut_off.close()
        await proxy.close()


async def test_deleting_the_leader_key_ends_leadership_at_once(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    a, b = candidates(stores, etcd_config.root, ttl=30)
    first = await asyncio.wait_for(a.campaign(), 10)
    deleted = time.monotonic()
    await stores[1].txn([], [Delete(a.key)])
    reason = await asyncio.wait_for(first.wait_lost(), 5)
    assert time.monotonic() - deleted < 2.0
    assert "deleted" in reason and not first.alive
    # Lost is for good, and the key is free for the next campaign.
    second = await asyncio.wait_for(b.campaign(), 10)
    assert not first.alive and second.alive
    await second.resign()
    await first.resign()


async def test_a_standby_that_stops_campaigning_leaves_the_leader_alone(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    a, b = candidates(stores, etcd_config.root)
    first = await asyncio.wait_for(a.campaign(), 10)
    standby = asyncio.create_task(b.campaign())
    await asyncio.sleep(0.5)
    standby.cancel()
    with pytest.raises(asyncio.CancelledError):
        await standby
    await asyncio.sleep(TTL)
    leader = await a.leader()
    assert first.alive and leader.identity == "replica-0" and leader.term == first.term
    await first.resign()
    assert (await a.leader()).identity is None  # resigning frees the key at once


async def test_elections_with_different_names_are_independent(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    a = Election(stores[0], etcd_config.root, "team-a", "x", ttl=TTL)
    b = Election(stores[1], etcd_config.root, "team-b", "y", ttl=TTL)
    la, lb = await asyncio.wait_for(asyncio.gather(a.campaign(), b.campaign()), 10)
    assert la.alive and lb.alive
    await la.resign()
    await lb.resign()


async def test_operators_serving_different_or_overlapping_namespaces_share_one_election(
        stores: list[EtcdStore], etcd_config: EtcdConfig) -> None:
    """The election a running operator joins does not depend on the namespaces it
    serves: the old pod of a rollout that adds a namespace (``a`` then ``a,b``), an
    install with a glob over them or a cluster-wide one all contend for one key, so
    one term fences them all; only a name given on purpose separates installs."""
    configs = [OperatorConfig(namespaces=("team-a",)),
               OperatorConfig(namespaces=("team-b", "team-a")),
               OperatorConfig(namespaces=("team-*",)), OperatorConfig()]
    assert {election_name(c) for c in configs} == {"all-namespaces"}
    assert election_name(OperatorConfig(namespaces=("team-a",),
                                        leader_election_name="blue")) == "blue"

    old, new = (Election(s, etcd_config.root, election_name(c), f"pod-{i}", ttl=TTL)
                for i, (s, c) in enumerate(zip(stores, configs[:2], strict=True)))
    first = await asyncio.wait_for(old.campaign(), 10)
    standby = asyncio.create_task(lead_after(new))
    await asyncio.sleep(2 * TTL)  # keep-alive rounds: the first keeps leading
    assert not standby.done(), "the operator with more namespaces led beside the first"
    await first.resign()
    second, _ = await asyncio.wait_for(standby, 10)
    assert second.term > first.term  # a new term: the first's writes are fenced
    await second.resign()


def test_the_key_is_beside_the_jobs_prefix_and_bad_names_are_refused() -> None:
    key = election_key("/joblease/v1/", "all-namespaces")
    assert key == b"/joblease/v1\0operator/leader/all-namespaces"
    assert not key.startswith(b"/joblease/v1/")  # the mirror's watch never sees it
    for bad in ("", "a/b", "x\0", "tab\there", "n" * 254):
        with pytest.raises(ValueError, match="invalid election name"):
            check_name(bad)
