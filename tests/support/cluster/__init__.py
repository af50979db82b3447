"""A real single-node Kubernetes for tests: kubelet, containerd, CNI, kube-proxy, CoreDNS.

Why: the product is used as pods (a native sidecar, read-only root
filesystems, projected service-account tokens, Service DNS), and only a real
kubelet running real containers shows how that behaves. Nothing is faked:
etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
kube-proxy v1.36 are the pinned builds (``hack/build-test-binaries``),
containerd 2.x is built from its Go module, runc, the CNI plugins, iptables
and socat come from Debian, and CoreDNS runs as a Deployment from an image
imported into containerd (``ctr images import``, no registry).

Network design (the machine's rule: traffic only to loopback or to network
namespaces the test created). Every cluster process runs inside a network
namespace this module creates, ``jl-<name>``, entered with ``setns(2)`` in the
child before ``exec`` (not ``ip netns exec``: that also gives the process a
private mount namespace and a fresh ``/sys``, hiding the cgroup mounts and
keeping the kubelet's volume mounts out of the host's view). The namespace
holds ``lo`` with 127.0.0.1 and the API server's advertise address
10.250.0.1 (a /32 on ``lo``: this kernel has no ``dummy`` driver; pods reach
the API server through the ``kubernetes`` Service, 10.0.0.1 → 10.250.0.1:6443,
never 127.0.0.1); and the CNI bridge
``cni0`` (pods 10.244.0.0/24). There is no default route and no masquerade:
nothing leaves it. Because the namespace is private, components use their
fixed default ports there.

Reaching the cluster from the test process: the host side may only use host
loopback. A forwarder pair bridges the two over a unix socket in the state
dir (path sockets are not network-namespace scoped): in the namespace
``socat UNIX-LISTEN:<dir>/apiserver.sock,fork TCP:127.0.0.1:6443``, on the
host ``socat TCP-LISTEN:<free port>,bind=127.0.0.1,fork UNIX-CONNECT:...``.
The admin kubeconfig points at ``https://127.0.0.1:<host port>`` (127.0.0.1 is
a SAN of the serving cert), so kubectl, helm and Python clients in the test
process work unchanged. TLS stays end to end (socat forwards bytes).
``kubectl logs/exec`` work too: the API server dials the kubelet by the node's
Hostname address, ``localhost``, inside the namespace.

Test-machine-only settings (see docs/control-plane.md): the kubelet runs with
``failCgroupV1: false`` (this machine has only cgroup v1 for memory) and
``cgroupDriver: cgroupfs``; containerd's CRI with ``restrict_oom_score_adj``
(runc cannot lower oom_score_adj here). Both are wrong for a production node.

Storage: a default StorageClass ``local`` (``kubernetes.io/no-provisioner``,
``WaitForFirstConsumer``) with a pool of pre-created local PersistentVolumes,
directories under ``<state dir>/volumes`` owned by UID/GID 65532 (the chart's
etcd and the project image run as that user), so StatefulSet claims bind as on
a real cluster (see :func:`storage_manifest`); they go with the state dir.

State lives in a well-known directory (``/var/tmp/jl-cluster/<name>``,
or ``JOBLEASE_CLUSTER_DIR``) with a state file ``cluster.json`` recording pids,
the sysctls the kubelet rewrites (recorded before it starts) and what existed
before. :meth:`Cluster.down` - and :meth:`Cluster.up` first, after a crashed
run - stops processes by pid (checked against their command line), kills what
is left in the cluster's cgroups, network namespace or containerd shims,
unmounts everything under the state dir, removes the cgroups
(``/sys/fs/cgroup/*/jl-<name>``, which is the kubelet's ``cgroupRoot``), the
network namespace (with its bridge and iptables rules), restores the sysctls
and removes the state dir.

If ``JOBLEASE_TEST_KUBECONFIG`` is set, that cluster is used and nothing is
started or stopped (images must already be loadable there: see the docs).

For humans: ``hack/cluster up|down|status`` (``python -m tests.support.cluster``).

The package, one concern per module: :mod:`.settings` (addresses, state root,
storage pool), :mod:`.host` (processes, mounts, cgroups, network namespaces,
sysctls), :mod:`.images` (the image archives), :mod:`.components` (each node
component's command line and configuration), :mod:`.manifests` (storage pool,
CoreDNS), :mod:`.node` (:class:`Cluster`: start-up in order, clients),
:mod:`.teardown` (giving it all back), :mod:`.access` (node access for
pod-level faults).
"""

from tests.support.cluster.access import (
    container_cgroup,
    container_pids,
    kill_containers,
    pod_cgroups,
    process_start_wall_time,
)
from tests.support.cluster.host import read_sysctl
from tests.support.cluster.images import image_ref
from tests.support.cluster.node import Cluster
from tests.support.cluster.settings import (
    KUBELET_SYSCTLS,
    MAX_PODS,
    STATE_ROOT,
    STORAGE_CLASS,
    ClusterError,
)

__all__ = [
    "KUBELET_SYSCTLS",
    "MAX_PODS",
    "STATE_ROOT",
    "STORAGE_CLASS",
    "Cluster",
    "ClusterError",
    "container_cgroup",
    "container_pids",
    "image_ref",
    "kill_containers",
    "pod_cgroups",
    "process_start_wall_time",
    "read_sysctl",
]
