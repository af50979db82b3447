"""docs/architecture.md's picture of the layers is the one `lint-imports` enforces:
the same layers, in the same order, with the same siblings (``|`` independent,
``:`` may import each other), as the ``layers`` contract of .importlinter."""

from __future__ import annotations

import configparser
import re

from tests.support.binaries import REPO_ROOT


def _contract_layers() -> list[str]:
    config = configparser.ConfigParser()
    config.read(REPO_ROOT / ".importlinter")
    return [line.strip() for line in config["importlinter:contract:layers"]["layers"].splitlines()
            if line.strip()]


def _pictured_layers() -> list[str]:
    text = (REPO_ROOT / "docs" / "architecture.md").read_text()
    block = text.split("```\n", 2)[1]  # the first code block is the picture
    layers = []
    for line in block.splitlines():
        if not line.strip() or line.startswith(" "):
            continue  # a description continued on the next line
        layers.append(re.split(r"\s{2,}", line.strip())[0])
    return layers


def test_the_pictured_layers_are_the_enforced_ones() -> None:
    assert _pictured_layers() == _contract_layers()
