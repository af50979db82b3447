"""Bad input raises a clear, typed error and writes nothing to etcd."""

from __future__ import annotations

from typing import Any

import pytest

from joblease import InvalidInputError, JobLeaseClient, JobRef, JobSpec
from joblease.validation import MAX_JSON_DEPTH, MAX_PARAMETERS_BYTES, MAX_RESULT_BYTES


def _nested(depth: int) -> object:
    """A list nested ``depth`` deep around a scalar (built without recursion)."""
    value: object = 1
    for _ in range(depth):
        value = [value]
    return value


async def snapshot(client: JobLeaseClient) -> tuple[int, list[Any]]:
    """Every key under the test's root with its revisions (the store's revision is
    global and moves with other tests' writes, so compare the keys we own)."""
    _, kvs = await client.store.get(client.keys.namespace_prefix(), prefix=True)
    return len(kvs), [(kv.key, kv.mod_revision, kv.version) for kv in kvs]


BAD_REGISTRATIONS = [
    (JobRef("default", "Upper-Case"), JobSpec(10), "invalid job name"),
    (JobRef("default", ""), JobSpec(10), "invalid job name"),
    (JobRef("default", "a" * 254), JobSpec(10), "invalid job name"),
    (JobRef("default", "under_score"), JobSpec(10), "invalid job name"),
    (JobRef("Bad NS", "job"), JobSpec(10), "invalid namespace"),
    (JobRef("default", "job"), JobSpec(1), "between 2"),
    (JobRef("default", "job"), JobSpec(0), "between 2"),
    (JobRef("default", "job"), JobSpec(86_401), "between 2"),
    (JobRef("default", "job"), JobSpec(1.5), "whole number"),  # type: ignore[arg-type]
    (JobRef("default", "job"), JobSpec("10"), "whole number"),  # type: ignore[arg-type]
    (JobRef("default", "job"), JobSpec(10, max_attempts=-1), "maxAttempts"),
    (JobRef("default", "job"), JobSpec(10, parameters={"x": "y" * MAX_PARAMETERS_BYTES}),
     "parameters too large"),
    (JobRef("default", "job"), JobSpec(10, parameters={"x": {1, 2}}), "not JSON"),
    (JobRef("default", "job"), JobSpec(10, parameters={"x": "\ud800"}), "lone UTF-16 surrogate"),
    (JobRef("default", "job"), JobSpec(10, parameters={"x": _nested(MAX_JSON_DEPTH)}),
     "nested deeper than 64"),
]


@pytest.mark.parametrize(("job", "spec", "message"), BAD_REGISTRATIONS)
async def test_invalid_registration_is_refused_and_writes_nothing(
    client: JobLeaseClient, job: JobRef, spec: JobSpec, message: str
) -> None:
    before = await snapshot(client)
    with pytest.raises(InvalidInputError, match=message) as info:
        await client.register(job, spec)
    assert info.value.exit_code == 2 and info.value.http_status == 400
    assert await snapshot(client) == before


@pytest.mark.parametrize("owner", ["", "has space", "x" * 254, "tab\there", "ünïcode"])
async def test_invalid_owner_is_refused_and_writes_nothing(
    client: JobLeaseClient, owner: str
) -> None:
    job = JobRef("default", "owned")
    await client.register(job, JobSpec(10))
    before = await snapshot(client)
    with pytest.raises(InvalidInputError, match="invalid owner"):
        await client.claim(job, owner)
    assert await snapshot(client) == before


async def test_a_result_at_the_depth_limit_is_accepted(client: JobLeaseClient) -> None:
    job = JobRef("default", "result-depth")
    await client.register(job, JobSpec(10))
    lease = await client.claim(job, "worker")
    await lease.complete(_nested(MAX_JSON_DEPTH))
    state = await client.get(job)
    assert state.result is not None and state.result.result == _nested(MAX_JSON_DEPTH)


@pytest.mark.parametrize(("result", "message"), [
    ({"blob": "x" * MAX_RESULT_BYTES}, "result too large"),
    ({"set": {1, 2}}, "not JSON"),
    (float("nan"), "not JSON"),
    # docs/protocol.md#stored-values (issue 24, items 7 and 8)
    ("\ud800", "lone UTF-16 surrogate"),
    ({"k": ["ok", "x\udfff"]}, "lone UTF-16 surrogate"),
    ({"\udc00": 1}, "lone UTF-16 surrogate"),
    (_nested(MAX_JSON_DEPTH + 1), "nested deeper than 64"),
    (_nested(3000), "nested deeper than 64"),
])
async def test_invalid_result_is_refused_and_the_lease_is_kept(
    client: JobLeaseClient, result: object, message: str
) -> None:
    job = JobRef("default", "result-size")
    await client.register(job, JobSpec(10))
    lease = await client.claim(job, "worker")
    before = await snapshot(client)
    with pytest.raises(InvalidInputError, match=message):
        await lease.complete(result)
    assert await snapshot(client) == before
    assert lease.valid
    record = await lease.complete({"ok": True})  # still the holder: a valid result lands
    assert record.token == lease.token


async def test_error_types_carry_distinct_exit_codes_and_statuses() -> None:
    from joblease import errors

    classes = [errors.InvalidInputError, errors.NotRegisteredError, errors.HeldError,
               errors.AlreadyCompletedError, errors.AttemptsExhaustedError,
               errors.StaleTokenError, errors.LeaseLostError, errors.StoreUnavailableError,
               errors.OutcomeUnknownError, errors.PermissionDeniedError]
    codes = [c.exit_code for c in classes]
    assert len(set(codes)) == len(codes)
    assert errors.StaleTokenError.http_status == 409
    assert errors.StaleTokenError.reason == "stale"


# A trailing newline: a pattern anchored with ``$`` matches before a final "\n", so
# these passed validation and were written to etcd (issue 20, defect 13).
TRAILING_NEWLINE_REFS = [
    (JobRef("default\n", "job"), "invalid namespace"),
    (JobRef("default", "job\n"), "invalid job name"),
    (JobRef("default", "a.b\n"), "invalid job name"),
]


@pytest.mark.parametrize(("job", "message"), TRAILING_NEWLINE_REFS)
async def test_a_trailing_newline_in_namespace_or_name_is_refused_and_writes_nothing(
    client: JobLeaseClient, job: JobRef, message: str
) -> None:
    before = await snapshot(client)
    with pytest.raises(InvalidInputError, match=message):
        await client.register(job, JobSpec(10))
    with pytest.raises(InvalidInputError, match=message):
        await client.claim(job, "worker")
    with pytest.raises(InvalidInputError, match=message):
        await client.unregister(job)
    assert await snapshot(client) == before


async def test_a_trailing_newline_in_the_owner_is_refused_and_writes_nothing(
    client: JobLeaseClient,
) -> None:
    job = JobRef("default", "owned-newline")
    await client.register(job, JobSpec(10))
    before = await snapshot(client)
    with pytest.raises(InvalidInputError, match="invalid owner"):
        await client.claim(job, "worker\n")
    assert await snapshot(client) == before
    assert (await client.get(job)).holder is None


@pytest.mark.parametrize("namespace", ["team-a\n", "team-a\n\n", "\nteam-a"])
def test_a_tenant_namespace_with_a_newline_is_refused(namespace: str) -> None:
    """The tenant's etcd user name and key range are derived from the namespace: a
    namespace the protocol would refuse must not get a user or a range either."""
    from joblease.tenancy import tenant_key_range, tenant_name

    with pytest.raises(InvalidInputError, match="invalid namespace"):
        tenant_name(namespace)
    with pytest.raises(InvalidInputError, match="invalid namespace"):
        tenant_key_range("/joblease/v1", namespace)


async def test_an_invalid_owner_is_refused_after_valid_ones_were_remembered(
    client: JobLeaseClient,
) -> None:
    """claim validates each owner string once and remembers it (a bounded set):
    an invalid owner is never remembered, so it is refused however many valid
    owners came before it, and the set stays bounded."""
    job = JobRef("default", "owners")
    await client.register(job, JobSpec(10, max_attempts=0))
    for i in range(70):
        await (await client.claim(job, f"worker-{i}")).release()
    assert 0 < len(client._valid_owners) <= 64
    before = await snapshot(client)
    for owner in ("has space", "", "x" * 254, "worker-1\n"):
        with pytest.raises(InvalidInputError, match="invalid owner"):
            await client.claim(job, owner)
        assert owner not in client._valid_owners
    assert await snapshot(client) == before


async def test_an_invalid_job_is_refused_while_valid_ones_are_cached(
    client: JobLeaseClient,
) -> None:
    """A claim of a job whose spec is cached skips validating its ref again (the
    ref was validated when the spec was read, the only way into the cache); an
    invalid ref is never cached, so its claim is refused and writes nothing."""
    job = JobRef("default", "cached-ref")
    await client.register(job, JobSpec(10))
    await (await client.claim(job, "worker")).release()
    before = await snapshot(client)
    for bad, message in [*TRAILING_NEWLINE_REFS, (JobRef("default", "Upper"), "job name")]:
        with pytest.raises(InvalidInputError, match=message):
            await client.claim(bad, "worker")
        assert bad not in client._specs
    assert await snapshot(client) == before
