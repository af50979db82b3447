"""The bundled etcd's member count is fixed at install: the real helm, the real API server.

What is guaranteed: ``helm upgrade`` with another ``etcd.replicas`` than the running
members were created with (1 to 3, 3 to 1) is refused before anything is sent, with a
message naming ``etcd.replicas``, both counts and the documented way out; the release
keeps its revision and every etcd object its resourceVersion. A server-side dry run
refuses it too. The same count upgrades as before, and restores a StatefulSet scaled
by hand. Install and ``helm template`` (nothing to look up) render any allowed count.
No kubelet or controller-manager runs here: the StatefulSet exists in the API without
pods, which is all the refusal reads (``lookup``); tests/cluster/test_etcd_scaling.py
holds the same refusal against running members with jobs held.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.chart import CHART, helm_ok, release_name, set_args
from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


@pytest.fixture
def release(control_plane: ControlPlane, namespace: str) -> Iterator[str]:
    """This test's release name; uninstalled afterwards (cluster-scoped RBAC too)."""
    name = release_name(namespace)
    yield name
    control_plane.helm("uninstall", name, "-n", namespace)


def get(cp: ControlPlane, namespace: str, kind: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(cp.kubectl("get", kind, name, "-n", namespace, "-o",
                                                "json", check=True).stdout)
    return obj


def etcd_objects(cp: ControlPlane, namespace: str, release: str) -> dict[str, Any]:
    """The etcd objects' resourceVersions and what the operator is given, to compare."""
    etcd = f"{release}-etcd"
    objects = {kind: get(cp, namespace, kind, name) for kind, name in (
        ("statefulset", etcd), ("service", etcd), ("service", f"{etcd}-peer"),
        ("poddisruptionbudget", etcd), ("deployment", f"{release}-joblease-operator"))}
    env = objects["deployment"]["spec"]["template"]["spec"]["containers"][0]["env"]
    return {
        "versions": {kind: o["metadata"]["resourceVersion"] for kind, o in objects.items()},
        "replicas": objects["statefulset"]["spec"]["replicas"],
        "minAvailable": objects["poddisruptionbudget"]["spec"]["minAvailable"],
        "endpoints": next(e["value"] for e in env if e["name"] == "JOBLEASE_ETCD_ENDPOINTS"),
    }


def revisions(cp: ControlPlane, namespace: str, release: str) -> list[tuple[int, str]]:
    history = json.loads(helm_ok(cp, "history", release, "-n", namespace, "-o", "json"))
    return [(int(h["revision"]), h["status"]) for h in history]


@pytest.mark.parametrize(("installed", "asked"), [(1, 3), (3, 1)],
                         ids=["one-to-three", "three-to-one"])
def test_upgrade_to_another_member_count_is_refused_and_changes_nothing(
        control_plane: ControlPlane, namespace: str, release: str,
        installed: int, asked: int) -> None:
    cp = control_plane
    # install: no StatefulSet to look up yet, so any allowed count installs
    helm_ok(cp, "install", release, str(CHART), "-n", namespace,
            *set_args({"etcd.replicas": installed}))
    before = etcd_objects(cp, namespace, release)
    assert before["replicas"] == installed

    for dry_run in ([], ["--dry-run=server"]):
        refused = cp.helm("upgrade", release, str(CHART), "-n", namespace, *dry_run,
                          *set_args({"etcd.replicas": asked}))
        assert refused.returncode != 0, (dry_run, refused.stdout)
        for part in ("etcd.replicas:", f"the bundled etcd {release}-etcd in namespace "
                     f"{namespace} has {installed} member(s) and this upgrade asks for "
                     f"{asked}", "Nothing was changed", f"Keep etcd.replicas={installed}",
                     '"Changing the number of etcd members" in docs/helm.md'):
            assert part in refused.stderr, (dry_run, refused.stderr)

    assert etcd_objects(cp, namespace, release) == before
    assert revisions(cp, namespace, release) == [(1, "deployed")]

    # the same count upgrades as before (an unrelated change goes through)
    helm_ok(cp, "upgrade", release, str(CHART), "-n", namespace,
            *set_args({"etcd.replicas": installed, "operator.logLevel": "DEBUG"}))
    after = etcd_objects(cp, namespace, release)
    assert (after["replicas"], after["minAvailable"], after["endpoints"]) == (
        before["replicas"], before["minAvailable"], before["endpoints"])
    assert revisions(cp, namespace, release) == [(1, "superseded"), (2, "deployed")]


def test_upgrade_with_the_created_count_restores_a_statefulset_scaled_by_hand(
        control_plane: ControlPlane, namespace: str, release: str) -> None:
    """The refusal compares the members the etcd was created with (``--initial-cluster``),
    not ``spec.replicas``: after ``kubectl scale`` the chart's own count still upgrades
    and puts the StatefulSet back, and the scaled-to count is still refused."""
    cp = control_plane
    helm_ok(cp, "install", release, str(CHART), "-n", namespace)
    cp.kubectl("scale", "statefulset", f"{release}-etcd", "-n", namespace, "--replicas=3",
               check=True)
    refused = cp.helm("upgrade", release, str(CHART), "-n", namespace,
                      *set_args({"etcd.replicas": 3}))
    assert refused.returncode != 0 and "has 1 member(s)" in refused.stderr, refused.stderr
    helm_ok(cp, "upgrade", release, str(CHART), "-n", namespace)
    assert get(cp, namespace, "statefulset", f"{release}-etcd")["spec"]["replicas"] == 1


def test_template_renders_any_allowed_count_without_a_cluster_to_ask(
        control_plane: ControlPlane, namespace: str, release: str) -> None:
    """``helm template`` cannot look the StatefulSet up, even with one in the API: it
    renders the count asked for (the refusal is the upgrade's)."""
    cp = control_plane
    helm_ok(cp, "install", release, str(CHART), "-n", namespace)
    out = helm_ok(cp, "template", release, str(CHART), "-n", namespace,
                  *set_args({"etcd.replicas": 3}))
    assert "replicas: 3" in out
