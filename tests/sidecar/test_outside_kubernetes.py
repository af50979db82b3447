"""docs/sidecar.md's "Outside Kubernetes" block works as written.

The block is read from the docs and run by bash, unchanged but for its etcd
endpoint (the session's real etcd on a free loopback port instead of
127.0.0.1:2379) and ``JOBLEASE_ROOT`` (the test's key root, so it shares no
keys with other tests). ``joblease`` is this checkout's CLI and
``joblease-sidecar`` the Go binary, both first on PATH; the job name is the
block's. Nothing is faked: the CLI registers the job in etcd, the sidecar
claims it, the example worker completes it through the HTTP API, and SIGTERM
stops the sidecar with exit 0.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from joblease import EtcdConfig, JobLeaseClient, JobRef
from tests.support.cli import doc_block

ROOT = Path(__file__).resolve().parents[2]
DOC_ENDPOINT = "127.0.0.1:2379"


def documented_block() -> str:
    return doc_block(ROOT / "docs" / "sidecar.md", "sh", section="Outside Kubernetes")


def test_the_documented_host_commands_complete_a_job(
        tmp_path: Path, etcd_config: EtcdConfig, sidecar_argv: list[str]) -> None:
    block = documented_block()
    assert DOC_ENDPOINT in block and "joblease-sidecar " in block
    script = block.replace(DOC_ENDPOINT, ",".join(etcd_config.endpoints))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "joblease-sidecar").symlink_to(sidecar_argv[0])
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
    env.update({"JOBLEASE_ROOT": etcd_config.root, "PYTHONPATH": str(ROOT / "operator"),
                "PATH": os.pathsep.join((str(bin_dir), str(Path(sys.executable).parent),
                                         env.get("PATH", "")))})
    done = subprocess.run(["bash", "-euc", script], cwd=tmp_path, env=env, timeout=180,
                          capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert not (tmp_path / "run" / "token").exists()  # removed once the job completed

    async def result() -> object:
        async with JobLeaseClient(etcd_config) as client:
            state = await client.get(JobRef("default", "nightly-report"))
            return state.result
    record = asyncio.run(result())
    assert record is not None, output
    assert record.owner.endswith(tuple("0123456789")), record.owner  # "$(hostname)/$$"
