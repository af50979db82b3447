"""What every chaos run must show, and where its run directory goes.

Shared by the library-worker runs (test_chaos.py) and the operator runs
(test_chaos_operator.py), so both are judged by the same rules; the queue runs
(test_chaos_queue.py) by ``judge_queue``, the semaphore runs
(test_chaos_semaphore.py) by ``judge_semaphore``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.chaos.queue_runner import QueueReport
from tests.chaos.runner import Report
from tests.chaos.sem_runner import SemReport


def run_dir(tmp_path: Path, name: str) -> Path:
    base = os.environ.get("JOBLEASE_CHAOS_DIR")
    if base:
        return Path(base) / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
    return tmp_path / name


def judge(report: Report) -> None:
    print("\n" + report.summary())
    print(f"report: {Path(report.run_dir) / 'report.json'}")
    assert report.violations == [], json.dumps(report.violations[:10], indent=2)
    scheduled = tuple(report.config["fault_types"])
    missing = [t for t in (*scheduled, "clock-skew") if not report.faults_by_type.get(t)]
    assert not missing, f"fault types never injected: {missing}"
    assert report.unexpected_exits == [], report.unexpected_exits
    assert report.jobs_completed == report.jobs_registered
    ops = report.operations
    assert ops["claim"]["accepted"] >= report.jobs_registered
    assert ops["write"]["accepted"] > 0
    # every destination took effects, the gates called directly included
    dests = {"http", "sqlite", "direct-memory", "direct-sqlite", "etcd"}
    if report.config["pg_dsn"]:
        dests.add("pg")
    assert {d for d, n in report.destination_entries.items() if n} >= dests, \
        report.destination_entries
    # writes were re-sent with their idempotency key (the duplicate rule was exercised)
    assert ops["write"].get("resent", 0) > 0
    # the sidecar pairs really worked (claims through the sidecar's HTTP API)
    assert report.sidecar_claims > 0


def judge_queue(report: QueueReport) -> None:
    """A queue run (tests/chaos/queue_runner.py): no violation (with the operator, its
    JobQueue statuses included), every scheduled fault injected, every acknowledged
    item settled, the poison ones Failed, the fences and the re-sends exercised, the
    sidecar pairs' claims there."""
    print("\n" + report.summary())
    print(f"report: {Path(report.run_dir) / 'report.json'}")
    assert report.violations == [], json.dumps(report.violations[:10], indent=2)
    scheduled = tuple(report.config["fault_types"])
    missing = [t for t in (*scheduled, "clock-skew") if not report.faults_by_type.get(t)]
    assert not missing, f"fault types never injected: {missing}"
    assert report.unexpected_exits == [], report.unexpected_exits
    assert report.items_enqueued == report.config["items"]
    assert report.items_completed + report.items_failed == report.items_enqueued
    assert len(report.failed_poison) == report.config["poison"], report.failed_poison
    ops = report.operations
    assert ops["claim"]["accepted"] >= report.items_enqueued
    assert ops["write"]["accepted"] > 0 and ops["write"].get("resent", 0) > 0
    assert ops["release"]["accepted"] > 0  # the poison items were given back
    if report.config["sidecar_pairs"]:
        # the pairs really drained (items served by the sidecar's queue mode)
        assert report.sidecar_claims > 0
    dests = {"http", "sqlite", "direct-memory", "direct-sqlite", "etcd"}
    if report.config["pg_dsn"]:
        dests.add("pg")
    assert {d for d, n in report.destination_entries.items() if n} >= dests, \
        report.destination_entries


def judge_semaphore(report: SemReport) -> None:
    """A semaphore run (tests/chaos/sem_runner.py): no violation, every scheduled fault
    injected, every job completed, slots granted and fenced, the limit changed and
    never exceeded."""
    print("\n" + report.summary())
    print(f"report: {Path(report.run_dir) / 'report.json'}")
    assert report.violations == [], json.dumps(report.violations[:10], indent=2)
    scheduled = tuple(report.config["fault_types"])
    missing = [t for t in (*scheduled, "clock-skew") if not report.faults_by_type.get(t)]
    assert not missing, f"fault types never injected: {missing}"
    assert report.unexpected_exits == [], report.unexpected_exits
    assert report.jobs_completed == report.jobs_registered > 0
    limits = list(report.config["limits"])
    assert 0 < report.max_live_slots <= max(limits)
    assert report.slot_grants >= report.jobs_registered  # one grant per claim at least
    if len(limits) > 1 and report.config["limit_every"]:
        assert len(set(report.limits_set)) > 1, report.limits_set  # the limit changed
    ops = report.operations
    assert ops["claim"]["accepted"] >= report.jobs_registered
    assert ops["write"]["accepted"] > 0 and ops["write"].get("resent", 0) > 0
    assert report.slot_effects > 0
    dests = {"http", "sqlite", "direct-memory", "direct-sqlite", "etcd"}
    if report.config["pg_dsn"]:
        dests.add("pg")
    assert {d for d, n in report.destination_entries.items() if n} >= dests, \
        report.destination_entries
