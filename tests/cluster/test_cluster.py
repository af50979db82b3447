"""The single-node cluster itself: real kubelet, containerd, runc, CNI, kube-proxy, CoreDNS.

Every test runs real pods from the imported images (pause, CoreDNS, the curl
stand-in, the project image) with ``imagePullPolicy: Never``: nothing is
pulled. Waits are on conditions with generous deadlines (the machine is loaded).
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from tests.support.cluster import Cluster, ClusterError, image_ref

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(900)]

TOKEN_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"


def curl_image() -> str:
    return image_ref("docker.io/curlimages/curl")


def run_pod(cluster: Cluster, namespace: str, pod: dict[str, Any],
            timeout: float = 300) -> dict[str, Any]:
    """Create the pod, wait until it ended, return its final status object."""
    pod.setdefault("apiVersion", "v1")
    pod.setdefault("kind", "Pod")
    pod.setdefault("metadata", {})["namespace"] = namespace
    pod["spec"].setdefault("restartPolicy", "Never")
    cluster.apply(json.dumps(pod))
    name = pod["metadata"]["name"]
    phase = cluster.wait_pod_done(name, namespace, timeout=timeout)
    final = cluster.pod(name, namespace)
    assert final is not None
    assert phase == "Succeeded", (
        f"pod {name} ended {phase}:\n"
        + cluster.kubectl("describe", "pod", name, "-n", namespace).stdout
        + "\n" + logs(cluster, namespace, name, all_containers=True))
    return final


def logs(cluster: Cluster, namespace: str, name: str, container: str | None = None,
         all_containers: bool = False) -> str:
    args = ["logs", name, "-n", namespace]
    if container:
        args += ["-c", container]
    if all_containers:
        args += ["--all-containers", "--prefix"]
    result = cluster.kubectl(*args)
    return result.stdout + result.stderr


def started_at(status: dict[str, Any]) -> dt.datetime:
    state = status["state"]
    running_or_done = state.get("terminated") or state.get("running")
    return dt.datetime.fromisoformat(running_or_done["startedAt"].replace("Z", "+00:00"))


def test_node_ready_readyz_and_pod_logs(cluster: Cluster, namespace: str) -> None:
    node = json.loads(cluster.kubectl("get", "node", "localhost", "-o", "json",
                                      check=True).stdout)
    ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
    assert ready and ready[0]["status"] == "True"
    assert not [t for t in node["spec"].get("taints", [])
                if t["key"] == "node.kubernetes.io/not-ready"]
    readyz = cluster.kubectl("get", "--raw", "/readyz", check=True)
    assert readyz.stdout.strip() == "ok"

    run_pod(cluster, namespace, {
        "metadata": {"name": "hello"},
        "spec": {"containers": [{
            "name": "hello", "image": curl_image(), "imagePullPolicy": "Never",
            "command": ["sh", "-c", "echo hello from $(hostname)"],
        }]},
    })
    assert logs(cluster, namespace, "hello").strip() == "hello from hello"


def test_native_sidecar_gates_main_container_and_pod_succeeds(
        cluster: Cluster, namespace: str) -> None:
    # The sidecar becomes "started" only when /shared/ready exists, which it
    # creates 4 s after it started. The main container records whether it saw
    # the file at its own start.
    sidecar_script = (
        "trap 'echo sidecar got TERM; exit 0' TERM; "
        "sleep 4; touch /shared/ready; echo sidecar ready; "
        "while true; do sleep 1; done"
    )
    final = run_pod(cluster, namespace, {
        "metadata": {"name": "sidecar"},
        "spec": {
            "terminationGracePeriodSeconds": 20,
            "volumes": [{"name": "shared", "emptyDir": {}}],
            "initContainers": [{
                "name": "sidecar", "image": curl_image(), "imagePullPolicy": "Never",
                "restartPolicy": "Always",
                "command": ["sh", "-c", sidecar_script],
                "startupProbe": {"exec": {"command": ["test", "-f", "/shared/ready"]},
                                 "periodSeconds": 1, "failureThreshold": 120},
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            }],
            "containers": [{
                "name": "main", "image": curl_image(), "imagePullPolicy": "Never",
                "command": ["sh", "-c",
                            "if test -f /shared/ready; then echo main saw ready; "
                            "else echo main started before ready; fi"],
                "volumeMounts": [{"name": "shared", "mountPath": "/shared"}],
            }],
        },
    })
    assert logs(cluster, namespace, "sidecar", "main").strip() == "main saw ready"
    sidecar_status = final["status"]["initContainerStatuses"][0]
    main_status = final["status"]["containerStatuses"][0]
    # Start times (whole seconds): main started at least 3 s after the sidecar,
    # i.e. after its startup probe could first pass.
    gap = (started_at(main_status) - started_at(sidecar_status)).total_seconds()
    assert gap >= 3, f"main started {gap}s after the sidecar"
    assert main_status["state"]["terminated"]["exitCode"] == 0
    # The kubelet stopped the sidecar once the main container exited.
    assert "terminated" in sidecar_status["state"], sidecar_status
    assert "sidecar got TERM" in logs(cluster, namespace, "sidecar", "sidecar")


def test_pod_resolves_and_reaches_a_cluster_ip_service_by_name(
        cluster: Cluster, namespace: str) -> None:
    # A real server from an imported image: CoreDNS's own HTTP health endpoint
    # (answers "OK"), behind a ClusterIP Service on port 80.
    labels = {"app": "web"}
    cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List", "items": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "web", "namespace": namespace},
         "data": {"Corefile": ".:1053 {\n    health :8080\n    whoami\n}\n"}},
        {"apiVersion": "v1", "kind": "Pod",
         "metadata": {"name": "web", "namespace": namespace, "labels": labels},
         "spec": {"containers": [{
             "name": "web", "image": image_ref("registry.k8s.io/coredns/coredns"),
             "imagePullPolicy": "Never", "args": ["-conf", "/etc/web/Corefile"],
             "ports": [{"containerPort": 8080}],
             "readinessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                "periodSeconds": 1},
             "volumeMounts": [{"name": "conf", "mountPath": "/etc/web"}]}],
             "volumes": [{"name": "conf", "configMap": {"name": "web"}}]}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "web", "namespace": namespace},
         "spec": {"selector": labels, "ports": [{"port": 80, "targetPort": 8080}]}},
    ]}))
    cluster.kubectl("wait", "--for=condition=Ready", "pod/web", "-n", namespace,
                    "--timeout=300s", check=True, timeout=320)
    cluster_ip = cluster.kubectl("get", "service", "web", "-n", namespace, "-o",
                                 "jsonpath={.spec.clusterIP}", check=True).stdout.strip()
    script = (
        f"getent hosts web.{namespace}.svc.cluster.local || nslookup web.{namespace}.svc"
        ".cluster.local; "
        "curl -sS --retry 30 --retry-delay 1 --retry-all-errors --max-time 5 "
        "-w ' %{remote_ip}\\n' http://web/health"
    )
    run_pod(cluster, namespace, {
        "metadata": {"name": "client"},
        "spec": {"containers": [{"name": "client", "image": curl_image(),
                                 "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", script]}]},
    })
    out = logs(cluster, namespace, "client")
    # resolved through CoreDNS to the Service's ClusterIP, and the Service
    # (kube-proxy's DNAT) reached the pod behind it
    assert cluster_ip in out, out
    assert out.strip().endswith(f"OK {cluster_ip}"), out


def test_pod_reaches_api_server_with_projected_service_account_token(
        cluster: Cluster, namespace: str) -> None:
    script = (
        f"curl -sS --max-time 20 --cacert {TOKEN_DIR}/ca.crt "
        f"-H \"Authorization: Bearer $(cat {TOKEN_DIR}/token)\" "
        "-H 'Content-Type: application/json' -X POST "
        "-d '{\"apiVersion\":\"authentication.k8s.io/v1\",\"kind\":\"SelfSubjectReview\"}' "
        "https://kubernetes.default.svc/apis/authentication.k8s.io/v1/selfsubjectreviews"
    )
    final = run_pod(cluster, namespace, {
        "metadata": {"name": "whoami"},
        "spec": {"containers": [{"name": "whoami", "image": curl_image(),
                                 "imagePullPolicy": "Never",
                                 "command": ["sh", "-c", script]}]},
    })
    review = json.loads(logs(cluster, namespace, "whoami"))
    user = review["status"]["userInfo"]
    assert user["username"] == f"system:serviceaccount:{namespace}:default"
    # a bound, projected token (it names the pod), not a legacy Secret token
    assert user["extra"]["authentication.kubernetes.io/pod-name"] == ["whoami"]
    volumes = final["spec"]["volumes"]
    assert any("projected" in v and v["name"].startswith("kube-api-access-") for v in volumes)


def test_project_image_runs_as_non_root_with_read_only_root(
        cluster: Cluster, namespace: str) -> None:
    """The project image (CLI, operator) and the sidecar image (the Go binary, the one
    sidecar) both run as 65532 with a read-only root and no capabilities."""
    project = image_ref("ghcr.io/joblease/joblease:")
    sidecar = image_ref("ghcr.io/joblease/joblease-sidecar")
    security = {"runAsUser": 65532, "runAsGroup": 65532, "runAsNonRoot": True,
                "readOnlyRootFilesystem": True, "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]}}
    commands = {"cli": (project, ["joblease", "--help"], "Usage: joblease "),
                "operator": (project, ["joblease", "operator", "--help"], "Usage: joblease "),
                "sidecar": (sidecar, ["/joblease-sidecar", "--help"],
                            "Usage: joblease-sidecar")}
    run_pod(cluster, namespace, {
        "metadata": {"name": "image"},
        "spec": {"containers": [
            {"name": name, "image": image, "imagePullPolicy": "Never", "command": argv,
             "securityContext": security}
            for name, (image, argv, _usage) in commands.items()]},
    })
    for name, (_image, _argv, usage) in commands.items():
        out = logs(cluster, namespace, "image", name)
        assert usage in out, (name, out)
    # it really ran as 65532 with a read-only root: the API recorded the context
    pod = cluster.pod("image", namespace)
    assert pod is not None
    for container in pod["spec"]["containers"]:
        assert container["securityContext"]["runAsUser"] == 65532
        assert container["securityContext"]["readOnlyRootFilesystem"] is True


# ------------------------------------------------------------------ teardown
# What a kubelet, kube-proxy or the CNI plugins would write into the host's
# tables if they leaked out of the namespace: their chains and our ranges.
# (Only these lines: other rules on the host are not this test's to judge.)
CLUSTER_RULE_MARKS = ("KUBE-", "CNI-", "10.244.", "10.0.0.", "10.250.0.", "cni0")


def _host_iptables() -> list[str]:
    import subprocess

    lines = []
    for tool in ("iptables-save", "ip6tables-save"):
        result = subprocess.run([tool], capture_output=True, text=True, timeout=60)
        lines += [line for line in result.stdout.splitlines()
                  if any(mark in line for mark in CLUSTER_RULE_MARKS)]
    return sorted(lines)


def _host_snapshot(name: str) -> dict[str, Any]:
    from tests.support.cluster import KUBELET_SYSCTLS, read_sysctl

    return {
        "iptables": _host_iptables(),
        "sysctls": {key: read_sysctl(key) for key in KUBELET_SYSCTLS},
        "netns": sorted(p.name for p in Path("/run/netns").glob(f"jl-{name}")),
        "run_containerd": Path("/run/containerd").exists(),
        "cni_results": sorted(p.name for p in Path("/var/lib/cni/results").glob(f"jl-{name}-*")),
    }


@pytest.mark.node  # starts a cluster of its own on this machine
def test_down_leaves_nothing_even_after_a_crashed_run() -> None:
    """A cluster of its own (state dir, cgroups, namespace): start it, run a pod,
    kill its processes as a crash would (pods, mounts, cgroups, netns stay), start
    it again (``up`` cleans up first), run a pod, ``down``: nothing remains."""
    import os

    name = f"d{os.getpid()}"
    other = Cluster(name, ready_timeout=400, local=True)
    before = _host_snapshot(name)
    assert not other.leftovers()

    def start_and_run_pod() -> None:
        other.up()
        assert other.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        other.kubectl("create", "namespace", "td", check=False)
        from tests.support.waiting import wait_until

        wait_until(lambda: other.kubectl("get", "serviceaccount", "default", "-n",
                                         "td").returncode == 0,
                   timeout=120, what="default serviceaccount", interval=0.5)
        other.apply(json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sleeper",
                                                            "namespace": "td"},
            "spec": {"containers": [{"name": "c", "image": curl_image(),
                                     "imagePullPolicy": "Never",
                                     "command": ["sleep", "3600"]}]}}))
        other.kubectl("wait", "--for=condition=Ready", "pod/sleeper", "-n", "td",
                      "--timeout=300s", check=True, timeout=320)

    try:
        start_and_run_pod()
        # while it runs: its rules live in its namespace only, not on the host
        assert _host_iptables() == before["iptables"]
        # the same name is refused while it runs (its processes hold the lock)
        with pytest.raises(ClusterError, match="is running"):
            Cluster(name, local=True).up()
        assert other.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
        running = [f"{kind}" for kind in other.leftovers()]
        assert any("mount" in item for item in running), running
        assert any("cgroup" in item for item in running), running
        # crash: SIGKILL every process of the fixture; nothing gets cleaned up
        other.crash()
        assert not other.in_use()
        crashed = other.leftovers()
        assert any("mount" in item for item in crashed), crashed
        assert any("network namespace" in item for item in crashed), crashed
        # a new instance with the same name recovers and works
        other = Cluster(name, ready_timeout=400, local=True)
        start_and_run_pod()
    finally:
        other.down()
    assert other.leftovers() == []
    after = _host_snapshot(name)
    assert after == before
