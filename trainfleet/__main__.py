"""``trainfleet`` (or ``python -m trainfleet``): offline tools of the controller.

- ``check SPEC...``: validate specs without contacting any host
- ``schema``: print the spec reference
- ``keys list|rotate|revoke|retired SPEC [NODE...]``: the SSH mesh keys in the key store;
  ``keys readmit SPEC NODE...``: take back host keys revoked under a node's name;
  ``keys ca|rotate-ca SPEC``: the cluster's SSH certificate authority
- ``diagnose DIR [--spec SPEC] [--json]``: judge a hardware capture offline (exit 0: clean,
  1: findings, 2: bad input)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainfleet.compare import printable
from trainfleet.diagnose import CaptureError, judge
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster
from trainfleet.schema import reference_markdown
from trainfleet.spec import EXIT_BAD_SPEC, SpecError


def main(argv: list[str] | None = None) -> int:
    """The ``trainfleet`` console script (pyproject's ``[project.scripts]``) and
    ``python -m trainfleet``; returns the exit status."""
    parser = argparse.ArgumentParser(prog=_prog())
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate spec files without contacting any host")
    check.add_argument("specs", nargs="+")
    check.add_argument("--json", action="store_true", help="print the derived cluster as JSON")
    sub.add_parser("schema", help="print the spec reference (markdown)")
    keys = sub.add_parser("keys", help="the SSH mesh keys in the controller's key store")
    keys.add_argument(
        "action",
        choices=["list", "rotate", "revoke", "retired", "readmit", "ca", "rotate-ca"],
        help="list: public keys; rotate: new keys (takes a revoked node back, the old key "
        "revoked); revoke: take nodes out of the mesh; retired: keys of nodes removed from "
        "the spec (moved aside by the deploy); readmit: take back the host keys "
        "revoked under the nodes' names (left the spec, replaced by a reimage), "
        "only when known safe; "
        "ca: the cluster CA's public key; rotate-ca: "
        "a new cluster CA (the next deploy moves every node to it, then trusts only it)",
    )
    keys.add_argument("spec")
    keys.add_argument("nodes", nargs="*", help="nodes to act on (rotate: all when none given)")
    keys.add_argument("--user", action="append", help="mesh user (default: every mesh user)")
    diagnose = sub.add_parser(
        "diagnose",
        help="judge a hardware capture (pyinfra INVENTORY deploy/capture.py) offline: "
        "exit 0 clean, 1 findings, 2 bad input",
    )
    diagnose.add_argument("capture", help="the capture's directory (one folder per node)")
    diagnose.add_argument("--spec", help="the cluster's spec: each node's GPU count")
    diagnose.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)

    if args.command == "diagnose":
        return _diagnose(args)

    if args.command == "schema":
        print(reference_markdown())
        return 0
    if args.command == "keys":
        return _keys(args)

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
            print(
                json.dumps(
                    {
                        "cluster": cluster.name,
                        "master": cluster.master.name,
                        "total_gpus": cluster.total_gpus,
                        "nodes": [
                            {
                                "name": n.name,
                                "address": n.address,
                                "rank": n.rank,
                                "gpus": n.gpus,
                                "names": n.names,
                            }
                            for n in cluster.nodes
                        ],
                    }
                )
            )
        else:
            print(
                f"{path}: ok: {len(cluster.nodes)} nodes, {cluster.total_gpus} GPUs, master "
                f"{cluster.master.name}"
            )
    return status


def _diagnose(args: argparse.Namespace) -> int:
    cluster = None
    try:
        if args.spec:
            cluster = Cluster.load(args.spec)
        report = judge(Path(args.capture), cluster)
    except SpecError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_SPEC
    except CaptureError as exc:
        for problem in exc.problems:
            print(printable(problem), file=sys.stderr)
        return EXIT_BAD_SPEC
    if args.json:
        print(report.dumps())
    else:
        print(report.table())
        for finding in report.findings:
            print(printable(f"[{finding.node}] {finding}"))
    return 1 if report.findings else 0


def _prog() -> str:
    """How the user called us, for usage lines: ``-m`` runs this file as ``__main__.py``, whose
    name would read badly; the console script is ``trainfleet``."""
    return "python -m trainfleet" if Path(sys.argv[0]).name == "__main__.py" else "trainfleet"


def _keys(args: argparse.Namespace) -> int:
    try:
        cluster = Cluster.load(args.spec)
    except SpecError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_SPEC
    names = [n.name for n in cluster.nodes]
    unknown = [n for n in args.nodes if n not in names]
    if unknown:
        print(
            f"not nodes of {cluster.name}: {', '.join(unknown)} (nodes: {', '.join(names)})",
            file=sys.stderr,
        )
        return EXIT_BAD_SPEC
    strangers = [u for u in args.user or [] if u not in cluster.mesh_users]
    if (
        strangers
    ):  # a user name becomes a path in the key store: only the spec's, checked by its grammar
        print(
            f"not mesh users of {cluster.name}: {', '.join(strangers)} "
            f"(mesh users: {', '.join(cluster.mesh_users)})",
            file=sys.stderr,
        )
        return EXIT_BAD_SPEC
    if args.action in ("revoke", "readmit") and not args.nodes:
        print(f"{args.action} needs the nodes to act on", file=sys.stderr)
        return EXIT_BAD_SPEC
    store = KeyStore(cluster.name)
    if args.action in ("ca", "rotate-ca", "readmit") and args.user:
        print(f"{args.action} acts on host keys or the CA: it takes no users", file=sys.stderr)
        return EXIT_BAD_SPEC
    if args.action in ("ca", "rotate-ca") and args.nodes:
        print(f"{args.action} acts on the cluster's CA: it takes no nodes", file=sys.stderr)
        return EXIT_BAD_SPEC
    if args.action == "ca":
        print(store.certificate_authority().public)
        return 0
    if args.action == "rotate-ca":
        old = store.rotate_certificate_authority()
        print(
            f"{cluster.name}: new CA {store.certificate_authority().public}"
            + (f" (the old one moved to {old})" if old else "")
            + "; run the deploy to move every node to it (a node that is down holds the "
            "move back: README, The SSH mesh)"
        )
        return 0
    if args.action == "readmit":
        for node in args.nodes:
            back = store.readmit_host_keys(node)
            print(
                f"{node}: {len(back)} revoked host key(s) taken back"
                + (
                    "; run the deploy to vouch for them again"
                    if back
                    else " (none was revoked under its name)"
                )
            )
        return 0
    if args.action == "retired":
        for path in store.retired():
            print(path)
        return 0
    for user in args.user or cluster.mesh_users:
        for node in args.nodes or names:
            if args.action == "list":
                state = (
                    "revoked" if store.is_revoked(user, node) else store.keypair(user, node).public
                )
                print(f"{user}@{node}: {state}")
            elif args.action == "rotate":
                store.rotate(user, node)
                print(f"{user}@{node}: new key; run the deploy to put it in place")
            else:
                store.revoke(user, node)
                print(f"{user}@{node}: revoked; run the deploy to remove it from every node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
