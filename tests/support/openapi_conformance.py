"""Judging sidecar answers against docs/sidecar-api.yaml (OpenAPI 3.1): each answer's
status must be one the document lists for its route and method, its body must validate
against the documented schema (``jsonschema``, draft 2020-12, the dialect of OpenAPI 3.1;
records and bodies are closed: an unknown field fails) and its documented headers must be
there. tests/sidecar/test_openapi.py drives every route through it;
tests/sidecar/test_queue_mode.py holds queue mode's answers to it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import jsonschema
import yaml

DOC_PATH = Path(__file__).resolve().parents[2] / "docs" / "sidecar-api.yaml"
DOC: dict[str, Any] = yaml.safe_load(DOC_PATH.read_text())
METHODS = ("get", "head", "post", "put", "delete", "patch", "options")


def _resolve(node: dict[str, Any]) -> dict[str, Any]:
    """Follow a local ``$ref`` (``#/components/...``) in the document."""
    while "$ref" in node:
        target: Any = DOC
        for part in node["$ref"].removeprefix("#/").split("/"):
            target = target[part]
        node = target
    return node


def _schema_validator(schema: dict[str, Any]) -> jsonschema.Draft202012Validator:
    # the document's components at the root, so "#/components/schemas/..." resolves
    return jsonschema.Draft202012Validator({**schema, "components": DOC["components"]})


def documented() -> set[tuple[str, str, int]]:
    """Every (path, METHOD, status) the document lists."""
    return {(path, method.upper(), int(status))
            for path, item in DOC["paths"].items()
            for method, op in item.items() if method in METHODS
            for status in op["responses"]}


class Conformance:
    """Judges answers against the document and records which triples were seen."""

    def __init__(self) -> None:
        self.seen: set[tuple[str, str, int]] = set()

    def check(self, path: str, method: str, r: httpx.Response) -> None:
        method = method.upper()
        item = DOC["paths"].get(path)
        what = f"{method} {path} -> {r.status_code} {r.text[:300]!r}"
        if item is None:
            # not a route: the description's routing rules
            if r.status_code == 307:
                target = r.headers["location"].split("://", 1)[1].split("/", 1)[1]
                assert "/" + target.split("?")[0] in DOC["paths"], what
            else:
                assert (r.status_code, r.text) == (404, "Not Found" if method != "HEAD" else ""), \
                    what
            return
        op = item.get(method.lower())
        if op is None:
            # a documented route, an undocumented method: 405 as MethodNotAllowed says
            assert r.status_code == 405, what
            spec = _resolve(DOC["components"]["responses"]["MethodNotAllowed"])
        else:
            responses = op["responses"]
            assert str(r.status_code) in responses, f"undocumented status: {what}"
            spec = _resolve(responses[str(r.status_code)])
            self.seen.add((path, method, r.status_code))
        for name, header in spec.get("headers", {}).items():
            assert name.lower() in r.headers, f"no {name} header: {what}"
            errors = list(_schema_validator(_resolve(header)["schema"]).iter_errors(
                r.headers[name.lower()]))
            assert not errors, f"{name}: {errors[0].message}: {what}"
        if method == "HEAD":
            assert r.content == b"", what
            return
        content = spec.get("content")
        assert content, f"the document has no body for {what}"
        media = r.headers["content-type"].split(";")[0].strip()
        assert media in content, f"content type {media!r} not documented: {what}"
        if media == "application/json":
            errors = sorted(_schema_validator(content[media]["schema"]).iter_errors(r.json()),
                            key=lambda e: e.path)
            assert not errors, f"{errors[0].message} at {list(errors[0].path)}: {what}"
