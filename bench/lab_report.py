"""The benchmark's outputs from its raw results: the markdown table, the plot, the machine.

Everything here reads the JSON that ``python -m bench`` writes (``docs/benchmark.json``), so
``python -m bench --render`` redraws the table and plot without running anything.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import platform
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.stats import RATIO_TARGET, Summary, Verdict, ratio, summarize, verdict
from bench.tally import PHASES, ExecCount, exec_count, phases, short_label, top_commands

TASKS = ("floor", "first provision", "re-run", "drift", "torch provision", "preflight")
WHAT = {
    "floor": "`pyinfra inventories/lab.py fact server.Hostname`: connect, one command per node, "
    "exit",
    "first provision": "`deploy/cluster.py` on freshly booted nodes (pdsh etc. installed with apt "
    "from the host's cache)",
    "re-run": "`deploy/cluster.py` again on the converged cluster (changes nothing)",
    "drift": "`deploy/drift.py` on the converged cluster (read-only)",
    "torch provision": "`deploy/cluster.py` with PyTorch 2.13.0+cpu pinned: pip installs it into "
    "every node's venv from the wheelhouse (once per N, the preflight's prerequisite)",
    "preflight": "`deploy/preflight.py` on the torch-pinned cluster (hygiene, reachability, gloo "
    "all_reduce)",
}


def machine() -> dict[str, Any]:
    """What the numbers were taken on."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = next(
        (
            int(line.split()[1])
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal:")
        ),
        0,
    )
    os_name = "unknown"
    if Path("/etc/os-release").exists():
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "os": os_name,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "pyinfra": importlib.metadata.version("pyinfra"),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def source(repo: Path) -> dict[str, Any]:
    """The commit measured, and whether the tree had other changes (docs/ aside)."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--", ".", ":!docs")
    return {"commit": commit, "clean": not changed}


def describe_source(src: dict[str, Any] | None) -> str:
    if not src:
        return "an unrecorded commit"
    return f"commit `{src['commit']}`" + ("" if src["clean"] else " with uncommitted changes")


def describe_machine(m: dict[str, Any]) -> str:
    return (
        f"{m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB, {m['os']}, kernel {m['kernel']}, "
        f"Python {m['python']}, pyinfra {m['pyinfra']}, {m['date']}"
    )


@dataclass
class Row:
    """One (N, task) line of the table."""

    nodes: int
    task: str
    summary: Summary | None
    cpu_median: float | None
    busy_median: float | None  # share of the machine's cores busy during the run
    rss_mb: float | None
    ratio: float | None
    execs: ExecCount | None
    verdict: Verdict | None
    problems: list[str]  # failed runs, a re-run that changed something


CHECKS = ("drift", "preflight")


def findings(sample: dict[str, Any]) -> dict[str, str]:
    """A check run's failed nodes (recorded, or read back from the stderr tail of older results)."""
    if sample.get("findings"):
        return sample["findings"]
    if sample["task"] in CHECKS and sample["returncode"] != 0:
        from bench.run import check_findings

        return check_findings(sample.get("stderr_tail", ""))
    return {}


def _ok(sample: dict[str, Any]) -> bool:
    """Timed in full: the run succeeded, or it is a check that ran to its verdict and failed
    nodes (its time is the check's; what it reported is listed beside it)."""
    if sample["task"] in CHECKS and sample["returncode"] == 1 and findings(sample):
        return True
    return sample["returncode"] == 0 and not sample.get("errors")


def summarize_findings(found: dict[str, str]) -> str:
    """``ssh mesh (root) on 5 nodes (rc=124)``: what failed, on how many nodes."""
    by_property: dict[str, list[str]] = {}
    for problem in found.values():
        prop = problem.split(" is ", 1)[0] if " is " in problem else problem[:60]
        by_property.setdefault(prop, []).append(problem)
    parts = []
    for prop, problems in sorted(by_property.items(), key=lambda kv: -len(kv[1])):
        codes = sorted(set(re.findall(r"rc=\d+", " ".join(problems))))
        parts.append(
            f"{prop} on {len(problems)} node{'s' if len(problems) > 1 else ''}"
            + (f" ({', '.join(codes)})" if codes else "")
        )
    return "; ".join(parts)


def _problems(task: str, samples: list[dict[str, Any]]) -> list[str]:
    problems = [f"run {s['round'] + 1} exited {s['returncode']}" for s in samples if not _ok(s)]
    failed = [s for s in samples if _ok(s) and findings(s)]
    if failed:
        nodes = max(len(findings(s)) for s in failed)
        problems.append(
            f"{len(failed)} of {len(samples)} runs failed nodes (up to {nodes}): "
            + summarize_findings(findings(failed[-1]))
        )
    if task in ("re-run", "drift", "preflight"):
        problems += [
            f"run {s['round'] + 1} changed {s['changed']} host-operations"
            for s in samples
            if s.get("changed")
        ]
    return problems


def _accounted(
    results: dict[str, Any], task: str, nodes: int, cprofile: bool = False
) -> dict[str, Any] | None:
    for entry in results.get("accounted", []):
        if entry["task"] == task and entry["nodes"] == nodes and entry["cprofile"] == cprofile:
            return entry["tally"]
    return None


def node_names(nodes: int) -> list[str]:
    return [f"node{i}" for i in range(1, nodes + 1)]


def build_rows(results: dict[str, Any]) -> list[Row]:
    """Every measured (N, task), in N then task order, with its ratio and target verdict."""
    by_key: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for sample in results["samples"]:
        by_key.setdefault((sample["nodes"], sample["task"]), []).append(sample)
    summaries = {
        key: summarize([s["seconds"] for s in samples if _ok(s)])
        for key, samples in by_key.items()
        if any(_ok(s) for s in samples)
    }
    rows = []
    for (nodes, task), samples in sorted(
        by_key.items(), key=lambda kv: (kv[0][0], TASKS.index(kv[0][1]))
    ):
        summary = summaries.get((nodes, task))
        floor = summaries.get((nodes, "floor"))
        task_ratio = ratio(summary, floor) if summary and floor else None
        tally = _accounted(results, task, nodes)
        execs = exec_count(tally, node_names(nodes)) if tally else None
        good = [s for s in samples if _ok(s)]
        cpu = summarize([s["cpu_seconds"] for s in good]).median if good else None
        busy_values = [s["machine_busy"] for s in good if s.get("machine_busy") is not None]
        busy = summarize(busy_values).median if busy_values else None
        rss = max(s["maxrss_kb"] for s in samples) / 1024
        rows.append(
            Row(
                nodes,
                task,
                summary,
                cpu,
                busy,
                round(rss, 1),
                task_ratio,
                execs,
                verdict(task, task_ratio, execs.high if execs else None),
                _problems(task, samples),
            )
        )
    return rows


# -- markdown ------------------------------------------------------------------------------


def _cell(value: float | None, fmt: str) -> str:
    return "—" if value is None else format(value, fmt)


def _target_cell(row: Row, note: int | None) -> str:
    cells = []
    if row.verdict is not None:
        cells.append(
            "met"
            if row.verdict.met
            else f"**missed**: {', '.join(row.verdict.missed)} (note {note})"
        )
    if row.problems:
        cells.append("**check**: " + "; ".join(row.problems))
    return "; ".join(cells)


def render_table(rows: list[Row], notes: dict[tuple[int, str], int]) -> str:
    lines = [
        "| N | task | runs | median s | min–max s | × floor | execs/node | controller CPU s | peak "
        "RSS MB | target |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        s = row.summary
        lines.append(
            " | ".join(
                [
                    f"| {row.nodes}",
                    row.task,
                    str(s.runs) if s else "0",
                    _cell(s.median if s else None, ".2f"),
                    s.spread() if s else "—",
                    _cell(row.ratio, ".2f") if row.task != "floor" else "1",
                    row.execs.describe() if row.execs else "—",
                    _cell(row.cpu_median, ".2f"),
                    _cell(row.rss_mb, ".0f"),
                    _target_cell(row, notes.get((row.nodes, row.task))),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def render_summary(rows: list[Row]) -> str:
    """Nodes by tasks: ``median s (× floor)``, the compact view the README shows."""
    tasks = [t for t in TASKS if any(r.task == t and r.summary for r in rows)]
    cells = {(r.nodes, r.task): r for r in rows if r.summary}
    lines = ["| N | " + " | ".join(tasks) + " |", "|---:|" + "---:|" * len(tasks)]
    for nodes in sorted({r.nodes for r in rows}):
        out = []
        for task in tasks:
            row = cells.get((nodes, task))
            if row is None:
                out.append("—")
            elif task == "floor":
                out.append(f"{row.summary.median:.2f}")
            else:
                out.append(f"{row.summary.median:.2f} ({row.ratio:.2f}x)")
        lines.append(f"| {nodes} | " + " | ".join(out) + " |")
    return "\n".join(lines)


def _nodes(count: int) -> str:
    return f"{count} node" if count == 1 else f"{count} nodes"


def explain(results: dict[str, Any], row: Row, floor: Row | None) -> str:
    """Why a target was missed, from the measured profile of that run (one or two sentences)."""
    parts = []
    tally = _accounted(results, row.task, row.nodes)
    floor_tally = _accounted(results, "floor", row.nodes)
    if row.summary and floor and floor.summary:
        gap = row.summary.median - floor.summary.median
        parts.append(
            f"{row.task} at {_nodes(row.nodes)} takes {gap:.2f} s more than the floor "
            f"({row.summary.median:.2f} s vs {floor.summary.median:.2f} s)"
        )
    if tally and floor_tally:
        mine, base = phases(tally), phases(floor_tally)
        extra = sorted(((mine[p] - base[p], p) for p in PHASES), reverse=True)
        parts.append(
            "the extra time is in "
            + ", ".join(f"{p} (+{d:.2f} s)" for d, p in extra[:2] if d > 0.05)
        )
    if row.cpu_median is not None and row.summary:
        busy = row.cpu_median / row.summary.median
        parts.append(
            f"the controller's own CPU time is {row.cpu_median:.2f} s, {busy:.0%} of the wall time"
            + (" (its one Python thread is the bottleneck)" if busy > 0.8 else "")
        )
    if row.busy_median is not None:
        cores = results["machine"]["cores"]
        parts.append(
            f"the machine's {cores} cores were {row.busy_median:.0%} busy during the run "
            "(controller, every node's sshd and commands)"
            + (": the lab is CPU-bound" if row.busy_median > 0.9 else "")
        )
    if tally and row.execs:
        floor_execs = (
            exec_count(floor_tally, node_names(row.nodes)).describe() if floor_tally else "?"
        )
        parts.append(
            f"{row.execs.describe()} execs/node (floor {floor_execs}); "
            + ", ".join(
                f"{short_label(c.label)} took {c.seconds / c.count:.2f} s on average with "
                f"{_nodes(row.nodes)} at once"
                for c in top_commands(tally, 2)
            )
        )
    parts.append(_slowest_parts(results, row))
    failed = [
        findings(s)
        for s in results["samples"]
        if s["task"] == row.task and s["nodes"] == row.nodes and findings(s)
    ]
    if failed:
        worst = max(failed, key=len)
        parts.append(
            f"{len(failed)} runs failed nodes of the converged cluster: {summarize_findings(worst)}"
            + (
                "; rc=124 is `timeout` ending a probe that did not finish within its bound"
                if "rc=124" in " ".join(worst.values())
                else ""
            )
        )
    if tally and row.verdict and any("execs/node" in m for m in row.verdict.missed):
        per_label = ", ".join(
            f"{short_label(label)} {v['count']}" for label, v in tally["commands"].items()
        )
        parts.append(
            f"the commands of the counted run are: {per_label}"
            + (
                "; an `op` command there is the verdict operation failing a node with findings "
                "(a node that passes gets none)"
                if any(k.startswith("op ") for k in tally["commands"])
                else ""
            )
        )
    return "; ".join(p for p in parts if p) + "."


def _sections(results: dict[str, Any], nodes: int) -> dict[str, float]:
    return next((e["seconds"] for e in results.get("sections", []) if e["nodes"] == nodes), {})


def deploy_parts(parts: dict[str, float]) -> dict[str, float]:
    """The parts the re-run's one command (DeployState) reads: all but identity, the NCCL
    variables as processes see them and the live mesh probe, which only drift adds."""
    from runtime.bundle import deploy_sections

    users = [name.split(":", 1)[1] for name in parts if name.startswith("mesh_user:")]
    mine = set(deploy_sections(users))
    return {k: v for k, v in parts.items() if k in mine}


def _slowest_parts(results: dict[str, Any], row: Row) -> str:
    parts = _sections(results, row.nodes)
    if row.task == "re-run":
        parts = deploy_parts(parts)
    if not parts:
        return ""
    top = sorted(parts.items(), key=lambda kv: kv[1], reverse=True)[:3]
    return (
        f"timed alone on one node of an idle lab, its parts take {sum(parts.values()):.2f} s, "
        "slowest " + ", ".join(f"{k} {v:.2f} s" for k, v in top)
    )


def render_sections(results: dict[str, Any]) -> str:
    """The fingerprint's parts at every N, as timed on node1 (one after another, idle lab)."""
    entries = sorted(results.get("sections", []), key=lambda e: e["nodes"])
    if not entries:
        return ""
    names = sorted(
        {k for e in entries for k in e["seconds"]},
        key=lambda k: -max(e["seconds"].get(k, 0.0) for e in entries),
    )
    lines = [
        (
            "Parts of the node fingerprint (drift's one command per node; the re-run's DeployState "
            "is the parts without identity, nccl_seen and mesh_proof), each timed alone on node1 "
            "of an idle lab, remote seconds:"
        ),
        "",
        "| part | " + " | ".join(f"N={e['nodes']}" for e in entries) + " |",
        "|---|" + "---:|" * len(entries),
    ]
    for name in names:
        lines.append(
            f"| {name} | "
            + " | ".join(f"{e['seconds'].get(name, 0.0):.2f}" for e in entries)
            + " |"
        )
    return "\n".join(lines)


def render_profile(results: dict[str, Any], nodes: int) -> str:
    """Phase times and hottest controller functions of the re-run and drift at ``nodes``."""
    lines = [
        f"Phases of one accounted run at N={nodes} (seconds; `bench/lab_driver.py` stamps "
        "pyinfra's stages):",
        "",
        "| task | " + " | ".join(PHASES) + " | total |",
        "|---|" + "---:|" * (len(PHASES) + 1),
    ]
    for task in ("floor", "re-run", "drift", "preflight"):
        tally = _accounted(results, task, nodes)
        if tally:
            ph = phases(tally)
            lines.append(
                f"| {task} | "
                + " | ".join(f"{ph[p]:.2f}" for p in PHASES)
                + f" | {sum(ph.values()):.2f} |"
            )
    for task in ("re-run", "drift"):
        tally = _accounted(results, task, nodes, cprofile=True)
        if tally and tally.get("cprofile"):
            lines += [
                "",
                (
                    f"Controller functions with the most own time in the {task} at N={nodes} "
                    "(cProfile, a separate run; profiling slows it):"
                ),
                "",
            ]
            lines += [
                f"- `{f['function']}`: {f['own_seconds']:.2f} s own, {f['calls']} calls"
                for f in tally["cprofile"][:8]
            ]
    return "\n".join(lines)


def render_markdown(results: dict[str, Any]) -> str:
    rows = build_rows(results)
    floors = {r.nodes: r for r in rows if r.task == "floor"}
    missed = [r for r in rows if r.verdict and not r.verdict.met]
    notes = {(r.nodes, r.task): i for i, r in enumerate(missed, 1)}
    plan = results["plan"]
    out = [
        "# Benchmark",
        "",
        (
            f"Measured on {describe_machine(results['machine'])}, at "
            f"{describe_source(results.get('source'))}, by `{results['command']}` "
            f"({results['total_minutes']:.0f} minutes). Raw samples: `docs/benchmark.json`."
        ),
        "",
        (
            "Each time is the wall clock of one `pyinfra -y --json` process on the controller, "
            "median of the runs (min–max beside it); every run at N is in its own freshly booted "
            "lab of N nodes. The lab's nodes are namespaces on this same machine: their sshd and "
            "remote commands share its cores with the controller. **× floor** is the median over "
            "the floor's median at the same N. **execs/node**: SSH exec requests the controller "
            "sent to each node (one per remote process sshd starts), counted by paramiko's "
            "`Channel.exec_command` in one extra run through `bench/lab_driver.py`; `mean "
            "(min–max)` when nodes differ. **controller CPU**: user + system time of that pyinfra "
            "process; **peak RSS**: its `ru_maxrss`, from `wait4` in a small parent "
            "(`bench/child.py`, so it is pyinfra's own peak), the largest of the runs."
        ),
        "",
        "| task | what runs |",
        "|---|---|",
        *[f"| {t} | {WHAT[t]} |" for t in TASKS],
        "",
        (
            f"Targets (issue #8): re-run and drift within {RATIO_TARGET}x of the floor at every N; "
            "the drift run one remote command per node."
        ),
        "",
        "Median seconds (× floor):",
        "",
        render_summary(rows),
        "",
        "Every measurement:",
        "",
        render_table(rows, notes),
    ]
    if missed:
        out += ["", "## Why targets were missed", ""]
        out += [
            f"{notes[(r.nodes, r.task)]}. {explain(results, r, floors.get(r.nodes))}"
            for r in missed
        ]
    largest = max((r.nodes for r in rows), default=None)
    if largest is not None:
        out += [
            "",
            "## Where the time goes",
            "",
            render_profile(results, plan.get("cprofile_at") or largest),
        ]
        if results.get("sections"):
            out += ["", render_sections(results)]
    skipped = results.get("not_measured", [])
    if skipped:
        out += ["", "## Not measured", ""]
        out += [f"- {s['task']} at N={s['nodes']}: {s['why']}" for s in skipped]
        torch = [r for r in rows if r.task == "torch provision" and r.summary]
        if torch and any(s["task"] == "preflight" for s in skipped):
            out.append(
                "- measured torch provision (one run each): "
                + ", ".join(
                    f"{r.summary.median:.0f} s at {r.nodes} node{'s' if r.nodes > 1 else ''}"
                    for r in torch
                )
            )
    return "\n".join(out) + "\n"


# -- plot ----------------------------------------------------------------------------------


def drawn(
    plot: Callable[[dict[str, Any], Path], None], document: dict[str, Any], path: Path
) -> bool:
    """``plot`` of ``document`` into ``path`` where matplotlib (the ``bench`` extra) is there;
    else a note on stderr and no picture: the md and the JSON are written either way, so a run
    without it is not lost after its first N."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print(
            f"bench: {path.name} not drawn: matplotlib is missing "
            "(pip install -e '.[bench]'; make bench installs it)",
            file=sys.stderr,
        )
        return False
    plot(document, path)
    return True


def plot(results: dict[str, Any], path: Path) -> None:
    """Time vs nodes, one line per task (the floor dashed); beside it, the ratio to the floor."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    rows = [r for r in build_rows(results) if r.summary]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 5.6))
    colors = dict(
        zip(
            TASKS,
            ("black", "tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple"),
            strict=False,
        )
    )
    for task in TASKS:
        mine = [r for r in rows if r.task == task]
        if not mine:
            continue
        xs = [r.nodes for r in mine]
        med = [r.summary.median for r in mine]
        err = [
            [r.summary.median - r.summary.low for r in mine],
            [r.summary.high - r.summary.median for r in mine],
        ]
        style = {"linestyle": "--" if task == "floor" else "-", "color": colors[task]}
        left.errorbar(xs, med, yerr=err, marker="o", capsize=3, label=task, **style)
        if task not in (
            "floor",
            "torch provision",
        ):  # torch is a one-off prerequisite, not a ratio to watch
            right.plot(
                [r.nodes for r in mine if r.ratio],
                [r.ratio for r in mine if r.ratio],
                marker="o",
                label=task,
                color=colors[task],
            )
    right.axhline(
        RATIO_TARGET, color="red", linestyle=":", label=f"target {RATIO_TARGET}x (re-run, drift)"
    )
    nodes = sorted({r.nodes for r in rows})
    for ax, title, ylabel in (
        (left, "wall time per run", "seconds (median, min–max)"),
        (right, "ratio to the floor at the same N", "× floor (log)"),
    ):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    fig.suptitle(
        f"trainfleet on the lab — {results['machine']['cpu']}, {results['machine']['cores']} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
