"""The test cluster's fixed settings: addresses inside its network namespace, the
state root, the storage pool, and its one error type."""

from __future__ import annotations

from pathlib import Path

# short: shim sockets are <state dir>/s/<64 hex> and a unix socket path has
# at most 107 bytes
STATE_ROOT = Path("/var/tmp/jl-cluster")
ADVERTISE_ADDRESS = "10.250.0.1"
SERVICE_CIDR = "10.0.0.0/24"
KUBERNETES_SERVICE_IP = "10.0.0.1"
DNS_SERVICE_IP = "10.0.0.10"
POD_CIDR = "10.244.0.0/24"
#: The kubelet's pod capacity (components.kubelet_config): below the /24's 253 addresses.
MAX_PODS = 200
NODE_NAME = "localhost"
APISERVER_PORT = 6443
# The host sysctls the kubelet rewrites (kubelet/cm setupKernelTunables).
KUBELET_SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
CLONE_NEWNET = 0x40000000
# libcni's result cache (containerd's CRI has no setting for it): files named
# <network>-<sandbox id>-<interface>, removed by CNI DEL, which killed pods skip
CNI_RESULTS = Path("/var/lib/cni/results")
# Storage: the default StorageClass and its pool of pre-created local volumes
# (see storage_manifest). 16: a few releases with 3 members each; a volume is not
# reused once its claim is deleted (Released, reclaim policy Retain).
STORAGE_CLASS = "local"
LOCAL_VOLUMES = 16
LOCAL_VOLUME_SIZE = "10Gi"
#: owner of the volume directories: the UID/GID the chart's etcd (and the
#: project image) run as, so the non-root container can write its data dir
VOLUME_OWNER = 65532


class ClusterError(RuntimeError):
    """The cluster did not start or did not stop cleanly (message carries log tails)."""
