"""End to end on the test cluster: worker pods of examples/worker-pod.yaml, the chart's
operator and bundled etcd, real kubelet and containerd (tests/support/cluster/).

Measures (issues 18 and 25, "Measure"):

- **apply -> Completed**: ``kubectl apply`` of the example's worker Job (its JobLease
  already registered) until ``kubectl get jl`` shows ``Completed`` (polled every
  0.2 s: what a user watching the status sees, operator lag included);
- **start -> held** inside a pod: the sidecar process's start (``/proc/<pid>/stat``
  of the container's first process, found by cgroup) to the claim's
  ``claimedAt`` in etcd; and pod creation (``kubectl apply``) to ``claimedAt``. The
  sidecars run at ``JOBLEASE_LOG_LEVEL=DEBUG``: each one's "start timeline" line
  (``kubectl logs``) breaks its start down step by step as bench/sidecar_start.py
  does on the host, and the time from the process's start to the top of the Go
  ``main`` (the line's ``ts`` minus its total) is "before main". The starts
  alternate ``--start-variants``: ``plain`` (the example's sidecar), ``hint``
  (``JOBLEASE_LEASE_TTL``, as injection sets it), ``fqdn`` (the hint, and the etcd
  endpoint as an absolute name, ``...svc.cluster.local.``: no search-list lookups
  under the pod's ``ndots:5``), ``cpu100m`` (the hint, and a CPU request of 100m
  instead of the example's 5m). After each start, the worker container (curl) times
  the endpoint's DNS lookup and TCP connect with each name (glibc's resolver, the
  pod's resolv.conf: the sidecar's own Go resolver follows the same search rules);
- **pod deletion -> next claim** and **pod kill -> next claim**: a chain of pods
  on one JobLease; pod *i+1* starts and waits ("held by another owner"), pod *i*
  (the holder) is deleted (``kubectl delete pod``: the sidecar releases on
  SIGTERM) or SIGKILLed from the node (sidecar then worker, by cgroup: nothing
  releases, the etcd lease expires); time = the next holder's ``claimedAt`` minus
  the moment of the loss (one kernel clock: every pod runs on this machine);
- the sidecar container's **memory** while it holds the lease: cgroup v1
  ``memory.usage_in_bytes`` and the working set (usage - ``total_inactive_file``,
  what the kubelet reports as the container's memory);
- **burst**: ``--burst-pods`` (100) worker pods created by one ``kubectl apply`` of a
  List, each claiming a JobLease of its own, until every one has held and finished
  (or ended otherwise, or the deadline passes): creation (kubectl's per-object
  ``created`` line) -> ``claimedAt`` and -> ``completedAt`` per pod (read from
  ``joblease watch``), the apply to the last claim and to the last completion,
  then the namespace's deletion until the node is back as before (no pod cgroup
  and no etcd job of the burst left; see :func:`measure_burst`);
- **image sizes**: the image archives in the cache and ``ctr images ls``.

The cluster: by default one of its own (``Cluster("bench")``, as ``hack/cluster up
--name bench`` starts it; torn down at the end unless ``--keep``); ``--name NAME``
reuses a running ``hack/cluster up --name NAME`` one (node access kept). The chart is
installed as release ``joblease`` in ``joblease-system`` unless it is there already.

    python bench/e2e.py [--name NAME] [--keep] [--trials 10] [--completions 3]
                        [--starts 5] [--start-variants plain,hint,fqdn,cpu100m]
                        [--kill-ttl 3] [--kill-backoff-max 0.5|default]
                        [--burst-pods 100] [--burst-ttl 30] [--burst-deadline 600]
                        [--only completions,starts,delete,kill,burst,images]
                        [--json bench/results/e2e.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct  # noqa: E402
from bench.sidecar_start import step_times, timeline  # noqa: E402
from tests.support.binaries import cache_dir, ctr_binary, kubectl_binary  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    Cluster,
    container_cgroup,
    container_pids,
    pod_cgroups,
    process_start_wall_time,
)
from tests.support.cluster.settings import NODE_NAME  # noqa: E402
from tests.support.release import Release  # noqa: E402
from tests.support.worker_pods import (  # noqa: E402
    SIDECAR,
    config_map,
    container_id,
    get_pod,
    joblease,
    joblease_cli,
    lose,
    operator_pod,
    owner_of,
    pod_doc,
    start_holder,
    wait_claimed,
    wait_log,
    wait_status,
    wait_worker_running,
    worker_job,
    worker_pod,
)

MIB = 1024 * 1024
PARTS = ("completions", "starts", "delete", "kill", "burst", "images")


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50": round(pct(values, 0.5), 3),
            "p99": round(pct(values, 0.99), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "mean": round(statistics.fmean(values), 3)}


def register(cluster: Cluster, ns: str, name: str, ttl: int, max_attempts: int = 0) -> None:
    cluster.apply(joblease(ns, name, ttl=ttl, max_attempts=max_attempts))
    wait_status(cluster, ns, name, "registration",
                lambda s: s.get("phase") == "Pending" and int(s.get("etcdRevision") or 0) > 0)


def sidecar_memory(cluster: Cluster, pod: dict[str, Any]) -> dict[str, float]:
    """The sidecar container's memory cgroup (v1): usage and working set, MiB."""
    cg = container_cgroup(cluster, container_id(pod, SIDECAR), "memory")
    usage = int((cg / "memory.usage_in_bytes").read_text())
    stat = dict(line.split() for line in (cg / "memory.stat").read_text().splitlines())
    inactive = int(stat.get("total_inactive_file", 0))
    return {"usage_mib": usage / MIB, "working_set_mib": max(0, usage - inactive) / MIB,
            "rss_mib": int(stat.get("total_rss", 0)) / MIB}


def measure_completions(cluster: Cluster, ns: str, n: int) -> list[float]:
    seconds = []
    for i in range(n):
        name = f"complete-{i}"
        register(cluster, ns, name, ttl=30, max_attempts=3)
        began = time.time()
        cluster.apply(worker_job(ns, name, name))
        deadline = time.monotonic() + 300
        while joblease_status_phase(cluster, ns, name) != "Completed":
            if time.monotonic() > deadline:
                raise RuntimeError(f"{name} not Completed after 300 s")
            time.sleep(0.2)  # the poll interval bounds the resolution (0.2 s)
        seconds.append(time.time() - began)
        print(f"  apply -> Completed #{i}: {seconds[-1]:.2f}s", file=sys.stderr)
    return seconds


def joblease_status_phase(cluster: Cluster, ns: str, name: str) -> str:
    r = cluster.kubectl("get", "joblease", name, "-n", ns, "-o",
                        "jsonpath={.status.phase}", timeout=30)
    return r.stdout.strip()


#: The example's etcd endpoint (the chart's: fewer dots than ndots:5, so the pod's
#: resolver tries the search list first) and the same as an absolute name.
ETCD_HOST = "joblease-etcd.joblease-system.svc"
ETCD_FQDN = ETCD_HOST + ".cluster.local."
TTL_S = 30
#: The sidecar's settings per start variant (see the module docstring).
START_VARIANTS: dict[str, dict[str, str]] = {
    "plain": {"JOBLEASE_LOG_LEVEL": "DEBUG"},
    "hint": {"JOBLEASE_LOG_LEVEL": "DEBUG", "JOBLEASE_LEASE_TTL": str(TTL_S)},
    "fqdn": {"JOBLEASE_LOG_LEVEL": "DEBUG", "JOBLEASE_LEASE_TTL": str(TTL_S),
             "JOBLEASE_ETCD_ENDPOINTS": f"https://{ETCD_FQDN}:2379",
             "JOBLEASE_ETCD_SERVER_NAME": ETCD_HOST},
    "cpu100m": {"JOBLEASE_LOG_LEVEL": "DEBUG", "JOBLEASE_LEASE_TTL": str(TTL_S)},
}
#: A variant's CPU request for the sidecar instead of the example's 5m (cpu.shares 5,
#: the kernel's weight of the container against every other one on the node).
START_CPU = {"cpu100m": "100m"}


def start_pod(cluster: Cluster, ns: str, job: str, pod: str, variant: str) -> dict[str, Any]:
    """:func:`start_holder` with the variant's sidecar settings (and CPU request)."""
    if variant not in START_CPU:
        return start_holder(cluster, ns, job, pod, sidecar_env=START_VARIANTS[variant])
    doc = pod_doc(ns, pod, job, sidecar_env=START_VARIANTS[variant])
    (sidecar,) = doc["spec"]["initContainers"]
    sidecar["resources"]["requests"]["cpu"] = START_CPU[variant]
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List",
                              "items": [config_map(ns), doc]}))
    wait_log(cluster, ns, pod, SIDECAR, '"lease held"')
    obj = get_pod(cluster, ns, pod)
    wait_status(cluster, ns, job, f"claim by {pod}",
                lambda st: st.get("holderIdentity") == owner_of(obj))
    return obj


class TaskEvents:
    """containerd's container and task events on the node (``ctr events``, each with
    its publication time, ns): when the sidecar's container was created, its task
    created (``runc create``: the init process forked and set the container up, then
    waits) and started (``runc start``: the init process execs the binary)."""

    TOPICS = ("/containers/create", "/tasks/create", "/tasks/start")

    def __init__(self, cluster: Cluster) -> None:
        self._seen: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()
        self._proc = subprocess.Popen(
            [ctr_binary(), "--address", str(cluster.containerd_socket), "-n", "k8s.io",
             "events"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True, name="ctr-events").start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            # 2026-12-03 14:41:33.969119123 +0000 UTC k8s.io /tasks/create {...}
            fields = line.split(" ", 6)
            if len(fields) < 7 or fields[5] not in self.TOPICS or fields[2] != "+0000":
                continue
            try:
                body = json.loads(fields[6])
            except ValueError:
                continue
            whole, _, frac = fields[1].partition(".")
            at = (datetime.strptime(f"{fields[0]} {whole}", "%Y-%m-%d %H:%M:%S")
                  .replace(tzinfo=UTC).timestamp() + float("0." + (frac or "0")))
            cid = str(body.get("container_id") or body.get("id") or "")
            with self._lock:
                self._seen.setdefault((fields[5], cid), at)

    def at(self, topic: str, container: str, timeout: float = 5) -> float | None:
        deadline = time.monotonic() + timeout
        while True:
            with self._lock:
                if (topic, container) in self._seen:
                    return self._seen[(topic, container)]
            if time.monotonic() > deadline:
                return None
            time.sleep(0.05)  # the reader thread fills it in; the deadline bounds the wait

    def close(self) -> None:
        self._proc.terminate()
        self._proc.wait(10)


def schedstat_ms(pid: int) -> tuple[float, float]:
    """The process's time on a CPU and waiting on a run queue since it started, ms
    (``/proc/<pid>/task/*/schedstat``, every thread alive now)."""
    on_cpu = waited = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            run, wait, _ = (task / "schedstat").read_text().split()
            on_cpu, waited = on_cpu + int(run), waited + int(wait)
    return on_cpu / 1e6, waited / 1e6


def curl_times(cluster: Cluster, ns: str, pod: str, host: str) -> dict[str, float] | None:
    """The worker container's curl to ``host``:2379: DNS lookup and TCP connect, ms
    (plain HTTP to the TLS port: the exchange fails after the connect, which is all
    that is timed). None if curl printed no times."""
    r = cluster.kubectl("exec", pod, "-n", ns, "-c", "worker", "--", "curl", "-s",
                        "-o", "/dev/null", "--max-time", "5", "-w",
                        "%{time_namelookup} %{time_connect}", f"http://{host}:2379/",
                        timeout=30)
    try:
        lookup, connect = (float(x) * 1000 for x in r.stdout.split())
    except ValueError:
        return None
    return {"dns_ms": round(lookup, 2), "tcp_ms": round(connect - lookup, 2)}


def measure_starts(cluster: Cluster, ns: str, n: int, variants: list[str]
                   ) -> dict[str, dict[str, list[float]]]:
    """Single pods on fresh JobLeases, ``n`` per variant, the variants alternating:
    process start -> held, apply -> held, the start timeline's steps, memory; and the
    DNS lookup of the etcd endpoint from each pod. Per variant, per measure, values."""
    out: dict[str, dict[str, list[float]]] = {v: {} for v in variants}
    events = TaskEvents(cluster)
    try:
        _measure_starts(cluster, ns, n, variants, out, events)
    finally:
        events.close()
    return out


def _measure_starts(cluster: Cluster, ns: str, n: int, variants: list[str],
                    out: dict[str, dict[str, list[float]]], events: TaskEvents) -> None:
    for i in range(n):
        for variant in variants:
            got = out[variant]

            def add(key: str, value: float, got: dict[str, list[float]] = got) -> None:
                got.setdefault(key, []).append(round(value, 4))

            name = f"start-{variant}-{i}"
            register(cluster, ns, name, ttl=TTL_S)
            applied = time.time()
            pod = start_pod(cluster, ns, name, name, variant)
            state = joblease_cli(cluster, ns, name, "get", name)
            claimed = float(state["holder"]["claimedAt"])
            # the container's first process is the sidecar binary itself (the Go
            # sidecar's image is that binary alone): its start is the earliest one. Its
            # /proc start time is when runc's init forked, before it set the container
            # up and exec'd the binary (10 ms resolution)
            cid = container_id(pod, SIDECAR)
            first = min(container_pids(cluster, cid))
            started = process_start_wall_time(first)
            add("process_start_to_held", claimed - started)
            on_cpu, waited = schedstat_ms(first)
            add("sidecar_on_cpu_ms", on_cpu)
            add("sidecar_runqueue_wait_ms", waited)
            shares = container_cgroup(cluster, cid, "cpu") / "cpu.shares"
            add("sidecar_cpu_shares", float(shares.read_text()))
            created, task_created, task_started = (
                events.at(topic, cid) for topic in TaskEvents.TOPICS)
            add("apply_to_held", claimed - applied)
            logs = cluster.kubectl("logs", name, "-n", ns, "-c", SIDECAR, timeout=30).stdout
            tl = timeline(logs)
            if tl is not None:
                rec = next(json.loads(line) for line in logs.splitlines()
                           if '"start timeline"' in line)
                logged = datetime.fromisoformat(rec["ts"].replace("Z", "+00:00")).timestamp()
                main_at = logged - tl["total"] / 1000  # the top of main (ts: 1 ms)
                add("before_main_ms", (main_at - started) * 1000)
                if created and task_created and task_started:
                    add("container_created_to_task_created_ms", (task_created - created) * 1000)
                    add("task_created_to_task_started_ms", (task_started - task_created) * 1000)
                    add("task_started_to_main_ms", (main_at - task_started) * 1000)
                    add("process_start_to_task_created_ms", (task_created - started) * 1000)
                add("main_to_held_ms", (claimed - main_at) * 1000)
                add("timeline_total_ms", tl["total"])
                for step, ms in step_times(tl).items():
                    add(f"step {step} ms", ms)
            wait_worker_running(cluster, ns, name)  # curl runs in the worker container
            for label, host in (("short", ETCD_HOST), ("fqdn", ETCD_FQDN)):
                times = curl_times(cluster, ns, name, host)
                for key, value in (times or {}).items():
                    add(f"curl {label} {key}", value)
            time.sleep(5)  # let the held sidecar settle before sampling its memory
            for key, value in sidecar_memory(cluster, pod).items():
                add(key, value)
            steps = (" ".join(f"{k[5:-3]}={v[-1]:.1f}" for k, v in got.items()
                              if k.startswith("step ")) if tl else "no timeline")
            print(f"  start {variant} #{i}: process->held "
                  f"{got['process_start_to_held'][-1]:.3f}s, apply->held "
                  f"{got['apply_to_held'][-1]:.2f}s, before main "
                  f"{got.get('before_main_ms', [float('nan')])[-1]:.1f} ms (task started -> "
                  f"main {got.get('task_started_to_main_ms', [float('nan')])[-1]:.1f}), "
                  f"runqueue wait {waited:.1f} ms, {steps}",
                  file=sys.stderr)
            cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")


def measure_chain(cluster: Cluster, ns: str, how: str, trials: int, ttl: int,
                  env: dict[str, str] | None) -> dict[str, Any]:
    """One JobLease, pods ``<how>-0..trials``: each loss hands the job to the next pod."""
    job = f"chain-{how}"
    register(cluster, ns, job, ttl=ttl)
    holder = start_holder(cluster, ns, job, f"{how}-0", sidecar_env=env)
    seconds: list[float] = []
    for i in range(1, trials + 1):
        name = f"{how}-{i}"
        cluster.apply(worker_pod(ns, name, job, sidecar_env=env))
        wait_log(cluster, ns, name, SIDECAR, "held by another owner")
        waiter = get_pod(cluster, ns, name)
        before = joblease_cli(cluster, ns, name, "get", job)
        assert before["holder"]["owner"] == owner_of(holder), before
        lost_at = lose(cluster, ns, holder, how)
        after = wait_claimed(cluster, ns, job, waiter)
        b, a = before["holder"], after["holder"]
        assert a["generation"] == b["generation"] + 1 and a["token"] > b["token"], (b, a)
        seconds.append(float(a["claimedAt"]) - lost_at)
        print(f"  {how} #{i}: next claim {seconds[-1]:.2f}s (TTL {ttl}s, generation "
              f"{a['generation']}, token {a['token']})", file=sys.stderr)
        if how == "kill":  # the killed pod is Failed; remove it
            cluster.kubectl("delete", "pod", holder["metadata"]["name"], "-n", ns,
                            "--wait=false")
        holder = get_pod(cluster, ns, name)
    cluster.kubectl("delete", "pod", holder["metadata"]["name"], "-n", ns, "--wait=false")
    return {"ttl": ttl, "sidecar_env": env or {}, "seconds": [round(s, 3) for s in seconds],
            **summary(seconds)}


class BurstError(RuntimeError):
    """The burst cannot start as asked (nothing was created): the message says why."""


def node_pod_room(cluster: Cluster) -> tuple[int, int]:
    """``(capacity, active)``: the node's allocatable pods and its pods that still
    count against it (not Succeeded or Failed, any namespace)."""
    node = json.loads(cluster.kubectl("get", "node", NODE_NAME, "-o", "json",
                                      check=True).stdout)
    pods = json.loads(cluster.kubectl(
        "get", "pods", "-A", "-o", "json", "--field-selector",
        f"spec.nodeName={NODE_NAME},status.phase!=Succeeded,status.phase!=Failed",
        check=True, timeout=60).stdout)["items"]
    return int(node["status"]["allocatable"]["pods"]), len(pods)


def wait_no_active_pods(cluster: Cluster, ns: str, timeout: float = 300) -> None:
    """Until the earlier parts' pods in ``ns`` are gone or terminal (they were deleted
    with --wait=false), so they do not take the burst's room on the node."""
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.kubectl("get", "pods", "-n", ns, "-o", "name", "--field-selector",
                            "status.phase!=Succeeded,status.phase!=Failed", timeout=60)
        if r.returncode == 0 and not r.stdout.strip():
            return
        if time.monotonic() > deadline:
            raise BurstError(f"pods of the earlier parts still active after {timeout} s: "
                             f"{r.stdout.split()}")
        time.sleep(1)  # poll interval; the deadline bounds the wait


def apply_timed(cluster: Cluster, manifest: str, timeout: float) -> dict[str, float]:
    """``kubectl apply`` of a List, with the moment each object's creation returned:
    kubectl prints ``<kind>/<name> created`` per object as it goes (its stdout is
    unbuffered), so each line's arrival time is that pod's creation, to the ms."""
    created: dict[str, float] = {}
    # stderr to a file: warnings while stdout is read line by line cannot fill a pipe
    with tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen([kubectl_binary(), "--kubeconfig", str(cluster.kubeconfig),
                                 "apply", "--request-timeout=120s", "-f", "-"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                                text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(manifest)
        proc.stdin.close()
        for line in proc.stdout:  # e.g. "pod/burst-007 created"
            fields = line.split()
            if len(fields) >= 2 and fields[0].startswith("pod/"):
                created[fields[0].removeprefix("pod/")] = time.time()
        if proc.wait(timeout=timeout) != 0:
            err.seek(0)
            raise RuntimeError(f"kubectl apply of the burst failed: {err.read()[-3000:]}")
    return created


class JobWatch:
    """``joblease watch -n NS`` in the operator pod (whose image has the CLI and whose
    environment has etcd's endpoint and TLS files), read on a thread: every job's
    state at every revision, so a claim that a completion follows within
    milliseconds (which deletes the holder record) is still seen."""

    def __init__(self, cluster: Cluster, ns: str) -> None:
        op_ns, op_pod = operator_pod(cluster)
        self.states: queue.Queue[dict[str, Any]] = queue.Queue()
        self._err = tempfile.TemporaryFile("w+")
        self._proc = subprocess.Popen(
            [kubectl_binary(), "--kubeconfig", str(cluster.kubeconfig), "exec", op_pod,
             "-n", op_ns, "-c", "operator", "--", "joblease", "watch", "-n", ns],
            stdout=subprocess.PIPE, stderr=self._err, text=True)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            if line.startswith("{"):
                self.states.put(json.loads(line))

    def alive(self) -> bool:
        return self._proc.poll() is None

    def errors(self) -> str:
        self._err.seek(0)
        return self._err.read()[-3000:]

    def close(self) -> None:
        self._proc.terminate()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        self._err.close()


def measure_burst(cluster: Cluster, release: Release, n: int, ttl: int,
                  deadline_s: float) -> dict[str, Any]:
    """``n`` worker pods of the example created at once (one ``kubectl apply`` of a
    List), each claiming a JobLease of its own, in a namespace of their own, until
    every one has held its job and finished (or the deadline passes).

    Each its own job: issue 25 asks for the time "until all hold or finish", i.e.
    ``n`` claims that all succeed; pods of one Job competing for one JobLease would
    measure one claim and ``n - 1`` refusals (the chain parts cover handing one job
    on). The pods are the example's as they are: the worker completes right after
    its claim (no demo hold file: ``n`` idle shells polling it with ``sleep 0.1``
    would load the node with forks that no real worker makes). A completion
    deletes the holder record, so the claims are read from ``joblease watch``
    (every revision), not from polls of the current state.
    """
    ns = f"bench-burst-{os.getpid()}"
    pods = [f"burst-{i:03d}" for i in range(n)]
    capacity, active = node_pod_room(cluster)
    if active + n > capacity:
        raise BurstError(f"--burst-pods {n}: the node allows {capacity} pods and "
                         f"{active} are active; at most {capacity - active} fit "
                         "(tests/support/cluster/settings.py MAX_PODS)")
    out: dict[str, Any] = {"pods": n, "ttl": ttl, "node_capacity": capacity,
                           "node_active_before": active}
    cluster.kubectl("create", "namespace", ns, check=True)
    watch: JobWatch | None = None
    try:
        deadline = time.monotonic() + 120
        while cluster.kubectl("get", "serviceaccount", "default", "-n", ns).returncode != 0:
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.5)  # the controller creates it; the deadline bounds the wait
        release.opt_in(ns)
        jobleases = [json.loads(joblease(ns, name, ttl=ttl, max_attempts=0)) for name in pods]
        began = time.monotonic()
        cluster.kubectl("apply", "-f", "-", check=True, timeout=300, input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": jobleases}))
        wait_registered(cluster, ns, set(pods))
        out["register_all_s"] = round(time.monotonic() - began, 1)
        watch = JobWatch(cluster, ns)
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": [
            config_map(ns), *(pod_doc(ns, name, name, hold=False) for name in pods)]})
        applied = time.time()
        created = apply_timed(cluster, manifest, timeout=600)
        out["apply_s"] = round(time.time() - applied, 3)
        if set(created) != set(pods):
            raise RuntimeError(f"kubectl apply reported {len(created)} of {n} pods created")
        print(f"  {n} pods created in {out['apply_s']:.1f}s", file=sys.stderr)
        held, completed, phases = wait_burst(cluster, ns, watch, pods, applied + deadline_s)
        out["load_at_last_completion"] = loadavg()
        all_ended, final = wait_pods_ended(cluster, ns, n, applied + deadline_s)
        phases.update({p["metadata"]["name"]: p["status"].get("phase", "?") for p in final})
        # the node's part and the sidecar's: creation -> the sidecar container's start
        # (the kubelet's startedAt, whole seconds) and that start -> the claim
        started = {p["metadata"]["name"]: sidecar_started(p) for p in final}
        start_of = {p: t for p, (t, _) in started.items() if t is not None}
        node_part = [start_of[p] - created[p] for p in held if p in start_of]
        sidecar_part = [held[p] - start_of[p] for p in held if p in start_of]
        # the slowest sidecars' own account of their start (kept until the cleanup)
        slowest = sorted((p for p in held if p in start_of),
                         key=lambda p: held[p] - start_of[p], reverse=True)[:3]
        out["slowest_sidecars"] = [{
            "pod": p, "started_to_held_s": round(held[p] - start_of[p], 1),
            "creation_to_started_s": round(start_of[p] - created[p], 1),
            "log": cluster.kubectl("logs", p, "-n", ns, "-c", SIDECAR, "--tail=30",
                                   timeout=60).stdout.splitlines()} for p in slowest]
        # every pod's figures, for a distribution beyond the summaries
        out["per_pod_s"] = {p: {"held": round(held[p] - created[p], 2),
                                "sidecar_started": (round(start_of[p] - created[p], 2)
                                                    if p in start_of else None)}
                            for p in sorted(held)}
        out.update({
            "held": len(held), "completed": len(completed),
            "pods_succeeded": sum(1 for p in phases.values() if p == "Succeeded"),
            "apply_to_all_pods_ended_s": (round(all_ended - applied, 1)
                                          if all_ended is not None else None),
            "sidecar_restarts": sum(r for _, r in started.values()),
            "creation_to_sidecar_started_s": summary(node_part) if node_part else None,
            "sidecar_started_to_held_s": summary(sidecar_part) if sidecar_part else None,
            # never held within the deadline, whether the pod finished or not
            "never_held": {p: phases.get(p, "?") for p in pods if p not in held},
            "finished_without_completing": {p: phases[p] for p in pods if p not in completed
                                            and phases.get(p) in ("Succeeded", "Failed")},
            "apply_to_all_held_s": (round(max(held.values()) - applied, 3)
                                    if len(held) == n else None),
            "apply_to_all_completed_s": (round(max(completed.values()) - applied, 3)
                                         if len(completed) == n else None),
            "creation_to_held_s": (summary([held[p] - created[p] for p in held])
                                   if held else None),
            "creation_to_completed_s": (summary([completed[p] - created[p]
                                                 for p in completed])
                                        if completed else None)})
        print(f"  held {len(held)}/{n}, completed {len(completed)}/{n}, pods Succeeded "
              f"{out['pods_succeeded']}/{n}; all held {out['apply_to_all_held_s']}s, all "
              f"completed {out['apply_to_all_completed_s']}s, all pods ended "
              f"{out['apply_to_all_pods_ended_s']}s after the apply", file=sys.stderr)
    finally:
        if watch is not None:
            if not watch.alive():
                out["watch_errors"] = watch.errors()
            watch.close()
        out["cleanup"] = clean_burst(cluster, ns)
    return out


def wait_pods_ended(cluster: Cluster, ns: str, n: int, deadline: float
                    ) -> tuple[float | None, list[dict[str, Any]]]:
    """Until all ``n`` pods of ``ns`` are Succeeded or Failed (the kubelet reports a
    pod's end after its worker exited and it stopped the sidecar: later than the
    completion in etcd), or ``deadline`` (wall clock). Returns the moment the last
    one was seen ended (None if not all did; polled every 2 s) and the pods."""
    items: list[dict[str, Any]] = []
    while True:
        r = cluster.kubectl("get", "pods", "-n", ns, "-o", "json", timeout=60)
        if r.returncode == 0:
            items = json.loads(r.stdout)["items"]
            ended = [p for p in items if p["status"].get("phase") in ("Succeeded", "Failed")]
            if len(ended) == n:
                return time.time(), items
        if time.time() > deadline:
            return None, items
        time.sleep(2)  # poll interval; the deadline bounds the wait


def sidecar_started(pod: dict[str, Any]) -> tuple[float | None, int]:
    """The sidecar container's ``startedAt`` (the kubelet's record: whole seconds) and
    its restart count, from the pod's status, running or terminated."""
    for status in pod["status"].get("initContainerStatuses", []):
        if status["name"] == SIDECAR:
            state = status.get("state") or {}
            started = (state.get("running") or state.get("terminated") or {}).get("startedAt")
            when = (datetime.fromisoformat(started.replace("Z", "+00:00")).timestamp()
                    if started else None)
            return when, int(status.get("restartCount") or 0)
    return None, 0


def wait_registered(cluster: Cluster, ns: str, names: set[str], timeout: float = 600) -> None:
    """Until the operator registered every JobLease of ``names`` in etcd."""
    deadline = time.monotonic() + timeout
    while True:
        r = cluster.kubectl("get", "jobleases", "-n", ns, "-o", "json", timeout=60)
        items = json.loads(r.stdout)["items"] if r.returncode == 0 else []
        done = {i["metadata"]["name"] for i in items
                if (i.get("status") or {}).get("phase") == "Pending"
                and int((i.get("status") or {}).get("etcdRevision") or 0) > 0}
        if names <= done:
            return
        assert time.monotonic() < deadline, f"not registered: {sorted(names - done)[:10]}"
        time.sleep(1)  # poll interval; the deadline bounds the wait


def wait_burst(cluster: Cluster, ns: str, watch: JobWatch, pods: list[str],
               deadline: float) -> tuple[dict[str, float], dict[str, float], dict[str, str]]:
    """Follow the watch until every pod's job has been held by it and completed, or
    its pod ended otherwise (Failed, or Succeeded without a completion), or until
    ``deadline`` (wall clock). Returns, by pod, the holder record's ``claimedAt``
    (its own claim), the result record's ``completedAt``, and the pods' last phases."""
    held: dict[str, float] = {}
    completed: dict[str, float] = {}
    phases: dict[str, str] = {}
    wanted = set(pods)
    next_pods = 0.0
    while True:
        try:
            state = watch.states.get(timeout=1)
        except queue.Empty:
            state = None
        if state is not None and state.get("name") in wanted:
            name = state["name"]
            holder = state.get("holder") or {}
            if name not in held and str(holder.get("owner", "")).startswith(f"{name}/"):
                held[name] = float(holder["claimedAt"])
            result = state.get("result") or {}
            if name not in completed and result.get("completedAt") is not None:
                completed[name] = float(result["completedAt"])
        if time.monotonic() >= next_pods:  # the pods' phases, every 5 s
            next_pods = time.monotonic() + 5
            r = cluster.kubectl("get", "pods", "-n", ns, "-o", "json", timeout=60)
            if r.returncode == 0:
                phases = {p["metadata"]["name"]: p["status"].get("phase", "?")
                          for p in json.loads(r.stdout)["items"]}
        # a pod that ended counts once the watch has caught up (its claim may be queued)
        settled = [p for p in pods if p in completed
                   or (phases.get(p) in ("Succeeded", "Failed") and watch.states.empty())]
        if len(settled) == len(pods) or time.time() > deadline:
            return held, completed, phases
        if not watch.alive() and watch.states.empty():
            raise RuntimeError(f"joblease watch ended: {watch.errors()}")


def clean_burst(cluster: Cluster, ns: str, timeout: float = 600) -> dict[str, Any]:
    """Delete the burst's namespace and check the node is as before: the namespace
    gone (its pods with it: the sidecars release on SIGTERM; the JobLeases'
    finalizers wait for their etcd keys to go), no pod cgroup of it left, no job of
    it left in etcd, and the node's active pods (back to the count before)."""
    began = time.monotonic()
    uids = set()
    r = cluster.kubectl("get", "pods", "-n", ns, "-o", "json", timeout=60)
    if r.returncode == 0:
        uids = {p["metadata"]["uid"] for p in json.loads(r.stdout)["items"]}
    cluster.kubectl("delete", "namespace", ns, "--wait=false", timeout=60)
    gone = None
    while time.monotonic() - began < timeout:
        if cluster.kubectl("get", "namespace", ns, timeout=30).returncode != 0:
            gone = round(time.monotonic() - began, 1)
            break
        time.sleep(1)  # poll interval; the deadline bounds the wait
    # the kubelet removes a pod's cgroups in its housekeeping, after the API object
    cgroups_left = [d for uid in uids for d in pod_cgroups(cluster, uid)]
    settle = time.monotonic() + 60
    while cgroups_left and time.monotonic() < settle:
        time.sleep(1)  # poll interval; the deadline bounds the wait
        cgroups_left = [d for uid in uids for d in pod_cgroups(cluster, uid)]
    # the JobLeases' finalizers waited for their keys; none may be left in etcd
    any_pod = operator_pod(cluster)[1]
    jobs_left = joblease_cli(cluster, ns, any_pod, "list")
    out = {"namespace_gone_s": gone, "pod_cgroups_left": len(cgroups_left),
           "jobs_left_in_etcd": len(jobs_left),
           "node_active_after": node_pod_room(cluster)[1]}
    print(f"  cleanup: namespace gone after {gone}s, pod cgroups left "
          f"{len(cgroups_left)}, jobs left in etcd {len(jobs_left)}, active pods on "
          f"the node {out['node_active_after']}", file=sys.stderr)
    return out


def image_sizes(cluster: Cluster) -> dict[str, Any]:
    index = json.loads((cache_dir() / "images" / "index.json").read_text())
    archives = {e["ref"]: round(Path(e["archive"]).stat().st_size / MIB, 1) for e in index}
    listed = cluster.ctr("images", "ls", check=False).stdout.splitlines()
    ctr: dict[str, str] = {}
    for line in listed[1:]:
        fields = line.split()
        if fields and not fields[0].startswith("sha256:"):
            # REF TYPE DIGEST SIZE(value unit) PLATFORMS LABELS
            ctr[fields[0]] = " ".join(fields[3:5])
    return {"archive_mib": archives, "ctr_images_ls": ctr}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", help="reuse the running `hack/cluster up --name NAME`")
    parser.add_argument("--keep", action="store_true", help="leave the cluster running")
    parser.add_argument("--trials", type=int, default=10, help="deletions and kills each")
    parser.add_argument("--completions", type=int, default=3)
    parser.add_argument("--starts", type=int, default=5, help="starts per variant")
    parser.add_argument("--start-variants", default="plain,hint",
                        help=f"alternated start by start, of {','.join(START_VARIANTS)}")
    parser.add_argument("--delete-ttl", type=int, default=60)
    parser.add_argument("--kill-ttl", type=int, default=3)
    parser.add_argument("--kill-backoff-max", default="default",
                        help="JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX of the kill chain's pods "
                             "('default': the sidecar's own, 5 s)")
    parser.add_argument("--burst-pods", type=int, default=100,
                        help="worker pods created at once, each on a JobLease of its own")
    parser.add_argument("--burst-ttl", type=int, default=30)
    parser.add_argument("--burst-deadline", type=float, default=600,
                        help="seconds after the apply by which every burst pod must hold")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "e2e.json")
    parser.add_argument("--only", default=",".join(PARTS),
                        help="comma-separated parts to run")
    args = parser.parse_args()
    parts = set(args.only.split(","))
    if parts - set(PARTS):
        parser.error(f"--only: unknown parts {sorted(parts - set(PARTS))}; "
                     f"choose from {','.join(PARTS)}")
    variants = args.start_variants.split(",")
    if not variants or set(variants) - set(START_VARIANTS):
        parser.error(f"--start-variants: unknown {sorted(set(variants) - set(START_VARIANTS))}; "
                     f"choose from {','.join(START_VARIANTS)}")
    if not 1 <= args.burst_pods <= 999:  # pod names burst-000..burst-998
        parser.error(f"--burst-pods {args.burst_pods}: 1 to 999")
    if args.burst_deadline <= 0 or args.burst_ttl <= 0:
        parser.error("--burst-deadline and --burst-ttl must be positive")
    if os.environ.get("JOBLEASE_TEST_KUBECONFIG"):
        print("bench/e2e.py needs node access (cgroups): unset JOBLEASE_TEST_KUBECONFIG "
              "and use --name", file=sys.stderr)
        return 2
    cluster = Cluster(args.name or "bench", die_with_parent=not args.keep)
    own = args.name is None
    if own:
        cluster.up()
        print(f"cluster up in {cluster.startup_seconds}s", file=sys.stderr)
    elif not cluster.kubeconfig.exists():
        print(f"no running cluster {args.name}: hack/cluster up --name {args.name}",
              file=sys.stderr)
        return 2
    results: dict[str, Any] = {"load_before": loadavg()}
    try:
        helm_home = Path(os.environ.get("TMPDIR", "/tmp")) / f"bench-e2e-helm-{os.getpid()}"
        release = Release(cluster, "joblease-system", helm_home, name="joblease")
        if cluster.kubectl("get", "deployment", release.fullname, "-n",
                           "joblease-system").returncode != 0:
            cluster.kubectl("create", "namespace", "joblease-system")
            began = time.monotonic()
            release.install()
            results["helm_install_to_ready_s"] = round(time.monotonic() - began, 1)
        ns = f"bench-e2e-{os.getpid()}"
        cluster.kubectl("create", "namespace", ns, check=True)
        deadline = time.monotonic() + 120
        while cluster.kubectl("get", "serviceaccount", "default", "-n", ns).returncode != 0:
            assert time.monotonic() < deadline, "no default ServiceAccount"
            time.sleep(0.5)  # the controller creates it; the deadline bounds the wait
        release.opt_in(ns)
        if "completions" in parts:
            print("apply -> Completed", file=sys.stderr)
            results["apply_to_completed_s"] = summary(measure_completions(cluster, ns,
                                                                          args.completions))
        if "starts" in parts:
            print("start -> held, memory", file=sys.stderr)
            starts = measure_starts(cluster, ns, args.starts, variants)
            results["start"] = {variant: {k: summary(v) for k, v in got.items()}
                                for variant, got in starts.items()}
        if "delete" in parts:
            print("pod deletion -> next claim", file=sys.stderr)
            results["delete"] = measure_chain(cluster, ns, "delete", args.trials,
                                              args.delete_ttl, None)
        if "kill" in parts:
            print("pod kill -> next claim", file=sys.stderr)
            env = (None if args.kill_backoff_max == "default"
                   else {"JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX": args.kill_backoff_max})
            results["kill"] = measure_chain(cluster, ns, "kill", args.trials, args.kill_ttl,
                                            env)
        if "burst" in parts:
            print(f"{args.burst_pods} pods at once -> all held", file=sys.stderr)
            wait_no_active_pods(cluster, ns)
            results["burst"] = measure_burst(cluster, release, args.burst_pods,
                                             args.burst_ttl, args.burst_deadline)
        if "images" in parts:
            results["images"] = image_sizes(cluster)
        results["load_after"] = loadavg()
        cluster.kubectl("delete", "namespace", ns, "--wait=false")
    finally:
        # what was measured is kept even when a later part fails
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
        print(json.dumps(results, indent=2))
        if own and not args.keep:
            cluster.down()
    return 0


if __name__ == "__main__":
    sys.exit(main())
