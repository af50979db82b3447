"""A job's tenure history: one record per claim, written by the transactions themselves.

The claim transaction puts ``_history/<name>/<generation>`` (its create
revision is the claim's commit revision: the token) and deletes every tenure
older than the last ``historyLimit`` with one range delete, so a backlog or a
lowered limit is cleared by the next claim and the history never grows past
the limit. A release puts the tenure's ``end`` in its own transaction; a
completion writes nothing more (its result record carries the token, so the
tenure whose token it is reads ``completed``); a checkpoint puts
``checkpoints``, whose etcd ``version`` counts them. Expiry writes nothing
(etcd deletes the holder with its lease): a tenure without an end or a result
whose holder is gone reads as ``expired``. Two records are
written after the fact, off the hot path, each by a guarded transaction that
commits only while that very tenure exists (``create(tenure) == token``, so
never into a later registration's tenure of the same generation): a refused
stale completion (``refused``, counted by ``version``), and ``revoked`` for a
claim that committed while its unknown outcome was being settled and was ended
by the revoke that settled it. docs/protocol.md, "Tenure history".

A queue item keeps the same history under its queue, ``Q/history/<id>/``
(:attr:`ItemKeys.history`), written by the same transactions of the item and
bounded by the queue's ``historyLimit`` (docs/history.md, "Queue items").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from joblease.errors import CorruptRecordError, JobLeaseError
from joblease.keys import HistoryKeys, ItemKeys, ItemRef, JobKeys, JobRef
from joblease.records import (
    History,
    JobSpec,
    JobState,
    QueueSpec,
    ResultRecord,
    Tenure,
    TenureEnd,
    encode_tenure_end,
    encode_tenure_mark,
)
from joblease.store import Compare, Delete, Get, KeyValue, Put, Store, TxnOp, prefix_end

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TenureKeys:
    """The keys of one tenure: generation ``generation`` of a job's history."""

    history: HistoryKeys
    generation: int

    @property
    def key(self) -> bytes:
        return self.history.tenure(self.generation)

    def claim_writes(self, start: bytes, limit: int) -> list[TxnOp]:
        """What the claim transaction adds: the tenure (``start``, its value:
        :func:`~joblease.records.encode_tenure_start`, or with the holder's by
        :func:`~joblease.records.encode_holder_and_tenure`), and the delete of
        every tenure older than the last ``limit`` (this one included), from the
        start of the history, so any backlog goes too."""
        history = self.history
        oldest_kept = self.generation - limit + 1
        if oldest_kept > 1:
            return [Put(history.tenure(self.generation), start),
                    Delete(history.prefix, end=history.tenure(oldest_kept))]
        return [Put(history.tenure(self.generation), start)]

    def end_put(self, how: TenureEnd) -> Put:
        """The end, for the release transaction to carry."""
        return Put(self.history.end(self.generation), encode_tenure_end(how, time.time()))

    def checkpoint_put(self) -> Put:
        """For the checkpoint transaction: its ``version`` counts the checkpoints."""
        return Put(self.history.checkpoints(self.generation), encode_tenure_mark(time.time()))

    async def record_end(self, store: Store, token: int, how: TenureEnd) -> bool:
        """Put the end after the fact, only if this tenure (``token``) exists and
        has none: True if it was written. Best effort (a failure is logged)."""
        return await self._guarded(store, token, [
            Compare(self.history.end(self.generation), "create", "==", 0)],
            Put(self.history.end(self.generation), encode_tenure_end(how, time.time())),
            f"end ({how.value})")

    async def record_refusal(self, store: Store, token: int) -> bool:
        """Count one stale completion refused under this tenure (``token``), only
        if the tenure exists. Best effort (a failure is logged)."""
        return await self._guarded(
            store, token, [],
            Put(self.history.refused(self.generation), encode_tenure_mark(time.time())),
            "refused completion")

    async def _guarded(self, store: Store, token: int, more: list[Compare], put: Put,
                       what: str) -> bool:
        # Not re-sent after an unknown outcome: a second copy of a count would
        # count twice, and a lost record is only a missing line of history.
        try:
            r = await store.txn([Compare(self.key, "create", "==", token), *more], [put], [])
        except JobLeaseError as exc:
            log.info("tenure %d's %s was not recorded: %s", self.generation, what, exc)
            return False
        return r.succeeded


def tenure_of(history: HistoryKeys, kv: KeyValue | None, generation: int, token: int
              ) -> TenureKeys | None:
    """The tenure of the claim with ``token`` at ``generation``, if ``kv`` (its
    tenure key as read) is that claim's."""
    if kv is None or kv.create_revision != token:
        return None
    return TenureKeys(history, generation)


def history_reads(keys: JobKeys | ItemKeys) -> list[Get]:
    """One read-only transaction's reads for :func:`assemble_history`: the spec
    (a job's, or the item's queue's), holder, result and history keys, and for
    an item its record (whether the queue holds it)."""
    item = [Get(keys.item)] if isinstance(keys, ItemKeys) else []
    return [Get(keys.spec), Get(keys.holder), Get(keys.result),
            Get(keys.history.prefix, prefix=True), *item]


def assemble_history(job: JobRef | ItemRef, keys: JobKeys | ItemKeys, revision: int,
                     spec_kv: KeyValue | None, holder_kv: KeyValue | None,
                     result_kv: KeyValue | None, kvs: list[KeyValue],
                     item_kv: KeyValue | None = None) -> History:
    """The job's (or item's) history from one read (:func:`history_reads`;
    ``item_kv``: an item's record). Never raises for stored data: a tenure
    that cannot be decoded is named in ``corrupt``."""
    limit = 0
    corrupt: list[tuple[int, str]] = []
    is_item = isinstance(job, ItemRef)
    if spec_kv is not None:
        try:
            limit = (QueueSpec.decode(spec_kv.value).history_limit if is_item
                     else JobSpec.decode(spec_kv.value).history_limit)
        except CorruptRecordError as exc:
            corrupt.append((0, str(exc)))
    holder_token = holder_kv.create_revision if holder_kv is not None else 0
    result = None
    if result_kv is not None:
        try:
            result = ResultRecord.decode(result_kv.value, result_kv.mod_revision)
        except CorruptRecordError as exc:
            corrupt.append((0, str(exc)))
    tenures, bad = tenures_from(keys.history, kvs, holder_token, result)
    registered = spec_kv is not None and (not is_item or item_kv is not None)
    return History(job=job, revision=revision, registered=registered,
                   history_limit=limit, tenures=tenures, corrupt=(*corrupt, *bad))


async def record_refusal_of(store: Store, history: HistoryKeys, token: int, what: str
                            ) -> None:
    """Count a stale completion refused under ``token`` (not a live holder's:
    one made from another process, ``complete --token``) against the tenure
    whose token it is, if the history still holds it: a keys-only read of the
    history (at most four keys per tenure kept), then the guarded put. Best effort."""
    try:
        _, kvs = await store.get(history.prefix, prefix=True, keys_only=True)
    except JobLeaseError as exc:
        log.info("refused completion of %s (token %d) not recorded: %s", what, token, exc)
        return
    for kv in kvs:
        parsed = history.parse(kv.key)
        if parsed is not None and parsed[1] == "" and kv.create_revision == token:
            await TenureKeys(history, parsed[0]).record_refusal(store, token)
            return


def tenures_from(history: HistoryKeys, kvs: list[KeyValue], holder_token: int,
                 result: ResultRecord | None
                 ) -> tuple[tuple[Tenure, ...], tuple[tuple[int, str], ...]]:
    """The tenures in ``kvs`` (history keys, all read at one revision), oldest
    first, and the ones that cannot be decoded; ``holder_token`` (0: none) and
    ``result`` are the job's at that revision: they tell open, expired and
    completed apart. The one interpretation of the history: ``joblease
    history`` and the JobLease status's short form both go through it."""
    parts: dict[int, dict[str, KeyValue]] = {}
    for kv in kvs:
        parsed = history.parse(kv.key)
        if parsed is not None:
            parts.setdefault(parsed[0], {})[parsed[1]] = kv
    corrupt: list[tuple[int, str]] = []
    tenures = []
    for generation in sorted(parts):
        fields = parts[generation]
        start = fields.get("")
        if start is None:
            continue  # a mark left without its tenure (written by hand): not a tenure
        try:
            tenures.append(Tenure.decode(generation, start, fields.get("end"),
                                         fields.get("checkpoints"), fields.get("refused"),
                                         holder_token, result))
        except CorruptRecordError as exc:
            corrupt.append((generation, str(exc)))
    return tuple(tenures), tuple(corrupt)


async def recent_tenures(store: Store, keys: JobKeys, state: JobState, count: int
                         ) -> tuple[tuple[Tenure, ...], tuple[tuple[int, str], ...]]:
    """The last ``count`` tenures of the job as of ``state.revision``: one range
    read at that revision of the newest ``count`` generations' keys (at most
    four keys each), decoded with the state's holder and result, so the answer
    is exactly what :meth:`JobLeaseClient.history` said at that revision.
    Raises :class:`~joblease.errors.CompactedError` once that revision is
    compacted."""
    if count <= 0 or state.generation <= 0:
        return (), ()
    first = max(1, state.generation - count + 1)
    _, kvs = await store.get(keys.history.tenure(first), end=prefix_end(keys.history.prefix),
                             revision=state.revision, limit=4 * count)
    holder_token = state.holder.token if state.holder is not None else 0
    return tenures_from(keys.history, kvs, holder_token, state.result)
