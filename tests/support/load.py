"""Claim/complete load against a release's etcd, from a pod of the project image.

A "tools" pod runs the project image with the release's etcd client Secret and
the operator's ``JOBLEASE_ETCD_*`` settings (every member as an endpoint), so it
reaches etcd the way a worker's sidecar does; :class:`ClaimLoad` runs
tests/support/claim_driver.py in it through ``kubectl exec`` and collects what
the driver printed (one JSON record per etcd answer), in order, while it runs.
Nothing is faked: the driver uses the real client against the real members.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any

from tests.support.binaries import kubectl_binary
from tests.support.cluster import image_ref
from tests.support.release import Release
from tests.support.waiting import wait_until

DRIVER = Path(__file__).with_name("claim_driver.py")
TLS_DIR = "/etc/joblease/etcd-tls"
#: where the operator's Deployment mounts the etcd root credentials (etcd auth on)
AUTH_DIR = "/etc/joblease/etcd-auth"


def joblease(namespace: str, name: str, *, ttl: int = 10, attempts: int = 10) -> dict[str, Any]:
    """A JobLease with spare attempts: a claim whose answer a fault ate may have
    used one (the driver then claims again)."""
    return {"apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"leaseDurationSeconds": ttl, "maxAttempts": attempts}}


def apply_jobleases(rel: Release, names: list[str]) -> None:
    """Apply one :func:`joblease` per name (not waiting)."""
    rel.cluster.apply(json.dumps({"apiVersion": "v1", "kind": "List",
                                  "items": [joblease(rel.namespace, n) for n in names]}))


def wait_registered(rel: Release, names: list[str], timeout: float = 300) -> None:
    """Wait until the operator registered every one of ``names`` (Pending with an
    ``etcdRevision``): one list per poll, not one get per JobLease."""
    def missing() -> list[str]:
        items = json.loads(rel.kubectl("get", "jobleases", "-o", "json"))["items"]
        done = {i["metadata"]["name"] for i in items
                if (i.get("status") or {}).get("phase") == "Pending"
                and int(i["status"].get("etcdRevision") or 0) > 0}
        return [n for n in names if n not in done]
    try:
        wait_until(lambda: not missing(), timeout=timeout, what=f"{names} registered",
                   interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {missing()} not\n{rel.diagnostics()}") from exc


def operator_etcd_access(rel: Release) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                list[dict[str, Any]]]:
    """``(env, volumeMounts, volumes)`` giving a container the operator's etcd access as
    the operator's Deployment has it: endpoints, root, TLS files and, with etcd auth on
    (the bundled etcd's default), the root Secret's username and password file."""
    template = rel.get("deployment", rel.fullname)["spec"]["template"]["spec"]
    container = template["containers"][0]
    env = [e for e in container["env"]
           if e["name"].startswith(("JOBLEASE_ETCD_", "JOBLEASE_ROOT"))
           and e["name"] != "JOBLEASE_ETCD_ENABLE_AUTH"]
    mounts = [{**m, "readOnly": True} for m in container["volumeMounts"]
              if m["mountPath"] in (TLS_DIR, AUTH_DIR)]
    volumes = [v for v in template["volumes"] if v["name"] in {m["name"] for m in mounts}]
    return env, mounts, volumes


def start_tools_pod(rel: Release, name: str = "tools") -> str:
    """A pod of the project image that idles, with the operator's etcd connection
    settings (endpoints, CA, client certificate, and with etcd auth on its root
    credentials: the bundled etcd's default) and the operator's etcd Secrets mounted
    where those settings point. Returns its name once it runs."""
    env, mounts, volumes = operator_etcd_access(rel)
    rel.cluster.apply(json.dumps({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": rel.namespace},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "tools", "image": image_ref("ghcr.io/joblease/joblease:"),
                "imagePullPolicy": "Never", "command": ["sleep", "3600"], "env": env,
                "securityContext": {"allowPrivilegeEscalation": False,
                                    "capabilities": {"drop": ["ALL"]}},
                "volumeMounts": mounts}],
            "volumes": volumes,
        }}))
    result = rel.cluster.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n",
                                 rel.namespace, "--timeout=300s", timeout=330)
    assert result.returncode == 0, f"tools pod not ready: {result.stderr}\n{rel.diagnostics()}"
    return name


class ClaimLoad:
    """The driver running in the tools pod; ``records`` fills while it runs.

    With ``until=True`` the load runs until :meth:`finish` (the driver's ``--until``):
    jobs with releases are released again and again, and none is completed before."""

    def __init__(self, rel: Release, pod: str, jobs: list[str], *, owner: str = "driver",
                 pause: float = 0.3, releases: int = 1, limit: float = 240.0,
                 until: bool = False) -> None:
        self.rel, self.pod, self.jobs, self.limit = rel, pod, jobs, limit
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self.until = f"/tmp/joblease-load-{owner}-{uuid.uuid4().hex[:8]}" if until else None
        argv = [kubectl_binary(), "--kubeconfig", str(rel.cluster.kubeconfig), "exec", "-i",
                pod, "-n", rel.namespace, "--", "python", "-",
                *(["--until", self.until] if self.until else []), rel.namespace, owner,
                str(pause), str(releases), str(limit), *jobs]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None
        self.proc.stdin.write(DRIVER.read_text())
        self.proc.stdin.close()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                record = {"op": "noise", "line": line.rstrip()}
            with self._lock:
                self.records.append(record)

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.records)

    def acknowledged(self, op: str) -> list[dict[str, Any]]:
        return [r for r in self.snapshot() if r.get("op") == op and r.get("ok")]

    def wait_completed(self, count: int, timeout: float = 300) -> None:
        """Wait until ``count`` completions were acknowledged."""
        wait_until(lambda: (len(self.acknowledged("complete")) >= count
                            or self.proc.poll() is not None),
                   timeout=timeout, what=f"{count} acknowledged completions", interval=0.2)
        assert len(self.acknowledged("complete")) >= count, self.failure()

    def wait_done(self, timeout: float | None = None) -> list[dict[str, Any]]:
        """Wait for the driver to end (all jobs done, or its own deadline); return
        its ``final`` records (etcd's state per job after the load)."""
        # the driver's own deadline, plus time for its final reads
        deadline = time.monotonic() + (timeout or self.limit + 160)
        while self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the driver has its own deadline; this one bounds the wait
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self._reader.join(timeout=10)
        records = self.snapshot()
        assert self.proc.returncode == 0 and records and records[-1].get("op") == "done", (
            self.failure())
        return [r for r in records if r.get("op") == "final"]

    def finish(self) -> None:
        """End an ``until=True`` load: its jobs go on to their completions."""
        assert self.until is not None, "finish() ends a load started with until=True"
        # (not rel.kubectl: its "-n" would follow the "--", as the command's argument)
        result = self.rel.cluster.kubectl("exec", self.pod, "-n", self.rel.namespace, "--",
                                          "python", "-c", f"open({self.until!r}, 'w').close()")
        assert result.returncode == 0, result.stderr

    def failure(self) -> str:
        stderr = ""
        if self.proc.poll() is not None and self.proc.stderr is not None:
            stderr = self.proc.stderr.read()
        tail = "\n".join(json.dumps(r) for r in self.snapshot()[-30:])
        return f"driver rc={self.proc.returncode}\n{tail}\n{stderr}\n{self.rel.diagnostics()}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def tokens_by_job(records: list[dict[str, Any]]) -> dict[str, list[int]]:
    """The tokens of the acknowledged claims per job, in the order etcd granted them
    (the driver works on one claim at a time)."""
    out: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if r.get("op") == "claim" and r.get("ok"):
            out[r["job"]].append(int(r["token"]))
    return dict(out)


# Asks every member for its status and the member list over the v3 gRPC gateway
# (JSON over HTTPS with the client certificate), from inside the tools pod: the
# etcd image has no shell or etcdctl, and the test process cannot reach pod IPs.
_MEMBERS_SCRIPT = r"""
import json, os
import grpc
from joblease._etcdpb import rpc_pb2, rpc_pb2_grpc
# gRPC, not etcd's HTTP gateway: with auth on, the gateway refuses any request made with a
# client certificate ("CommonName of client sending a request against gateway will be
# ignored"), and the members require one (--client-cert-auth)
tls = os.environ["JOBLEASE_ETCD_CA_FILE"].rsplit("/", 1)[0]
read = lambda name: open(tls + "/" + name, "rb").read()
creds = grpc.ssl_channel_credentials(read("ca.crt"), read("tls.key"), read("tls.crt"))
server_name = os.environ.get("JOBLEASE_ETCD_SERVER_NAME")
options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
password_file = os.environ.get("JOBLEASE_ETCD_PASSWORD_FILE")
out = {"members": None, "status": {}}
for endpoint in os.environ["JOBLEASE_ETCD_ENDPOINTS"].split(","):
    try:
        with grpc.secure_channel(endpoint.split("://")[-1], creds, options) as channel:
            metadata = []
            if password_file:  # etcd auth on: the operator's user (root), a token per member
                login = rpc_pb2.AuthenticateRequest(
                    name=os.environ["JOBLEASE_ETCD_USERNAME"],
                    password=open(password_file).read().strip())
                token = rpc_pb2_grpc.AuthStub(channel).Authenticate(login, timeout=5).token
                metadata = [("token", token)]
            st = rpc_pb2_grpc.MaintenanceStub(channel).Status(
                rpc_pb2.StatusRequest(), timeout=5, metadata=metadata)
            out["status"][endpoint] = {"id": str(st.header.member_id), "leader": str(st.leader),
                                       "cluster": str(st.header.cluster_id),
                                       "revision": st.header.revision,
                                       "raftIndex": st.raftIndex}
            if out["members"] is None:
                listed = rpc_pb2_grpc.ClusterStub(channel).MemberList(
                    rpc_pb2.MemberListRequest(), timeout=5, metadata=metadata)
                out["members"] = [{"id": str(m.ID), "name": m.name} for m in listed.members]
    except Exception as exc:
        out["status"][endpoint] = {"error": repr(exc)[:500]}
print(json.dumps(out))
"""


def etcd_members(rel: Release, pod: str) -> dict[str, Any]:
    """``{"members": [{"id", "name"}], "status": {endpoint: {"id", "leader", "cluster",
    "revision", "raftIndex"} or {"error"}}}`` as the members report it now."""
    result = rel.cluster.kubectl("exec", pod, "-n", rel.namespace, "--", "python", "-c",
                                 _MEMBERS_SCRIPT, timeout=120)
    assert result.returncode == 0, result.stderr
    found: dict[str, Any] = json.loads(result.stdout)
    return found
