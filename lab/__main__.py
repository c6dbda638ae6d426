"""``python -m lab up N [--rails R] | down | status | stop NODE | start NODE | ssh NODE [CMD]``"""

from __future__ import annotations

import argparse
import json
import os
import sys

from lab.netns import Lab, LabError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab", description="the local namespace lab cluster"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start N nodes (node1..nodeN at 198.18.0.11...)")
    up.add_argument("count", type=int)
    up.add_argument(
        "--single-nic",
        action="store_true",
        help="no decoy second NIC (by default each node also has eno1 on a subnet peers cannot "
        "reach)",
    )
    up.add_argument(
        "--rails",
        type=int,
        default=0,
        metavar="R",
        help="give each node R rail interfaces (eth1..ethR, rail r on a bridge and subnet "
        "198.18.(10+r).0/24 of its own), declared in the spec as preflight.rails",
    )
    sub.add_parser("down", help="stop every node and remove every trace of the lab")
    status = sub.add_parser("status", help="show the nodes; exit 0 only when all are reachable")
    status.add_argument("--json", action="store_true")
    status.add_argument("--quiet", "-q", action="store_true")
    for verb, text in (
        ("stop", "power a node off (its disk and network stay)"),
        ("start", "boot a stopped node"),
    ):
        sub.add_parser(verb, help=text).add_argument("node")
    ssh = sub.add_parser("ssh", help="run a shell or command on a node over SSH")
    ssh.add_argument("node")
    ssh.add_argument("cmd", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    lab = Lab()

    try:
        if args.command == "up":
            lab.up(args.count, decoy=not args.single_nic, rails=args.rails)
            print(f"lab: inventory: inventories/lab.py (spec {lab.spec})")
            return 0
        if args.command == "down":
            return 1 if lab.down() else 0
        if args.command == "status":
            rows = lab.status()
            ok = bool(rows) and all(r["ssh"] for r in rows)
            if args.json:
                print(json.dumps({"up": ok, "nodes": rows}))
            elif not args.quiet:
                if not rows:
                    print("lab: not up (`python -m lab up 3`)")
                for r in rows:
                    state = "up" if r["ssh"] else ("no sshd" if r["process"] else "down")
                    print(f"{r['name']:8} {r['address']:15} {state}")
            return 0 if ok else 1
        if args.command in ("stop", "start"):
            getattr(lab, args.command)(args.node)
            print(f"lab: {args.node} {'stopped' if args.command == 'stop' else 'started'}")
            return 0
        if args.command == "ssh":
            return _ssh(lab, args.node, args.cmd)
    except LabError as exc:
        print(f"lab: {exc}", file=sys.stderr)
        return 1
    return 2


def _ssh(lab: Lab, name: str, cmd: list[str]) -> int:
    node = lab.node(name)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    argv = [
        "ssh",
        *lab.ssh_options(),
        f"root@{node.address}",
        *cmd,
    ]
    os.execvp("ssh", argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
