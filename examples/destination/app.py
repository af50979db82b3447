"""The example ledger destination; the code lives in :mod:`joblease.fencing.destination`
so that ``joblease demo`` can use it from a plain install."""

from joblease.fencing.destination import MemoryLedger, SqliteLedger, create_app, resource_for

__all__ = ["MemoryLedger", "SqliteLedger", "create_app", "resource_for"]
