"""Parsing what collective.sh prints: each local rank's steps."""

from __future__ import annotations

import json
import re
from typing import Any

from trainfleet.model import VENV_PYTHON
from trainfleet.text import printable


def _no_python(line: str) -> str:
    """collective.sh's word for a python that is not there (its path after it: the spec's)."""
    python = printable(line[len("nopython ") :]) or VENV_PYTHON
    if python == VENV_PYTHON:
        return f"no python at {python}: the node has no venv (pin stack.torch and deploy)"
    return f"no python at {python} (preflight.python): the node lacks that env"


_EXIT_LINE = re.compile(r"exit ([0-9]{1,3})", re.ASCII)


def _steps(lines: list[str]) -> list[dict[str, Any]]:
    """The collective's JSON steps, and what collective.sh says when python itself failed:
    ``nopython`` (no venv), ``nosecret`` (no rendezvous secret on stdin), ``exit N`` and the
    last ``stderr`` lines (escaped: a user may write into what a failing import prints)."""
    steps: list[dict[str, Any]] = []
    for line in lines:
        exited = _EXIT_LINE.fullmatch(line)
        if line == "nopython" or line.startswith("nopython "):
            steps.append({"step": "error", "stage": "python", "error": _no_python(line)})
        elif line == "nosecret":  # the controller's fault, never a user's: named all the same
            steps.append(
                {"step": "error", "stage": "secret", "error": "no rendezvous secret came on stdin"}
            )
        elif exited:
            steps.append({"step": "exit", "code": int(exited.group(1))})
        elif line.startswith("stderr "):
            steps.append({"step": "stderr", "text": printable(line[len("stderr ") :])})
        elif line.startswith(
            "nccl "
        ):  # a line of NCCL's INFO log (its host part is the node's to name)
            steps.append({"step": "nccl", "text": printable(line[len("nccl ") :], 300)})
        else:
            try:
                step = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(step, dict):
                steps.append(step)
    return steps


_RANK_LINE = re.compile(r"([0-9]{1,3}) (.*)", re.ASCII | re.DOTALL)


def node_steps(lines: list[str], count: int) -> list[list[dict[str, Any]]]:
    """Each local rank's steps from collective.sh's output: a rank's lines carry its local rank
    ("3 {...}", "3 exit 1"); a line without one (``nopython``) is the node's, for every rank."""
    mine: list[list[str]] = [[] for _ in range(count)]
    shared: list[str] = []
    for line in lines:
        tagged = _RANK_LINE.fullmatch(line)
        if tagged and int(tagged.group(1)) < count:
            mine[int(tagged.group(1))].append(tagged.group(2))
        elif not tagged:
            shared.append(line)
    return [_steps(shared + rank) for rank in mine]


def job_steps(steps: list[dict[str, Any]], jobs: int) -> list[list[dict[str, Any]]]:
    """One rank's steps per job (collective.py runs its jobs in turn): a step names its job; one
    that does not is the process's: NCCL's INFO lines (one log per process) belong to every job,
    the import's failure and collective.sh's exit status and stderr to the job the process was
    in and every job after, which never ran."""
    split: list[list[dict[str, Any]]] = [[] for _ in range(jobs)]
    current = 0
    for step in steps:
        job = step.get("job")
        if isinstance(job, int) and 0 <= job < jobs:
            current = job
            split[job].append(step)
        else:
            for later in split if step.get("step") == "nccl" else split[current:]:
                later.append(step)
    return split
