"""The cluster's own objects, applied at start-up: the storage pool and CoreDNS."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.support.cluster.settings import (
    DNS_SERVICE_IP,
    LOCAL_VOLUME_SIZE,
    NODE_NAME,
    STORAGE_CLASS,
)


def storage_manifest(volumes_dir: Path, count: int) -> str:
    """A default StorageClass without a provisioner, and ``count`` local volumes.

    Why this and not a provisioner: ``kubernetes.io/no-provisioner`` with
    ``WaitForFirstConsumer`` is how Kubernetes serves pre-created local disks (the
    scheduler's volume binder picks a free PersistentVolume of the class on the
    pod's node when the pod is scheduled, the kubelet bind-mounts the directory).
    Every part is the real one; only the pool is finite: a volume whose claim is
    deleted becomes ``Released`` and is not handed out again (``Retain``; nothing
    here scrubs data), so the pool bounds how many claims a session may create.
    ``local`` volumes need node affinity, which is the one node. The capacity is
    nominal (a directory has no size limit); it only has to cover the claims.
    """
    class_ = {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
              "metadata": {"name": STORAGE_CLASS, "annotations": {
                  "storageclass.kubernetes.io/is-default-class": "true"}},
              "provisioner": "kubernetes.io/no-provisioner",
              "volumeBindingMode": "WaitForFirstConsumer",
              "reclaimPolicy": "Retain"}
    volumes: list[dict[str, Any]] = [{
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": f"{STORAGE_CLASS}-pv-{index:02d}",
                     "labels": {"joblease.io/test-volume": "true"}},
        "spec": {
            "capacity": {"storage": LOCAL_VOLUME_SIZE},
            "accessModes": ["ReadWriteOnce"], "volumeMode": "Filesystem",
            "persistentVolumeReclaimPolicy": "Retain", "storageClassName": STORAGE_CLASS,
            "local": {"path": str(volumes_dir / f"pv-{index:02d}")},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [{
                "key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}]}]}},
        }} for index in range(count)]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": [class_, *volumes]})


def coredns_manifest(image: str) -> str:
    """CoreDNS as upstream deploys it, minus upstream forwarding (pods have no route out)."""
    corefile = """.:53 {
    errors
    health {
        lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 30
    }
    cache 30
    loop
    reload
    loadbalance
}
"""
    labels = {"k8s-app": "kube-dns"}
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "ServiceAccount",
         "metadata": {"name": "coredns", "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
         "metadata": {"name": "system:coredns"},
         "rules": [
             {"apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
              "verbs": ["list", "watch"]},
             {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["list", "watch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "system:coredns"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                     "name": "system:coredns"},
         "subjects": [{"kind": "ServiceAccount", "name": "coredns",
                       "namespace": "kube-system"}]},
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "coredns", "namespace": "kube-system"},
         "data": {"Corefile": corefile}},
        {"apiVersion": "apps/v1", "kind": "Deployment",
         "metadata": {"name": "coredns", "namespace": "kube-system", "labels": labels},
         "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                  "template": {"metadata": {"labels": labels}, "spec": {
                      "serviceAccountName": "coredns",
                      "priorityClassName": "system-cluster-critical",
                      "dnsPolicy": "Default",
                      "containers": [{
                          "name": "coredns", "image": image, "imagePullPolicy": "Never",
                          "args": ["-conf", "/etc/coredns/Corefile"],
                          "ports": [{"containerPort": 53, "name": "dns", "protocol": "UDP"},
                                    {"containerPort": 53, "name": "dns-tcp",
                                     "protocol": "TCP"},
                                    {"containerPort": 9153, "name": "metrics",
                                     "protocol": "TCP"}],
                          "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns",
                                            "readOnly": True}],
                          "readinessProbe": {"httpGet": {"path": "/ready", "port": 8181},
                                             "periodSeconds": 2},
                          "livenessProbe": {"httpGet": {"path": "/health", "port": 8080},
                                            "initialDelaySeconds": 60},
                          "securityContext": {
                              "allowPrivilegeEscalation": False,
                              "capabilities": {"add": ["NET_BIND_SERVICE"], "drop": ["ALL"]},
                              "readOnlyRootFilesystem": True,
                              "runAsNonRoot": True, "runAsUser": 65532},
                      }],
                      "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                  }}}},
        {"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
         "spec": {"selector": labels, "clusterIP": DNS_SERVICE_IP, "ports": [
             {"name": "dns", "port": 53, "protocol": "UDP"},
             {"name": "dns-tcp", "port": 53, "protocol": "TCP"},
             {"name": "metrics", "port": 9153, "protocol": "TCP"}]}},
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
