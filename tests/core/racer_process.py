"""A process running several independent claimers that race for one job.

Each claimer has its own client (its own etcd lease). Once every client is
connected the process writes ``ready WALL`` (its wall clock, as this process
sees it) to stderr and waits for a line on stdin, so that the racers of a test
start together: a process that started first could otherwise win every
generation before the others have imported joblease. A winner prints its win as
a JSON line and releases at once; everyone stops once the job's generation
reaches the target. Used by the competing-claims and clock-skew tests.

Run: python -m tests.core.racer_process ENDPOINTS ROOT NS/NAME PREFIX CLAIMERS TARGET
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from joblease import EtcdConfig, HeldError, JobLeaseClient, JobRef


async def claimer(client: JobLeaseClient, job: JobRef, owner: str, target: int) -> None:
    async with client:
        while True:
            try:
                lease = await client.claim(job, owner)
            except HeldError as e:
                if e.generation >= target:
                    return
                await asyncio.sleep(0.001)
                continue
            print(json.dumps({"owner": owner, "generation": lease.generation,
                              "token": lease.token, "wall": time.time()}), flush=True)
            await lease.release()
            if lease.generation >= target:
                return


async def main(endpoints: str, root: str, job_text: str, prefix: str, n: str,
               target: str) -> None:
    config = EtcdConfig(endpoints=tuple(endpoints.split(",")), root=root)
    job = JobRef.parse(job_text)

    async def stop_when_done() -> None:
        async with JobLeaseClient(config) as c:
            while (await c.get(job)).generation < int(target):
                await asyncio.sleep(0.05)

    clients = [JobLeaseClient(config) for _ in range(int(n))]
    await asyncio.gather(*(c.get(job) for c in clients))  # connected, the spec readable
    print(f"ready {time.time()}", file=sys.stderr, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    claimers = [asyncio.create_task(claimer(c, job, f"{prefix}-{i}", int(target)))
                for i, c in enumerate(clients)]
    await stop_when_done()
    await asyncio.wait_for(asyncio.gather(*claimers, return_exceptions=True), 30)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
