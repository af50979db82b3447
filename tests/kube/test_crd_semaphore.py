"""The JobSemaphore CRD installs and the API server enforces its schema and CEL rule
(each bad spec refused with a message naming its field, nothing created)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.support.controlplane import ControlPlane

pytestmark = pytest.mark.kube


def jobsemaphore(name: str, spec: dict[str, object]) -> str:
    return json.dumps({"apiVersion": "joblease.io/v1alpha1", "kind": "JobSemaphore",
                       "metadata": {"name": name}, "spec": spec})


def test_crd_established_with_short_name_and_columns(crds_installed: ControlPlane,
                                                     namespace: str) -> None:
    cp = crds_installed
    crd = json.loads(cp.kubectl("get", "crd", "jobsemaphores.joblease.io", "-o", "json",
                                check=True).stdout)
    assert crd["spec"]["names"]["shortNames"] == ["jsem"]
    assert crd["spec"]["scope"] == "Namespaced"
    version = crd["spec"]["versions"][0]
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Limit", "Live", "Waiters", "Age"]
    assert version["subresources"] == {"status": {}}
    cp.kubectl("apply", "-n", namespace, "-f", "-", check=True,
               input=jobsemaphore("db", {"limit": 3}))
    table = cp.kubectl("get", "jsem", "-n", namespace, check=True).stdout
    assert table.split()[:6] == ["NAME", "LIMIT", "LIVE", "WAITERS", "AGE", "db"]
    assert table.split()[6] == "3"


@pytest.mark.parametrize(("spec", "error"), [
    ({"limit": 0}, "spec.limit: Invalid value: 0: "
     "spec.limit in body should be greater than or equal to 1"),
    ({"limit": 10001}, "spec.limit: Invalid value: 10001: "
     "spec.limit in body should be less than or equal to 10000"),
    ({}, "spec.limit: Required value"),
    ({"limit": "3"}, 'spec.limit: Invalid value: "string": '
     'spec.limit in body must be of type integer: "string"'),
], ids=["limit-0", "limit-too-big", "limit-missing", "limit-string"])
def test_invalid_jobsemaphore_refused_with_one_clear_error(
        crds_installed: ControlPlane, namespace: str, spec: dict[str, object],
        error: str) -> None:
    cp = crds_installed
    result = cp.kubectl("create", "-n", namespace, "-f", "-", input=jobsemaphore("bad", spec))
    assert result.returncode != 0, result.stdout
    text = result.stderr.strip()
    if text.startswith('The JobSemaphore "bad" is invalid: \n'):
        # A structural error (a missing or mistyped field) stops the API server before
        # the CEL rules (status.etcdRevision's), and it says so in a second line under
        # <nil>: the only other line allowed (as for JobQueue).
        lines = [line.strip().removeprefix("* ") for line in text.splitlines()[1:]]
        assert lines[0] == error and all(
            line.startswith("<nil>: Invalid value: null: some validation rules were not "
                            "checked") for line in lines[1:]), text
    else:
        assert text == f'The JobSemaphore "bad" is invalid: {error}', text
    assert "NotFound" in cp.kubectl("get", "jsem", "bad", "-n", namespace).stderr


def test_status_etcd_revision_never_decreases(crds_installed: ControlPlane,
                                              namespace: str) -> None:
    cp = crds_installed
    cp.kubectl("create", "-n", namespace, "-f", "-", check=True,
               input=jobsemaphore("rev", {"limit": 1}))

    def patch(value: int) -> subprocess.CompletedProcess[str]:
        return cp.kubectl("patch", "jsem", "rev", "-n", namespace, "--subresource=status",
                          "--type=merge", "-p", json.dumps({"status": {"etcdRevision": value}}))
    ok = patch(10)
    assert ok.returncode == 0, ok.stderr
    refused = patch(9)
    assert refused.returncode != 0
    assert "status.etcdRevision" in refused.stderr and "never decreases" in refused.stderr
    got = json.loads(cp.kubectl("get", "jsem", "rev", "-n", namespace, "-o", "json",
                                check=True).stdout)
    assert got["status"]["etcdRevision"] == 10
