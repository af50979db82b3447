"""``python -m joblease.sidecar``: the same command as ``joblease sidecar``."""

from joblease.sidecar.command import sidecar_command

if __name__ == "__main__":
    sidecar_command(prog_name="joblease sidecar")
