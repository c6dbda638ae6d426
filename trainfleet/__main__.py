"""``trainfleet`` (or ``python -m trainfleet``): offline tools of the controller.

- ``check SPEC... [--strict] [--json]``: validate specs without contacting any host; values of
  the right shape that are most likely wrong are warnings (``--strict``: a bad spec)
- ``schema``: print the spec reference
- ``keys list|rotate|revoke|retired SPEC [NODE...]``: the SSH mesh keys in the key store;
  ``keys readmit SPEC NODE... --fingerprint SHA256:...|--known-hosts``: take back the named
  host keys revoked under a node's name;
  ``keys ca|rotate-ca SPEC``: the cluster's SSH certificate authority
- ``diagnose DIR [--spec SPEC] [--json]``: judge a hardware capture offline
- ``--version``

Exit statuses: 0 ok, 1 findings (or nothing to show yet), 2 a bad spec or input, 64 a usage
error (sysexits' EX_USAGE).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import NoReturn

from trainfleet import front_door, html_report
from trainfleet import metrics as prometheus
from trainfleet.certificates import fingerprint
from trainfleet.compare import printable
from trainfleet.controller_files import write_atomic
from trainfleet.diagnose import CaptureError, judge
from trainfleet.diagnose_nccl import env_lines
from trainfleet.keystore import KeyStore
from trainfleet.mesh import KnownHostsError, every_listed_key
from trainfleet.metrics import report_registry
from trainfleet.model import Cluster
from trainfleet.node_sets import fold
from trainfleet.schema import reference_markdown
from trainfleet.spec import EXIT_BAD_SPEC, SpecError, load_cluster
from trainfleet.spec_warnings import spec_warnings

EXIT_USAGE = 64  # sysexits.h EX_USAGE: the command line itself is wrong


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error's own exit status (argparse's 2 is a bad spec's here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _version() -> str:
    try:
        return version("trainfleet")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _every_command(sub: argparse._SubParsersAction) -> str:  # type: ignore[type-arg]
    """Every command with every option (each command's usage line, built from its parser, so
    none is left out), and the exit statuses: the top-level ``--help``'s epilog."""
    usages = [
        " ".join(command.format_usage().removeprefix("usage: ").split())
        for command in sub.choices.values()
    ]
    return (
        "every command and its options (COMMAND --help says what each does):\n"
        + "\n".join(f"  {usage}" for usage in usages)
        + "\n\nexit status: 0 ok, 1 findings or failed nodes, 2 a bad spec or input, 64 a usage"
        " error"
    )


def main(argv: list[str] | None = None) -> int:
    """The ``trainfleet`` console script (pyproject's ``[project.scripts]``) and
    ``python -m trainfleet``; returns the exit status."""
    parser = _Parser(prog=_prog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="validate spec files without contacting any host")
    check.add_argument("specs", nargs="+")
    check.add_argument(
        "--json",
        action="store_true",
        help="print the derived cluster, the problems and the warnings as JSON",
    )
    check.add_argument(
        "--strict",
        action="store_true",
        help="fail (exit 2, as a bad spec) on warnings too: values of the right shape that are "
        "most likely wrong (a driver older than its CUDA's own, an address the preflight cannot "
        "test, a named ssh.key or known_hosts missing or lacking a node)",
    )
    sub.add_parser("schema", help="print the spec reference (markdown)")
    keys = sub.add_parser("keys", help="the SSH mesh keys in the controller's key store")
    keys.add_argument(
        "action",
        choices=["list", "rotate", "revoke", "retired", "readmit", "ca", "rotate-ca"],
        help="list: public keys; rotate: new keys (takes a revoked node back, the old key "
        "revoked); revoke: take nodes out of the mesh; retired: keys of nodes removed from "
        "the spec (moved aside by the deploy); readmit: take back the host keys "
        "revoked under the nodes' names (left the spec, replaced by a reimage) that "
        "--fingerprint names or --known-hosts lists, only when known safe; "
        "ca: the cluster CA's public key; rotate-ca: "
        "a new cluster CA (the next deploy moves every node to it, then trusts only it)",
    )
    keys.add_argument("spec")
    keys.add_argument("nodes", nargs="*", help="nodes to act on (rotate: all when none given)")
    keys.add_argument("--user", action="append", help="mesh user (default: every mesh user)")
    keys.add_argument(
        "--fingerprint",
        action="append",
        help="readmit: a revoked host key to take back, as `ssh-keygen -l` prints it "
        "(SHA256:...; the deploy's message names it); repeat for several",
    )
    keys.add_argument(
        "--known-hosts",
        action="store_true",
        help="readmit: take back the revoked host keys the controller's known_hosts lists for "
        "each node (the ones pyinfra verifies it by: what it presents when the deploy reaches it)",
    )
    diagnose = sub.add_parser(
        "diagnose",
        help="judge a hardware capture (pyinfra INVENTORY deploy/capture.py) offline: "
        "exit 0 clean, 1 findings, 2 bad input",
    )
    diagnose.add_argument("capture", help="the capture's directory (one folder per node)")
    diagnose.add_argument("--spec", help="the cluster's spec: each node's GPU count")
    diagnose.add_argument("--json", action="store_true", help="print the report as JSON")
    diagnose.add_argument(
        "--metrics",
        metavar="PATH.prom",
        help="also write Prometheus metrics there (node_exporter's textfile format)",
    )
    diagnose.add_argument(
        "--html",
        metavar="PATH.html",
        help="also write the report as one self-contained HTML page there",
    )
    diagnose.add_argument(
        "--wide",
        action="store_true",
        help="the node x check grid even where it is wider than 160 columns (else it folds)",
    )
    front_door.add_parsers(sub)
    parser.epilog = _every_command(sub)
    args = parser.parse_args(argv)

    if args.command in front_door.DOORS:
        return _door(args)
    if args.command == "diagnose":
        return _diagnose(args)

    if args.command == "schema":
        print(reference_markdown())
        return 0
    if args.command == "keys":
        return _keys(args)

    status = 0
    for path in args.specs:
        status = max(status, _check(path, args.json, args.strict))
    return status


def _check(path: str, as_json: bool, strict: bool) -> int:
    """``check`` of one spec: 0 ok (warnings or not), 2 refused, or warned under ``--strict``."""
    try:
        cluster = load_cluster(path)
    except SpecError as exc:
        if as_json:
            print(json.dumps({"spec": path, "ok": False, "problems": exc.problems}))
        else:
            print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_SPEC
    warnings = [w.line(path) for w in spec_warnings(cluster)]
    failed = strict and bool(warnings)
    if as_json:
        report = {"spec": path, "ok": not failed, **_summary(cluster), "warnings": warnings}
        print(json.dumps(report))
        return EXIT_BAD_SPEC if failed else 0
    for line in warnings:
        print(line, file=sys.stderr)
    if failed:
        print(f"{path}: {len(warnings)} warning(s), refused under --strict", file=sys.stderr)
        return EXIT_BAD_SPEC
    print(
        f"{path}: ok: {len(cluster.nodes)} nodes ({fold(n.name for n in cluster.nodes)}), "
        f"{cluster.total_gpus} GPUs, master {cluster.master.name}"
    )
    return 0


def _summary(cluster: Cluster) -> dict[str, object]:
    return {
        "cluster": cluster.name,
        "master": cluster.master.name,
        "total_gpus": cluster.total_gpus,
        "nodes": [
            {"name": n.name, "address": n.address, "rank": n.rank, "gpus": n.gpus, "names": n.names}
            for n in cluster.nodes
        ],
    }


def _door(args: argparse.Namespace) -> int:
    """``trainfleet deploy|drift|preflight|capture|remediate SPEC``: the flags checked and the
    spec validated, then pyinfra on the inventory it describes; its status passed on (0 ok,
    1 a node failed or a finding)."""
    if problems := front_door.problems(args):
        print("\n".join(f"{_prog()} {args.command}: {p}" for p in problems), file=sys.stderr)
        return EXIT_USAGE
    try:
        cluster = load_cluster(args.spec)
    except SpecError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_SPEC
    for warning in spec_warnings(cluster):  # what `check` warns of, before any host is reached
        print(warning.line(args.spec), file=sys.stderr)
    if problems := front_door.node_problems(args, [node.name for node in cluster.nodes]):
        print("\n".join(f"{_prog()} {args.command}: {p}" for p in problems), file=sys.stderr)
        return EXIT_USAGE
    if not (front_door.REPO / front_door.DOORS[args.command].deploy).is_file():
        print(
            f"{_prog()}: no deploy/ beside the package: run from a trainfleet checkout",
            file=sys.stderr,
        )
        return EXIT_USAGE
    argv, env = front_door.command(args.command, args)
    ran = subprocess.run(argv, cwd=front_door.REPO, env={**os.environ, **env}, check=False)
    return 0 if ran.returncode == 0 else EXIT_BAD_SPEC if ran.returncode == 2 else 1


def _diagnose(args: argparse.Namespace) -> int:
    cluster = None
    if args.metrics is not None and (problem := prometheus.path_problem(args.metrics)):
        print(f"{_prog()} diagnose: --metrics: {problem}", file=sys.stderr)
        return EXIT_USAGE
    if args.html is not None and not Path(args.html).parent.is_dir():
        print(
            f"{_prog()} diagnose: --html: {Path(args.html).parent}: no such folder", file=sys.stderr
        )
        return EXIT_USAGE
    try:
        if args.spec:
            cluster = load_cluster(args.spec)
        report = judge(Path(args.capture), cluster)
    except SpecError as exc:
        print("\n".join(exc.problems), file=sys.stderr)
        return EXIT_BAD_SPEC
    except CaptureError as exc:
        for problem in exc.problems:
            print(printable(problem), file=sys.stderr)
        return EXIT_BAD_SPEC
    if args.html is not None:
        title = f"trainfleet diagnose {Path(args.capture).name}"
        write_atomic(Path(args.html), html_report.page(report, title))
    if args.metrics is not None:
        prometheus.write(Path(args.metrics), report_registry(report, "diagnose", time.time()))
    if args.json:
        print(report.dumps())
    else:
        print(report.table(wide=args.wide))
        print("\n".join(printable(line) for line in env_lines(report)))
        for line in report.finding_lines(wide=args.wide):
            print(line)
    return 1 if report.findings else 0


def _readmit(args: argparse.Namespace, cluster: Cluster, store: KeyStore) -> int:
    """``keys readmit``: take back only the revoked host keys the operator names (by fingerprint)
    or that the controller's known_hosts lists for each node; any doubt is exit 2 with nothing
    taken back (a command line that names neither: 64)."""
    if bool(args.fingerprint) == args.known_hosts:
        print(
            "readmit takes back only the host keys you name: --fingerprint SHA256:... (repeat "
            "for several) or --known-hosts (those the controller's known_hosts lists for each "
            "node); give one of the two",
            file=sys.stderr,
        )
        return EXIT_USAGE
    revoked = {node: store.revoked_host_keys(node) for node in args.nodes}
    if args.known_hosts:
        wanted, problems = _known_hosts_keys(cluster, args.nodes)
        problems = problems or _ambiguous_known_hosts(wanted, store.revoked_keys())
    else:
        wanted, problems = _fingerprinted_keys(args.fingerprint, revoked)
    if problems:
        print("\n".join(problems) + "\nnothing was taken back", file=sys.stderr)
        return EXIT_BAD_SPEC
    for node in args.nodes:
        back = store.readmit_host_keys(node, wanted[node])
        taken = ", ".join(fingerprint(line) for line in back)
        kept = len(revoked[node]) - len(back)
        print(
            f"{node}: {len(back)} revoked host key(s) taken back"
            + (f" ({taken}); run the deploy to vouch for them again" if back else "")
            + (f"; {kept} other(s) revoked under its name stay revoked" if kept else "")
        )
    return 0


_FINGERPRINT = re.compile(r"SHA256:[A-Za-z0-9+/]{43}")


def _fingerprinted_keys(
    fingerprints: list[str], revoked: dict[str, list[str]]
) -> tuple[dict[str, list[str]], list[str]]:
    """The revoked keys of each node that the operator's fingerprints name; every fingerprint
    must be well formed and name a key revoked under one of the nodes."""
    problems = [
        f"{printable(fp)!r} is not a fingerprint as `ssh-keygen -l` prints it (SHA256:<43 chars>)"
        for fp in fingerprints
        if not _FINGERPRINT.fullmatch(fp)
    ]
    if problems:
        return {}, problems
    named = set(fingerprints)
    wanted = {
        node: [line for line in lines if fingerprint(line) in named]
        for node, lines in revoked.items()
    }
    found = {fingerprint(line) for lines in wanted.values() for line in lines}
    for fp in sorted(named - found):
        under = "; ".join(
            f"{node}: {', '.join(fingerprint(line) for line in lines) or 'none'}"
            for node, lines in revoked.items()
        )
        problems.append(f"{fp} is not a host key revoked under these names (revoked: {under})")
    return wanted, problems


def _known_hosts_keys(cluster: Cluster, nodes: list[str]) -> tuple[dict[str, list[str]], list[str]]:
    """Each node's keys in the controller's known_hosts; a node it lists no key for is an
    error (nothing to go by)."""
    wanted, problems = {}, []
    for name in nodes:
        node = cluster.node(name)
        try:
            wanted[name] = every_listed_key(node.address, node.ssh["port"], node.ssh["known_hosts"])
        except KnownHostsError as exc:
            return {}, [str(exc)]
        if not wanted[name]:
            problems.append(
                f"the controller's known_hosts ({node.ssh['known_hosts'] or '~/.ssh/known_hosts'}) "
                f"lists no host key for {name} ({node.address}): put the keys it presents there "
                "first, or name them with --fingerprint"
            )
    return wanted, problems


def _ambiguous_known_hosts(wanted: dict[str, list[str]], revoked: list[str]) -> list[str]:
    """Nodes whose known_hosts lists a revoked key beside an unrevoked key of the same type: a
    new key appended without ``ssh-keygen -R``, which says nothing of which one the node
    presents now; taking the old one back would admit its still valid certificate again."""
    problems = []
    refused = {" ".join(line.split()[:2]) for line in revoked}
    for node, lines in wanted.items():
        gone = {line for line in lines if line in refused}
        kept_types = {line.split()[0] for line in lines if line not in gone}
        for line in sorted(gone):
            if line.split()[0] in kept_types:
                problems.append(
                    f"{node}: the controller's known_hosts lists the revoked {line.split()[0]} "
                    f"key {fingerprint(line)} beside another {line.split()[0]} key: which one "
                    "the node presents now is unknown; remove the stale line (ssh-keygen -R) or "
                    "name the key with --fingerprint"
                )
    return problems


def _prog() -> str:
    """How the user called us, for usage lines: ``-m`` runs this file as ``__main__.py``, whose
    name would read badly; the console script is ``trainfleet``."""
    return "python -m trainfleet" if Path(sys.argv[0]).name == "__main__.py" else "trainfleet"


def _keys(args: argparse.Namespace) -> int:
    try:
        cluster = load_cluster(args.spec)
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
        return EXIT_USAGE
    strangers = [u for u in args.user or [] if u not in cluster.mesh_users]
    if (
        strangers
    ):  # a user name becomes a path in the key store: only the spec's, checked by its grammar
        print(
            f"not mesh users of {cluster.name}: {', '.join(strangers)} "
            f"(mesh users: {', '.join(cluster.mesh_users)})",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.action in ("revoke", "readmit") and not args.nodes:
        print(f"{args.action} needs the nodes to act on", file=sys.stderr)
        return EXIT_USAGE
    store = KeyStore(cluster.name)
    if args.action != "readmit" and (args.fingerprint or args.known_hosts):
        print("--fingerprint and --known-hosts are readmit's", file=sys.stderr)
        return EXIT_USAGE
    if args.action in ("ca", "rotate-ca", "readmit") and args.user:
        print(f"{args.action} acts on host keys or the CA: it takes no users", file=sys.stderr)
        return EXIT_USAGE
    if args.action in ("ca", "rotate-ca") and args.nodes:
        print(f"{args.action} acts on the cluster's CA: it takes no nodes", file=sys.stderr)
        return EXIT_USAGE
    if args.action == "ca":  # read only: the first deploy makes the CA
        public = store.snapshot([], []).ca
        if public is None:
            print(f"{cluster.name}: no CA yet; the first deploy makes it", file=sys.stderr)
            return 1
        print(public.public)
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
        return _readmit(args, cluster, store)
    if args.action == "retired":
        for path in store.retired():
            print(path)
        return 0
    users, nodes = args.user or cluster.mesh_users, args.nodes or names
    held = store.snapshot(users, nodes) if args.action == "list" else None  # read only
    for user in users:
        for node in nodes:
            if held is not None:
                pair = held.pairs.get((user, node))
                state = (
                    "revoked"
                    if (user, node) in held.revoked
                    else pair.public
                    if pair
                    else "no key yet (the deploy makes it)"
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
