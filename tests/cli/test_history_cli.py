"""``joblease history`` and ``kubectl joblease history`` on a real etcd: the
table, JSON (as a real process, and through the real kubectl's plugin
lookup), and the exit codes of a job that is not registered, of a tenure
record that cannot be decoded and of a history limit out of range. The jobs
are set up with the library: only the verbs under test run as the CLI."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner, Result

from joblease import EtcdConfig, JobLeaseClient, JobRef, JobSpec
from joblease.cli import main
from joblease.keys import ItemRef, QueueRef
from joblease.queue import Queues
from joblease.store import Put
from tests.support.binaries import kubectl_binary
from tests.support.cli import as_json, jl


def _env(config: EtcdConfig) -> dict[str, str]:
    return {"JOBLEASE_ETCD_ENDPOINTS": ",".join(config.endpoints), "JOBLEASE_ROOT": config.root}


async def _invoke(config: EtcdConfig, *args: str) -> Result:
    """The CLI in this process (in a thread: it runs its own event loop)."""
    return await asyncio.to_thread(CliRunner().invoke, main, list(args), env=_env(config))


async def test_history_table_json_and_the_kubectl_plugin(etcd_config: EtcdConfig,
                                                         client: JobLeaseClient) -> None:
    job = JobRef("team-a", "nightly")
    await client.register(job, JobSpec(600, 0, history_limit=2))
    leases = []
    for owner in ("w1", "w2", "w3"):
        leases.append(await client.claim(job, owner))
        if owner != "w3":
            await leases[-1].release()
    found = as_json(jl(etcd_config, "history", "team-a/nightly", "-o", "json"))
    assert found["historyLimit"] == 2
    assert [(t["generation"], t["owner"], t["token"], t["end"]) for t in found["tenures"]] == [
        (2, "w2", leases[1].token, "released"), (3, "w3", leases[2].token, "open")]
    table = await _invoke(etcd_config, "history", "nightly", "-n", "team-a")
    assert table.exit_code == 0, table.output
    lines = table.output.splitlines()
    assert lines[0].split() == ["GENERATION", "TOKEN", "OWNER", "CLAIMED", "ENDED", "END",
                                "CHECKPOINTS", "REFUSED"]
    assert [line.split()[:3] for line in lines[1:]] == [
        ["2", str(leases[1].token), "w2"], ["3", str(leases[2].token), "w3"]]

    bindir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
           **_env(etcd_config)}
    done = subprocess.run([kubectl_binary(), "joblease", "history", "team-a/nightly", "-o",
                           "json"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert as_json(done)["tenures"] == found["tenures"]

    # a corrupt tenure is named on stderr (exit 14); the others are still shown
    await client.store.txn([], [Put(client.keys.job(job).history.tenure(2), b"{")])
    bad = await _invoke(etcd_config, "history", "team-a/nightly", "-o", "json")
    assert bad.exit_code == 14
    assert "joblease: corrupt: job team-a/nightly: tenure 2:" in bad.output
    await leases[2].release()


def test_history_of_a_job_that_is_not_registered_exits_3(etcd_config: EtcdConfig) -> None:
    done = CliRunner().invoke(main, ["history", "nope"], env=_env(etcd_config))
    assert done.exit_code == 3 and "not registered" in done.output


async def test_a_history_limit_out_of_range_exits_2_and_registers_nothing(
        etcd_config: EtcdConfig, client: JobLeaseClient) -> None:
    done = await _invoke(etcd_config, "register", "bad", "--ttl", "10", "--history-limit", "-1")
    assert done.exit_code == 2 and "historyLimit" in done.output
    assert not (await client.get(JobRef("default", "bad"))).registered


async def test_an_items_history_table_and_json_and_its_late_completion_counted(
        etcd_config: EtcdConfig, client: JobLeaseClient) -> None:
    """``joblease history --queue QUEUE/ITEM`` (and ``NS/QUEUE/ITEM``, which is
    always an item): a queue created with the CLI's default limit, a claim
    released, one completed, and a completion sent with the released claim's
    token (`joblease queue complete --token`) refused (exit 7) and counted
    against that tenure."""
    created = await _invoke(etcd_config, "queue", "create", "files", "-n", "team-a",
                            "--ttl", "600", "-o", "json")
    assert created.exit_code == 0, created.output
    q = QueueRef("team-a", "files")
    queues = Queues(client)
    assert (await queues.spec(q))[1].history_limit == 3  # DEFAULT_QUEUE_HISTORY_LIMIT
    await queues.enqueue(q, [("x", None)])
    first = await queues.claim(ItemRef(q, "x"), "w1")
    await first.release()
    second = await queues.claim(ItemRef(q, "x"), "w2")
    await second.complete("ok")
    late = await _invoke(etcd_config, "queue", "complete", "files", "x", "-n", "team-a",
                         "--owner", "w1", "--token", str(first.token))
    assert late.exit_code == 7, late.output

    found = as_json(jl(etcd_config, "history", "--queue", "files/x", "-n", "team-a",
                       "-o", "json"))
    assert (found["queue"], found["item"], found["historyLimit"]) == ("team-a/files", "x", 3)
    assert [(t["generation"], t["owner"], t["token"], t["end"], t["refusedCompletions"])
            for t in found["tenures"]] == [
        (1, "w1", first.token, "released", 1), (2, "w2", second.token, "completed", 0)]
    table = await _invoke(etcd_config, "history", "team-a/files/x")
    assert table.exit_code == 0, table.output
    assert [line.split()[:3] for line in table.output.splitlines()[1:]] == [
        ["1", str(first.token), "w1"], ["2", str(second.token), "w2"]]
    # without --queue, QUEUE/ITEM is a job NS/NAME: none is registered
    as_job = await _invoke(etcd_config, "history", "files/x")
    assert as_job.exit_code == 3 and "job files/x is not registered" in as_job.output
    missing = await _invoke(etcd_config, "history", "-q", "files/nope", "-n", "team-a")
    assert missing.exit_code == 3 and "item team-a/files/nope is not registered" in missing.output
