"""The ``joblease sidecar``: claims one job for the pod it runs in.

It keeps the lease alive, publishes the fencing token on a loopback HTTP API
and in a token file, completes or releases the job for the worker, and on
loss stops answering with the old token and signals the worker. See
docs/sidecar.md.
"""

from joblease.sidecar.config import Backoff, SidecarConfig
from joblease.sidecar.runner import SidecarRunner
from joblease.sidecar.serve import Sidecar, run_sidecar

__all__ = ["Backoff", "Sidecar", "SidecarConfig", "SidecarRunner", "run_sidecar"]
