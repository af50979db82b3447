"""Per-namespace etcd credentials made by the operator (``--tenant-credentials``).

Real kube-apiserver (``control_plane``), real etcd with TLS and auth enabled
(``auth_etcd`` from tests/support/secure_etcd.py), the operator as a real
process connected as etcd ``root``. Every wait is a condition with a
deadline; the operator's log is attached on failure.
"""

from __future__ import annotations

import asyncio
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
from tests.support.etcd_keys import events_since
from tests.support.failure_logs import attach_on_failure
from tests.support.operator import Kube, OperatorProcess, running_operator, wait_for
from tests.support.secure_etcd import ROOT_PASSWORD, Pki
from tests.support.sidecar_process import Env, Sidecar, swap_file
from tests.support.waiting import poll


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
                   JOBLEASE_TENANT_ROTATION_GRACE="2")
        env.update(self.extra)
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
def operator_settings() -> dict[str, str]:
    """Extra operator environment for ``tenant_operator`` (a test overrides it)."""
    return {}


@pytest.fixture
async def tenant_operator(crds_installed: ControlPlane, namespace: str, base_config: EtcdConfig,
                          tmp_path: Path, request: pytest.FixtureRequest,
                          operator_settings: dict[str, str]) -> AsyncIterator[TenantOperator]:
    password_file = tmp_path / "root-password"
    password_file.write_text(ROOT_PASSWORD + "\n")
    op = TenantOperator(crds_installed, base_config, namespace, tmp_path / "operator.log",
                        password_file, **operator_settings)
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


#: The load's lease TTL. 3 s lost a lease at the old user's deletion on this 2-core
#: machine at load 15-19 (a keep-alive unanswered for its 1 s timeout, then the
#: re-authentication after the 2.4 s safety deadline): 6 s leaves room for both.
LOAD_TTL = 6



@pytest.mark.kube
@pytest.mark.parametrize("operator_settings", [{"JOBLEASE_TENANT_ROTATION_GRACE": "6"}],
                         ids=["grace-6s"])
async def test_rotation_under_a_steady_claim_complete_load(
        crds_installed: ControlPlane, namespace: str, tenant_operator: TenantOperator,
        base_config: EtcdConfig, admin: JobLeaseClient, tmp_path: Path,
        sidecar_argv: list[str], request: pytest.FixtureRequest) -> None:
    """Credential rotation under load (issue 28): three workers, each a loop of real Go
    sidecars (one per job: claim, hold through a renewal, complete, stop), and a
    fourth whose one sidecar claims on the old user and holds until that user is deleted
    (it must re-read the files when etcd refuses its token) and two renewals more, on
    jobs of one namespace, while the
    operator rotates its credentials (the rotation annotation; grace 6 s and resync 1 s
    through the operator's own settings, ``operator_settings``: 2 s was shorter than this
    test's own copy of the Secret into the files takes at load 15, kubectl included). The
    sidecars read the
    username and password files the test keeps in step with the Secret, as the kubelet
    would for a mounted Secret (no kubelet runs here: that copy is the only stand-in).

    Asserted: completions happened in each phase (before the switch, during the grace
    when both users work, after the old user's deletion); no claim or completion failed
    and no lease was lost; every job completed exactly once, by the token it was
    claimed with (etcd's history of the namespace's prefix: one put of each result);
    the old user is gone and its password refused at the end."""
    kube = Kube(crds_installed, namespace)
    root_store = admin.store
    assert isinstance(root_store, EtcdStore)
    auth = EtcdAuthAdmin(root_store)
    await kube.apply("anchor", {"leaseDurationSeconds": 5})  # opts the namespace in
    first = secret_data(await wait_for("the tenant Secret", lambda: get_secret(kube)))
    creds_dir = tmp_path / "mounted-secret"
    creds_dir.mkdir()
    user_file, password_file = creds_dir / "username", creds_dir / "password"
    swap_file(user_file, first["username"])
    swap_file(password_file, first["password"])
    start, _ = await root_store.get(b"\0")

    phase = "before"
    done: dict[str, list[str]] = {"before": [], "grace": [], "after": []}
    tokens: dict[JobRef, int] = {}
    failures: list[str] = []
    env = Env(tmp_path, base_config, sidecar_argv)
    stop = asyncio.Event()
    counter = iter(range(10_000))

    async def worker(w: int, *, long: bool = False) -> None:
        while not stop.is_set():
            n = next(counter)
            job = JobRef(namespace, f"load-{n}")
            await admin.register(job, JobSpec(lease_duration_seconds=LOAD_TTL))
            s = env.sidecar(f"w{w}-{n}", JOBLEASE_JOB_NAME=job.name,
                            JOBLEASE_JOB_NAMESPACE=namespace,
                            JOBLEASE_ETCD_CA_FILE=str(base_config.ca_file),
                            JOBLEASE_ETCD_USERNAME_FILE=str(user_file),
                            JOBLEASE_ETCD_PASSWORD_FILE=str(password_file))
            await s.started()
            try:
                lease = await s.held()
            except AssertionError as exc:
                failures.append(f"{job}: no lease: {exc}")
                return
            try:  # the work: held through a renewal
                await _renewed(s, lease["token"], times=1)
                while long and phase != "after":  # on the old user until it is deleted
                    await _renewed(s, lease["token"], times=1)
                if long:  # and renewing on the new one after
                    await _renewed(s, lease["token"], times=2)
            except AssertionError as exc:
                failures.append(f"{job}: {exc}")
                return
            r = await s.request("POST", "/v1/complete",
                                json={"token": lease["token"], "result": {"n": n}})
            if r.status_code != 200:
                failures.append(f"{job}: completion {r.status_code} {r.text}")
                return
            tokens[job] = lease["token"]
            done[phase].append(job.name)  # the phase the completion was accepted in
            s.signal(15)
            if (code := await s.wait_exit(20)) != 0 or s.logged("lease lost"):
                failures.append(f"{job}: exit {code}, lease lost: {s.logged('lease lost')}")
                return
            if long:
                spanned.append(job)
                return

    spanned: list[JobRef] = []
    workers = [asyncio.create_task(worker(w)) for w in range(3)]
    workers.append(asyncio.create_task(worker(3, long=True)))
    try:
        await wait_for("completions before the rotation", lambda: _at_least(done["before"], 3),
                       timeout=60)
        assert not spanned and not stop.is_set()
        r = await kube.run("annotate", "secret", SECRET_NAME, f"{ROTATE_ANNOTATION}=true")
        assert r.returncode == 0, r.stderr

        async def moved() -> dict[str, str] | None:
            s = await get_secret(kube)
            data = secret_data(s) if s else {}
            return data if data.get("username", first["username"]) != first["username"] else None
        new = await wait_for("the Secret moved to the other user", moved)
        swap_file(user_file, new["username"])  # the kubelet's part: the mounted files follow
        swap_file(password_file, new["password"])
        phase = "grace"
        assert await auth.authenticate(first["username"], first["password"])  # both work

        async def old_user_gone() -> bool:
            return await auth.user_roles(first["username"]) is None
        await wait_for("the old user deleted after the grace", old_user_gone)
        phase = "after"
        await wait_for("completions after the old user's deletion",
                       lambda: _at_least(done["after"], 3), timeout=60)
    finally:
        stop.set()
        await asyncio.gather(*workers, return_exceptions=True)
        env.stop()
        attach_on_failure(request, "sidecar logs", env.logs)
    for w in workers:
        assert w.exception() is None, w.exception()
    assert not failures, failures
    assert all(done[p] for p in ("before", "grace", "after")), done
    assert len(spanned) == 1, spanned  # the long holder moved users and kept its claim

    after = await events_since(root_store, f"{base_config.root}/{namespace}/", start)
    results = [key for _, kind, key in after if kind == "put" and key.endswith(b"/result")]
    assert len(results) == len(set(results)) == len(tokens), results  # each exactly once
    for job, token in tokens.items():
        state = await admin.get(job)
        assert state.result is not None and state.result.token == token, job
        assert state.generation == 1, job  # never re-claimed: no lease was lost
    assert await auth.user_roles(first["username"]) is None
    assert not await auth.authenticate(first["username"], first["password"])


async def _renewed(s: Sidecar, token: int, times: int) -> None:
    """Until the sidecar's lease was renewed ``times`` times (its remaining seconds went
    up), answered with ``token`` throughout."""
    seen = {"last": float("inf"), "renewals": 0}

    async def renewed() -> bool:
        r = await s.request("GET", "/v1/lease")
        assert r.status_code == 200 and r.json()["token"] == token, r.text
        left = r.json()["remainingSeconds"]
        if left > seen["last"]:
            seen["renewals"] += 1
        seen["last"] = left
        return seen["renewals"] >= times
    await poll(renewed, timeout=20, what=f"{times} renewals", interval=0.1)


async def _at_least(items: list[str], n: int) -> bool:
    return len(items) >= n
