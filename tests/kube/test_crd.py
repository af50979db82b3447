"""The JobLease CRD installs and the API server enforces its schema and CEL rules."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def joblease(name: str, spec: dict[str, object]) -> str:
    return json.dumps({
        "apiVersion": "joblease.io/v1alpha1", "kind": "JobLease",
        "metadata": {"name": name}, "spec": spec,
    })


def test_crd_established(crds_installed: ControlPlane) -> None:
    names = crds_installed.kubectl(
        "get", "crd", "jobleases.joblease.io", "-o", "jsonpath={.spec.names.shortNames}",
        check=True,
    )
    assert "jl" in names.stdout


def test_valid_joblease_accepted_with_defaults(crds_installed: ControlPlane,
                                              namespace: str) -> None:
    crds_installed.kubectl("apply", "-n", namespace, "-f", "-", check=True,
                           input=joblease("ok", {"leaseDurationSeconds": 30,
                                                 "parameters": {"n": 1}}))
    got = json.loads(crds_installed.kubectl("get", "jl", "ok", "-n", namespace, "-o", "json",
                                            check=True).stdout)
    assert got["spec"] == {"leaseDurationSeconds": 30, "maxAttempts": 3, "suspend": False,
                           "historyLimit": 10, "parameters": {"n": 1}}


def test_semaphores_are_accepted_with_a_default_weight(crds_installed: ControlPlane,
                                                       namespace: str) -> None:
    crds_installed.kubectl("apply", "-n", namespace, "-f", "-", check=True,
                           input=joblease("limited", {"leaseDurationSeconds": 30,
                                                      "semaphores": [{"name": "billing-db"}]}))
    got = json.loads(crds_installed.kubectl("get", "jl", "limited", "-n", namespace, "-o",
                                            "json", check=True).stdout)
    assert got["spec"]["semaphores"] == [{"name": "billing-db", "weight": 1}]


@pytest.mark.parametrize(
    ("spec", "field", "why"),
    [
        ({"leaseDurationSeconds": 1}, "spec.leaseDurationSeconds",
         "greater than or equal to 2"),
        ({"leaseDurationSeconds": 86401}, "spec.leaseDurationSeconds", "less than or equal"),
        ({"leaseDurationSeconds": "abc"}, "spec.leaseDurationSeconds", "integer"),
        ({"maxAttempts": 2}, "spec.leaseDurationSeconds", "Required value"),
        ({"leaseDurationSeconds": 10, "maxAttempts": -1}, "spec.maxAttempts",
         "greater than or equal to 0"),
        ({"leaseDurationSeconds": 10, "parameters": {f"k{i}": i for i in range(65)}},
         "spec.parameters", "at most 64"),
        ({"leaseDurationSeconds": 10, "semaphores": [{"name": "Bad_Name"}]},
         "spec.semaphores[0].name", "should match"),
        ({"leaseDurationSeconds": 10, "semaphores": [{"name": "db", "weight": 0}]},
         "spec.semaphores[0].weight", "greater than or equal to 1"),
        ({"leaseDurationSeconds": 10, "semaphores": [{"name": "db"}, {"name": "db"}]},
         "spec.semaphores[1]", "Duplicate value"),
        ({"leaseDurationSeconds": 10, "historyLimit": 1001}, "spec.historyLimit",
         "less than or equal to 1000"),
    ],
    ids=["ttl-1", "ttl-too-long", "ttl-string", "ttl-missing", "attempts-negative",
         "too-many-parameters", "semaphore-bad-name", "semaphore-weight-0",
         "semaphore-twice", "history-limit-too-large"],
)
def test_invalid_joblease_refused(crds_installed: ControlPlane, namespace: str,
                                  spec: dict[str, object], field: str, why: str) -> None:
    result = crds_installed.kubectl("apply", "-n", namespace, "-f", "-",
                                    input=joblease("bad", spec))
    assert result.returncode != 0, result.stdout
    assert field in result.stderr, result.stderr
    assert why in result.stderr, result.stderr
    absent = crds_installed.kubectl("get", "jl", "bad", "-n", namespace)
    assert "NotFound" in absent.stderr


@pytest.mark.parametrize("field", ["etcdRevision"])
def test_status_never_moves_backwards(crds_installed: ControlPlane, namespace: str,
                                      field: str) -> None:
    """CEL transition rules refuse a status update that goes back in etcd history."""
    cp = crds_installed
    cp.kubectl("apply", "-n", namespace, "-f", "-", check=True,
               input=joblease("mono", {"leaseDurationSeconds": 5}))

    def patch_status(value: int) -> subprocess.CompletedProcess[str]:
        return cp.kubectl("patch", "jl", "mono", "-n", namespace, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {field: value}}))

    assert patch_status(10).returncode == 0
    assert patch_status(11).returncode == 0
    refused = patch_status(9)
    assert refused.returncode != 0
    assert f"status.{field}" in refused.stderr and "never decreases" in refused.stderr, (
        refused.stderr
    )


@pytest.mark.parametrize(("spec", "error"), [
    ({"leaseDurationSeconds": -5}, "spec.leaseDurationSeconds: Invalid value: -5: "
     "spec.leaseDurationSeconds in body should be greater than or equal to 2"),
    ({"leaseDurationSeconds": 99999999999}, "spec.leaseDurationSeconds: Invalid value: "
     "99999999999: spec.leaseDurationSeconds in body should be less than or equal to 86400"),
    ({"leaseDurationSeconds": 10, "maxAttempts": 3000000000}, "spec.maxAttempts: Invalid "
     "value: 3000000000: spec.maxAttempts in body should be less than or equal to 2147483647"),
], ids=["ttl-negative", "ttl-huge", "attempts-huge"])
def test_an_out_of_range_value_gets_one_error_naming_its_field(
        crds_installed: ControlPlane, namespace: str, spec: dict[str, object],
        error: str) -> None:
    """Not the same error twice (an OpenAPI bound and a CEL rule saying the same), nor
    one under the path ``<nil>`` (the API server's ``format: int32`` check)."""
    result = crds_installed.kubectl("create", "-n", namespace, "-f", "-",
                                    input=joblease("bad", spec))
    assert result.returncode != 0
    assert result.stderr.strip() == f'The JobLease "bad" is invalid: {error}', result.stderr
