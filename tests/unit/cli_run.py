"""The command line run as a user runs it: a child process on this checkout's package."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def run_cli(
    *argv: str | Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run in the checkout, its output captured; ``env`` added to this environment.
    PYTHONPATH names this checkout's package, whichever checkout the venv was installed from."""
    return subprocess.run(
        [str(a) for a in argv],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
        timeout=120,
    )
