"""Guarded etcd writes: the holder's own effects, committed only while it holds the job.

When the destination *is* etcd (the same cluster that holds the lease), no
separate gate is needed: the write and the ownership check can be one
transaction. :func:`guarded_put` commits ``puts`` only if the job's holder key
still has this lease's token (create revision) and exact value (owner +
claim id) -- the same condition as renew, complete and release (invariants
``renew-checks-holder`` and ``same-condition``, docs/protocol.md). A paused
worker whose lease expired, or whose job was claimed again, writes nothing,
whatever its local clock believes.

etcd's answer is authoritative, so the handle's local validity is not
consulted: a handle from ``JobLeaseClient.lease_for`` (which does not renew)
can write as long as etcd says the claim is current.
"""

from __future__ import annotations

from collections.abc import Sequence

from joblease.errors import StaleTokenError
from joblease.lease import Lease
from joblease.records import Holder
from joblease.store import Get, Put, Store


async def guarded_put(store: Store, lease: Lease, puts: Sequence[Put]) -> int:
    """Write ``puts`` in one transaction iff ``lease`` still holds its job.

    Returns the revision the writes committed at. Raises
    :class:`~joblease.errors.StaleTokenError` (naming the current holder's
    token, if any) when the claim is no longer current; then nothing was
    written. An ``OutcomeUnknownError`` propagates: the caller reads its keys
    back (the writes either all landed, under this claim, or none did).
    """
    compares = lease.holder_compares()
    holder_key = compares[0].key
    r = await store.txn(compares, list(puts), [Get(holder_key)])
    if r.succeeded:
        return r.revision
    holder = r.kv(0)
    if holder is None:
        raise StaleTokenError(str(lease.job), lease.token, None, None,
                              "guarded write refused; nothing was written")
    owner = str(Holder.decode_value(holder.value).get("owner"))
    raise StaleTokenError(str(lease.job), lease.token, holder.create_revision, owner,
                          "guarded write refused; nothing was written")
