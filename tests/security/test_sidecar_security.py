"""The sidecar as a real process (the Go binary) with a tenant's
etcd credentials over TLS: it works on its namespace's job, exits with a clear
permission error on another namespace's job, and never logs a secret."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from joblease import JobLeaseClient, JobRef, JobSpec
from joblease.errors import PermissionDeniedError
from joblease.keys import KeySpace
from joblease.tenancy import (
    EtcdAuthAdmin,
    TenantCredentials,
    revoke_tenant_user,
    rotate_to_other_user,
)
from tests.support.etcd_keys import events_since, snapshot, writes
from tests.support.failure_logs import attach_on_failure
from tests.support.secure_etcd import Tenants
from tests.support.sidecar_process import Sidecar, swap_file
from tests.support.waiting import poll


class Sidecars:
    def __init__(self, tmp: Path, t: Tenants, argv: list[str]) -> None:
        self.tmp, self.t, self.argv = tmp, t, argv
        self.started: list[Sidecar] = []

    def start(self, name: str, job: JobRef, creds: TenantCredentials | None,
              **extra: str) -> Sidecar:
        workdir = self.tmp / name
        workdir.mkdir()
        env = {k: v for k, v in os.environ.items() if not k.startswith("JOBLEASE_")}
        env.update({
            "PYTHONUNBUFFERED": "1",
            "JOBLEASE_ETCD_ENDPOINTS": ",".join(self.t.base.endpoints),
            "JOBLEASE_ETCD_CA_FILE": str(self.t.base.ca_file),
            "JOBLEASE_ROOT": self.t.root,
            "JOBLEASE_JOB_NAME": job.name, "JOBLEASE_JOB_NAMESPACE": job.namespace,
            "POD_NAME": f"pod-{name}", "POD_UID": uuid.uuid4().hex[:8],
            "JOBLEASE_SIDECAR_PORT": "0", "JOBLEASE_SIDECAR_PORT_FILE": str(workdir / "port"),
            "JOBLEASE_SIDECAR_PROBE_PORT": "off",
            "JOBLEASE_TOKEN_FILE": str(workdir / "token"),
            "JOBLEASE_SIDECAR_ON_LOSS": "none",
            "JOBLEASE_SIDECAR_REGISTRATION_WAIT": "2",
            # plain processes: a refused claim ends them with the error's exit code
            "JOBLEASE_SIDECAR_ON_FINAL": "exit",
        })
        if creds is not None:
            pw = workdir / "etcd-password"
            pw.write_text(creds.password + "\n")
            env.update({"JOBLEASE_ETCD_USERNAME": creds.username,
                        "JOBLEASE_ETCD_PASSWORD_FILE": str(pw)})
        env.update(extra)
        s = Sidecar(name, workdir, env, self.argv)
        self.started.append(s)
        return s


@pytest.fixture
def sidecars(tmp_path: Path, tenants: Tenants, request: pytest.FixtureRequest,
             sidecar_argv: list[str]) -> Iterator[Sidecars]:
    """Sidecar processes (the Go binary, ``sidecar_argv``)."""
    s = Sidecars(tmp_path, tenants, sidecar_argv)
    yield s
    for p in s.started:
        p.stop()
    attach_on_failure(request, "sidecar logs", lambda: "\n".join(
        f"===== {p.name}\n{p.output()}" for p in s.started))


async def test_sidecar_with_tenant_credentials(sidecars: Sidecars, tenants: Tenants) -> None:
    t = tenants
    job_a, job_b = JobRef(t.ns_a, "etl"), JobRef(t.ns_b, "etl")
    async with JobLeaseClient(t.root_config) as root:
        await root.register(job_a, JobSpec(lease_duration_seconds=5))
        await root.register(job_b, JobSpec(lease_duration_seconds=5))

        bearer = "bearer-" + uuid.uuid4().hex
        secret = sidecars.tmp / "api-token"
        secret.write_text(bearer + "\n")
        good = sidecars.start("a", job_a, t.a, JOBLEASE_SIDECAR_API_TOKEN_FILE=str(secret),
                              JOBLEASE_LOG_LEVEL="DEBUG")
        good.api_token = bearer
        await good.started()
        lease = await good.held()
        r = await good.request("POST", "/v1/complete",
                               json={"token": lease["token"], "result": {"n": 1}})
        assert r.status_code == 200, r.text
        state = await root.get(job_a)
        assert state.result is not None and state.result.token == lease["token"]

        keys_b = root.keys.job(job_b).prefix
        before = await snapshot(root.store, keys_b)
        bad = sidecars.start("b", job_b, t.a)
        assert await bad.wait_exit(30) == PermissionDeniedError.exit_code, bad.output()
        errors = [r for r in bad.log_records() if r.get("level") == "error"]
        assert errors and "permission denied" in errors[0].get("reason", ""), bad.output()
        assert "Traceback" not in bad.output()
        assert not writes(before, await snapshot(root.store, keys_b))
        assert (await root.get(job_b)).holder is None

        # SIGTERM: clean exit, then no secret in any log line
        good.signal(15)
        assert await good.wait_exit(20) == 0
        for s in (good, bad):
            out = s.output()
            assert t.a.password not in out, s.name
            assert bearer not in out, s.name
        assert good.log_records(), "the sidecar logs JSON lines"


async def test_sidecar_with_a_wrong_password_exits_clearly(sidecars: Sidecars,
                                                           tenants: Tenants) -> None:
    t = tenants
    job_a = JobRef(t.ns_a, "etl")
    wrong = TenantCredentials(t.ns_a, t.a.username, "wrong-" + uuid.uuid4().hex, t.a.role,
                              t.a.key_prefix)
    s = sidecars.start("w", job_a, wrong, JOBLEASE_LOG_LEVEL="DEBUG")
    assert await s.wait_exit(30) == PermissionDeniedError.exit_code, s.output()
    assert "authentication failed" in s.output()
    assert wrong.password not in s.output()


async def test_sidecar_rate_limit(sidecars: Sidecars, tenants: Tenants) -> None:
    """JOBLEASE_SIDECAR_RATE_LIMIT: over the limit the API answers 429 + JSON."""
    t = tenants
    job_a = JobRef(t.ns_a, "limited")
    async with JobLeaseClient(t.root_config) as root:
        await root.register(job_a, JobSpec(lease_duration_seconds=5))
    s = sidecars.start("r", job_a, t.a, JOBLEASE_SIDECAR_RATE_LIMIT="2")
    await s.started()
    await poll(lambda: s.token_file.exists(), 30, "the lease")
    async with httpx.AsyncClient(base_url=s.url, timeout=10) as http:
        codes = [(await http.get("/v1/lease")) for _ in range(8)]
    limited = [r for r in codes if r.status_code == 429]
    assert limited, [r.status_code for r in codes]
    body = limited[0].json()
    assert body["error"] == "rate_limited" and "2 requests per second" in body["message"]
    assert int(limited[0].headers["retry-after"]) >= 1
    assert all(r.status_code in (200, 429) for r in codes)



async def test_a_running_sidecar_moves_to_rotated_credentials_without_losing_its_lease(
        sidecars: Sidecars, tenants: Tenants) -> None:
    """Rotation without downtime (operator.tenants): the Secret moves to the namespace's
    other etcd user while the first still works, then the first is deleted. The sidecar
    reads username and password from files; when etcd refuses its old token it reads
    them again and carries on with the same claim: its completion is accepted with the
    token it held from the start, and the old credential is refused afterwards."""
    t = tenants
    job = JobRef(t.ns_a, "rotating")
    admin = EtcdAuthAdmin(t.admin)
    async with JobLeaseClient(t.root_config) as root:
        await root.register(job, JobSpec(lease_duration_seconds=3))
        workdir = sidecars.tmp / "creds"
        workdir.mkdir()
        user_file, password_file = workdir / "username", workdir / "password"
        swap_file(user_file, t.a.username)
        swap_file(password_file, t.a.password)
        s = sidecars.start("r", job, None, JOBLEASE_ETCD_USERNAME_FILE=str(user_file),
                           JOBLEASE_ETCD_PASSWORD_FILE=str(password_file))
        await s.started()
        lease = await s.held()

        new = await rotate_to_other_user(t.admin, t.root, t.ns_a, t.a.username)
        assert new.username != t.a.username
        assert await admin.authenticate(t.a.username, t.a.password)  # both work meanwhile
        swap_file(user_file, new.username)
        swap_file(password_file, new.password)
        assert await revoke_tenant_user(t.admin, t.ns_a, t.a.username)

        revoked = time.monotonic()

        # two TTLs (3 s) of renewals and holder re-checks on the new credentials: the
        # sidecar answers with its lease throughout (it would stop at its safety
        # deadline if its re-checks were refused)
        async def held_past_two_ttls() -> bool:
            r = await s.request("GET", "/v1/lease")
            assert r.status_code == 200 and r.json()["token"] == lease["token"], r.text
            return time.monotonic() - revoked > 6.5
        await poll(held_past_two_ttls, timeout=20, what="the lease held for two TTLs",
                   interval=0.5)
        r = await s.request("POST", "/v1/complete",
                            json={"token": lease["token"], "result": {"rotated": True}})
        assert r.status_code == 200, r.text
        state = await root.get(job)
        assert state.result is not None and state.result.token == lease["token"]
        assert state.generation == 1  # never re-claimed
        assert not await admin.authenticate(t.a.username, t.a.password)
        assert new.password not in s.output() and t.a.password not in s.output()


async def test_a_sidecar_whose_credentials_are_revoked_stops_and_says_why(
        sidecars: Sidecars, tenants: Tenants) -> None:
    """Its user deleted and nothing new to read: the sidecar's renewals are refused, it
    stops answering with its token (never acts on the stale claim) and says why: in
    ``GET /v1/lease``, in ``/readyz`` (503, the reason in its body), in its log, and in
    ``joblease_sidecar_auth_failures_total``. etcd's history of the namespace's whole
    prefix after the revocation holds no write of the sidecar: only the expiry of its
    holder key, etcd's own doing."""
    t = tenants
    job = JobRef(t.ns_a, "revoked")
    async with JobLeaseClient(t.root_config) as root:
        await root.register(job, JobSpec(lease_duration_seconds=3))
        workdir = sidecars.tmp / "revoked-creds"
        workdir.mkdir()
        swap_file(workdir / "username", t.a.username)
        swap_file(workdir / "password", t.a.password)
        s = sidecars.start("x", job, None,
                           JOBLEASE_ETCD_USERNAME_FILE=str(workdir / "username"),
                           JOBLEASE_ETCD_PASSWORD_FILE=str(workdir / "password"))
        await s.started()
        lease = await s.held()
        ready = await s.request("GET", "/readyz")
        assert ready.status_code == 200 and "message" not in ready.json(), ready.text
        assert (await s.metrics())["joblease_sidecar_auth_failures_total"] == 0
        assert await revoke_tenant_user(t.admin, t.ns_a, t.a.username)
        revoked_at, _ = await t.admin.get(b"\0")

        async def lost() -> httpx.Response | None:
            r = await s.request("GET", "/v1/lease")
            return r if r.status_code != 200 else None
        r = await poll(lost, timeout=20, what="the sidecar giving up its lease")
        # the keep-alive is refused at once: lost, with etcd's reason in the body ...
        assert r.status_code == 409 and r.json()["state"] == "lost", r.text
        assert "authentication failed" in r.json()["message"], r.text
        # ... in the readiness answer, so a failing probe names the credential problem ...
        ready = await s.request("GET", "/readyz")
        assert ready.status_code == 503, ready.text
        body = ready.json()
        assert body["ready"] is False and body["state"] == "lost", ready.text
        assert "etcd refused the credentials" in body["message"], ready.text
        assert "authentication failed" in body["message"], ready.text
        # ... and in the metrics
        assert (await s.metrics())["joblease_sidecar_auth_failures_total"] >= 1
        c = await s.request("POST", "/v1/complete",
                            json={"token": lease["token"], "result": {"stale": True}})
        assert c.status_code == 409, c.text  # the stale token is refused
        assert (await root.get(job)).result is None
        # ... and in the log
        lost_lines = [x for x in s.log_records() if x.get("msg") == "lease lost"]
        assert lost_lines and "authentication failed" in lost_lines[0]["reason"], s.output()

        # nothing the sidecar could write reached etcd after the revocation: the only
        # change under the namespace's prefix is its holder key's expiry (TTL 3 s)
        holder = root.keys.job(job).holder
        await poll(lambda: _gone(root, holder), timeout=20, what="the holder key's expiry")
        prefix = KeySpace(t.root).namespace_prefix(t.ns_a)
        after = await events_since(t.admin, prefix, revoked_at)
        assert [(kind, key) for _, kind, key in after] == [("delete", holder)], after


async def _gone(client: JobLeaseClient, key: bytes) -> bool:
    _, kvs = await client.store.get(key)
    return not kvs
