"""bench/cpu_cost.py's pure parts: reading a process's CPU from /proc (against a
real child process that burns a known amount on a second thread), pairing
rounds, the ratios' orientation and reference scaling, medians, etcd's metrics."""

from __future__ import annotations

import asyncio
import select
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from bench import cpu_cost
from bench.cpu_cost import Reference, RoundCost, Snapshot

#: The child: burns CPU on a *second* thread (a reading of the main thread only
#: would miss it) until its own process_time has grown by the seconds it is sent,
#: then prints its process_time and waits for the next line.
CHILD = r"""
import sys, threading, time
def burn(seconds):
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1
for line in sys.stdin:
    t = threading.Thread(target=burn, args=(float(line),))
    t.start(); t.join()
    print(repr(time.process_time()), flush=True)
"""


@pytest.fixture
def child() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait(timeout=10)


def burn(proc: subprocess.Popen[str], seconds: float, timeout: float = 30.0) -> float:
    """Have the child burn ``seconds`` of CPU; its process_time once done."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(f"{seconds}\n")
    proc.stdin.flush()
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, f"the child did not finish burning {seconds} s of CPU in {timeout} s"
    return float(proc.stdout.readline())


#: Clock ticks are 10 ms (CLK_TCK 100): two ticks of slack, and 5 ms for the
#: scheduler's ns clock against the child's own process_time.
TICKS = 2 / cpu_cost.CLK_TCK


def test_a_child_process_cpu_read_from_proc_matches_its_own_count(child) -> None:
    own = burn(child, 0.3)
    assert own >= 0.3
    # utime + stime of all threads (the burning one has exited: stat keeps its time)
    assert cpu_cost.proc_cpu_seconds(child.pid) == pytest.approx(own, abs=TICKS)

    before = Snapshot.take([child.pid])
    own_after = burn(child, 0.2)
    cost = before.until(Snapshot.take([child.pid]))
    # The burning thread was born after the first reading and died before the
    # second: the threads' ns miss it, the ticks have it.
    assert cost["etcd_cpu_ticks_s"] == pytest.approx(own_after - own, abs=TICKS)


def test_the_threads_ns_count_a_live_second_thread() -> None:
    # A thread that lives across both readings (the Go runtime's threads do):
    # burn on the main thread of another child that keeps a second thread busy.
    spinner = subprocess.Popen(
        [sys.executable, "-c",
         "import threading, time\n"
         "def spin():\n    while True: pass\n"
         "threading.Thread(target=spin, daemon=True).start()\n"
         "time.sleep(60)\n"])
    try:
        # let the spinning thread start (it is live at both readings from then on)
        deadline = time.monotonic() + 10
        while len(cpu_cost.thread_cpu_ns(spinner.pid)) < 2:
            assert time.monotonic() < deadline, "the spinner's second thread never started"
            time.sleep(0.01)
        before = Snapshot.take([spinner.pid])
        first = cpu_cost.thread_cpu_ns(spinner.pid)
        # wait until it has burnt at least 0.2 s more (by its ticks), with a deadline
        start_ticks = cpu_cost.proc_cpu_seconds(spinner.pid)
        deadline = time.monotonic() + 30
        while cpu_cost.proc_cpu_seconds(spinner.pid) < start_ticks + 0.2:
            assert time.monotonic() < deadline, "the spinner burnt no CPU"
            time.sleep(0.02)
        cost = before.until(Snapshot.take([spinner.pid]))
        assert cost["etcd_cpu_s"] is not None and cost["etcd_cpu_ticks_s"] is not None
        # both ways of counting agree (to the ticks' resolution)
        assert cost["etcd_cpu_s"] == pytest.approx(cost["etcd_cpu_ticks_s"], abs=TICKS)
        assert cost["etcd_cpu_s"] >= 0.2 - TICKS
        # the main thread sleeps: the time is the second thread's, not the leader's
        later = cpu_cost.thread_cpu_ns(spinner.pid)
        leader = spinner.pid
        assert later[leader] - first[leader] < 0.05e9
    finally:
        spinner.kill()
        spinner.wait(timeout=10)


def test_stat_fields_are_counted_from_the_last_parenthesis() -> None:
    # a command name with a space and a ')' in it; utime 250, stime 50 ticks
    fields = ["S", "1", "2", "3", "0", "-1", "4194560", "100", "0", "0", "0", "250", "50",
              "0", "0", "20", "0", "9"]
    text = f"1234 (etcd) x) {' '.join(fields)}\n"
    assert cpu_cost.parse_stat_cpu(text, clk_tck=100) == pytest.approx(3.0)


def _round(side: str, cpu_ms: float, wall_ms: float = 1.0, etcd_ms: float | None = 0.5,
           ref_ms: float = 20.0, cycles: int = 100) -> RoundCost:
    ref = Reference(ref_ms / 1000, ref_ms / 1000)
    cost = {"wall_s": wall_ms * cycles / 1000, "client_cpu_s": cpu_ms * cycles / 1000,
            "etcd_cpu_s": None if etcd_ms is None else etcd_ms * cycles / 1000}
    return RoundCost.of(side, cycles, cost, ref, ref)


def test_rounds_pair_in_the_order_they_ran() -> None:
    rounds = [_round("off", 1), _round("on", 2), _round("on", 3), _round("off", 4),
              _round("off", 5), _round("on", 6)]
    assert [(a.client_cpu_s * 10, b.client_cpu_s * 10)
            for a, b in cpu_cost.pairs(rounds, "off", "on")] == [
        pytest.approx((1, 2)), pytest.approx((4, 3)), pytest.approx((5, 6))]
    with pytest.raises(ValueError, match="unpaired"):
        cpu_cost.pairs(rounds[:-1], "off", "on")


def test_ratios_read_like_cycles_per_second_and_take_out_a_slower_host() -> None:
    # on costs 25 % more client CPU and twice the wall: 0.8 and 0.5, higher is better
    r = cpu_cost.pair_ratios(_round("off", 1.0, wall_ms=1.0), _round("on", 1.25, wall_ms=2.0))
    assert r["client_cpu"] == pytest.approx(0.8)
    assert r["wall"] == pytest.approx(0.5)
    assert r["etcd_cpu"] == pytest.approx(1.0)
    assert r["total_cpu"] == pytest.approx(1.5 / 1.75)
    # the host ran 1.5x slower during the on round: its reference shows it
    slow = cpu_cost.pair_ratios(_round("off", 1.0, etcd_ms=0.5),
                                _round("on", 1.5, etcd_ms=0.75, ref_ms=30.0))
    assert slow["client_cpu"] == pytest.approx(1.0)
    assert slow["etcd_cpu"] == pytest.approx(1.0)
    assert slow["total_cpu_unscaled"] == pytest.approx(1.5 / 2.25)
    # no etcd reading (an --endpoints run): no etcd or total ratio, the rest still
    none = cpu_cost.pair_ratios(_round("off", 1.0, etcd_ms=None), _round("on", 2.0,
                                                                         etcd_ms=None))
    assert none["etcd_cpu"] is None and none["total_cpu"] is None
    assert none["client_cpu"] == pytest.approx(0.5)


def test_a_row_reports_the_median_of_its_paired_ratios() -> None:
    # three pairs whose client ratios are 0.5, 0.9 and 1.0; one outlier round
    rounds = [_round("off", 1.0), _round("on", 2.0),
              _round("on", 1.0 / 0.9), _round("off", 1.0),
              _round("off", 1.0), _round("on", 1.0)]
    s = cpu_cost.summarize(rounds, "off", "on")
    assert s["ratio_client_cpu"] == pytest.approx(0.9, abs=1e-3)
    assert [p["client_cpu"] for p in s["pairs"]] == pytest.approx([0.5, 0.9, 1.0], abs=1e-3)
    assert s["on"]["client_cpu_ms"] == pytest.approx(1.0 / 0.9, abs=1e-3)
    assert s["off"]["client_cpu_ms"] == pytest.approx(1.0)
    assert s["off"]["reference_cpu_ms"] == pytest.approx(20.0)
    assert len(s["rounds"]) == 6
    assert "median of 3 paired rounds" in cpu_cost.format_row("c=1", s, "off", "on")


def test_a_measured_round_is_bracketed_by_the_reference() -> None:
    async def one_round() -> dict[str, object]:
        snap = Snapshot.take()
        cpu_cost._reference_work(50_000)
        return {"cycles": 10, "cpu": snap.until(Snapshot.take())}

    result, cost = asyncio.run(cpu_cost.measured("on", one_round))
    assert result["cycles"] == 10
    assert cost.side == "on" and cost.cycles == 10 and cost.etcd_cpu_s is None
    assert cost.client_cpu_s > 0 and cost.reference_cpu_s > 0
    # a quarter of the reference loop's work, give or take the host
    assert 0.05 < cost.client_cpu_s / cost.reference_cpu_s < 1.0


def test_etcd_rpc_counts_are_summed_over_codes() -> None:
    text = "\n".join([
        "# TYPE grpc_server_handled_total counter",
        'grpc_server_handled_total{grpc_code="OK",grpc_method="Authenticate",'
        'grpc_service="etcdserverpb.Auth",grpc_type="unary"} 3',
        'grpc_server_handled_total{grpc_code="InvalidArgument",grpc_method="Authenticate",'
        'grpc_service="etcdserverpb.Auth",grpc_type="unary"} 1',
        'grpc_server_handled_total{grpc_code="OK",grpc_method="Txn",'
        'grpc_service="etcdserverpb.KV",grpc_type="unary"} 1.2e+06',
        'grpc_server_started_total{grpc_method="Txn",grpc_service="etcdserverpb.KV",'
        'grpc_type="unary"} 7',
    ])
    assert cpu_cost.parse_rpc_counts(text) == {"Authenticate": 4, "Txn": 1_200_000}


async def test_a_bench_round_on_a_real_etcd_counts_both_processes(etcd, etcd_config) -> None:
    from bench.claims import bench_joblease

    (endpoint,) = etcd.endpoints
    before = cpu_cost.etcd_rpc_counts(endpoint)
    result = await bench_joblease(etcd_config, 60, 4, etcd_pids=cpu_cost.pids_of(etcd))
    after = cpu_cost.etcd_rpc_counts(endpoint)
    cost = result["cpu"]
    assert result["cycles"] == 60
    # two transactions per cycle (claim, completion) reached etcd and cost it CPU
    assert after["Txn"] - before["Txn"] >= 2 * 60
    assert cost["etcd_cpu_s"] is not None and cost["etcd_cpu_s"] > 0
    assert 0 < cost["client_cpu_s"] and 0 < cost["wall_s"]
