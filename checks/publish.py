"""A check run's output: a table for people on stderr, JSON for scripts (the verdict per node
is the ``operations.verdict.verdict`` operation)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from trainfleet.controller_files import write_atomic
from trainfleet.keystore import controller_folder


def report_path(kind: str, cluster: str) -> Path:
    """``.trainfleet/reports/<kind>-<cluster>.json`` (under TRAINFLEET_HOME when set)."""
    return controller_folder("reports") / f"{kind}-{cluster}.json"


def publish(
    title: str, table: str, lines: list[str], json_text: str, path: Path, stdout_env: str
) -> None:
    """Print the table and one line per finding, write the JSON atomically, and also print
    it on stdout when the environment variable ``stdout_env`` is ``-``."""
    print(f"\n--> {title}:", file=sys.stderr)
    print(table, file=sys.stderr)
    for line in lines:
        print(f"    {line}", file=sys.stderr)
    write_atomic(path, json_text + "\n")
    print(f"    JSON report: {path}\n", file=sys.stderr)
    if os.environ.get(stdout_env) == "-":
        print(json_text)
