"""Every benchmark command the docs give parses as written.

The benchmarks take minutes and some need a cluster, so the default suite does not run
them (docs/benchmarks*.md say so). What a reader copies can still be checked: each
``python bench/NAME.py ARGS`` in README.md and docs/*.md (in a fence or in backticks,
continued lines joined) is given to that script's own argument parser, as written, and
must be accepted. A flag renamed or removed, a value the parser refuses, or a script
that no longer exists fails here; the doc is then fixed or the command marked as an
earlier commit's with the commit named beside it.

Real: the bench scripts themselves, run with ``runpy`` as ``__main__``; only their
``ArgumentParser.parse_args`` is wrapped, to stop each script once its arguments are
parsed (nothing else of it runs, nothing connects).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.binaries import REPO_ROOT
from tests.support.cli import PROJECT_DOCS, fenced_blocks

#: a documented command with a placeholder for what the reader supplies
PLACEHOLDER = re.compile(r"\.\.\.|<[^<>]+>")


def _commands(text: str) -> Iterator[str]:
    """Each ``python bench/...`` command in ``text``: from its line (continuation
    backslashes joined, a trailing ``# comment`` dropped) or its backtick span."""
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        for match in re.finditer(r"python3? (bench/[a-z_]+\.py)\b([^`#\n]*)", line):
            yield " ".join(f"{match.group(1)}{match.group(2)}".split())


def _variants(command: str) -> Iterator[str]:
    """``command`` with each ``[optional part]`` left out, and with all of them in."""
    if "[" not in command:
        yield command
        return
    yield " ".join(re.sub(r"\[[^\]]*\]", "", command).split())
    yield " ".join(re.sub(r"\[([^\]]*)\]", r"\1", command).split())


def documented_commands() -> list[tuple[str, str]]:
    """``(doc, command)`` for every benchmark command, fences first, then prose."""
    found: dict[tuple[str, str], None] = {}
    for doc in PROJECT_DOCS:
        name = str(doc.relative_to(REPO_ROOT))
        for _, block in fenced_blocks(doc):
            for command in _commands(block):
                for variant in _variants(command):
                    found[(name, variant)] = None
        # backtick spans in prose, which may wrap across lines
        prose = re.sub(r"```.*?```", "", doc.read_text(), flags=re.DOTALL)
        for span in re.findall(r"`([^`]+)`", prose):
            for command in _commands(" ".join(span.split())):
                for variant in _variants(command):
                    found[(name, variant)] = None
    return list(found)


class _Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def parse_as_written(command: str) -> argparse.Namespace:
    """The script's own parser's reading of ``command``'s arguments: raises
    ``SystemExit`` (argparse's exit 2, its message on stderr) when it refuses them."""
    script, *argv = shlex.split(command)
    path = REPO_ROOT / script
    assert path.is_file(), f"{script} does not exist"
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Parsed(original(self, *args, **kwargs))

    saved_argv = sys.argv
    argparse.ArgumentParser.parse_args = parse_then_stop  # type: ignore[method-assign, assignment]
    sys.argv = [str(path), *argv]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except _Parsed as parsed:
        return parsed.namespace
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = saved_argv
    raise AssertionError(f"{script} ran to its end without parsing arguments")


COMMANDS = documented_commands()


def test_the_docs_give_benchmark_commands() -> None:
    assert len(COMMANDS) >= 40, COMMANDS  # the extraction finds them (65 lines today)
    assert ("docs/benchmarks.md", "bench/claims.py --cycles 3000 --concurrency 1,8,64") in COMMANDS


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[f"{d}:{c}" for d, c in COMMANDS])
def test_each_documented_benchmark_command_parses_as_written(doc: str, command: str) -> None:
    if PLACEHOLDER.search(command):
        script = shlex.split(PLACEHOLDER.sub("", command))[0]
        assert (REPO_ROOT / script).is_file(), f"{doc}: {script} does not exist"
        return  # the reader fills in the rest: only the script is checked
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            parse_as_written(command)
        except SystemExit as exc:
            pytest.fail(f"{doc}: `python {command}` is refused by the script's parser "
                        f"(exit {exc.code}):\n{stderr.getvalue()}")


def test_a_renamed_flag_is_caught() -> None:
    with contextlib.redirect_stderr(io.StringIO()) as stderr, pytest.raises(SystemExit):
        parse_as_written("bench/claims.py --cycles 3000 --concurency 1,8,64")
    assert "unrecognized arguments: --concurency" in stderr.getvalue()
