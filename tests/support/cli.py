"""The ``joblease`` command run as a real process against a test's etcd."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from joblease import EtcdConfig

#: TTL for jobs whose holder must still be there a few CLI runs later. A claim
#: without ``--hold`` is never renewed, and each ``jl`` call is a fresh Python
#: process (seconds apiece on a loaded machine), so a short TTL lets the holder
#: expire between steps and the test observe an expiry it is not about. No test
#: here waits for this TTL: it is a lifetime longer than any test, not a wait.
LONG_TTL = "600"


def jl(config: EtcdConfig, *args: str, check: int | None = 0, timeout: float = 60
       ) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints),
           "JOBLEASE_ROOT": config.root}
    done = subprocess.run([sys.executable, "-m", "joblease.cli", *args], env=env,
                          capture_output=True, text=True, timeout=timeout)
    if check is not None:
        assert done.returncode == check, (done.returncode, done.stdout, done.stderr)
    return done


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(done.stdout)
