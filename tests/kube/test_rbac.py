"""RBAC is enforced: a ServiceAccount gets exactly what its Role grants.

Uses a real TokenRequest token (``kubectl create token``), which is what the
operator and sidecar will authenticate with in a cluster.
"""

from __future__ import annotations

import json

import pytest

from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def can_i(cp: ControlPlane, namespace: str, sa: str, *what: str) -> str:
    result = cp.kubectl("auth", "can-i", *what, "-n", namespace,
                        f"--as=system:serviceaccount:{namespace}:{sa}")
    return result.stdout.strip()


def test_role_grants_only_reading_jobleases(crds_installed: ControlPlane,
                                            namespace: str) -> None:
    cp, sa = crds_installed, "reader"
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
        "metadata": {"name": "joblease-reader", "namespace": namespace},
        "rules": [{"apiGroups": ["joblease.io"], "resources": ["jobleases"],
                   "verbs": ["get", "list"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
        "metadata": {"name": "joblease-reader", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                    "name": "joblease-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": namespace}],
    }
    kubeconfig = cp.service_account_kubeconfig(namespace, sa)
    for obj in (role, binding):
        cp.kubectl("apply", "-f", "-", input=json.dumps(obj), check=True)

    assert can_i(cp, namespace, sa, "list", "jobleases.joblease.io") == "yes"
    assert can_i(cp, namespace, sa, "delete", "pods") == "no"
    assert can_i(cp, namespace, sa, "list", "secrets") == "no"

    allowed = cp.kubectl("get", "jobleases", "-n", namespace, kubeconfig=kubeconfig)
    assert allowed.returncode == 0, allowed.stderr
    denied = cp.kubectl("get", "secrets", "-n", namespace, kubeconfig=kubeconfig)
    assert denied.returncode != 0
    assert "Forbidden" in denied.stderr, denied.stderr
    assert f"system:serviceaccount:{namespace}:{sa}" in denied.stderr
