"""etcd's own history of a semaphore's slots: the most slot keys live at any
one revision (docs/semaphores.md: "live slots never exceed the limit")."""

from __future__ import annotations

from joblease.store import Store


async def max_live(store: Store, prefix: bytes, since: int) -> int:
    """The most slot keys live at any one revision after ``since``, replaying
    puts and deletes revision by revision from a watch of ``prefix``."""
    _, kvs = await store.get(prefix, prefix=True, revision=since)
    live = {kv.key for kv in kvs}
    most = len(live)
    now, _ = await store.get(b"\0")
    async for batch in store.watch(prefix, prefix=True, start_revision=since + 1):
        by_revision: dict[int, list[tuple[str, bytes]]] = {}
        for e in batch.events:
            by_revision.setdefault(e.kv.mod_revision, []).append((e.kind, e.kv.key))
        for revision in sorted(by_revision):
            for kind, key in by_revision[revision]:
                (live.add if kind == "put" else live.discard)(key)
            most = max(most, len(live))
        if batch.revision >= now:
            return most
    return most
