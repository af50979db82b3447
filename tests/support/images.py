"""The cluster's container images: built by ``hack/build-images``, found here.

``ensure_images()`` runs ``hack/build-images`` (idempotent: an image whose
inputs are unchanged is not rebuilt; a warm run takes seconds) and returns the
archives listed in ``${JOBLEASE_CACHE:-~/.cache/joblease}/images/index.json``:
docker-archive tarballs, each carrying the reference users write (e.g.
``ghcr.io/joblease/joblease:0.1.0``), for ``ctr -n k8s.io images import``.
The build needs root, buildah, debootstrap and the network (Debian mirror,
PyPI, Go module proxy): call it before the test cluster's namespace exists.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path

from tests.support.binaries import REPO_ROOT

BUILD_SCRIPT = REPO_ROOT / "hack" / "build-images"
#: What hack/build-images builds, in the order it builds them.
IMAGE_NAMES = ("pause", "coredns", "joblease", "curl", "etcd", "sidecar")


class ImageBuildError(RuntimeError):
    pass


@dataclass(frozen=True)
class ImageArchive:
    name: str      # pause, coredns, joblease, curl, etcd
    ref: str       # the reference the archive carries
    archive: Path  # docker-archive tarball
    id: str        # sha256 of the build inputs


def images_dir() -> Path:
    cache = os.environ.get("JOBLEASE_CACHE") or str(Path.home() / ".cache" / "joblease")
    return Path(cache) / "images"


def read_index() -> list[ImageArchive]:
    """The index as it is (no build); [] if there is none yet."""
    path = images_dir() / "index.json"
    try:
        entries = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    return [ImageArchive(name=e.get("name", ""), ref=e["ref"], archive=Path(e["archive"]),
                         id=e["id"]) for e in entries]


_lock = threading.Lock()
_checked: set[str] = set()  # names hack/build-images confirmed current in this process


def ensure_images(names: tuple[str, ...] = IMAGE_NAMES, *,
                  timeout: float = 3600) -> list[ImageArchive]:
    """Build (or confirm cached) ``names`` and return their archives, in that order.

    hack/build-images decides staleness (it hashes every input), so it runs once
    per process and name; its output is in the error if it fails.
    """
    unknown = set(names) - set(IMAGE_NAMES)
    if unknown:
        raise ValueError(f"unknown images {sorted(unknown)}; known: {IMAGE_NAMES}")
    with _lock:
        todo = [n for n in names if n not in _checked]
        if todo:
            if os.geteuid() != 0:
                raise ImageBuildError(f"{BUILD_SCRIPT} needs root (buildah, debootstrap); "
                                      f"run `sudo {BUILD_SCRIPT} {' '.join(todo)}` first")
            try:
                result = subprocess.run([str(BUILD_SCRIPT), *todo], capture_output=True,
                                        text=True, timeout=timeout, stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as exc:
                raise ImageBuildError(f"{BUILD_SCRIPT} took over {timeout:.0f}s") from exc
            if result.returncode != 0:
                raise ImageBuildError(f"{BUILD_SCRIPT} {' '.join(todo)} failed "
                                      f"(exit {result.returncode}):\n"
                                      f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}")
            _checked.update(todo)
        by_name = {image.name: image for image in read_index()}
    missing = [n for n in names if n not in by_name or not by_name[n].archive.is_file()]
    if missing:
        raise ImageBuildError(f"{images_dir() / 'index.json'} lists no archive for {missing}")
    return [by_name[n] for n in names]
