"""Queue workers for the chaos suite: drain one queue, every operation into a history.

    python -m tests.chaos.queue_workload --queue chaos/q --id w1 --dir RUNDIR ... \
        [--mode worker] [--concurrency 2] [--claim-wait 1.0]

The options of ``tests.chaos.workload`` plus the queue's. Until ``RUNDIR/stop``
exists, ``--concurrency`` claimers of one :class:`~joblease.queue.Queues` (so
they share its candidate pool) take the next item with ``claim_next`` and
work on it as the job workload works on a job (``Worker._library_job``):
``--effects`` fenced effects whose resource is the item and whose token is
the item's token, each after an ``ensure_valid()`` unless unchecked, then the
completion; a lost lease still sends late "rogue" effects and sometimes tries
to complete anyway.

A *poison* item (payload ``{"poison": true}``) is one whose command always
fails: its worker makes one effect, then releases the item without completing
it, as ``joblease queue run`` does for a non-zero exit. Such an item must end
``Failed`` once it used the queue's ``maxAttempts`` claims.

History records (tests/chaos/history.py): a claim's invoke names only the
queue (``extra.queue``), its ``ok`` outcome the item (``job``), its token,
generation and ``extra.owner``/``extra.poison``; ``fail`` reasons are the
library's error words, plus ``empty`` when nothing became claimable within
``--claim-wait`` seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

from joblease import JobLeaseClient, JobLeaseError, Lease
from joblease.errors import LeaseLostError, StoreUnavailableError
from joblease.keys import QueueRef
from joblease.queue import Queues
from tests.chaos.workload import Worker, etcd_config, parser


def is_poison(lease: Lease) -> bool:
    payload = lease.item.payload if lease.item is not None else None
    return isinstance(payload, dict) and payload.get("poison") is True


class QueueWorker(Worker):
    """One worker process draining ``--queue`` (the job workload's effects and rules)."""

    async def run_queue(self) -> None:
        queue = QueueRef.parse(self.args.queue)
        async with JobLeaseClient(etcd_config(self.args)) as client:
            queues = Queues(client)
            await asyncio.gather(*(self.claimer(queues, queue)
                                   for _ in range(self.args.concurrency)))

    async def claimer(self, queues: Queues, queue: QueueRef) -> None:
        while not self.stopping():
            inv = self.h.invoke("claim", extra={"queue": str(queue)})
            try:
                lease = await queues.claim_next(queue, self.process, wait=self.args.claim_wait)
            except (StoreUnavailableError, LeaseLostError) as e:  # incl. OutcomeUnknownError
                self.h.unknown(inv, e.reason)  # LeaseLostError: committed, but lost already
                await asyncio.sleep(0.2)
                continue
            except JobLeaseError as e:
                self.h.fail(inv, e.reason)
                await asyncio.sleep(0.2)
                continue
            if lease is None:
                self.h.fail(inv, "empty")
                continue
            item, poison = str(lease.job), is_poison(lease)
            self.h.ok(inv, job=item, token=lease.token, generation=lease.generation,
                      extra={"owner": self.process, **({"poison": True} if poison else {})})
            try:
                if poison:
                    await self._poison(lease, item)
                else:
                    await self._library_job(lease, item)
            finally:
                if lease.lost_reason is not None:
                    self.note_lost(item, lease.token, lease.generation, lease.lost_reason)

    async def _poison(self, lease: Lease, item: str) -> None:
        """A command that always fails: one effect, then the item goes back unfinished."""
        await self.pace()
        checked = self.rng.random() >= self.args.unchecked
        if checked:
            try:
                lease.ensure_valid()
            except LeaseLostError:
                return
        await self.effects.write(item, lease.token, lease.generation, 0, checked=checked)
        inv = self.h.invoke("release", job=item, token=lease.token, generation=lease.generation)
        try:
            await lease.release()
        except StoreUnavailableError as e:
            self.h.unknown(inv, e.reason)
            return
        except JobLeaseError as e:
            self.h.fail(inv, e.reason)
            return
        self.h.ok(inv)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser("python -m tests.chaos.queue_workload")
    p.add_argument("--queue", required=True, help="namespace/name of the queue to drain")
    p.add_argument("--concurrency", type=int, default=2,
                   help="claimers in this process (they share one candidate pool)")
    p.add_argument("--claim-wait", type=float, default=1.0,
                   help="seconds claim_next waits (a watch) for a claimable item")
    args = p.parse_args(argv)
    if args.mode == "sidecar":
        # The hook for the Go sidecar's queue mode (being written on another branch):
        # a pair here would start the sidecar per item with the queue's options, take
        # the item, token and generation from its GET /v1/lease, make the same
        # effects through Effects.write and complete through POST /v1/complete,
        # recording the claim exactly as QueueWorker.claimer does (the ok outcome
        # names the item), so that the runner and checker need no change.
        p.error("--mode sidecar: the sidecar has no queue mode yet; only --mode worker "
                "drains a queue (see this module's sidecar hook)")
    return args


async def amain(args: argparse.Namespace) -> None:
    w = QueueWorker(args)
    try:
        await w.run_queue()
    finally:
        if w.background:
            await asyncio.wait(w.background, timeout=args.rogue_delay + 5)
        await w.effects.close()
        w.h.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(amain(parse()))
