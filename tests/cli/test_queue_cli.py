"""The queue verbs as a real process against a real etcd: output, errors, exit codes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from joblease import EtcdConfig
from tests.support.cli import LONG_TTL, as_json, jl


def test_create_enqueue_claim_complete_items_cycle(etcd_config: EtcdConfig,
                                                   tmp_path: Path) -> None:
    jl(etcd_config, "queue", "create", "files", "-n", "team-a", "--ttl", LONG_TTL,
       "--max-attempts", "1")
    lines = tmp_path / "items.jsonl"
    lines.write_text("".join(json.dumps({"id": f"f{n}", "payload": {"n": n}}) + "\n"
                             for n in range(3)))
    added = as_json(jl(etcd_config, "queue", "enqueue", "team-a/files", "--file", str(lines),
                       "-o", "json"))
    assert (added["added"], added["existing"]) == (3, 0)
    again = as_json(jl(etcd_config, "queue", "enqueue", "team-a/files", "--file", str(lines),
                       "-o", "json"))
    assert (again["added"], again["existing"]) == (0, 3)  # idempotent

    claimed = as_json(jl(etcd_config, "queue", "claim", "team-a/files", "--owner", "w1",
                         "-o", "json"))
    assert claimed["queue"] == "team-a/files" and claimed["generation"] == 1
    assert claimed["payload"] == {"n": int(claimed["item"][1:])}
    done = as_json(jl(etcd_config, "queue", "complete", "team-a/files", claimed["item"],
                      "--owner", "w1", "--token", str(claimed["token"]), "--result", '"ok"',
                      "-o", "json"))
    assert done["token"] == claimed["token"] and done["result"] == "ok"
    # a second completion under the same token is the same answer; another token is stale
    stale = jl(etcd_config, "queue", "complete", "team-a/files", claimed["item"], "--owner",
               "w1", "--token", str(claimed["token"] - 1), check=7)
    assert stale.stderr.startswith("joblease: stale:")

    counts = as_json(jl(etcd_config, "queue", "get", "files", "-n", "team-a", "-o", "json"))
    assert (counts["total"], counts["completed"], counts["pending"]) == (3, 1, 2)
    items = as_json(jl(etcd_config, "items", "team-a/files", "-o", "json"))
    assert [i["item"] for i in items] == ["f0", "f1", "f2"]
    assert {i["phase"] for i in items} == {"Completed", "Pending"}
    table = jl(etcd_config, "queue", "items", "team-a/files", "--phase", "Completed").stdout
    assert claimed["item"] in table and "Completed" in table and "Pending" not in table


def test_a_failed_item_is_listed_and_retried(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "q", "--ttl", LONG_TTL, "--max-attempts", "1")
    jl(etcd_config, "queue", "enqueue", "q", "--item", "poison", "--payload", "1")
    claimed = as_json(jl(etcd_config, "queue", "claim", "q", "--item", "poison", "--owner", "w",
                         "-o", "json"))
    jl(etcd_config, "queue", "release", "q", "poison", "--owner", "w", "--token",
       str(claimed["token"]))
    jl(etcd_config, "queue", "claim", "q", "--item", "poison", "--owner", "w", check=6)
    failed = as_json(jl(etcd_config, "items", "q", "--phase", "Failed", "-o", "json"))
    assert [i["item"] for i in failed] == ["poison"]
    jl(etcd_config, "queue", "retry", "q", "poison")
    again = as_json(jl(etcd_config, "queue", "claim", "q", "--owner", "w", "-o", "json"))
    assert again["item"] == "poison" and again["generation"] == 2


def test_a_cron_slot_is_claimed_once(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "nightly", "--ttl", LONG_TTL)
    slot = "2026-12-01T23:00:00Z"
    first = as_json(jl(etcd_config, "queue", "claim", "nightly", "--item", slot, "--create",
                       "--owner", "job-1", "-o", "json"))
    jl(etcd_config, "queue", "complete", "nightly", slot, "--owner", "job-1", "--token",
       str(first["token"]))
    second = jl(etcd_config, "queue", "claim", "nightly", "--item", slot, "--create",
                "--owner", "job-2", check=5)
    assert second.stderr.startswith("joblease: completed:")
    nothing = jl(etcd_config, "queue", "claim", "nightly", "--owner", "w", check=3)
    assert "no" in nothing.stderr and "claimable item" in nothing.stderr


@pytest.mark.parametrize(("args", "code", "word"), [
    (("queue", "enqueue", "missing", "--item", "a"), 3, "not_found"),
    (("queue", "enqueue", "q", "--item", "a/b"), 2, "invalid"),
    (("queue", "enqueue", "q", "--item", "a", "--payload", "NaN"), 2, "invalid"),
    (("queue", "enqueue", "q", "--item", "taken", "--payload", "2"), 16, "conflict"),
    (("queue", "create", "q", "--ttl", "1"), 2, "invalid"),
    (("queue", "create", "Bad_Name", "--ttl", "10"), 2, "invalid"),
    (("queue", "claim", "missing", "--owner", "w"), 3, "not_found"),
    (("items", "missing"), 3, "not_found"),
    (("queue", "retry", "q", "taken"), 2, "invalid"),  # not failed
])
def test_queue_errors_are_one_line_with_distinct_exit_codes(
        etcd_config: EtcdConfig, args: tuple[str, ...], code: int, word: str) -> None:
    jl(etcd_config, "queue", "create", "q", "--ttl", LONG_TTL)
    jl(etcd_config, "queue", "enqueue", "q", "--item", "taken", "--payload", "1")
    done = jl(etcd_config, *args, check=code)
    assert done.stderr.startswith(f"joblease: {word}:"), done.stderr
    assert done.stderr.count("\n") == 1 and done.stdout == ""


def test_a_suspended_queue_refuses_claims_with_exit_17(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "q", "--ttl", LONG_TTL, "--suspend")
    jl(etcd_config, "queue", "enqueue", "q", "--item", "a")
    done = jl(etcd_config, "queue", "claim", "q", "--owner", "w", check=17)
    assert done.stderr.startswith("joblease: suspended:")


def test_queue_run_drains_with_one_command_per_item(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "q", "--ttl", "10", "--max-attempts", "2")
    for n in range(3):
        jl(etcd_config, "queue", "enqueue", "q", "--item", f"i{n}", "--payload",
           json.dumps({"n": n}))
    jl(etcd_config, "queue", "enqueue", "q", "--item", "bad", "--payload", '{"n": -1}')
    script = ('import json, os, sys; p = json.loads(os.environ["JOBLEASE_PAYLOAD"]); '
              'sys.exit(3) if p["n"] < 0 else print(json.dumps({"item": '
              'os.environ["JOBLEASE_ITEM"], "token": int(os.environ["JOBLEASE_TOKEN"]), '
              '"double": 2 * p["n"]}))')
    done = jl(etcd_config, "queue", "run", "q", "--owner", "runner", "--", sys.executable,
              "-c", script, check=3)  # every good item done; the poison one's code last
    assert "no claimable item" in done.stderr
    items = {i["item"]: i for i in as_json(jl(etcd_config, "items", "q", "-o", "json"))}
    for n in range(3):
        result = items[f"i{n}"]["result"]
        assert items[f"i{n}"]["phase"] == "Completed"
        assert result["result"] == {"item": f"i{n}", "token": result["token"], "double": 2 * n}
    assert items["bad"]["phase"] == "Failed" and items["bad"]["generation"] == 2


def test_queue_run_one_item_of_an_indexed_job(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "shards", "--ttl", "10", "--shards", "4")
    jl(etcd_config, "queue", "run", "shards", "--item", "2", "--", sys.executable, "-c",
       'import os; print(os.environ["JOBLEASE_ITEM"])')
    items = {i["item"]: i["phase"] for i in as_json(jl(etcd_config, "items", "shards",
                                                       "-o", "json"))}
    assert items == {"0": "Pending", "1": "Pending", "2": "Completed", "3": "Pending"}
    again = jl(etcd_config, "queue", "run", "shards", "--item", "2", "--", "false", check=5)
    assert again.stderr.startswith("joblease: completed:")  # run once, never again


def test_queue_prune_forgets_finished_items(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "queue", "create", "q", "--ttl", LONG_TTL)
    jl(etcd_config, "queue", "enqueue", "q", "--item", "a", "--item", "b")
    claimed = as_json(jl(etcd_config, "queue", "claim", "q", "--item", "a", "--owner", "w",
                         "-o", "json"))
    jl(etcd_config, "queue", "complete", "q", "a", "--owner", "w", "--token",
       str(claimed["token"]))
    assert as_json(jl(etcd_config, "queue", "prune", "q", "--older-than", "0",
                      "-o", "json"))["pruned"] == 1
    assert [i["item"] for i in as_json(jl(etcd_config, "items", "q", "-o", "json"))] == ["b"]


def test_semaphore_verbs_and_a_job_that_takes_a_slot(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "semaphore", "create", "db", "--limit", "1")
    jl(etcd_config, "register", "a", "--ttl", LONG_TTL, "--semaphore", "db")
    jl(etcd_config, "register", "b", "--ttl", LONG_TTL, "--semaphore", "db:1")
    claimed = as_json(jl(etcd_config, "claim", "a", "--owner", "w", "-o", "json"))
    assert claimed["semaphores"] == [{"semaphore": "default/db", "slots": [0],
                                      "token": claimed["token"]}]
    full = jl(etcd_config, "claim", "b", "--owner", "w", check=18)
    assert full.stderr.startswith("joblease: full: semaphore default/db has no room")
    holders = as_json(jl(etcd_config, "semaphore", "holders", "db", "-o", "json"))
    assert (holders["limit"], holders["live"]) == (1, 1)
    assert holders["holders"][0]["holder"] == "default/a"
    jl(etcd_config, "release", "a", "--owner", "w", "--token", str(claimed["token"]))
    jl(etcd_config, "claim", "b", "--owner", "w")
    jl(etcd_config, "register", "c", "--ttl", "10", "--semaphore", "db:0", check=2)
    jl(etcd_config, "semaphore", "create", "db", "--limit", "0", check=2)


def test_run_hands_the_command_its_slot_tokens(etcd_config: EtcdConfig) -> None:
    jl(etcd_config, "semaphore", "create", "db", "--limit", "2")
    jl(etcd_config, "register", "job", "--ttl", "10", "--semaphore", "db")
    done = jl(etcd_config, "run", "job", "--", sys.executable, "-c",
              'import os; print(os.environ["JOBLEASE_SEMAPHORES"])')
    slots = json.loads(done.stdout.strip().splitlines()[-1])
    token = as_json(jl(etcd_config, "get", "job", "-o", "json"))["token"]
    assert len(slots) == 1 and slots[0]["semaphore"] == "default/db"
    assert slots[0]["token"] == token and slots[0]["slots"][0] in (0, 1)
    holders = as_json(jl(etcd_config, "semaphore", "get", "db", "-o", "json"))
    assert holders["live"] == 0  # the completion freed the slot


def test_queue_list_shows_each_queue_of_a_namespace_once(etcd_config: EtcdConfig) -> None:
    for name in ("b-files", "a-shards"):
        jl(etcd_config, "queue", "create", name, "-n", "team", "--ttl", LONG_TTL)
    jl(etcd_config, "queue", "create", "elsewhere", "--ttl", LONG_TTL)
    jl(etcd_config, "queue", "enqueue", "team/b-files", "--item", "x", "--item", "y")
    jl(etcd_config, "register", "a-job", "-n", "team", "--ttl", LONG_TTL)
    listed = as_json(jl(etcd_config, "queue", "list", "-n", "team", "-o", "json"))
    assert [(q["queue"], q["total"]) for q in listed] == [("team/a-shards", 0),
                                                         ("team/b-files", 2)]
    assert as_json(jl(etcd_config, "queue", "list", "-n", "empty", "-o", "json")) == []
