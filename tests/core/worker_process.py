"""A worker as a real process, driven line by line over stdin; used by the core tests.

It claims one job (retrying while held), prints one JSON line per event and
then obeys commands: ``complete <json>``, ``release``, ``status``, ``exit``.
While holding it prints ``{"event": "renewed", "at": <monotonic>}`` after
each keep-alive so a test can tell when the last renewal was sent
(CLOCK_MONOTONIC is shared by all processes on the machine).

Run: python -m tests.core.worker_process ENDPOINTS ROOT NAMESPACE/NAME OWNER
(``NAMESPACE/QUEUE/ITEM``: claim that item of a queue, the same way.)
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from joblease import EtcdConfig, HeldError, JobLeaseClient, JobLeaseError, JobRef
from joblease.keys import ItemRef, QueueRef
from joblease.lease import Lease
from joblease.queue import Queues


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


async def main(endpoints: str, root: str, job_text: str, owner: str) -> None:
    config = EtcdConfig(endpoints=tuple(endpoints.split(",")), root=root)
    async with JobLeaseClient(config) as client:
        async def claim() -> Lease:
            if job_text.count("/") == 2:
                namespace, queue, item = job_text.split("/")
                return await Queues(client).claim(ItemRef(QueueRef(namespace, queue), item), owner)
            return await client.claim(JobRef.parse(job_text), owner)

        while True:
            try:
                lease = await claim()
                break
            except HeldError:
                await asyncio.sleep(0.05)
            except JobLeaseError as e:
                emit(event="claim_failed", error=e.reason, message=str(e))
                return
        emit(event="claimed", token=lease.token, generation=lease.generation,
             at=time.monotonic(), wall=time.time())

        async def report_renewals() -> None:
            last = 0.0
            while True:
                if lease.last_renewal != last:
                    last = lease.last_renewal
                    emit(event="renewed", at=last)
                await asyncio.sleep(0.02)

        reporter = asyncio.create_task(report_renewals())
        reader = asyncio.StreamReader()
        loop = asyncio.get_running_loop()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        while line := (await reader.readline()).decode().strip():
            cmd, _, arg = line.partition(" ")
            if cmd == "status":
                emit(event="status", valid=lease.valid, state=lease.state.value,
                     lost_reason=lease.lost_reason, remaining=lease.remaining())
            elif cmd == "complete":
                valid_before = lease.valid
                try:
                    rec = await lease.complete(json.loads(arg or "null"))
                    emit(event="completed", ok=True, token=rec.token, valid_before=valid_before)
                except JobLeaseError as e:
                    emit(event="completed", ok=False, valid_before=valid_before, **e.to_dict())
            elif cmd == "release":
                try:
                    await lease.release()
                    emit(event="released", ok=True)
                except JobLeaseError as e:
                    emit(event="released", ok=False, **e.to_dict())
            elif cmd == "exit":
                break
        reporter.cancel()


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
