"""``joblease get/list/watch`` on a job whose stored record cannot be decoded, and on one
etcd does not know: a clear answer for that job, every other job still shown."""

from __future__ import annotations

import asyncio
import json

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.store import Put
from tests.support.cli import as_json, jl


def put_raw(config: EtcdConfig, job: JobRef, field: str, value: bytes) -> None:
    """Write a value under the job's prefix as a tenant could (no validation)."""
    async def go() -> None:
        async with JobLeaseClient(config) as c:
            key = c.keys.job(job).prefix + field.encode()
            await c.store.txn([], [Put(key, value)], [])
    asyncio.run(go())


def test_get_list_and_watch_show_a_corrupt_job_and_the_others(etcd_config: EtcdConfig) -> None:
    for name in ("good", "bad-result", "bad-spec"):
        jl(etcd_config, "register", f"team/{name}", "--ttl", "10")
    put_raw(etcd_config, JobRef("team", "bad-result"), "result", b"{not json")
    put_raw(etcd_config, JobRef("team", "bad-spec"), "spec", b'{"leaseDurationSeconds": "x"}')

    listed = {s["job"]: s for s in as_json(jl(etcd_config, "list", "-o", "json"))}
    assert {j: s["phase"] for j, s in listed.items()} == {
        "team/good": "Pending", "team/bad-result": "Corrupt", "team/bad-spec": "Corrupt"}
    assert "result" in listed["team/bad-result"]["corrupt"]
    table = jl(etcd_config, "list")
    rows = {line.split()[0]: line.split()[1] for line in table.stdout.splitlines()[1:]}
    assert rows == {"team/good": "Pending", "team/bad-result": "Corrupt",
                    "team/bad-spec": "Corrupt"}
    assert "joblease: corrupt: job team/bad-spec: stored spec record" in table.stderr

    # get: what did decode, and a distinct exit code with the reason (not "not registered").
    for name, record in (("bad-result", "result"), ("bad-spec", "spec")):
        done = jl(etcd_config, "get", f"team/{name}", "-o", "json", check=14)
        assert as_json(done)["phase"] == "Corrupt"
        assert f"joblease: corrupt: job team/{name}: stored {record} record" in done.stderr
    assert as_json(jl(etcd_config, "get", "team/good", "-o", "json"))["phase"] == "Pending"

    lines = jl(etcd_config, "watch", "-n", "team", "--count", "3").stdout.splitlines()
    assert {json.loads(line)["job"]: json.loads(line)["phase"] for line in lines} == {
        "team/good": "Pending", "team/bad-result": "Corrupt", "team/bad-spec": "Corrupt"}


def test_get_of_a_job_etcd_does_not_know_says_not_registered(etcd_config: EtcdConfig) -> None:
    done = jl(etcd_config, "get", "team/nobody", check=3)
    assert "not_found" in done.stderr and "not registered" in done.stderr


def test_get_of_a_result_outside_the_stored_value_rule_exits_14_with_the_reason(
    etcd_config: EtcdConfig,
) -> None:
    """docs/protocol.md#stored-values: a stored result holding a lone surrogate
    (issue 24, item 7: read as if fine) or nested 3000 deep (item 8: a stray
    RecursionError as the reason) is a corrupt record with a plain reason,
    one stderr line, exit 14; the job's other records still show."""
    def record(value: bytes) -> bytes:
        return (b'{"claimId":"c1","completedAt":1.5,"generation":1,"owner":"w","result":'
                + value + b',"token":7}')
    cases = {"surrogate": (record(b'{"note":"\\ud800"}'), "lone UTF-16 surrogate"),
             "deep": (record(b"[" * 3000 + b"]" * 3000), "nested deeper than 64 levels")}
    for name, (value, why) in cases.items():
        jl(etcd_config, "register", f"team/{name}", "--ttl", "10")
        put_raw(etcd_config, JobRef("team", name), "result", value)
        for output in ("json", "yaml", "table"):
            done = jl(etcd_config, "get", f"team/{name}", "-o", output, check=14)
            lines = done.stderr.strip().splitlines()
            assert len(lines) == 1 and "stored result record cannot be decoded" in lines[0]
            assert why in lines[0], done.stderr
        state = as_json(jl(etcd_config, "get", f"team/{name}", "-o", "json", check=14))
        assert state["phase"] == "Corrupt" and state["result"] is None
        assert state["leaseDurationSeconds"] == 10
