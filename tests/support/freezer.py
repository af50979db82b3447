"""Freeze one container of a pod from the node side (cgroup v1 freezer).

Why the freezer and not SIGSTOP: it stops every task of the container at once,
whatever its processes are, as a long GC pause, a stalled node or a VM that was
descheduled would; nothing inside the container can notice or handle it, and
thawing resumes the tasks where they were. Nothing is faked: it is the kernel's
freezer on the real container the kubelet started.

The test cluster's node is this machine: with the kubelet's ``cgroupfs`` driver a
container's cgroup is ``/sys/fs/cgroup/freezer/<cgroupRoot>/kubepods[/<qos>]/
pod<pod uid>/<container id>`` (tests/support/cluster/). The directory is found by
the pod's UID and the container's id, not assumed. A cluster whose node is not this
machine (``JOBLEASE_TEST_KUBECONFIG``) cannot be frozen from here: the helper says so.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

FREEZER = Path("/sys/fs/cgroup/freezer")


def container_cgroup(pod_uid: str, container_id: str, root: Path = FREEZER) -> Path:
    """The freezer cgroup of one container, found by pod UID and container id."""
    if not (root / "cgroup.procs").exists():
        raise AssertionError(f"no cgroup v1 freezer at {root}: cannot freeze a container")
    found = [pod_dir / container_id for pod_dir in root.rglob(f"pod{pod_uid}")
             if (pod_dir / container_id / "freezer.state").exists()]
    if len(found) != 1:
        raise AssertionError(
            f"freezer cgroup of container {container_id[:12]} in pod {pod_uid}: found "
            f"{found or 'none'} under {root} (is the cluster's node this machine?)")
    return found[0]


def _set_state(cgroup: Path, state: str, timeout: float) -> None:
    """Write ``state`` (FROZEN or THAWED) and wait until the kernel reports it (freezing
    passes through FREEZING while tasks are being stopped)."""
    (cgroup / "freezer.state").write_text(state)
    deadline = time.monotonic() + timeout
    while (current := (cgroup / "freezer.state").read_text().strip()) != state:
        if time.monotonic() > deadline:
            raise AssertionError(f"{cgroup}: freezer.state is {current}, not {state}, "
                                 f"after {timeout}s")
        time.sleep(0.05)  # poll interval; the deadline bounds the wait


@contextlib.contextmanager
def frozen(cgroup: Path, timeout: float = 30) -> Iterator[Path]:
    """Freeze every task of ``cgroup`` for the block; always thaw on the way out
    (a frozen container left behind would hang the cluster's teardown: SIGKILL does
    not end a frozen task). Call :func:`thaw` inside the block to thaw earlier."""
    try:
        _set_state(cgroup, "FROZEN", timeout)
        yield cgroup
    finally:
        thaw(cgroup, timeout)


def thaw(cgroup: Path, timeout: float = 30) -> None:
    """Thaw ``cgroup`` (idempotent; a cgroup that is gone, its container ended, is fine)."""
    with contextlib.suppress(FileNotFoundError):
        _set_state(cgroup, "THAWED", timeout)


def is_frozen(cgroup: Path) -> bool:
    return (cgroup / "freezer.state").read_text().strip() == "FROZEN"
