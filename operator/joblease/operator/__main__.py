"""``python -m joblease.operator`` (same as ``joblease operator``)."""

from joblease.operator.command import operator_command

if __name__ == "__main__":
    operator_command(prog_name="python -m joblease.operator")
