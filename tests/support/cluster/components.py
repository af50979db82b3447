"""What each node component is started with: command lines and configuration files,
as pure functions of paths and settings (the :class:`Cluster` starts them, in order,
inside its network namespace). The test-machine-only settings are marked where
they are set (docs/control-plane.md explains each)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.cluster.settings import (
    ADVERTISE_ADDRESS,
    APISERVER_PORT,
    DNS_SERVICE_IP,
    MAX_PODS,
    NODE_NAME,
    POD_CIDR,
    SERVICE_CIDR,
)
from tests.support.controlplane import SERVICE_ACCOUNT_ISSUER

ETCD_URL = "http://127.0.0.1:2379"


def etcd_argv(binary: str, data_dir: Path) -> list[str]:
    """The Kubernetes API server's own etcd (not joblease's: the chart brings that)."""
    return [
        binary, "--name", "default", "--data-dir", str(data_dir),
        "--listen-client-urls", ETCD_URL, "--advertise-client-urls", ETCD_URL,
        "--listen-peer-urls", "http://127.0.0.1:2380",
        "--initial-advertise-peer-urls", "http://127.0.0.1:2380",
        "--initial-cluster", "default=http://127.0.0.1:2380", "--unsafe-no-fsync",
        "--listen-metrics-urls", "http://127.0.0.1:2381",
    ]


def apiserver_argv(binary: str, pki: Path, cert_dir: Path) -> list[str]:
    return [
        binary,
        "--etcd-servers", ETCD_URL,
        "--bind-address", "0.0.0.0", "--advertise-address", ADVERTISE_ADDRESS,
        "--secure-port", str(APISERVER_PORT),
        "--cert-dir", str(cert_dir),
        "--tls-cert-file", str(pki / "apiserver.crt"),
        "--tls-private-key-file", str(pki / "apiserver.key"),
        "--client-ca-file", str(pki / "ca.crt"),
        "--kubelet-client-certificate", str(pki / "apiserver-kubelet-client.crt"),
        "--kubelet-client-key", str(pki / "apiserver-kubelet-client.key"),
        "--kubelet-preferred-address-types", "Hostname",
        "--authorization-mode", "Node,RBAC",
        "--enable-admission-plugins", "NodeRestriction",
        "--service-account-issuer", SERVICE_ACCOUNT_ISSUER,
        "--service-account-key-file", str(pki / "sa.pub"),
        "--service-account-signing-key-file", str(pki / "sa.key"),
        "--service-cluster-ip-range", SERVICE_CIDR,
        "--allow-privileged=true",
    ]


def controller_manager_argv(binary: str, kubeconfig: Path, pki: Path) -> list[str]:
    return [
        binary,
        "--kubeconfig", str(kubeconfig),
        "--authentication-kubeconfig", str(kubeconfig),
        "--authorization-kubeconfig", str(kubeconfig),
        "--bind-address", "127.0.0.1",
        "--leader-elect=false", "--use-service-account-credentials",
        "--controllers", "*",
        "--service-account-private-key-file", str(pki / "sa.key"),
        "--root-ca-file", str(pki / "ca.crt"),
        "--service-cluster-ip-range", SERVICE_CIDR, "--cluster-cidr", POD_CIDR,
        "--node-monitor-period", "2s",
    ]


def scheduler_argv(binary: str, kubeconfig: Path) -> list[str]:
    return [
        binary,
        "--kubeconfig", str(kubeconfig),
        "--authentication-kubeconfig", str(kubeconfig),
        "--authorization-kubeconfig", str(kubeconfig),
        "--bind-address", "127.0.0.1", "--leader-elect=false",
    ]


def kubelet_argv(binary: str, config: Path, kubeconfig: Path, root: Path) -> list[str]:
    return [
        binary, "--config", str(config),
        "--kubeconfig", str(kubeconfig),
        "--root-dir", str(root), "--cert-dir", str(root / "pki"),
        "--hostname-override", NODE_NAME, "--node-ip", ADVERTISE_ADDRESS,
    ]


def kubeconfig(server: str, pki: Path, stem: str) -> str:
    """A kubeconfig for client certificate ``pki/<stem>.crt`` against ``server``."""
    return json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "joblease", "cluster": {
            "server": server, "certificate-authority": str(pki / "ca.crt")}}],
        "users": [{"name": stem, "user": {
            "client-certificate": str(pki / f"{stem}.crt"),
            "client-key": str(pki / f"{stem}.key")}}],
        "contexts": [{"name": "joblease", "context": {"cluster": "joblease", "user": stem}}],
        "current-context": "joblease",
    }, indent=2)


def cni_conflist(network: str, ipam_dir: Path) -> str:
    """The pod network: one bridge ``cni0``, no masquerade (nothing leaves the namespace)."""
    return json.dumps({
        "cniVersion": "1.0.0", "name": network,
        "plugins": [
            {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(ipam_dir)}},
            {"type": "portmap", "capabilities": {"portMappings": True}},
        ],
    }, indent=2)


def containerd_config(*, base: Path, socket: Path, state_dir: Path, pause: str, runc: str,
                      cni_bin_dir: str, cni_conf: Path) -> str:
    """containerd 2.x's config.toml: its own root, state and sockets under the state dir;
    test-machine-only: ``restrict_oom_score_adj`` (runc cannot lower oom_score_adj here)."""
    return f"""version = 4
root = "{base}/root"
state = "{base}/state"
imports = []
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.tracing",
                    "io.containerd.tracing.processor.v1.otlp",
                    "io.containerd.image-verifier.v1.bindir"]
[plugins."io.containerd.server.v1.grpc"]
  address = "{socket}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{socket}.ttrpc"
[plugins."io.containerd.server.v1.debug"]
  address = ""
[plugins."io.containerd.server.v1.metrics"]
  address = ""
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{state_dir}/s"
[plugins."io.containerd.internal.v1.opt"]
  path = "{base}/opt"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause}"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_unprivileged_ports = true
  enable_unprivileged_icmp = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        Root = "{base}/runc"
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
[plugins."io.containerd.grpc.v1.cri"]
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""

def kube_proxy_config(kubeconfig: Path) -> str:
    return json.dumps({
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": NODE_NAME,
        "clusterCIDR": POD_CIDR,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # 0 = leave the (host-wide) conntrack table size and timeouts alone
        "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                      "tcpCloseWaitTimeout": "0s"},
    }, indent=2)


def kubelet_config(*, cgroup: str, containerd_socket: Path, ca: Path,
                   pod_logs: Path) -> str:
    config: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        # test-machine-only: cgroup v1 and no systemd here (docs/control-plane.md)
        "failCgroupV1": False,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{cgroup}",
        "containerRuntimeEndpoint": f"unix://{containerd_socket}",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(ca)}},
        "authorization": {"mode": "Webhook"},
        "address": "0.0.0.0",
        "clusterDNS": [DNS_SERVICE_IP],
        "clusterDomain": "cluster.local",
        "resolvConf": "",
        "podLogsDir": str(pod_logs),
        "failSwapOn": False,
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "nodeStatusUpdateFrequency": "2s",
        "serializeImagePulls": False,
        "rotateCertificates": False,
        # The default (110) leaves little room beside bench/e2e.py's burst of 100
        # worker pods: CoreDNS, etcd and the operator run too, and pods of a
        # previous step may still be terminating. The ceiling is the pod CIDR:
        # host-local IPAM has 253 addresses in the /24, so stay well below it.
        "maxPods": MAX_PODS,
    }
    return json.dumps(config, indent=2)
