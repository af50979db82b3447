"""A fenced "ledger" destination: see :mod:`examples.destination.app`."""

from examples.destination.app import create_app

__all__ = ["create_app"]
