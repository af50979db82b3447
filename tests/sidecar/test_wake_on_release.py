"""A sidecar refused because another sidecar holds the job claims as soon as the
holder goes (it watches the holder key), not up to a backoff later (the Go
sidecar, as real processes).

Real processes against the session's real etcd; nothing is faked. Each test
starts two sidecars on one job (TTL 3 s, the default claim backoff: 0.2 s
doubling to 5 s). A holds; B is refused until its backoff has grown to
1.6-3.2 s (its fifth refusal); then A goes the moment B logs that refusal:

* SIGTERM: A releases; B must hold within 1.5 s. A backoff-only waiter would
  next claim at least 1.6 s after that refusal, so this case fails without the
  watch, every time.
* SIGKILL: nobody releases; etcd expires A's lease at most TTL after A's last
  keep-alive; B must hold within TTL + 1 s of the kill. A backoff-only waiter
  fails this one only when its retries straddle the expiry (often, not always).

Both implementations (``sidecar_impl``/``sidecar_argv``, tests/support/sidecar_impls.py);
a Go binary that cannot be built fails the [go] cases, never skips them.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from tests.support.waiting import poll

ROOT = Path(__file__).resolve().parents[2]
TTL = 3
HELD_MSG = "job held by another owner; backing off"
# The fifth refusal (attempt 4) is followed by a 1.6-3.2 s backoff (0.2 * 2**4, halved
# up to full): long enough that only a wake on the holder's change meets 1.5 s.
REFUSALS = 5


class _Sidecar:
    """One sidecar process: its log (JSON lines), port file and API."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], workdir: Path) -> None:
        workdir.mkdir()
        self.name, self.port_file, self.log = name, workdir / "port", workdir / "sidecar.log"
        self._log_f = self.log.open("wb")
        self.popen = subprocess.Popen(argv, stdout=self._log_f, stderr=subprocess.STDOUT, cwd=ROOT,
                                      env={**env, "JOBLEASE_SIDECAR_PORT_FILE": str(self.port_file),
                                           "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
                                           "POD_NAME": f"pod-{name}",
                                           "POD_UID": uuid.uuid4().hex[:8]})

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def refusals(self) -> int:
        """How many claims this sidecar logged as refused because the job is held."""
        n = 0
        for line in self.output().splitlines():
            try:
                n += json.loads(line).get("msg") == HELD_MSG
            except ValueError:
                pass
        return n

    async def lease_status(self) -> int:
        if self.popen.poll() is not None:
            raise AssertionError(
                f"{self.name} exited (rc {self.popen.returncode}):\n{self.output()}")
        try:
            url = f"http://127.0.0.1:{int(self.port_file.read_text())}/v1/lease"
        except (OSError, ValueError):
            return 0  # not listening yet
        try:
            async with httpx.AsyncClient(timeout=5) as http:
                return (await http.get(url)).status_code
        except httpx.TransportError:
            return 0

    async def holds(self) -> bool:
        return await self.lease_status() == 200

    def stop(self) -> None:
        try:
            if self.popen.poll() is None:
                self.popen.kill()
                self.popen.wait(10)
        finally:
            self._log_f.close()


@pytest.fixture
def start(tmp_path: Path, etcd_config: EtcdConfig, request: pytest.FixtureRequest,
          sidecar_argv: list[str]) -> Iterator[Any]:
    """``start(name, job)`` runs a sidecar with the default claim backoff; all are
    killed afterwards, and their logs attached to a failure."""
    started: list[_Sidecar] = []

    def run(name: str, job: JobRef) -> _Sidecar:
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
        env.update({"PYTHONUNBUFFERED": "1",
                    "JOBLEASE_ETCD_ENDPOINTS": ",".join(etcd_config.endpoints),
                    "JOBLEASE_ROOT": etcd_config.root,
                    "JOBLEASE_JOB_NAME": job.name, "JOBLEASE_JOB_NAMESPACE": job.namespace,
                    "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PROBE_PORT": "off",
                    "JOBLEASE_SIDECAR_ON_LOSS": "none"})
        s = _Sidecar(name, sidecar_argv, env, tmp_path / name)
        started.append(s)
        return s

    yield run
    for s in started:
        s.stop()
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        rep.sections.append(("sidecar logs", "\n".join(
            f"===== {s.name} (rc={s.popen.poll()})\n{s.output()}" for s in started)))


@pytest.mark.parametrize("how", ["sigterm-releases", "sigkill-expires"])
async def test_a_refused_sidecar_claims_when_the_holder_goes(
        start: Any, client: JobLeaseClient, sidecar_impl: str, how: str) -> None:
    job = JobRef("default", "wake-" + uuid.uuid4().hex[:8])
    await client.register(job, JobSpec(lease_duration_seconds=TTL))
    a = start("a", job)
    await poll(a.holds, 30, "sidecar a to hold the job")
    b = start("b", job)
    # Act at once on B's fifth refusal, while its backoff after it is 1.6-3.2 s.
    await poll(lambda: b.refusals() >= REFUSALS, 30, f"sidecar b to be refused {REFUSALS} times",
               interval=0.01)
    assert await b.lease_status() == 503  # B is still claiming, not holding

    gone = time.monotonic()
    if how == "sigterm-releases":
        a.popen.send_signal(signal.SIGTERM)
        within = 1.5
    else:
        a.popen.kill()
        within = TTL + 1.0
    await poll(b.holds, within + 30, "sidecar b to hold the job", interval=0.02)
    took = time.monotonic() - gone
    # The generous poll above only says *whether*; this says *how soon*.
    assert took <= within, f"b held {took:.2f}s after a's {how} (limit {within}s)"
    state = await client.get(job)
    assert state.holder is not None and state.holder.owner.startswith("pod-b")
    if how == "sigterm-releases":
        assert a.popen.wait(10) == 0  # released and exited cleanly
