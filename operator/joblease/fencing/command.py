"""``joblease ledger``: the example ledger destination as a server (examples/ledger.yaml).

A command of the fencing package, registered by the CLI like the sidecar's and
the operator's (the CLI sits below the applications and imports none of them).
"""

from __future__ import annotations

import click


@click.command("ledger")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (0.0.0.0 in a pod, so that its Service reaches it).")
@click.option("--port", type=int, default=8080, show_default=True, help="Port to listen on.")
@click.option("--db", default=None,
              help="SQLite file for the ledger and its gate, written in one transaction "
                   "per entry (default: both in memory, gone on restart).")
@click.option("--root-path", default="",
              help="The path prefix a proxy serves the ledger under (e.g. /api).")
def ledger_command(host: str, port: int, db: str | None, root_path: str) -> None:
    """Serve the example ledger destination: writes with a stale fencing token get 409
    (docs/fencing.md; examples/ledger.yaml runs it in a cluster)."""
    import uvicorn

    from joblease.fencing.destination import create_app

    uvicorn.run(create_app(db=db), host=host, port=port, log_level="info",
                root_path=root_path)
