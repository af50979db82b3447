"""``hack/cluster up|down|status [--name NAME]`` (``python -m tests.support.cluster``)."""

from __future__ import annotations

import argparse
import json
import logging
import sys

from tests.support.cluster import Cluster, ClusterError
from tests.support.cluster import __doc__ as cluster_doc


def main(argv: list[str] | None = None) -> int:
    """``hack/cluster up|down|status [--name NAME]``."""
    parser = argparse.ArgumentParser(prog="hack/cluster", description=cluster_doc.split("\n")[0])
    parser.add_argument("command", choices=("up", "down", "status"))
    parser.add_argument("--name", default="default", help="cluster name (netns jl-NAME)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cluster = Cluster(args.name, die_with_parent=False)
    if cluster.external:
        print("JOBLEASE_TEST_KUBECONFIG is set: that cluster is used, nothing to do",
              file=sys.stderr)
        return 2
    if args.command == "up":
        try:
            cluster.up()
        except ClusterError as exc:
            print(exc, file=sys.stderr)
            return 1
        print(f"ready in {cluster.startup_seconds}s: "
              + ", ".join(f"{k} {v}s" for k, v in cluster.timings.items()), file=sys.stderr)
        print(f"logs: {cluster.logs}", file=sys.stderr)
        print(cluster.kubeconfig)
        return 0
    if args.command == "down":
        try:
            cluster.down()
        except ClusterError as exc:
            print(exc, file=sys.stderr)
            return 1
        left = cluster.leftovers()
        for item in left:
            print(f"left behind: {item}", file=sys.stderr)
        return 1 if left else 0
    print(json.dumps(cluster.status(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
