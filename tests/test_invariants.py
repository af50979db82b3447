"""The protocol's invariants are one named list, in docs/protocol.md, cited by name.

Code, tests and docs once cited "DESIGN.md invariant N" (a file that is not in
the repository) and bare numbers that disagreed with protocol.md's own; the Go
sidecar cited a "guarantee 5" of a docs/errs.md that never existed. This
reads the real files: every ``protocol.md#<name>`` link and every
``invariant(s) `name```-style citation must name an anchor protocol.md defines,
and no numbered citation ("invariant 3", "guarantee 5") or DESIGN.md or
errs.md reference may come back, in the Python package, the Go sidecar, the
tests, the docs or the examples.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOCOL = ROOT / "docs" / "protocol.md"
SEARCHED = ("operator/joblease", "sidecar-go", "tests", "docs", "bench", "examples", "README.md")


def _files() -> list[Path]:
    found: list[Path] = []
    for name in SEARCHED:
        path = ROOT / name
        paths = [path] if path.is_file() else sorted(path.rglob("*"))
        found += [p for p in paths if p.suffix in (".py", ".md", ".go") and p.is_file()
                  and p != Path(__file__).resolve()]
    return found


def _anchors() -> set[str]:
    return set(re.findall(r'<a id="([a-z0-9-]+)"></a>', PROTOCOL.read_text()))


def test_protocol_md_names_each_invariant() -> None:
    anchors = _anchors()
    assert {"claim-is-one-transaction", "tokens-increase", "read-back",
            "effects-carry-token", "not-exactly-once", "ttl-lower-bound"} <= anchors


def test_invariants_are_cited_by_a_name_protocol_md_defines() -> None:
    anchors = _anchors()
    numbered = re.compile(r"(?:invariants?|guarantee)\s+\d|DESIGN\.md|errs\.md", re.IGNORECASE)
    link = re.compile(r"protocol\.md#([a-z0-9-]+)")
    named = re.compile(r"[Ii]nvariants?\s+((?:``?[a-z0-9-]+``?(?:,\s*|\s+and\s+)?)+)")
    bad: list[str] = []
    for path in _files():
        text = path.read_text(errors="replace")
        where = path.relative_to(ROOT)
        bad += [f"{where}: numbered {m.group(0)!r}" for m in numbered.finditer(text)]
        cited = set(link.findall(text))
        for m in named.finditer(text):
            cited |= set(re.findall(r"`+([a-z0-9-]+)`+", m.group(1)))
        bad += [f"{where}: unknown invariant {name!r}" for name in sorted(cited - anchors)]
    assert not bad, "\n".join(bad)
