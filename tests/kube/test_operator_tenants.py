"""Per-namespace etcd credentials made by the operator (``--tenant-credentials``).

Real kube-apiserver (``control_plane``), real etcd with TLS and auth enabled
(``auth_etcd`` from tests/support/secure_etcd.py), the operator as a real
process connected as etcd ``root``. Every wait is a condition with a
deadline; the operator's log is attached on failure.
"""

from __future__ import annotations

import base64
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from joblease import EtcdConfig, JobLeaseClient, JobRef
from joblease.embedded import EtcdCluster
from joblease.errors import PermissionDeniedError
from joblease.etcd_store import EtcdStore
from joblease.operator import command as operator_command_module
from joblease.operator.main import OperatorConfig
from joblease.operator.tenants import (
    LABELS,
    MANAGED_BY_LABEL,
    RETIRING_USER_ANNOTATION,
    ROTATE_ANNOTATION,
    SECRET_NAME,
    TENANT_LABEL,
)
from joblease.records import JobSpec
from joblease.tenancy import EtcdAuthAdmin, tenant_status
from tests.support.controlplane import ControlPlane
from tests.support.failure_logs import attach_on_failure
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for
from tests.support.secure_etcd import ROOT_PASSWORD, Pki


# ----------------------------------------------------------------------------- helpers
class TenantOperator(OperatorProcess):
    """The operator as ``root`` over TLS, with ``JOBLEASE_TENANT_CREDENTIALS=1``."""

    def __init__(self, cp: ControlPlane, etcd: EtcdConfig, namespace: str, log: Path,
                 password_file: Path, **extra: str) -> None:
        super().__init__(cp, etcd, namespace, log)
        self.password_file = password_file
        self.extra = extra

    def environment(self) -> dict[str, str]:
        assert self.etcd.ca_file
        env = dict(super().environment(), JOBLEASE_ETCD_CA_FILE=self.etcd.ca_file,
                   JOBLEASE_ETCD_USERNAME="root",
                   JOBLEASE_ETCD_PASSWORD_FILE=str(self.password_file),
                   JOBLEASE_TENANT_CREDENTIALS="1", JOBLEASE_TENANT_RESYNC_INTERVAL="1",
                   JOBLEASE_TENANT_ROTATION_GRACE="2", **self.extra)
        env.pop("JOBLEASE_ETCD_PASSWORD", None)
        return env

    def log_since_start(self) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return text.split(f"===== operator start #{self.starts} =====", 1)[-1]


async def get_secret(kube: Kube) -> dict[str, Any] | None:
    return await kube.get_object("secret", SECRET_NAME)


def secret_data(secret: dict[str, Any]) -> dict[str, str]:
    return {k: base64.b64decode(v).decode() for k, v in secret["data"].items()}


@pytest.fixture
def base_config(auth_etcd: EtcdCluster, pki: Pki,
                request: pytest.FixtureRequest) -> Iterator[EtcdConfig]:
    """endpoints + TLS + a key root private to the test, no credentials."""
    yield EtcdConfig(endpoints=auth_etcd.endpoints, ca_file=str(pki.ca),
                     root=f"/joblease-tenants/{uuid.uuid4().hex[:12]}")
    attach_on_failure(request, "etcd log", auth_etcd.log_tails)


@pytest.fixture
async def admin(base_config: EtcdConfig) -> AsyncIterator[JobLeaseClient]:
    """A root client (registers other namespaces' jobs, checks etcd's auth state)."""
    async with JobLeaseClient(base_config.with_(username="root", password=ROOT_PASSWORD)) as c:
        yield c


@pytest.fixture
async def tenant_operator(crds_installed: ControlPlane, namespace: str, base_config: EtcdConfig,
                          tmp_path: Path, request: pytest.FixtureRequest
                          ) -> AsyncIterator[TenantOperator]:
    password_file = tmp_path / "root-password"
    password_file.write_text(ROOT_PASSWORD + "\n")
    op = TenantOperator(crds_installed, base_config, namespace, tmp_path / "operator.log",
                        password_file)
    async with running_operator(op, request, log_lines=250) as running:
        yield running


# ----------------------------------------------------------------------------- tests
@pytest.mark.kube
async def test_tenant_secret_is_created_idempotent_rotated_and_removed_with_the_last_joblease(
        crds_installed: ControlPlane, namespace: str, tenant_operator: TenantOperator,
        base_config: EtcdConfig, admin: JobLeaseClient) -> None:
    kube = Kube(crds_installed, namespace)
    root_store = admin.store
    assert isinstance(root_store, EtcdStore)
    auth = EtcdAuthAdmin(root_store)
    ns_b = f"other-{uuid.uuid4().hex[:8]}"  # a namespace the tenant must not reach
    seen_passwords: list[str] = []

    # 1. A JobLease in A: the Secret appears, with credentials that work in A only.
    await kube.apply("first", {"leaseDurationSeconds": 5, "maxAttempts": 3})
    secret = await wait_for("the tenant Secret in A", lambda: get_secret(kube))
    assert secret["type"] == "Opaque"
    labels = secret["metadata"].get("labels") or {}
    assert labels[MANAGED_BY_LABEL] == "joblease-operator" and labels[TENANT_LABEL] == "true"
    assert LABELS.items() <= labels.items()
    data = secret_data(secret)
    assert set(data) == {"username", "password", "keyPrefix"}
    assert data["username"] == f"joblease-ns-{namespace}"
    assert data["keyPrefix"] == f"{base_config.root}/{namespace}/"
    assert len(data["password"]) >= 32
    seen_passwords.append(data["password"])
    tenant = base_config.with_(username=data["username"], password=data["password"])

    job_a, job_b = JobRef(namespace, "first"), JobRef(ns_b, "theirs")

    async def registered() -> bool:
        return (await admin.get(job_a)).registered
    await wait_for("registration of A's job", registered)
    await admin.register(job_b, JobSpec(lease_duration_seconds=5))
    async with JobLeaseClient(tenant) as worker:
        lease = await worker.claim(job_a, "tenant-worker")
        assert lease.token > 0
        with pytest.raises(PermissionDeniedError):
            await worker.claim(job_b, "tenant-worker")
        with pytest.raises(PermissionDeniedError):
            await worker.get(job_b)
        await lease.complete({"ok": True})
    assert (await admin.get(job_b)).generation == 0  # the refused claim wrote nothing

    # 2. Idempotent: another JobLease, then a restart, leave the Secret untouched.
    await kube.apply("second", {"leaseDurationSeconds": 5})
    unchanged = f"etcd tenant credentials of namespace {namespace}: unchanged"

    async def second_handled() -> bool:
        return unchanged in tenant_operator.log_since_start()
    await wait_for("the tenant handler of the second JobLease", second_handled)
    tenant_operator.stop()
    tenant_operator.start()
    await tenant_operator.wait_ready()

    async def both_resumed() -> bool:
        return tenant_operator.log_since_start().count(unchanged) >= 2
    await wait_for("both JobLeases' tenant handlers after the restart", both_resumed)
    again = await get_secret(kube)
    assert again is not None
    assert secret_data(again) == data
    assert again["metadata"]["resourceVersion"] == secret["metadata"]["resourceVersion"]
    assert await auth.authenticate(data["username"], data["password"])

    # 3. Rotation on request: annotate the Secret; the resync sets a new password.
    r = await kube.run("annotate", "secret", SECRET_NAME, f"{ROTATE_ANNOTATION}=true")
    assert r.returncode == 0, r.stderr

    async def rotated() -> dict[str, Any] | None:
        s = await get_secret(kube)
        if s is None or ROTATE_ANNOTATION in (s["metadata"].get("annotations") or {}):
            return None
        return s if secret_data(s)["password"] != data["password"] else None
    rotated_secret = await wait_for("the rotated password in the Secret", rotated)
    new = secret_data(rotated_secret)
    seen_passwords.append(new["password"])
    # the Secret moved to the namespace's other user; the first keeps working for the
    # grace period (2 s here), so running sidecars can re-read the Secret first
    assert new["username"] == f"joblease-ns-{namespace}.next"
    assert new["keyPrefix"] == data["keyPrefix"]
    assert await auth.authenticate(new["username"], new["password"])
    notes = rotated_secret["metadata"]["annotations"]
    assert "joblease.io/rotated-at" in notes
    assert notes[RETIRING_USER_ANNOTATION] == data["username"]

    async def retired() -> bool:
        s = await get_secret(kube)
        return s is not None and RETIRING_USER_ANNOTATION not in (
            s["metadata"].get("annotations") or {})
    await wait_for("the old user retired after the grace period", retired)
    assert not await auth.authenticate(data["username"], data["password"])
    assert await auth.authenticate(new["username"], new["password"])
    tenant = base_config.with_(username=new["username"], password=new["password"])

    # Nothing secret in the JobLeases (status included).
    for name in ("first", "second"):
        obj = await kube.get(name)
        assert obj is not None
        assert not any(p in json.dumps(obj) for p in seen_passwords)

    # 4. Deleting one of two JobLeases keeps the credentials ...
    r = await kube.run("delete", "jl", "first", "--wait=false")
    assert r.returncode == 0, r.stderr

    async def first_gone() -> bool:
        return await kube.get("first") is None
    await wait_for("the first JobLease gone", first_gone)
    kept = await get_secret(kube)
    assert kept is not None and secret_data(kept) == new
    assert await auth.authenticate(new["username"], new["password"])

    # ... deleting the last one removes the Secret and the etcd user and role.
    r = await kube.run("delete", "jl", "second", "--wait=false")
    assert r.returncode == 0, r.stderr

    async def second_gone() -> bool:
        return await kube.get("second") is None
    await wait_for("the last JobLease gone", second_gone)
    # the finalizer is released only after the tenant was removed: no waiting needed
    assert await get_secret(kube) is None
    status = await tenant_status(root_store, namespace)
    assert not status.user_exists and not status.role_exists
    assert not await auth.authenticate(new["username"], new["password"])
    with pytest.raises(PermissionDeniedError):
        async with JobLeaseClient(tenant) as gone:
            await gone.get(JobRef(namespace, "whatever"))

    # Never a password in the operator's log.
    log_text = tenant_operator.log.read_text(errors="replace")
    assert "tenant credentials of namespace" in log_text
    assert not any(p in log_text for p in [*seen_passwords, ROOT_PASSWORD])


@pytest.fixture
async def label_operator(crds_installed: ControlPlane, namespace: str,
                         base_config: EtcdConfig, pki: Pki, tmp_path: Path,
                         request: pytest.FixtureRequest) -> AsyncIterator[TenantOperator]:
    """The operator as the chart runs it: tenants follow the injection label, the
    workers' TLS files go into each Secret. Served namespaces: this test's only (a
    glob of its prefix), so other tests' namespaces are not touched."""
    password_file = tmp_path / "root-password"
    password_file.write_text(ROOT_PASSWORD + "\n")
    tls = tmp_path / "worker-tls"
    tls.mkdir()
    for key, text in (("ca.crt", "CA"), ("tls.crt", "CERT"), ("tls.key", "KEY")):
        (tls / key).write_text(f"worker {text}\n")
    op = TenantOperator(crds_installed, base_config, namespace, tmp_path / "operator.log",
                        password_file, JOBLEASE_TENANT_NAMESPACE_LABEL=INJECT_LABEL,
                        JOBLEASE_TENANT_TLS_DIR=str(tls))
    async with running_operator(op, request, log_lines=250) as running:
        yield running


INJECT_LABEL = "joblease.io/inject=enabled"


@pytest.mark.kube
async def test_tenants_follow_the_injection_label(
        crds_installed: ControlPlane, namespace: str, label_operator: TenantOperator,
        base_config: EtcdConfig, admin: JobLeaseClient) -> None:
    """Labelling the namespace is the only step: its Secret (credentials and the
    workers' TLS files) appears without any JobLease; removing the label deletes the
    etcd users, the role and the Secret, and the credentials stop working."""
    kube = Kube(crds_installed, namespace)
    auth = EtcdAuthAdmin(admin.store)  # type: ignore[arg-type]
    assert await get_secret(kube) is None
    labelled = time.monotonic()
    r = await kube.run("label", "namespace", namespace, INJECT_LABEL, "--overwrite")
    assert r.returncode == 0, r.stderr
    secret = await wait_for("the tenant Secret after labelling", lambda: get_secret(kube))
    provisioned = time.monotonic() - labelled
    data = secret_data(secret)
    assert data["username"] == f"joblease-ns-{namespace}"
    assert (data["ca.crt"], data["tls.crt"], data["tls.key"]) == (
        "worker CA\n", "worker CERT\n", "worker KEY\n")
    tenant = base_config.with_(username=data["username"], password=data["password"])
    job = JobRef(namespace, "labelled")
    await admin.register(job, JobSpec(lease_duration_seconds=5))
    async with JobLeaseClient(tenant) as worker:
        lease = await worker.claim(job, "w")
        await lease.complete({"ok": True})
    print(f"\nlabel -> tenant Secret: {provisioned:.2f} s")

    unlabelled = time.monotonic()
    r = await kube.run("label", "namespace", namespace, INJECT_LABEL.split("=")[0] + "-")
    assert r.returncode == 0, r.stderr

    async def removed() -> bool:
        return await get_secret(kube) is None and not await auth.authenticate(
            data["username"], data["password"])
    await wait_for("the tenant removed after unlabelling", removed)
    print(f"unlabel -> credentials refused: {time.monotonic() - unlabelled:.2f} s")
    status = await tenant_status(admin.store, namespace)  # type: ignore[arg-type]
    assert not status.user_exists and not status.role_exists
    with pytest.raises(PermissionDeniedError):
        async with JobLeaseClient(tenant) as gone:
            await gone.get(job)


@pytest.mark.kube
async def test_a_foreign_secret_of_the_same_name_is_left_alone(
        crds_installed: ControlPlane, namespace: str, tenant_operator: TenantOperator,
        admin: JobLeaseClient) -> None:
    kube = Kube(crds_installed, namespace)
    r = await kube.run("create", "secret", "generic", SECRET_NAME,
                       "--from-literal=password=mine")
    assert r.returncode == 0, r.stderr
    await kube.apply("job", {"leaseDurationSeconds": 5})

    async def refused() -> bool:
        return "is not labelled" in tenant_operator.log_since_start()
    await wait_for("the operator refusing to overwrite the foreign Secret", refused)
    secret = await get_secret(kube)
    assert secret is not None and secret_data(secret) == {"password": "mine"}
    # Registration does not depend on the tenant handler.
    await kube.status_where("job", "Pending", lambda s: s["phase"] == "Pending")
    r = await kube.run("delete", "jl", "job", "--wait=false")
    assert r.returncode == 0, r.stderr

    async def gone() -> bool:
        return await kube.get("job") is None
    await wait_for("the JobLease gone", gone)
    secret = await get_secret(kube)
    assert secret is not None and secret_data(secret) == {"password": "mine"}


def test_tenant_credentials_are_off_by_default_and_switched_on_by_flag_or_env(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the command's flag and environment parsing is under test here, so the
    operator it would start is replaced by a function that records its config
    (the operator itself runs for real in the tests above)."""
    seen: list[OperatorConfig] = []

    async def fake_run(config: OperatorConfig) -> None:
        seen.append(config)

    monkeypatch.setattr(operator_command_module, "run_operator", fake_run)
    monkeypatch.delenv("JOBLEASE_TENANT_CREDENTIALS", raising=False)
    runner = CliRunner()
    cmd = operator_command_module.operator_command
    assert runner.invoke(cmd, []).exit_code == 0
    assert runner.invoke(cmd, ["--tenant-credentials",
                               "--tenant-resync-interval", "5"]).exit_code == 0
    assert runner.invoke(cmd, [], env={"JOBLEASE_TENANT_CREDENTIALS": "1"}).exit_code == 0
    assert [(c.tenant_credentials, c.tenant_resync_interval) for c in seen] == [
        (False, 60.0), (True, 5.0), (True, 60.0)]
