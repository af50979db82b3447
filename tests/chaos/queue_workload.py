"""Queue workers for the chaos suite: drain one queue, every operation into a history.

    python -m tests.chaos.queue_workload --queue chaos/q --id w1 --dir RUNDIR ... \
        [--mode worker|sidecar] [--concurrency 2] [--claim-wait 1.0]

The options of ``tests.chaos.workload`` plus the queue's. Until ``RUNDIR/stop``
exists, the process takes the queue's next item, one after another, and works
on it as the job workload works on a job: ``--effects`` fenced effects whose
resource is the item and whose token is the item's token, each after a
validity check unless unchecked, then the completion; a lost lease still
sends late "rogue" effects and sometimes tries to complete anyway.

* ``--mode worker``: ``--concurrency`` claimers of one
  :class:`~joblease.queue.Queues` (so they share its candidate pool) take the
  next item with ``claim_next``; the check is ``ensure_valid()``.
* ``--mode sidecar``: a *pair*. The Go sidecar (``--sidecar-cmd``) drains the
  queue (docs/sidecar.md, "Queue mode": ``--queue`` without ``--item``,
  on-loss ``none``, so it claims the next item by itself once one ended) and
  this process is its worker over HTTP, as a worker in any language would be:
  ``GET /v1/lease`` until it names an item newer than the last one (``item``,
  ``payload``, ``token``, ``generation``), the same effects (the check is
  ``GET /v1/lease`` still answering 200 with that token), then ``POST
  /v1/complete`` (or ``/v1/release`` for a poison item). The sidecar's pid is in
  ``RUNDIR/<id>.sidecar.pid`` so the nemesis can pause or kill it; the pair
  starts a new one when it died. Its etcd traffic goes through the proxies of
  ``--endpoints`` (the runner gives the pair's sidecar its own).

A *poison* item (payload ``{"poison": true}``) is one whose command always
fails: its worker makes one effect, then releases the item without completing
it, as ``joblease queue run`` does for a non-zero exit. Such an item must end
``Failed`` once it used the queue's ``maxAttempts`` claims.

History records (tests/chaos/history.py): a claim's invoke names only the
queue (``extra.queue``), its ``ok`` outcome the item (``job``), its token,
generation and ``extra.owner``/``extra.poison``; ``fail`` reasons are the
library's error words, plus ``empty`` when nothing became claimable within
``--claim-wait`` seconds. A pair records a claim when its sidecar *serves* the
item: a claim the sidecar made and lost before serving it is not in the
history (the checker needs no claim it was not told of); a sidecar that died
while the pair waited makes the claim ``unknown``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from joblease import JobLeaseClient, JobLeaseError, Lease
from joblease.errors import LeaseLostError, StoreUnavailableError
from joblease.keys import QueueRef
from joblease.queue import Queues
from tests.chaos.workload import Worker, etcd_config, parser


def is_poison(lease: Lease) -> bool:
    return poison_payload(lease.item.payload if lease.item is not None else None)


def poison_payload(payload: Any) -> bool:
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

    # -- the sidecar pair (the Go sidecar drains, this process is its worker) -------------

    async def run_sidecar_queue(self) -> None:
        queue = QueueRef.parse(self.args.queue)
        n, last_token = 0, 0
        async with httpx.AsyncClient(timeout=3.0) as api:
            while not self.stopping():
                n += 1
                proc, port_file = self.start_queue_sidecar(queue, n)
                try:
                    last_token = await self._drain_through(api, queue, proc, port_file, n,
                                                           last_token)
                finally:
                    await self.stop_sidecar(proc)
                    port_file.unlink(missing_ok=True)

    def start_queue_sidecar(self, queue: QueueRef, n: int
                            ) -> tuple[subprocess.Popen[bytes], Path]:
        """A draining sidecar (no ``--item``): on-loss ``none``, so a lost item is
        followed by the next claim, and nothing signals this process."""
        port_file = self.run / f"{self.args.id}.sidecar-{n}.port"
        port_file.unlink(missing_ok=True)
        env = self.sidecar_env()
        with open(self.run / f"{self.args.id}.sidecar.log", "ab") as log:
            proc = subprocess.Popen(
                [*json.loads(self.args.sidecar_cmd), "--queue", str(queue),
                 "--owner", self.sidecar_owner(n), "--port", "0",
                 "--port-file", str(port_file),
                 "--token-file", str(self.run / f"{self.args.id}.token"), "--on-loss", "none",
                 "--on-final", "exit",
                 "--claim-backoff-initial", "0.05", "--claim-backoff-max", "0.3",
                 "--registration-wait", "30"],
                env=env, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        (self.run / f"{self.args.id}.sidecar.pid").write_text(str(proc.pid))
        return proc, port_file

    async def _drain_through(self, api: httpx.AsyncClient, queue: QueueRef,
                             proc: subprocess.Popen[bytes], port_file: Path, n: int,
                             last_token: int) -> int:
        """Items served by one sidecar until it dies or the run stops; returns the
        last item token seen (a new sidecar's first item is newer: tokens are etcd
        revisions, and every claim commits a new one)."""
        deadline = time.monotonic() + self.args.sidecar_claim_wait + 10
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline or self.stopping():
                return last_token
            await asyncio.sleep(0.05)
        base = f"http://127.0.0.1:{port_file.read_text().strip()}"
        owner = self.sidecar_owner(n)
        while not self.stopping():
            if proc.poll() is not None:
                return last_token
            inv = self.h.invoke("claim", extra={"queue": str(queue)})
            body = await self._next_item(api, base, proc, last_token)
            if body is None:
                if proc.poll() is not None:
                    self.h.unknown(inv, f"sidecar exit {proc.poll()}")
                    return last_token
                self.h.fail(inv, "empty")
                continue
            if body.get("error"):  # a final answer: the sidecar ends (on-final exit)
                self.h.fail(inv, str(body.get("reason") or body["error"]))
                return last_token
            item, token, generation = str(body["job"]), int(body["token"]), int(body["generation"])
            last_token = token
            poison = poison_payload(body.get("payload"))
            self.h.ok(inv, job=item, token=token, generation=generation,
                      extra={"owner": owner, **({"poison": True} if poison else {})})
            if poison:
                await self._sidecar_poison(api, base, item, token, generation)
            else:
                await self._sidecar_item(api, base, item, token, generation)
        return last_token

    async def _next_item(self, api: httpx.AsyncClient, base: str,
                         proc: subprocess.Popen[bytes], after: int) -> dict[str, Any] | None:
        """``GET /v1/lease`` until it serves an item with a token above ``after`` (its
        body), a final answer (409 with an ``exitCode``: its body), or ``--claim-wait``
        seconds pass or the sidecar dies (None). A 409 ``lost``/``completed`` of the
        previous item, or 503 while the sidecar claims or waits, is waited through."""
        deadline = time.monotonic() + self.args.claim_wait
        while True:
            status, body = await self._lease(api, base)
            if status == 200 and int(body.get("token") or 0) > after:
                return body
            if status == 409 and body.get("state") == "failed":
                return body
            if proc.poll() is not None or time.monotonic() > deadline or self.stopping():
                return None
            await asyncio.sleep(0.05)

    async def _still_ours(self, api: httpx.AsyncClient, base: str, item: str, token: int,
                          generation: int) -> bool:
        """The pair's validity check: the sidecar still serves this token."""
        status, now = await self._lease(api, base)
        if status == 200 and now.get("token") == token:
            return True
        if now.get("error") == "lost" and now.get("token") in (token, None):
            self.note_lost(item, token, generation, str(now.get("message")))
        return False

    async def _sidecar_item(self, api: httpx.AsyncClient, base: str, item: str, token: int,
                            generation: int) -> None:
        lost = False
        for step in range(self.args.effects):
            await self.pace()
            checked = self.rng.random() >= self.args.unchecked
            if checked and not await self._still_ours(api, base, item, token, generation):
                lost = True
                if self.rng.random() < self.args.rogue:
                    self.late_rogue(item, token, generation)
                break
            await self.effects.write(item, token, generation, step, checked=checked)
        if lost and self.rng.random() >= self.args.complete_anyway:
            # a well-behaved worker gives up; the sidecar already moved on (on-loss none)
            return
        await self.pace()
        await self._sidecar_end(api, base, "complete", item, token, generation,
                                {"token": token, "result": {"by": self.process}})

    async def _sidecar_poison(self, api: httpx.AsyncClient, base: str, item: str, token: int,
                              generation: int) -> None:
        """A command that always fails: one effect, then the item goes back unfinished."""
        await self.pace()
        checked = self.rng.random() >= self.args.unchecked
        if checked and not await self._still_ours(api, base, item, token, generation):
            return
        await self.effects.write(item, token, generation, 0, checked=checked)
        await self._sidecar_end(api, base, "release", item, token, generation,
                                {"token": token})

    async def _sidecar_end(self, api: httpx.AsyncClient, base: str, kind: str, item: str,
                           token: int, generation: int, body: dict[str, Any]) -> None:
        """``POST /v1/complete`` or ``/v1/release``: 200 ok, 409 the sidecar's refusal
        (``stale``, ``lost``, ...), anything else (no answer, 503) unknown."""
        inv = self.h.invoke(kind, job=item, token=token, generation=generation)
        try:
            r = await api.post(f"{base}/v1/{kind}", json=body)
        except httpx.HTTPError as exc:
            self.h.unknown(inv, f"sidecar: {type(exc).__name__}")
            return
        if r.status_code == 200:
            self.h.ok(inv)
            return
        try:
            answer = r.json()
        except ValueError:
            answer = {}
        if r.status_code == 409:
            self.h.fail(inv, str(answer.get("error", "stale")),
                        extra={"currentToken": answer.get("currentToken")})
        else:
            self.h.unknown(inv, f"sidecar http {r.status_code}: {answer.get('error')}")


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser("python -m tests.chaos.queue_workload")
    p.add_argument("--queue", required=True, help="namespace/name of the queue to drain")
    p.add_argument("--concurrency", type=int, default=2,
                   help="claimers in this process (they share one candidate pool)")
    p.add_argument("--claim-wait", type=float, default=1.0,
                   help="seconds claim_next waits (a watch) for a claimable item")
    args = p.parse_args(argv)
    if args.mode == "sidecar" and not args.sidecar_cmd:
        p.error("--mode sidecar needs --sidecar-cmd (the Go sidecar's command line)")
    return args


async def amain(args: argparse.Namespace) -> None:
    w = QueueWorker(args)
    try:
        if args.mode == "worker":
            await w.run_queue()
        else:
            await w.run_sidecar_queue()
    finally:
        if w.background:
            await asyncio.wait(w.background, timeout=args.rogue_delay + 5)
        await w.effects.close()
        w.h.close()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(amain(parse()))
