"""A lossy TCP proxy in front of etcd whose connections can be cut, for sidecar processes.

The in-process fault tests (tests/support/faulty_store.py) inject faults at
exact steps inside the Python client; a sidecar of another implementation
has no such hooks, so the process-level tests fault the network instead:
the sidecar's only etcd endpoint is this proxy. Losing bytes in the middle of
an HTTP/2 connection leaves it unusable (frames and header-compression state
are gone), so after a fault the test *severs* every connection and lets new
ones pass: the sidecar's gRPC client reconnects, as it would after any
network failure. Only the network is faked; etcd and the sidecar are real.
"""

from __future__ import annotations

import asyncio

from tests.support.proxy import LossyProxy


class SeverableProxy(LossyProxy):
    """:class:`LossyProxy` plus :meth:`sever`."""

    @classmethod
    async def to(cls, endpoint: str) -> SeverableProxy:
        host, port = endpoint.rsplit(":", 1)
        proxy = cls(host, int(port))
        await proxy.start()
        return proxy

    async def sever(self) -> None:
        """Close every proxied connection now; new ones pass (mode ``pass``)."""
        self.mode = "pass"
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
