"""``joblease demo``: the seed's worked example as one command (see :mod:`.run`)."""

from __future__ import annotations

import json
import sys

import click


@click.command("demo")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON report instead of a table.")
def demo_command(as_json: bool) -> None:
    """Run the seed example: A pauses past its TTL, B takes over, A's late
    completion and A's late write are both rejected. Exit 0 only if they are."""
    from joblease.demo.run import exit_code, run_demo, verdict_lines

    report = run_demo(echo=not as_json)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True, default=str))
    else:
        click.echo("")
        for line in verdict_lines(report):
            click.echo(line)
    sys.exit(exit_code(report))


__all__ = ["demo_command"]
