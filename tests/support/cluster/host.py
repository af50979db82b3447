"""What the cluster borrows from the host and must give back: processes (started in
its network namespace, found by pid and command line, stopped by pid), mounts,
cgroups, network namespaces and sysctls. Plain functions over /proc and
/sys: no knowledge of Kubernetes.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.support.cluster.settings import CLONE_NEWNET, ClusterError


def load_libc() -> ctypes.CDLL:
    return ctypes.CDLL("libc.so.6", use_errno=True)


def child_setup(netns: str | None, die_with_parent: bool) -> Callable[[], None]:
    """preexec_fn: enter the cluster's network namespace; optionally get SIGKILL
    when the parent (the test process) dies, so nothing outlives a crashed run."""
    def setup() -> None:
        libc = load_libc()
        if die_with_parent:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if netns:
            fd = os.open(f"/run/netns/{netns}", os.O_RDONLY)
            try:
                if libc.setns(fd, CLONE_NEWNET) != 0:
                    os._exit(126)
            finally:
                os.close(fd)
    return setup


def run(argv: list[str], *, netns: str | None = None, check: bool = True,
         timeout: float = 120, input: str | None = None) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, input=input,
                            preexec_fn=child_setup(netns, False) if netns else None)
    if check and result.returncode != 0:
        raise ClusterError(f"{' '.join(argv)} failed ({result.returncode}): "
                           f"{result.stderr.strip() or result.stdout.strip()}")
    return result


def tail(path: Path, lines: int) -> str:
    if not path.exists():
        return f"({path.name}: no log)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"----- last {len(text)} lines of {path} -----\n" + "\n".join(text)


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(
            errors="replace")
    except OSError:
        return ""


def all_pids() -> Iterator[int]:
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            yield int(entry)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot ("" if gone): with the
    pid, it names one process (pids are reused, start times are not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def kill_and_wait(pids: list[int], deadline_s: float, sig: int = signal.SIGTERM) -> list[int]:
    """Send ``sig`` to each pid, wait until all are gone, SIGKILL the rest at the
    deadline. Returns the pids that were still alive after SIGKILL + 5 s."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    for grace, final in ((deadline_s, signal.SIGKILL), (5.0, None)):
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(alive(p) for p in pids):
            reap(pids)
            time.sleep(0.1)  # poll interval; the deadline bounds the wait
        left = [p for p in pids if alive(p)]
        if not left or final is None:
            return left
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, final)
        pids = left
    return pids


def reap(pids: list[int]) -> None:
    """Collect those of ``pids`` that are exited children of this process (when we
    started them), so they do not linger as zombies."""
    for pid in pids:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)


def mountpoints_under(root: Path) -> list[str]:
    """Mount points at or below ``root`` in this mount namespace, deepest first."""
    prefix = str(root).rstrip("/") + "/"
    points = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == str(root) or point.startswith(prefix):
            points.append(point)
    return sorted(set(points), key=lambda p: p.count("/"), reverse=True)


def umount(point: str) -> None:
    libc = load_libc()
    if libc.umount2(point.encode(), 0) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return
        if libc.umount2(point.encode(), 2) != 0:  # MNT_DETACH
            err = ctypes.get_errno()
            if err not in (errno.EINVAL, errno.ENOENT):
                raise ClusterError(f"umount {point}: {os.strerror(err)}")


def cgroup_dirs(group: str) -> list[Path]:
    """``/sys/fs/cgroup/<hierarchy>/<group>`` in every mounted hierarchy."""
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            path = Path(fields[4]) / group
            if path.is_dir():
                found.append(path)
    return found


def cgroup_hierarchies() -> list[Path]:
    result = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split()
        sep = fields.index("-")
        if fields[sep + 1] in ("cgroup", "cgroup2"):
            result.append(Path(fields[4]))
    return result


def remove_cgroup_tree(top: Path, deadline_s: float = 30.0) -> None:
    deadline = time.monotonic() + deadline_s
    while top.exists():
        below = sorted((p for p in top.rglob("*") if p.is_dir()),
                       key=lambda p: len(p.parts), reverse=True)
        dirs = [*below, top]
        busy = []
        for directory in dirs:
            try:
                directory.rmdir()
            except FileNotFoundError:
                pass
            except OSError as exc:
                busy.append(f"{directory}: {exc.strerror}")
        if not busy:
            return
        if time.monotonic() > deadline:
            raise ClusterError("cgroups not removable: " + "; ".join(busy[:5]))
        time.sleep(0.2)  # tasks still exiting; the deadline bounds the wait


def pids_in_cgroup(top: Path) -> set[int]:
    """Every pid in ``top`` and the cgroups below it. The kubelet and containerd
    remove cgroups while this walks them: ``os.walk`` skips a directory gone
    before it is listed (``Path.rglob`` raised), and a ``cgroup.procs`` gone
    before it is read counts as empty."""
    pids: set[int] = set()
    for directory, _, files in os.walk(top):
        if "cgroup.procs" in files:
            with contextlib.suppress(OSError):
                pids.update(int(x) for x in (Path(directory) / "cgroup.procs").read_text().split())
    return pids


def netns_inode(name: str) -> int | None:
    try:
        return os.stat(f"/run/netns/{name}").st_ino
    except OSError:
        return None


def pids_in_netns(inode: int) -> set[int]:
    found = set()
    for pid in all_pids():
        with contextlib.suppress(OSError):
            if os.stat(f"/proc/{pid}/ns/net").st_ino == inode:
                found.add(pid)
    return found


def read_sysctl(key: str) -> str:
    return Path("/proc/sys", key).read_text().strip()


def write_sysctl(key: str, value: str) -> None:
    Path("/proc/sys", key).write_text(value + "\n")

