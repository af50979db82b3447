"""``python -m examples.destination --port 8080 [--db ledger.sqlite] [--root-path /api]``."""

from __future__ import annotations

import argparse

import uvicorn

from examples.destination.app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.destination",
                                     description="A ledger destination fenced by joblease tokens.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--db", default=None,
                        help="SQLite file for the ledger and the gate (default: in memory)")
    parser.add_argument("--root-path", default="",
                        help="the path prefix a proxy serves the ledger under (e.g. /api)")
    args = parser.parse_args(argv)
    uvicorn.run(create_app(db=args.db), host=args.host, port=args.port, log_level="info",
                root_path=args.root_path)


if __name__ == "__main__":
    main()
