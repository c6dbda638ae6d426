"""``python -m trainfleet check SPEC...`` validates specs offline; ``schema`` prints the reference."""

from __future__ import annotations

import argparse
import json
import sys

from trainfleet.model import Cluster
from trainfleet.schema import reference_markdown
from trainfleet.spec import EXIT_BAD_SPEC, SpecError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainfleet")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate spec files without contacting any host")
    check.add_argument("specs", nargs="+")
    check.add_argument("--json", action="store_true", help="print the derived cluster as JSON")
    sub.add_parser("schema", help="print the spec reference (markdown)")
    args = parser.parse_args(argv)

    if args.command == "schema":
        print(reference_markdown())
        return 0

    status = 0
    for path in args.specs:
        try:
            cluster = Cluster.load(path)
        except SpecError as exc:
            for problem in exc.problems:
                print(problem, file=sys.stderr)
            status = EXIT_BAD_SPEC
            continue
        if args.json:
            print(json.dumps({
                "cluster": cluster.name,
                "master": cluster.master.name,
                "total_gpus": cluster.total_gpus,
                "nodes": [
                    {"name": n.name, "address": n.address, "rank": n.rank, "gpus": n.gpus, "names": n.names}
                    for n in cluster.nodes
                ],
            }))
        else:
            print(f"{path}: ok: {len(cluster.nodes)} nodes, {cluster.total_gpus} GPUs, master {cluster.master.name}")
    return status


if __name__ == "__main__":
    sys.exit(main())
