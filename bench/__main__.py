"""``python -m bench [--nodes 1,2,4,8,16] [--runs 3] [--out docs/]``: run the benchmark on the lab.

Writes OUT/benchmark.json (raw samples, counts, the machine), OUT/benchmark.md (the table)
and OUT/benchmark.png (the plot), after every N so an interrupted run keeps what it measured.
``--render`` redraws the table and plot from an existing OUT/benchmark.json.
Needs root (the lab) and no other lab up; it takes every lab it brings up down again.
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

from bench.lab_report import drawn, machine, plot, render_markdown, source
from bench.run import REPO, Plan, Results, Runner, measure, node_counts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--nodes", type=node_counts, default=[1, 2, 4, 8, 16], help="lab sizes (default 1,2,4,8,16)"
    )
    parser.add_argument(
        "--runs", type=int, default=3, help="timed runs of each task at each N (default 3)"
    )
    parser.add_argument(
        "--out", type=Path, default=Path("docs"), help="where the results go (default docs/)"
    )
    parser.add_argument(
        "--preflight-max-nodes",
        type=int,
        default=4,
        help="largest N that gets PyTorch and the preflight (~1 min a node; default 4)",
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=40.0,
        help="stop starting runs that would end past this (default 40)",
    )
    parser.add_argument(
        "--render", action="store_true", help="only redraw OUT/benchmark.{md,png} from its JSON"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    return args


def write_outputs(out: Path, document: dict[str, Any]) -> list[str]:
    """Writes the JSON, the md and (with matplotlib) the plot; the names of what it wrote."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "benchmark.json").write_text(json.dumps(document, indent=1) + "\n")
    (out / "benchmark.md").write_text(render_markdown(document))
    drew = drawn(plot, document, out / "benchmark.png")
    return ["benchmark.md", "benchmark.json"] + (["benchmark.png"] if drew else [])


def _document(
    results: Results, command: str, started: float, machine_info: dict[str, Any]
) -> dict[str, Any]:
    return {
        "command": command,
        "machine": machine_info,
        "source": source(REPO),
        "total_minutes": round((time.monotonic() - started) / 60, 1),
        **results.to_json(),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        document = json.loads((args.out / "benchmark.json").read_text())
        written = write_outputs(args.out, document)
        print(f"bench: wrote {', '.join(written)} in {args.out}", file=sys.stderr)
        return 0
    if os.geteuid() != 0:
        print("bench: the lab needs root", file=sys.stderr)
        return 1
    command = "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv)
    plan = Plan(
        nodes=args.nodes,
        runs=args.runs,
        preflight_max_nodes=args.preflight_max_nodes,
        budget_seconds=args.budget_minutes * 60,
        cprofile_at=max(args.nodes),
    )
    started = time.monotonic()
    machine_info = machine()

    def log(message: str) -> None:
        print(f"[{time.monotonic() - started:7.1f}s] {message}", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="trainfleet-bench-") as workdir:
        # Its own key store and reports: the developer's .trainfleet/ is never touched.
        env = {
            **os.environ,
            "TRAINFLEET_HOME": str(Path(workdir) / "home"),
            "PYINFRA_PROGRESS": "off",
        }
        runner = Runner(env, Path(workdir), log)
        results = measure(
            runner,
            plan,
            lambda r: write_outputs(args.out, _document(r, command, started, machine_info)),
        )
    written = write_outputs(args.out, _document(results, command, started, machine_info))
    log(f"wrote {', '.join(written)} in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
