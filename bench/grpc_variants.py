"""What the Python gRPC layer costs per etcd transaction, and what changing how
it is called changes (issue 29 item 2). One transaction of a claim's shape (four
compares, two puts, two reads; every key fresh) is sent many times through each
variant on one etcd, the variants taking turns round by round. Each row gives
txn/s, the process's CPU per transaction and the ratio to the first variant.

    python bench/grpc_variants.py                    # concurrency 1 and 64, 2 rounds
    python bench/grpc_variants.py --concurrency 64 --rounds 4 --txns 20000

Variants:
- ``stub``: the generated ``KVStub.Txn``, the request built from the generated
  classes each time (a claim's ops are new each time); what the store did until
  ``joblease.etcd_wire``;
- ``stub-opts``: the same on a channel with BDP probing off and a larger stream limit;
- ``wire``: the request written by ``joblease.etcd_wire`` and sent as bytes, what
  ``EtcdStore.txn`` does now;
- ``sync-future``: grpc's synchronous channel, ``.future()`` calls bridged to asyncio
  with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import grpc
import grpc.aio

from bench.etcd_binary import etcd_binary_or_none
from joblease import etcd_wire
from joblease._etcdpb import rpc_pb2, rpc_pb2_grpc
from joblease.embedded import EtcdCluster
from joblease.store import Compare, Get, Put

_HOLDER = b'{"owner":"bench-worker","claimId":"' + b"x" * 32 + b'","ttl":30}'


def _ops(key: bytes) -> tuple[list[Compare], list[Put | Get], list[Get]]:
    """bench/claims.py's raw claim: four compares, two puts and two reads, four
    reads if it fails (it never does here: every key is fresh)."""
    return ([Compare(key + b"spec", "mod", "==", 0), Compare(key + b"holder", "create", "==", 0),
             Compare(key + b"result", "version", "==", 0),
             Compare(key + b"claims", "version", "<", 3)],
            [Put(key + b"holder", _HOLDER, lease=0), Put(key + b"claims", b"{}"),
             Get(key + b"claims"), Get(key + b"checkpoint")],
            [Get(key + b"spec"), Get(key + b"holder"), Get(key + b"result"),
             Get(key + b"claims")])


_TARGET = {"mod": rpc_pb2.Compare.MOD, "create": rpc_pb2.Compare.CREATE,
           "version": rpc_pb2.Compare.VERSION}
_RESULT = {"==": rpc_pb2.Compare.EQUAL, "<": rpc_pb2.Compare.LESS}
_FIELD = {"mod": "mod_revision", "create": "create_revision", "version": "version"}


def _message(key: bytes) -> Any:
    """The same request through the generated classes, as EtcdStore built it before
    joblease.etcd_wire (tests/core/test_etcd_wire.py keeps that builder)."""
    compares, success, failure = _ops(key)

    def op(o: Put | Get) -> Any:
        if isinstance(o, Put):
            return rpc_pb2.RequestOp(request_put=rpc_pb2.PutRequest(key=o.key, value=o.value,
                                                                     lease=o.lease))
        return rpc_pb2.RequestOp(request_range=rpc_pb2.RangeRequest(key=o.key))

    return rpc_pb2.TxnRequest(
        compare=[rpc_pb2.Compare(key=c.key, target=_TARGET[c.target], result=_RESULT[c.op],
                                 **{_FIELD[c.target]: int(c.value)}) for c in compares],
        success=[op(o) for o in success], failure=[op(o) for o in failure])


def _cpu() -> float:
    return time.process_time()


async def _pool(txns: int, concurrency: int, call: Callable[[int], Awaitable[None]]
                ) -> tuple[float, float]:
    todo = iter(range(txns))

    async def worker() -> None:
        for i in todo:
            await call(i)

    t, c = time.perf_counter(), _cpu()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return txns / (time.perf_counter() - t), (_cpu() - c) / txns * 1e6


Call = Callable[[int], Awaitable[None]]
Closer = Callable[[], Awaitable[None]]


async def _stub(endpoint: str, prefix: bytes, options: list[tuple[str, Any]]
                ) -> tuple[Call, Closer]:
    channel = grpc.aio.insecure_channel(endpoint, options=options)
    kv = rpc_pb2_grpc.KVStub(channel)

    async def call(i: int) -> None:
        await kv.Txn(_message(prefix + str(i).encode() + b"/"), timeout=5.0, metadata=())
    return call, channel.close


async def _wire(endpoint: str, prefix: bytes) -> tuple[Call, Closer]:
    channel = grpc.aio.insecure_channel(endpoint)
    txn = channel.unary_unary(
        "/etcdserverpb.KV/Txn", request_serializer=None,
        response_deserializer=rpc_pb2.TxnResponse.FromString, _registered_method=True)

    async def call(i: int) -> None:
        await txn(etcd_wire.txn_request(*_ops(prefix + str(i).encode() + b"/")), timeout=5.0,
                  metadata=())
    return call, channel.close


async def _sync_future(endpoint: str, prefix: bytes) -> tuple[Call, Closer]:
    channel = grpc.insecure_channel(endpoint)
    kv = rpc_pb2_grpc.KVStub(channel)
    loop = asyncio.get_running_loop()

    def settle(future: asyncio.Future[Any], done: Any) -> None:
        try:
            future.set_result(done.result())
        except Exception as exc:  # handed to the awaiting caller
            future.set_exception(exc)

    async def call(i: int) -> None:
        future: asyncio.Future[Any] = loop.create_future()
        pending = kv.Txn.future(_message(prefix + str(i).encode() + b"/"), timeout=5.0)
        pending.add_done_callback(lambda done: loop.call_soon_threadsafe(settle, future, done))
        await future

    async def close() -> None:
        channel.close()
    return call, close


VARIANTS = {
    "stub": lambda ep, p: _stub(ep, p, []),
    "stub-opts": lambda ep, p: _stub(ep, p, [("grpc.http2.bdp_probe", 0),
                                             ("grpc.max_concurrent_streams", 1000)]),
    "wire": _wire,
    "sync-future": _sync_future,
}


async def run(endpoint: str, concurrencies: list[int], rounds: int, txns: int) -> None:
    for concurrency in concurrencies:
        sums: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in VARIANTS}
        for r in range(rounds):
            names = list(VARIANTS)
            names = names[r % len(names):] + names[:r % len(names)]  # each goes first in turn
            for name in names:
                prefix = f"/bench/grpc/{name}-{concurrency}-{r}-{os.getpid()}/".encode()
                call, close = await VARIANTS[name](endpoint, prefix)
                rate, cpu = await _pool(txns, concurrency, call)
                await close()
                s = sums[name]
                s[0] += txns / rate
                s[1] += cpu * txns
                s[2] += txns
        base = sums["stub"][2] / sums["stub"][0]
        load = os.getloadavg()
        print(f"concurrency {concurrency}, {txns} txns x {rounds} rounds "
              f"(load after {load[0]:.2f})")
        for name, (seconds, cpu_sum, n) in sums.items():
            rate = n / seconds
            print(f"  {name:12s} {rate:8.0f} txn/s  {cpu_sum / n:6.0f} us CPU/txn  "
                  f"ratio to stub {rate / base:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")],
                        default=[1, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--txns", type=int, default=10000)
    parser.add_argument("--endpoints", help="use this etcd instead of starting one")
    args = parser.parse_args()
    if args.endpoints:
        asyncio.run(run(args.endpoints.split(",")[0], args.concurrency, args.rounds, args.txns))
        return
    with EtcdCluster(1, binary=etcd_binary_or_none()) as cluster:
        endpoint = cluster.endpoints[0].removeprefix("http://")
        asyncio.run(run(endpoint, args.concurrency, args.rounds, args.txns))


if __name__ == "__main__":
    main()
