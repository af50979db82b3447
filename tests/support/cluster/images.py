"""The image archives the node imports into containerd (no registry), by reference."""

from __future__ import annotations

import contextlib
import importlib
import json

from tests.support.binaries import cache_dir
from tests.support.cluster.settings import ClusterError


def images_index() -> list[dict[str, str]]:
    """The image archives: ``tests.support.images.ensure_images()`` builds them when
    that module exists; the index it writes is read either way."""
    with contextlib.suppress(ImportError):
        images = importlib.import_module("tests.support.images")
        images.ensure_images()
    index = cache_dir() / "images" / "index.json"
    if not index.exists():
        raise ClusterError(f"no image index at {index}: build the images first "
                           "(tests/support/images.py ensure_images())")
    entries: list[dict[str, str]] = json.loads(index.read_text())
    return entries


def image_ref(prefix: str) -> str:
    """The reference in the image index that starts with ``prefix``
    (e.g. ``registry.k8s.io/pause``)."""
    for entry in images_index():
        if entry["ref"].startswith(prefix):
            return entry["ref"]
    raise ClusterError(f"no image {prefix}* in the image index")

