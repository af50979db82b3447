"""A process running several independent claimers that race for one job.

Each claimer has its own client (its own etcd lease). A winner prints its win
as a JSON line and releases at once; everyone stops once the job's generation
reaches the target. Used by the competing-claims and clock-skew tests.

Run: python -m tests.core.racer_process ENDPOINTS ROOT NS/NAME PREFIX CLAIMERS TARGET
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

from joblease import EtcdConfig, HeldError, JobLeaseClient, JobRef


async def claimer(config: EtcdConfig, job: JobRef, owner: str, target: int) -> None:
    async with JobLeaseClient(config) as client:
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

    claimers = [asyncio.create_task(claimer(config, job, f"{prefix}-{i}", int(target)))
                for i in range(int(n))]
    await stop_when_done()
    await asyncio.wait_for(asyncio.gather(*claimers, return_exceptions=True), 30)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:7]))
