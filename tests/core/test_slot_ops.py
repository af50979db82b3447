"""What a claim taking slots builds once and keeps (joblease.slots.SlotOps, the
store's kept wire form, the pick of a free index): never an old limit, spec
revision or value, and picks only free slots. No etcd here: the compares are
checked against the protocol's four as docs/semaphores.md writes them; the
same on a real etcd, with a warm client, is in test_semaphore_view.py."""

from __future__ import annotations

import random
from types import MappingProxyType

from joblease import etcd_wire
from joblease._etcdpb import rpc_pb2
from joblease.keys import KeySpace, SemaphoreKeys, SemaphoreRef
from joblease.slots import SemaphoreState, _pick, plan, slot_ops
from joblease.store import Compare, Delete, KeyValue

REF = SemaphoreRef("default", "billing-db")


def _state(keys: SemaphoreKeys, spec_revision: int, limit: int, live: set[int] = frozenset()
           ) -> SemaphoreState:
    slots = {i: KeyValue(keys.slot(i), b"{}", 7, 7, 1, 9) for i in live}
    return SemaphoreState(REF, keys, spec_revision, limit, MappingProxyType(slots), [])


def _protocol(keys: SemaphoreKeys, spec_revision: int, limit: int, picks: tuple[int, ...]
              ) -> list[Compare]:
    """The compares of docs/semaphores.md "The claim", built afresh."""
    prefix = keys.prefix
    return [Compare(prefix + b"spec", "mod", "==", spec_revision),
            *(Compare(prefix + b"slots/" + str(i).zfill(6).encode(), "create", "==", 0)
              for i in picks),
            Compare(prefix + b"slots/" + str(limit).zfill(6).encode(), "create", "==", 0,
                    range_end=prefix + b"slots0"),
            Compare(prefix + b"waiters/", "create", "==", 0, range_end=prefix + b"waiters0")]


def test_kept_compares_follow_the_spec_revision_and_the_limit() -> None:
    """A limit changed at runtime, a semaphore deleted and created again (a new
    spec revision, maybe the same limit), another semaphore: each claim's
    compares are those of the spec and limit it planned with."""
    keys = KeySpace("/t-slot-ops").semaphore(REF)
    other = KeySpace("/t-slot-ops").semaphore(SemaphoreRef("default", "other"))
    for k, spec_revision, limit in [(keys, 10, 4), (keys, 10, 4), (keys, 12, 2), (keys, 12, 2),
                                    (keys, 14, 4), (keys, 20, 4), (other, 20, 3),
                                    (keys, 20, 4), (keys, 21, 9)]:
        p = plan("default/job", [(_state(k, spec_revision, limit), 1)], None)
        (_, picks), = p.picks
        assert p.compares() == _protocol(k, spec_revision, limit, picks)
        # the wire form sent is the compare's own
        for c in p.compares():
            assert etcd_wire.compare(c) == etcd_wire.compare(
                Compare(c.key, c.target, c.op, c.value, c.range_end))
    # the same index's delete and compare come back kept, each for its own key
    ops = slot_ops(keys)
    assert ops.delete(3) is ops.delete(3) and ops.delete(3) == Delete(keys.slot(3))
    assert ops.free(3) is ops.free(3) and ops.free(3).key == keys.slot(3)


def test_a_kept_wire_form_is_the_compares_own_in_every_request() -> None:
    key = b"/t-slot-ops/k"
    for c in [Compare(key, "version", "<", 3), Compare(key, "create", "==", 0),
              Compare(key, "mod", "==", 5), Compare(key, "lease", "==", 0),
              Compare(key, "value", "==", b"v"), Compare(key, "create", "==", 0,
                                                         range_end=b"/t-slot-ops/l")]:
        fresh = etcd_wire.compare(Compare(c.key, c.target, c.op, c.value, c.range_end))
        assert etcd_wire.compare(c) == fresh
        assert etcd_wire.compare(c) == fresh  # kept, and still the same
    # two compares of one key with different values never share a wire form
    five, six = Compare(key, "mod", "==", 5), Compare(key, "mod", "==", 6)
    assert etcd_wire.compare(five) != etcd_wire.compare(six)
    # every request built with the kept forms carries their own values
    delete = Delete(key)
    for _ in range(2):
        sent = rpc_pb2.TxnRequest.FromString(etcd_wire.txn_request([five, six], [delete], []))
        assert [c.mod_revision for c in sent.compare] == [5, 6]
        assert sent.success[0].request_delete_range.key == key


def test_a_pick_takes_only_free_slots_and_avoids_the_ones_in_flight() -> None:
    keys = KeySpace("/t-slot-ops").semaphore(REF)
    rng = random.Random(7)
    for _ in range(300):
        limit = rng.randint(1, 80)
        live = set(rng.sample(range(limit), rng.randint(0, limit - 1)))
        free = set(range(limit)) - live
        taken = set(rng.sample(sorted(free), rng.randint(0, len(free))))
        slots = _state(keys, 1, limit, live).slots
        weight = rng.randint(1, len(free))
        for kept in (None, free):  # listed from the slots, or kept by a view
            picked = _pick(slots, limit, weight, taken, kept)
            assert len(set(picked)) == weight and set(picked) <= free
            if len(free - taken) >= weight:
                assert not set(picked) & taken, (limit, live, taken, picked)
    # one free slot left (the probes miss it most times): that one
    for _ in range(50):
        assert _pick(_state(keys, 1, 64, set(range(64)) - {41}).slots, 64, 1, None) == (41,)
        assert _pick(_state(keys, 1, 64, set(range(60))).slots, 64, 1, {60, 61, 63}) == (62,)
        assert _pick(_state(keys, 1, 64, set(range(60))).slots, 64, 1, {60, 61, 63},
                     {60, 61, 62, 63}) == (62,)
