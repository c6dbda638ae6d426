"""``python -m bench.controller [--nodes 16,64,256,1024] [--runs 3] [--profile N] [--mesh
certificates|keys] [--compare keys] [--compare-runs 1] [--out docs/]``: trainfleet's controller
against N fake nodes (issue #17), and what the SSH mesh costs per node and per run (issue #18).

Writes OUT/controller-benchmark.{json,md,png}, after every N so an interrupted run keeps what
it measured. ``--render`` redraws the md and png from the JSON. ``record`` (root, the lab)
re-takes bench/controller/recorded.json, the lab node outputs the fake nodes answer with.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.controller.controller_report import plot, render_markdown
from bench.controller.fleet import MESH_MODES
from bench.controller.measure import Results, Runner, measure
from bench.controller.record import load, record
from bench.lab_report import drawn, machine, source
from bench.run import REPO, node_counts

NAME = "controller-benchmark"
NOTES = [
    "A run is one pyinfra process; the fake connector answers instantly, so wall ≈ CPU when the "
    "machine is otherwise idle. Where another session loaded the machine, wall time grows and CPU "
    "time stays the controller's.",
    "Fact bytes: every node sends back its /etc/hosts and genders blocks, a line per node, so the "
    "bytes read per run keep an N² part in either mesh. A key mesh adds known_hosts, "
    "authorized_keys and ssh config blocks with a line (or stanza) per node; a certificate mesh "
    "replaces them with one CA line, one pattern stanza and certificates of constant size. The "
    "controller's reading of them is part of what is measured.",
    "Bytes sent: the fact commands (scripts) each node is asked to run, the same size whatever N; "
    "drift's mesh probe names its sampled peers. The timed runs change nothing and the plan is a "
    "dry run, so nothing is uploaded.",
    "recorded.json comes from a key-mesh lab node; its sshd_mesh section and each mesh user's "
    "certificate line are synthesized as that node's fact scripts print them "
    "(bench/controller/fleet.py); a converged node's sections are what the capabilities' "
    "converged(plan) say, answered by each section's fact: exactly the certificates the plan "
    "signs with the key store's cluster CA.",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.controller", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("command", nargs="?", choices=["run", "record"], default="run")
    parser.add_argument(
        "--nodes",
        type=node_counts,
        default=[16, 64, 256, 1024],
        help="fleet sizes (default 16,64,256,1024)",
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="timed runs of each task at each N (default 3)"
    )
    parser.add_argument(
        "--profile",
        type=int,
        default=None,
        metavar="N",
        help="also run the re-run and drift once under cProfile at N (one of --nodes)",
    )
    parser.add_argument(
        "--mesh",
        choices=MESH_MODES,
        default="certificates",
        help="the fleet's ssh.mesh (default certificates, the spec's default)",
    )
    parser.add_argument(
        "--compare",
        action="append",
        choices=MESH_MODES,
        default=[],
        help="also build each N in this mesh and run the re-run, plan and drift on it, for "
        "comparison",
    )
    parser.add_argument(
        "--compare-runs", type=int, default=1, help="runs of each compared task (default 1)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="where the results go (default docs/)"
    )
    parser.add_argument(
        "--render", action="store_true", help="only redraw the md and png from the JSON"
    )
    args = parser.parse_args(argv)
    if args.runs < 1 or args.compare_runs < 1:
        parser.error("--runs and --compare-runs must be at least 1")
    args.compare = [m for m in dict.fromkeys(args.compare) if m != args.mesh]
    if args.profile is not None and args.profile not in args.nodes:
        parser.error("--profile N must be one of --nodes")
    return args


def write_outputs(out: Path, document: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{NAME}.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / f"{NAME}.md").write_text(render_markdown(document))
    drawn(plot, document, out / f"{NAME}.png")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    if args.command == "record":
        record(log=log)
        return 0
    if args.render:
        write_outputs(args.out, json.loads((args.out / f"{NAME}.json").read_text()))
        return 0
    recorded = load()
    header = recorded["header"]
    command = "python -m bench.controller " + " ".join(sys.argv[1:] if argv is None else argv)
    machine_info, src = machine(), source(REPO)

    def document(results: Results) -> dict[str, Any]:
        return {
            "command": command,
            "machine": machine_info,
            "source": src,
            "recorded": {
                "date": header["date"],
                "kernel": header["kernel"],
                "os": header["os"],
                "source": header["source"],
                "lab": {k: header["lab"][k] for k in ("nodes", "node", "address")},
            },
            "total_minutes": round((time.monotonic() - started) / 60, 1),
            "notes": NOTES,
            **results.to_json(),
        }

    with tempfile.TemporaryDirectory(prefix="trainfleet-controller-bench-") as workdir:
        env = {**os.environ, "PYINFRA_PROGRESS": "off"}
        runner = Runner(Path(workdir), env, log)
        results = Results(
            nodes=args.nodes,
            runs=args.runs,
            profile_at=args.profile,
            mesh=args.mesh,
            compare=args.compare,
            compare_runs=args.compare_runs,
        )
        measure(runner, results, recorded, lambda r: write_outputs(args.out, document(r)))
    write_outputs(args.out, document(results))
    bad = [s for s in results.samples if not s.ok]
    log(f"wrote {args.out}/{NAME}.md, .png and .json; {len(bad)} failed measurements")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
