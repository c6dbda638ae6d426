"""Smoke job verdicts: each rank's report, and what a launcher that failed said."""

from __future__ import annotations

import json
import re
from typing import Any

from checks.collective_verdicts import TIMEOUT_EXITS, rank_owners
from checks.preflight_report import Problem
from trainfleet.model import Cluster
from trainfleet.text import printable


def smoke_reports(lines: list[str]) -> dict[int, dict[str, Any]]:
    """The smoke job's JSON line of each rank found among a launcher's output (pdsh and the
    launchers prefix or surround it with their own), by rank."""
    reports: dict[int, dict[str, Any]] = {}
    for line in lines:
        start = line.find('{"smoke"')
        if start < 0:
            continue
        try:
            report = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if (
            isinstance(report, dict)
            and isinstance(report.get("rank"), int)
            and not isinstance(report["rank"], bool)
        ):
            reports[report["rank"]] = report
    return reports


def smoke_problems(cluster: Cluster, launcher: str, out: dict[str, list[str]]) -> list[Problem]:
    """The smoke stage: every rank of every node reported "ok" with the cluster's world size.
    ``out`` is each launching node's output (the master's alone for runners that start every
    node's ranks). A rank that never reported is named with what its launcher said last."""
    reports: dict[int, dict[str, Any]] = {}
    for lines in out.values():
        reports.update(smoke_reports(lines))
    problems = []
    for rank, node in rank_owners(cluster).items():
        report = reports.get(rank)
        if report is None:
            said = out.get(node) if node in out else out.get(cluster.master.name, [])
            problems.append(
                Problem(
                    "smoke",
                    node,
                    f"through {launcher}: rank {rank} never reported{_last_words(said or [])}",
                )
            )
        elif report.get("smoke") != "ok":
            problems.append(
                Problem(
                    "smoke",
                    node,
                    f"through {launcher}: rank {rank} failed: "
                    f"{printable(str(report.get('error', 'no error given')))}",
                )
            )
        elif report.get("world") != cluster.total_slots:
            problems.append(
                Problem(
                    "smoke",
                    node,
                    f"through {launcher}: rank {rank} ran in a world of "
                    f"{report.get('world')}, the cluster has {cluster.total_slots} ranks",
                )
            )
    return problems


def _last_words(lines: list[str]) -> str:
    code = next(
        (
            line[len("exit ") :]
            for line in reversed(lines)
            if re.fullmatch(r"exit [0-9]{1,3}", line)
        ),
        None,
    )
    stderr = [line[len("stderr ") :] for line in lines if line.startswith("stderr ")]
    if code is None:
        return " (its launcher gave no answer)"
    ended = "timed out" if int(code) in TIMEOUT_EXITS else f"exited with status {code}"
    return f" (its launcher {ended}{': ' + printable(stderr[-1]) if stderr else ''})"
