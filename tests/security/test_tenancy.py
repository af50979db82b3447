"""etcd auth with per-namespace roles: a tenant works on its own namespace and is
refused -- by etcd, with nothing written -- everywhere else; rotation and
removal take effect."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from joblease import JobLeaseClient, JobRef, JobSpec, Lease
from joblease.errors import InvalidInputError, PermissionDeniedError
from joblease.etcd_store import EtcdStore
from joblease.fencing import Effect, EtcdGate, guarded_put
from joblease.records import Holder
from joblease.store import KeyValue, Put
from joblease.tenancy import (
    EtcdAuthAdmin,
    ensure_namespace_tenant,
    remove_namespace_tenant,
    rotate_tenant_password,
    tenant_key_range,
    tenant_name,
    tenant_status,
)
from tests.support.etcd_keys import from_kvs, writes
from tests.support.secure_etcd import ROOT_PASSWORD, Tenants

SPEC = JobSpec(lease_duration_seconds=10, max_attempts=3)


async def _snapshot(t: Tenants) -> tuple[int, list[KeyValue]]:
    """Everything under the test's root, read as root (the revision is the shared
    etcd's: compare the keys, never it)."""
    return await t.admin.get(f"{t.root}/".encode(), prefix=True)


async def test_tenant_role_is_exactly_the_namespace_prefix(tenants: Tenants) -> None:
    t = tenants
    status = await tenant_status(t.admin, t.ns_a)
    key, end = tenant_key_range(t.root, t.ns_a)
    assert key == f"{t.root}/{t.ns_a}/".encode() and end == f"{t.root}/{t.ns_a}0".encode()
    assert status.in_place(t.root)
    assert status.user_roles == (tenant_name(t.ns_a),)
    assert status.permissions == (("READWRITE", key, end),)
    assert t.a.username == t.a.role == f"joblease-ns-{t.ns_a}"
    assert t.a.key_prefix == key.decode()
    assert t.a.password not in repr(t.a)
    assert t.a.secret_data() == {"username": t.a.username, "password": t.a.password,
                                 "keyPrefix": t.a.key_prefix}


async def test_ensure_is_idempotent_and_repairs(tenants: Tenants) -> None:
    t = tenants
    admin = EtcdAuthAdmin(t.admin)
    # same password back: nothing changes, the stored credentials keep working
    again = await ensure_namespace_tenant(t.admin, t.root, t.ns_a, password=t.a.password)
    assert again == t.a
    # drift: a wider permission and a foreign role are removed again
    name = tenant_name(t.ns_a)
    await admin.role_grant_readwrite(name, b"/", b"\x00")
    await admin.user_grant_role(name, tenant_name(t.ns_b))
    assert not (await tenant_status(t.admin, t.ns_a)).in_place(t.root)
    repaired = await ensure_namespace_tenant(t.admin, t.root, t.ns_a, password=t.a.password)
    assert repaired.password == t.a.password
    assert (await tenant_status(t.admin, t.ns_a)).in_place(t.root)
    # a password etcd does not accept (a lost Secret) is replaced by a new one
    fresh = await ensure_namespace_tenant(t.admin, t.root, t.ns_a, password="not-it")
    assert fresh.password != t.a.password and fresh.password != "not-it"
    assert await admin.authenticate(name, fresh.password)
    assert not await admin.authenticate(name, t.a.password)
    with pytest.raises(InvalidInputError):
        await ensure_namespace_tenant(t.admin, t.root, "Not_A_Namespace")


async def test_tenant_works_on_its_own_namespace(tenants: Tenants) -> None:
    t = tenants
    job = JobRef(t.ns_a, "report")
    async with JobLeaseClient(t.config(t.a)) as a:
        await a.register(job, SPEC)
        lease = await a.claim(job, "worker-a")
        assert lease.generation == 1
        assert [s.job for s in await a.list(t.ns_a)] == [job]
        record = await lease.complete({"rows": 1})
        assert record.token == lease.token
        lease2_job = JobRef(t.ns_a, "other")
        await a.register(lease2_job, SPEC)
        async with await a.claim(lease2_job, "worker-a"):
            pass  # released (and the session lease revoked) on close: needs no more rights
    async with JobLeaseClient(t.root_config) as root:
        state = await root.get(job)
    assert state.result is not None and state.result.token == lease.token


async def test_tenant_is_refused_on_another_namespace(tenants: Tenants) -> None:
    t = tenants
    job_b = JobRef(t.ns_b, "payroll")
    async with JobLeaseClient(t.config(t.b)) as b, JobLeaseClient(t.config(t.a)) as a:
        await b.register(job_b, SPEC)
        lease_b = await b.claim(job_b, "worker-b")
        job_a = JobRef(t.ns_a, "mine")
        await a.register(job_a, SPEC)
        lease_a = await a.claim(job_a, "worker-a")

        before = await _snapshot(t)
        keys_b = a.keys.job(job_b)
        holder_b = next(kv for kv in before[1] if kv.key == keys_b.holder)

        with pytest.raises(PermissionDeniedError):
            await a.get(job_b)
        with pytest.raises(PermissionDeniedError):
            await a.list(t.ns_b)
        with pytest.raises(PermissionDeniedError):
            await a.list()  # the whole root
        with pytest.raises(PermissionDeniedError):
            await a.register(job_b, SPEC)
        with pytest.raises(PermissionDeniedError):
            await a.claim(job_b, "worker-a")
        with pytest.raises(PermissionDeniedError):
            await a.unregister(job_b)
        with pytest.raises(PermissionDeniedError):
            await a.lease_for(job_b, "worker-b", lease_b.token)
        # even knowing B's token, owner and claim id (say, leaked), A cannot complete
        stolen = Lease(store=a.store, session=None, job=job_b, keys=keys_b, owner="worker-b",
                       claim_id=str(Holder.decode_value(holder_b.value).get("claimId")),
                       token=lease_b.token, generation=lease_b.generation, ttl=10,
                       holder_value=holder_b.value)
        with pytest.raises(PermissionDeniedError):
            await stolen.complete({"forged": True})
        with pytest.raises(PermissionDeniedError):
            await stolen.release()
        # fencing: A's own valid lease cannot carry writes into B's prefix ...
        with pytest.raises(PermissionDeniedError):
            await guarded_put(a.store, lease_a, [Put(keys_b.prefix + b"output", b"x")])
        # ... nor can A move a fencing gate that lives under B's prefix
        gate = EtcdGate(a.store, root=f"{t.root}/{t.ns_b}/fence")
        with pytest.raises(PermissionDeniedError):
            await gate.admit(Effect("db-table", lease_a.token, "k1"),
                             puts=[Put(keys_b.prefix + b"output", b"x")])
        # leases: attaching a key to B's etcd lease, or revoking it, needs write
        # permission on the keys already attached to it (B's holder)
        with pytest.raises(PermissionDeniedError):
            await a.store.put(a.keys.job(job_a).prefix + b"tmp", b"x", lease=holder_b.lease)
        with pytest.raises(PermissionDeniedError):
            await a.store.revoke(holder_b.lease)

        after = await _snapshot(t)
        # same keys with the same revisions under the test's root: nothing written
        assert not writes(from_kvs(before[1]), from_kvs(after[1]))
        assert (await b.get(job_b)).holder is not None
        await lease_b.complete({"ok": True})  # B is unaffected
        await lease_a.release()


async def test_client_without_or_with_wrong_credentials(tenants: Tenants) -> None:
    t = tenants
    job = JobRef(t.ns_a, "x")
    for config in (t.base, t.base.with_(username=t.a.username, password="wrong"),
                   t.base.with_(username="nobody", password="x")):
        async with JobLeaseClient(config.with_(request_timeout=3)) as c:
            with pytest.raises(PermissionDeniedError):
                await c.get(job)


def test_cli_with_tenant_credentials(tenants: Tenants, tmp_path: object) -> None:
    from pathlib import Path

    from joblease.cli import main

    t = tenants
    assert isinstance(tmp_path, Path)
    pw = tmp_path / "password"
    pw.write_text(t.a.password + "\n")
    env = {"JOBLEASE_ETCD_ENDPOINTS": ",".join(t.base.endpoints),
           "JOBLEASE_ETCD_CA_FILE": str(t.base.ca_file), "JOBLEASE_ROOT": t.root,
           "JOBLEASE_ETCD_USERNAME": t.a.username,
           "JOBLEASE_ETCD_PASSWORD_FILE": str(pw)}
    runner = CliRunner()
    r = runner.invoke(main, ["register", "cli", "-n", t.ns_a, "--ttl", "5"], env=env)
    assert r.exit_code == 0, r.output
    for args in (["register", "cli", "-n", t.ns_b, "--ttl", "5"], ["get", "cli", "-n", t.ns_b],
                 ["claim", "cli", "-n", t.ns_b, "--owner", "me"], ["list"]):
        r = runner.invoke(main, args, env=env)
        assert r.exit_code == 12, (args, r.output)
        assert "forbidden" in r.output and "permission denied" in r.output
        assert t.a.password not in r.output


async def test_rotation_and_removal(tenants: Tenants) -> None:
    t = tenants
    job = JobRef(t.ns_a, "rotating")
    old = t.config(t.a)
    async with JobLeaseClient(old) as before:
        await before.register(job, SPEC)  # this client now holds a simple token
        new = await rotate_tenant_password(t.admin, t.root, t.ns_a)
        assert new.password != t.a.password and new.username == t.a.username
        # etcd invalidated the old session's token; re-authenticating with the old
        # password fails
        with pytest.raises(PermissionDeniedError):
            await before.get(job)
    async with JobLeaseClient(old) as c:
        with pytest.raises(PermissionDeniedError):
            await c.get(job)
    async with JobLeaseClient(t.config(new)) as c:
        assert (await c.get(job)).registered
        assert await remove_namespace_tenant(t.admin, t.ns_a)
        # the open session's token is gone with the user
        with pytest.raises(PermissionDeniedError):
            await c.get(job)
    async with JobLeaseClient(t.config(new)) as c:
        with pytest.raises(PermissionDeniedError):
            await c.get(job)
    status = await tenant_status(t.admin, t.ns_a)
    assert not status.user_exists and not status.role_exists
    assert not await remove_namespace_tenant(t.admin, t.ns_a)  # idempotent
    with pytest.raises(InvalidInputError):
        await rotate_tenant_password(t.admin, t.root, t.ns_a)
    # B never noticed
    async with JobLeaseClient(t.config(t.b)) as b:
        await b.register(JobRef(t.ns_b, "still-fine"), SPEC)
    # the keys of A stay (the operator's finalizers own them)
    async with JobLeaseClient(t.root_config) as root:
        assert (await root.get(job)).registered


async def test_removing_the_role_alone_revokes_access(tenants: Tenants) -> None:
    """A token that stays valid (the user is kept) still loses the permission."""
    t = tenants
    admin = EtcdAuthAdmin(t.admin)
    async with JobLeaseClient(t.config(t.a)) as a:
        await a.register(JobRef(t.ns_a, "j"), SPEC)
        key, end = tenant_key_range(t.root, t.ns_a)
        await admin.role_revoke(tenant_name(t.ns_a), key, end)
        with pytest.raises(PermissionDeniedError):
            await a.get(JobRef(t.ns_a, "j"))


async def test_enable_auth_is_idempotent(tenants: Tenants) -> None:
    from joblease.tenancy import enable_auth

    await enable_auth(t_store := EtcdStore(tenants.root_config), "ignored-when-on")
    assert await EtcdAuthAdmin(t_store).auth_enabled()
    await t_store.close()
    # root's password did not change
    async with EtcdStore(tenants.base.with_(username="root", password=ROOT_PASSWORD)) as s:
        assert await EtcdAuthAdmin(s).authenticate("root", ROOT_PASSWORD)
