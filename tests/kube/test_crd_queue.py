"""The JobQueue CRD installs and the API server enforces its schema and CEL rules
(each bad spec refused with a message naming its field, nothing created)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def jobqueue(name: str, spec: dict[str, object]) -> str:
    return json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobQueue",
                       "metadata": {"name": name}, "spec": spec})


def test_crd_established_with_short_name_and_columns(crds_installed: ControlPlane) -> None:
    crd = json.loads(crds_installed.kubectl("get", "crd", "jobqueues.joblease.io", "-o",
                                            "json", check=True).stdout)
    assert crd["spec"]["names"]["shortNames"] == ["jq"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Pending", "Held", "Completed", "Failed", "Age"]
    assert version["subresources"] == {"status": {}}
    assert "retention" not in version["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"]  # not implemented yet: no field that would be silently ignored


def test_valid_jobqueue_accepted_with_defaults(crds_installed: ControlPlane,
                                               namespace: str) -> None:
    cp = crds_installed
    cp.kubectl("apply", "-n", namespace, "-f", "-", check=True,
               input=jobqueue("ok", {"leaseDurationSeconds": 30}))
    got = json.loads(cp.kubectl("get", "jq", "ok", "-n", namespace, "-o", "json",
                                check=True).stdout)
    assert got["spec"] == {"leaseDurationSeconds": 30, "maxAttempts": 3, "suspend": False,
                           "historyLimit": 3}
    table = cp.kubectl("get", "jq", "-n", namespace, check=True).stdout
    assert table.split()[:6] == ["NAME", "PENDING", "HELD", "COMPLETED", "FAILED", "AGE"]


@pytest.mark.parametrize(("spec", "error"), [
    ({"leaseDurationSeconds": 1}, "spec.leaseDurationSeconds: Invalid value: 1: "
     "spec.leaseDurationSeconds in body should be greater than or equal to 2"),
    ({"leaseDurationSeconds": 86401}, "spec.leaseDurationSeconds: Invalid value: 86401: "
     "spec.leaseDurationSeconds in body should be less than or equal to 86400"),
    ({"maxAttempts": 2}, "spec.leaseDurationSeconds: Required value"),
    ({"leaseDurationSeconds": 10, "maxAttempts": -1}, "spec.maxAttempts: Invalid value: -1: "
     "spec.maxAttempts in body should be greater than or equal to 0"),
    ({"leaseDurationSeconds": 10, "shards": 100001}, "spec.shards: Invalid value: 100001: "
     "spec.shards in body should be less than or equal to 100000"),
    ({"leaseDurationSeconds": 10, "shards": -1}, "spec.shards: Invalid value: -1: "
     "spec.shards in body should be greater than or equal to 0"),
    ({"leaseDurationSeconds": 10, "suspend": "yes"}, 'spec.suspend: Invalid value: "string": '
     'spec.suspend in body must be of type boolean: "string"'),
    ({"leaseDurationSeconds": 10, "historyLimit": 101}, "spec.historyLimit: Invalid value: "
     "101: spec.historyLimit in body should be less than or equal to 100"),
    ({"leaseDurationSeconds": 10, "historyLimit": -1}, "spec.historyLimit: Invalid value: "
     "-1: spec.historyLimit in body should be greater than or equal to 0"),
], ids=["ttl-1", "ttl-too-long", "ttl-missing", "attempts-negative", "shards-too-many",
        "shards-negative", "suspend-string", "history-limit-too-large",
        "history-limit-negative"])
def test_invalid_jobqueue_refused_with_one_clear_error(
        crds_installed: ControlPlane, namespace: str, spec: dict[str, object],
        error: str) -> None:
    cp = crds_installed
    result = cp.kubectl("create", "-n", namespace, "-f", "-", input=jobqueue("bad", spec))
    assert result.returncode != 0, result.stdout
    text = result.stderr.strip()
    if text.startswith('The JobQueue "bad" is invalid: \n'):
        # Several errors, one a line. A structural error (a missing or mistyped field)
        # stops the API server before the spec's CEL rule (shards' transition rule),
        # and it says so in a second line under <nil>: the only other line allowed.
        lines = [line.strip().removeprefix("* ") for line in text.splitlines()[1:]]
        assert lines[0] == error and all(
            line.startswith("<nil>: Invalid value: null: some validation rules were not "
                            "checked") for line in lines[1:]), text
    else:
        assert text == f'The JobQueue "bad" is invalid: {error}', text
    assert "NotFound" in cp.kubectl("get", "jq", "bad", "-n", namespace).stderr


@pytest.mark.parametrize(("before", "after"), [
    ({"shards": 4}, {"shards": 5}),
    ({"shards": 4}, {}),
    ({}, {"shards": 3}),
], ids=["changed", "removed", "added"])
def test_shards_are_immutable(crds_installed: ControlPlane, namespace: str,
                              before: dict[str, object], after: dict[str, object]) -> None:
    cp = crds_installed
    cp.kubectl("create", "-n", namespace, "-f", "-", check=True,
               input=jobqueue("sharded", {"leaseDurationSeconds": 10, **before}))
    result = cp.kubectl("replace", "-n", namespace, "-f", "-",
                        input=jobqueue("sharded", {"leaseDurationSeconds": 10, **after}))
    assert result.returncode != 0, result.stdout
    assert "spec.shards is immutable once the queue exists" in result.stderr, result.stderr
    got = json.loads(cp.kubectl("get", "jq", "sharded", "-n", namespace, "-o", "json",
                                check=True).stdout)
    assert got["spec"].get("shards") == before.get("shards")
    # Other fields stay mutable, and absent shards equal 0 shards.
    ok = cp.kubectl("replace", "-n", namespace, "-f", "-", input=jobqueue("sharded", {
        "leaseDurationSeconds": 20, "suspend": True, "shards": before.get("shards", 0)}))
    assert ok.returncode == 0, ok.stderr


def test_status_etcd_revision_never_moves_backwards(crds_installed: ControlPlane,
                                                    namespace: str) -> None:
    cp = crds_installed
    cp.kubectl("apply", "-n", namespace, "-f", "-", check=True,
               input=jobqueue("mono", {"leaseDurationSeconds": 5}))

    def patch_status(value: int) -> subprocess.CompletedProcess[str]:
        return cp.kubectl("patch", "jq", "mono", "-n", namespace, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {"etcdRevision": value}}))

    assert patch_status(10).returncode == 0
    assert patch_status(11).returncode == 0
    refused = patch_status(9)
    assert refused.returncode != 0
    assert "status.etcdRevision" in refused.stderr and "never decreases" in refused.stderr, (
        refused.stderr)
