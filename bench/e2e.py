"""End to end on the test cluster: worker pods of examples/worker-pod.yaml, the chart's
operator and bundled etcd, real kubelet and containerd (tests/support/cluster/).

Measures (issue 18, "Measure"):

- **apply -> Completed**: ``kubectl apply`` of the example's worker Job (its JobLease
  already registered) until ``kubectl get jl`` shows ``Completed`` (polled every
  0.2 s: what a user watching the status sees, operator lag included);
- **start -> held** inside a pod: the sidecar process's start (``/proc/<pid>/stat``
  of the container's first process, found by cgroup) to the claim's
  ``claimedAt`` in etcd; and pod creation (``kubectl apply``) to ``claimedAt``;
- **pod deletion -> next claim** and **pod kill -> next claim**: a chain of pods
  on one JobLease; pod *i+1* starts and waits ("held by another owner"), pod *i*
  (the holder) is deleted (``kubectl delete pod``: the sidecar releases on
  SIGTERM) or SIGKILLed from the node (sidecar then worker, by cgroup: nothing
  releases, the etcd lease expires); time = the next holder's ``claimedAt`` minus
  the moment of the loss (one kernel clock: every pod runs on this machine);
- the sidecar container's **memory** while it holds the lease: cgroup v1
  ``memory.usage_in_bytes`` and the working set (usage - ``total_inactive_file``,
  what the kubelet reports as the container's memory);
- **image sizes**: the image archives in the cache and ``ctr images ls``.

The cluster: by default one of its own (``Cluster("bench")``, as ``hack/cluster up
--name bench`` starts it; torn down at the end unless ``--keep``); ``--name NAME``
reuses a running ``hack/cluster up --name NAME`` one (node access kept). The chart is
installed as release ``joblease`` in ``joblease-system`` unless it is there already.

    python bench/e2e.py [--name NAME] [--keep] [--trials 10] [--completions 3]
                        [--starts 5] [--kill-ttl 3] [--kill-backoff-max 0.5|default]
                        [--only completions,starts,delete,kill,images]
                        [--json bench/results/e2e.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.claims import pct  # noqa: E402
from tests.support.binaries import cache_dir  # noqa: E402
from tests.support.cluster import (  # noqa: E402
    Cluster,
    container_cgroup,
    container_pids,
    process_start_wall_time,
)
from tests.support.release import Release  # noqa: E402
from tests.support.worker_pods import (  # noqa: E402
    SIDECAR,
    container_id,
    get_pod,
    joblease,
    joblease_cli,
    lose,
    owner_of,
    start_holder,
    wait_claimed,
    wait_log,
    wait_status,
    worker_job,
    worker_pod,
)

MIB = 1024 * 1024


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


def measure_starts(cluster: Cluster, ns: str, n: int) -> dict[str, list[float]]:
    """Single pods on fresh JobLeases: process start -> held, apply -> held, memory."""
    out: dict[str, list[float]] = {"process_start_to_held": [], "apply_to_held": [],
                                   "usage_mib": [], "working_set_mib": [], "rss_mib": []}
    for i in range(n):
        name = f"start-{i}"
        register(cluster, ns, name, ttl=30)
        applied = time.time()
        pod = start_holder(cluster, ns, name, name)
        state = joblease_cli(cluster, ns, name, "get", name)
        claimed = float(state["holder"]["claimedAt"])
        first_pid = container_pids(cluster, container_id(pod, SIDECAR))[0]
        out["process_start_to_held"].append(claimed - process_start_wall_time(first_pid))
        out["apply_to_held"].append(claimed - applied)
        time.sleep(5)  # let the held sidecar settle before sampling its memory
        for key, value in sidecar_memory(cluster, pod).items():
            out[key].append(value)
        print(f"  start #{i}: process->held {out['process_start_to_held'][-1]:.2f}s, "
              f"apply->held {out['apply_to_held'][-1]:.2f}s, working set "
              f"{out['working_set_mib'][-1]:.1f} MiB", file=sys.stderr)
        cluster.kubectl("delete", "pod", name, "-n", ns, "--wait=false")
    return out


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
    parser.add_argument("--starts", type=int, default=5)
    parser.add_argument("--delete-ttl", type=int, default=60)
    parser.add_argument("--kill-ttl", type=int, default=3)
    parser.add_argument("--kill-backoff-max", default="default",
                        help="JOBLEASE_SIDECAR_CLAIM_BACKOFF_MAX of the kill chain's pods "
                             "('default': the sidecar's own, 5 s)")
    parser.add_argument("--json", type=Path, default=HERE / "results" / "e2e.json")
    parser.add_argument("--only", default="completions,starts,delete,kill,images",
                        help="comma-separated parts to run")
    args = parser.parse_args()
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
    parts = set(args.only.split(","))
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
        release.copy_worker_secret(ns)
        if "completions" in parts:
            print("apply -> Completed", file=sys.stderr)
            results["apply_to_completed_s"] = summary(measure_completions(cluster, ns,
                                                                          args.completions))
        if "starts" in parts:
            print("start -> held, memory", file=sys.stderr)
            starts = measure_starts(cluster, ns, args.starts)
            results["start"] = {k: summary(v) for k, v in starts.items()}
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
