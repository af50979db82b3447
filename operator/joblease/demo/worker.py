"""A demo worker process, driven over stdin, reporting JSON lines on stdout.

It claims the job once, then obeys ``write <url> <json>`` (a fenced HTTP write
carrying its token), ``complete <json>`` and ``exit``. It deliberately does
not check its own lease before writing: the demo models a request that was
already in flight when the worker paused, which only the destination can stop.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

import httpx

from joblease.client import JobLeaseClient
from joblease.errors import JobLeaseError
from joblease.etcd_store import EtcdConfig
from joblease.fencing.http import fencing_headers
from joblease.keys import JobRef


def emit(**fields: object) -> None:
    print(json.dumps(fields, default=str), flush=True)


async def main(endpoints: str, root: str, job_text: str, owner: str) -> None:
    config = EtcdConfig(endpoints=tuple(endpoints.split(",")), root=root)
    async with JobLeaseClient(config) as client:
        try:
            lease = await client.claim(JobRef.parse(job_text), owner)
        except JobLeaseError as e:
            emit(event="claim", ok=False, **e.to_dict())
            return
        emit(event="claim", ok=True, token=lease.token, generation=lease.generation,
             at=time.monotonic())
        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        writes = 0
        async with httpx.AsyncClient(timeout=10) as http:
            while line := (await reader.readline()).decode().strip():
                cmd, _, arg = line.partition(" ")
                if cmd == "write":
                    url, _, body = arg.partition(" ")
                    writes += 1  # one idempotency key per distinct write of this claim
                    resp = await http.post(url, content=body,
                                           headers={**fencing_headers(lease, f"write-{writes}"),
                                                    "content-type": "application/json"})
                    emit(event="write", status=resp.status_code, body=resp.json(),
                         valid=lease.valid, token=lease.token)
                elif cmd == "complete":
                    try:
                        record = await lease.complete(json.loads(arg or "null"))
                        emit(event="complete", ok=True, token=record.token,
                             generation=record.generation)
                    except JobLeaseError as e:
                        emit(event="complete", ok=False, **e.to_dict())
                elif cmd == "exit":
                    break


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:5]))
