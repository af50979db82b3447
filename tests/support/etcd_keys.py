"""Assert "nothing was written" on the keys a test owns, not on etcd's revision.

Why: the session etcd is shared by every test, and its header revision moves
whenever any of them writes, including a lease of an earlier test expiring in
the background. Comparing that global revision before and after makes a test
fail for reasons it does not own. What a test does own is its key prefix (its
``EtcdConfig.root`` or its job's keys): a write under it changes a key's mod
revision and version, creates a key, or deletes one. A snapshot of
``{key: (create_revision, mod_revision, version)}`` under that prefix, taken
before and after, shows exactly that and nothing else.

Two ways to take the snapshot: through the project's store (``snapshot``), or
through etcd's JSON gateway (``gateway_snapshot``), which is synchronous (for
hypothesis bodies and CLI runs) and independent of the client under test.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from collections.abc import Iterable

from joblease.store import KeyValue, Store, prefix_end

KeyRevisions = dict[bytes, tuple[int, int, int]]
"""key -> (create revision, mod revision, version) for every key under a prefix."""


def _as_bytes(prefix: bytes | str) -> bytes:
    return prefix.encode() if isinstance(prefix, str) else prefix


def from_kvs(kvs: Iterable[KeyValue]) -> KeyRevisions:
    return {kv.key: (kv.create_revision, kv.mod_revision, kv.version) for kv in kvs}


async def snapshot(store: Store, prefix: bytes | str) -> KeyRevisions:
    """Every key under ``prefix`` with its revisions, read linearizably via ``store``."""
    _, kvs = await store.get(_as_bytes(prefix), prefix=True, keys_only=True)
    return from_kvs(kvs)


def gateway_snapshot(endpoint: str, prefix: bytes | str, timeout: float = 10) -> KeyRevisions:
    """Every key under ``prefix`` via etcd's JSON gateway at ``endpoint`` (host:port,
    plain HTTP, no auth): synchronous and independent of the client under test."""
    key = _as_bytes(prefix)
    body = json.dumps({"key": base64.b64encode(key).decode(),
                       "range_end": base64.b64encode(prefix_end(key)).decode(),
                       "keys_only": True}).encode()
    request = urllib.request.Request(f"http://{endpoint}/v3/kv/range", data=body)
    with urllib.request.urlopen(request, timeout=timeout) as r:
        answer = json.load(r)
    return {base64.b64decode(kv["key"]): (int(kv.get("create_revision", 0)),
                                          int(kv.get("mod_revision", 0)),
                                          int(kv.get("version", 0)))
            for kv in answer.get("kvs", [])}


def writes(before: KeyRevisions, after: KeyRevisions) -> list[str]:
    """What changed between two snapshots, one line per key (empty: nothing written)."""
    out = []
    for key in sorted(before.keys() | after.keys()):
        old, new = before.get(key), after.get(key)
        if old is None:
            out.append(f"created {key!r} {new}")
        elif new is None:
            out.append(f"deleted {key!r} (was {old})")
        elif old != new:
            out.append(f"modified {key!r} {old} -> {new}")
    return out


async def events_since(store: Store, prefix: bytes | str,
                       since: int) -> list[tuple[int, str, bytes]]:
    """etcd's history under ``prefix`` after revision ``since`` up to now, as
    ``(revision, "put" | "delete", key)`` in commit order: what was written, by anyone,
    after a moment the test chose (the store's revision then)."""
    key = _as_bytes(prefix)
    now, _ = await store.get(b"\0")
    out: list[tuple[int, str, bytes]] = []
    if now <= since:
        return out
    async for batch in store.watch(key, prefix=True, start_revision=since + 1):
        out.extend((e.kv.mod_revision, e.kind, e.kv.key) for e in batch.events
                   if e.kv.mod_revision <= now)
        if batch.revision >= now:
            break
    return out
