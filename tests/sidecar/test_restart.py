"""A sidecar restarted in the same pod (a container restart keeps the pod's volumes)."""

from __future__ import annotations

import signal

from joblease import HeldError, JobLeaseClient
from joblease.lease import Lease
from tests.support.sidecar_process import Env, Sidecar
from tests.support.waiting import poll


async def test_a_restarted_sidecar_removes_the_dead_incarnations_token_before_serving(
        registered: Env, client: JobLeaseClient) -> None:
    """The token file a SIGKILLed incarnation left names a claim that is over, and
    another pod holds the job by then: the new incarnation removes it before it
    serves anything, publishes nothing while the other pod holds, and writes its
    own token once it holds the job itself."""
    env = registered
    first = await env.sidecar("a", POD_UID="uid-a").started()
    old_token = (await first.held())["token"]
    assert first.token_file.read_text() == f"{old_token}\n"
    first.signal(signal.SIGKILL)
    await first.wait_exit(10)
    assert first.token_file.read_text() == f"{old_token}\n"  # nothing could clean up

    async def other_claims() -> Lease | None:
        try:
            return await client.claim(env.job, "pod-b/other")
        except HeldError:
            return None  # the dead incarnation's lease has not expired yet (TTL 2 s)
    other: Lease = await poll(other_claims, 15, "another pod to claim the job")

    # Same pod, same volume: the harness's port file is the dead one's too.
    first.port_file.unlink()
    second = Sidecar("a-restarted", first.workdir,
                     env.sidecar_env("a", first.workdir, POD_UID="uid-a"), env.sidecar_argv)
    env.procs.append(second)
    await second.started()
    assert not second.token_file.exists(), "the dead incarnation's token is still published"
    assert not second.token_file.with_name("token.json").exists()
    lease = await second.lease()
    assert lease["status"] != 200
    await poll(lambda: second.logged("job held by another owner; backing off"), 10,
               "the restarted sidecar to be refused")
    assert not second.token_file.exists()

    await other.release()
    new_token = (await second.held())["token"]
    assert new_token > other.token > old_token
    await poll(lambda: second.token_file.exists(), 5, "the new token file")
    assert second.token_file.read_text() == f"{new_token}\n"
