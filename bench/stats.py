"""Medians, spreads, ratios to the floor and the issue's targets: plain functions, no I/O."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# The targets: re-run and drift within 1.5x of the floor; drift one exec per node.
RATIO_TARGET = 1.5
RATIO_TARGET_TASKS = ("re-run", "drift")
EXECS_TARGET = {"drift": 1}


@dataclass(frozen=True)
class Summary:
    """Several timings of one task at one N."""

    median: float
    low: float
    high: float
    runs: int

    def spread(self) -> str:
        return f"{self.low:.2f}–{self.high:.2f}" if self.runs > 1 else "1 run"


def summarize(samples: list[float]) -> Summary:
    if not samples:
        raise ValueError("no samples to summarize")
    return Summary(
        median=statistics.median(samples), low=min(samples), high=max(samples), runs=len(samples)
    )


def ratio(task: Summary, floor: Summary) -> float:
    """The task's median over the floor's median at the same N."""
    if floor.median <= 0:
        raise ValueError("the floor's median must be positive")
    return task.median / floor.median


@dataclass(frozen=True)
class Verdict:
    met: bool
    missed: list[str]  # what was missed, one phrase each ("ratio 2.10 > 1.5")


def verdict(task: str, task_ratio: float | None, execs_max: int | None) -> Verdict | None:
    """The targets that apply to ``task``; None when the issue sets none for it.

    ``execs_max`` is the most remote commands any one node got (the target is per node).
    """
    missed = []
    applies = False
    if task in RATIO_TARGET_TASKS:
        applies = True
        if task_ratio is None:
            missed.append("ratio not measured")
        elif task_ratio > RATIO_TARGET:
            missed.append(f"ratio {task_ratio:.2f} > {RATIO_TARGET}")
    if task in EXECS_TARGET:
        applies = True
        if execs_max is None:
            missed.append("execs not counted")
        elif execs_max > EXECS_TARGET[task]:
            missed.append(f"{execs_max} execs/node > {EXECS_TARGET[task]}")
    if not applies:
        return None
    return Verdict(met=not missed, missed=missed)
