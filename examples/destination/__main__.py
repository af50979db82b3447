"""``python -m examples.destination --port 8080 [--db ledger.sqlite] [--root-path /api]``:
the same as ``joblease ledger`` (the command the image runs, examples/ledger.yaml)."""

from __future__ import annotations

from joblease.fencing.command import ledger_command


def main(argv: list[str] | None = None) -> None:
    ledger_command.main(args=argv, prog_name="python -m examples.destination")


if __name__ == "__main__":
    main()
