"""One front door: ``trainfleet deploy|drift|preflight|capture|remediate|remove SPEC`` runs the
matching pyinfra deploy on the inventory the spec describes (``inventories/from_spec.py``),
with the run's options as flags instead of ``--data trainfleet_*`` strings. Every flag is
checked, and the spec validated, before pyinfra starts: a bad value is a usage error (64), a
bad spec 2. pyinfra's own commands keep working as before. Plain argv building; the CLI runs
it."""

from __future__ import annotations

import argparse
import fnmatch
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from trainfleet import metrics, stamps
from trainfleet.node_sets import fold
from trainfleet.schema import smoke_launcher_problem

REPO = Path(__file__).resolve().parents[1]  # deploy/ and inventories/ beside the package
INVENTORY = "inventories/from_spec.py"
NODES_GROUP = "nodes"  # the inventory's group of every node


@dataclass(frozen=True)
class Door:
    deploy: str  # deploy/<file>
    help: str
    read_only: bool  # changes nothing on a node: no confirmation to ask for (-y)


DOORS: Mapping[str, Door] = MappingProxyType(
    {
        "deploy": Door("deploy/cluster.py", "converge every node to the spec", False),
        "drift": Door(
            "deploy/drift.py", "read-only: what differs from the spec and majority", True
        ),
        "preflight": Door("deploy/preflight.py", "read-only: can the cluster train", True),
        "capture": Door("deploy/capture.py", "read-only: save each node's hardware", True),
        "remediate": Door("deploy/remediate.py", "opt-in remediation of one node", False),
        "remove": Door(
            "deploy/remove.py",
            "undo the deploy on every node: user bytes kept, packages stay",
            False,
        ),
    }
)


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """One subcommand per door, each with pyinfra's run flags and its own options."""
    for name, door in DOORS.items():
        parser = sub.add_parser(name, help=door.help)
        parser.add_argument("spec")
        parser.add_argument("--limit", help="only these nodes (pyinfra's --limit)")
        parser.add_argument("--dry", action="store_true", help="show what would change")
        parser.add_argument("--diff", action="store_true", help="show file diffs (pyinfra --diff)")
        parser.add_argument("-y", "--yes", action="store_true", help="do not ask to confirm")
        if name in ("drift", "preflight"):
            parser.add_argument("--metrics", metavar="PATH.prom", help="Prometheus textfile")
            parser.add_argument("--wide", action="store_true", help="the grid beyond 160 columns")
        if name == "preflight":
            parser.add_argument("--stale", help="test again only nodes older than this (6h)")
            parser.add_argument("--smoke", help="also train the smoke job with this launcher")
        if name == "remediate":
            parser.add_argument("--node", required=True, help="the one node to remediate")
        if name == "remove":
            parser.add_argument(
                "--purge-venv", action="store_true", help="also delete trainfleet's venv"
            )


def problems(args: argparse.Namespace) -> list[str]:
    """The flags' values that cannot be right, before anything runs (a usage error)."""
    found = []
    if getattr(args, "metrics", None) and (problem := metrics.path_problem(args.metrics)):
        found.append(f"--metrics: {problem}")
    if getattr(args, "stale", None):
        try:
            stamps.parse_stale(args.stale)
        except ValueError as exc:
            found.append(f"--stale: {exc}")
    if getattr(args, "smoke", None) and (problem := smoke_launcher_problem(args.smoke)):
        found.append(f"--smoke: {problem}")
    if args.dry and args.yes:
        found.append("--dry and -y: a dry run never asks, and pyinfra's -y turns its checks off")
    return found


def node_problems(args: argparse.Namespace, names: list[str]) -> list[str]:
    """``--limit`` and ``--node`` against the spec's nodes, before pyinfra starts: a limit
    that matches no node would run on nothing and pass, having checked nothing. pyinfra's
    ``--limit`` takes host and group names (``nodes``: every node) and globs, comma-separated."""
    found = []
    for part in filter(None, (getattr(args, "limit", None) or "").split(",")):
        if part != NODES_GROUP and not fnmatch.filter(names, part):
            found.append(f"--limit: {part!r} matches no node of the spec ({fold(names)})")
    node = getattr(args, "node", None)
    if node is not None and node not in names:
        found.append(f"--node: {node!r} is no node of the spec ({fold(names)})")
    return found


def command(name: str, args: argparse.Namespace) -> tuple[list[str], dict[str, str]]:
    """pyinfra's argv (from the repository root) and the environment it adds."""
    door = DOORS[name]
    pyinfra = str(Path(sys.executable).parent / "pyinfra")
    argv = [pyinfra]
    if args.dry:
        argv.append("--dry")
    elif args.yes or door.read_only:
        argv.append("-y")
    if args.diff:
        argv.append("--diff")
    if args.limit:
        argv += ["--limit", args.limit]
    data = {
        "trainfleet_metrics": str(Path(args.metrics).resolve())
        if getattr(args, "metrics", None)
        else None,
        "trainfleet_stale": getattr(args, "stale", None),
        "trainfleet_smoke": getattr(args, "smoke", None),
        "trainfleet_remediate": getattr(args, "node", None),
        "trainfleet_purge_venv": "1" if getattr(args, "purge_venv", False) else None,
    }
    for key, value in data.items():
        if value:
            argv += ["--data", f"{key}={value}"]
    env = {"TRAINFLEET_SPEC": str(Path(args.spec).resolve())}
    if getattr(args, "wide", False):
        env["TRAINFLEET_WIDE"] = "1"
    return [*argv, INVENTORY, door.deploy], env
