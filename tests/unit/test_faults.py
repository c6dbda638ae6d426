"""A failed step names what happened: pyinfra itself, on this machine (@local), runs a step
whose command hangs past its timeout and one whose command fails (lab: tests/lab/test_drift.py
loses a node in the middle of a deploy)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
DEPLOY = """
from pyinfra import state
from pyinfra.operations import server

from runtime.faults import name_step_faults

name_step_faults(state)
server.shell(name="A step that fails", commands=["false"], _ignore_errors=True)
server.shell(name="A step that hangs", commands=["sleep 30"], _timeout=1)
"""


def test_a_timed_out_step_is_named_with_its_timeout_and_a_failed_command_is_left_alone(tmp_path):
    deploy = tmp_path / "hang.py"
    deploy.write_text(DEPLOY)
    run = subprocess.run(
        [PYINFRA, "-y", "@local", str(deploy)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    said = [line.strip() for line in run.stderr.splitlines() if "trainfleet:" in line]
    assert said == ["[@local] trainfleet: timed out after 1s, in the step 'A step that hangs'"], (
        run.stderr
    )
