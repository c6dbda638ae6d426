"""docs/controller-benchmark.{md,png} from the raw results (``--render`` redraws them from the
JSON).

Timing tables are of the main mesh (``plan.mesh``; results from before it existed were of a key
mesh); the SSH mesh section sets each measured mesh beside the other."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.lab_report import describe_machine, describe_source

TASKS = ("floor", "pyinfra baseline", "re-run", "first-provision plan", "drift")
WHAT = {
    "floor": "`pyinfra INVENTORY fact server.Hostname`: load the inventory, one command per node, "
    "exit",
    "pyinfra baseline": "`bench/controller/noop_deploy.py`: the deploy's 12 operations (one mesh "
    "user) as no-ops that read no fact: pyinfra's own cost per host and operation",
    "re-run": "`deploy/cluster.py` on nodes answering as converged (must change nothing)",
    "first-provision plan": "`pyinfra --json --dry ... deploy/cluster.py` on nodes answering as "
    "freshly booted (every node must get changes; no `-y`: with it pyinfra never evaluates an "
    "operation)",
    "drift": "`deploy/drift.py` on nodes answering as converged (must find nothing)",
}
GROWTH_LIMIT = 2.0 * 1.15  # each doubling of N at most doubles CPU, +15%
GROWTH_TASKS = ("re-run", "first-provision plan", "drift")
GROWTH_FROM, GROWTH_TO = 64, 1024
RATIO_LIMIT = 1.5  # re-run and drift CPU at the largest N within 1.5x the baseline's
RATIO_TASKS = ("re-run", "drift")
# Issue #18: one node's SSH mesh files of constant size, bytes per run growing linearly with N.
CONSTANT_K = 0.05  # fitted exponent of a size that does not grow with N
LINEAR_K = 1.05  # fitted exponent of bytes per run that grow linearly with N
WIRE_TASKS = ("re-run", "first-provision plan", "drift")
MESH_FILES = (
    "known_hosts",
    "authorized_keys",
    "ssh_config",
    "user_certificate",
    "host_certificates",
    "sshd_drop_in",
    "revoked_keys",
)
MESH_FILE_TITLES = {
    "known_hosts": "known_hosts block",
    "authorized_keys": "authorized_keys block",
    "ssh_config": "ssh config block",
    "user_certificate": "user cert",
    "host_certificates": "host certs",
    "sshd_drop_in": "sshd drop-in",
    "revoked_keys": "KRL",
}
GROUPS = ("ssh mesh", "hosts + pdsh", "other")
SHORT = {"re-run": "re-run", "first-provision plan": "plan", "drift": "drift"}


def main_mesh(results: dict[str, Any]) -> str:
    """The mesh of the timing tables: ``plan.mesh``; results from before it existed were of a key
    mesh."""
    return results.get("plan", {}).get("mesh", "keys")


def meshes(results: dict[str, Any]) -> list[str]:
    """Every mesh measured, the main one first."""
    main = main_mesh(results)
    found = {s.get("mesh", main) for s in [*results["samples"], *results["setups"]]}
    return [main, *sorted(found - {main})]


@dataclass
class Cell:
    nodes: int
    task: str
    runs: int  # valid measurements
    failed: list[str]  # why the others are not
    wall: float | None
    cpu: float | None
    rss_mb: float | None
    busy: float | None


def cells(results: dict[str, Any], mesh: str | None = None) -> dict[tuple[int, str], Cell]:
    """Medians by (N, task) of one mesh's samples (the main mesh's unless ``mesh``)."""
    main = main_mesh(results)
    mesh = mesh or main
    grouped: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for s in results["samples"]:
        if s.get("mesh", main) == mesh:
            grouped.setdefault((s["nodes"], s["task"]), []).append(s)
    out = {}
    for (nodes, task), samples in grouped.items():
        good = [s for s in samples if s["ok"]]
        busy = [s["machine_busy"] for s in good if s.get("machine_busy") is not None]
        failed = [f"run {s['round'] + 1}: {s['problem']}" for s in samples if not s["ok"]]
        out[(nodes, task)] = Cell(
            nodes,
            task,
            len(good),
            failed,
            _median(good, "seconds"),
            _median(good, "cpu_seconds"),
            round(max(s["maxrss_kb"] for s in samples) / 1024, 1),
            statistics.median(busy) if busy else None,
        )
    return out


def _median(samples: list[dict[str, Any]], key: str) -> float | None:
    return round(statistics.median(s[key] for s in samples), 3) if samples else None


def growth(points: dict[int, float]) -> tuple[float | None, list[tuple[int, int, float]]]:
    """(k of CPU ∝ N^k fitted on log2-log2, per-doubling CPU ratios between consecutive Ns)."""
    ns = sorted(points)
    steps = [
        (a, b, (points[b] / points[a]) ** (1 / math.log2(b / a)))
        for a, b in zip(ns, ns[1:], strict=False)
        if points[a] > 0
    ]
    if len(ns) < 2:
        return None, steps
    xs, ys = [math.log2(n) for n in ns], [math.log2(points[n]) for n in ns]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    k = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=False)) / sum(
        (x - mx) ** 2 for x in xs
    )
    return k, steps


def growth_points(table: dict[tuple[int, str], Cell], task: str) -> dict[int, float]:
    return {
        n: c.cpu
        for (n, t), c in table.items()
        if t == task and c.cpu and GROWTH_FROM <= n <= GROWTH_TO
    }


def _f(value: float | None, fmt: str = ".2f") -> str:
    return "—" if value is None else format(value, fmt)


def _mb(count: int) -> str:
    return f"{count / 2**20:.1f}"


def wire_counts(results: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, int]]:
    """(mesh, N, task) -> what the fake connector was sent and answered in one run (the median
    run of the valid ones; every run of a task at one N sends and reads the same)."""
    main = main_mesh(results)
    grouped: dict[tuple[str, int, str], list[dict[str, int]]] = {}
    for s in results["samples"]:
        if s.get("wire") and s["ok"]:
            grouped.setdefault((s.get("mesh", main), s["nodes"], s["task"]), []).append(s["wire"])
    return {
        key: {field: int(statistics.median(w[field] for w in runs)) for field in runs[0]}
        for key, runs in grouped.items()
    }


def setups_of(results: dict[str, Any], mesh: str) -> dict[int, dict[str, Any]]:
    main = main_mesh(results)
    return {s["nodes"]: s for s in results["setups"] if s.get("mesh", main) == mesh}


def mesh_series(results: dict[str, Any]) -> dict[tuple[str, str], dict[int, float]]:
    """(mesh, quantity) -> {N: value}: the quantities issue #18 follows with N."""
    out: dict[tuple[str, str], dict[int, float]] = {}
    wire = wire_counts(results)
    for mesh in meshes(results):
        for n, setup in setups_of(results, mesh).items():
            if setup.get("mesh_files"):
                out.setdefault((mesh, "one node's mesh files"), {})[n] = setup["mesh_files"][
                    "total"
                ]
            for group in GROUPS:
                if setup.get("fact_bytes_by_group", {}).get(group):
                    out.setdefault((mesh, f"read: re-run, {group} sections"), {})[n] = setup[
                        "fact_bytes_by_group"
                    ][group]
        for (m, n, task), w in wire.items():
            if m == mesh and task in WIRE_TASKS:
                out.setdefault((mesh, f"read: {task}"), {})[n] = w["stdout_bytes"]
                out.setdefault((mesh, f"sent: {task}"), {})[n] = w["command_bytes"]
    return out


def render_mesh(results: dict[str, Any]) -> list[str]:
    """Issue #18: one node's SSH mesh files and the bytes each run sends and reads, per mesh."""
    found = meshes(results)
    wire = wire_counts(results)
    setups = {m: setups_of(results, m) for m in found}
    if not any(s.get("mesh_files") for by in setups.values() for s in by.values()):
        return []
    out = [
        "",
        "## SSH mesh: per-node files and bytes per run",
        "",
        (
            "One node's SSH mesh files as the plan renders them, in bytes: the managed blocks of "
            "`/etc/ssh/ssh_known_hosts`, the mesh user's `authorized_keys` and `~/.ssh/config` "
            "(with their BEGIN/END lines, as written into an empty file), "
            "`~/.ssh/id_trainfleet-cert.pub`, the host certificates "
            "`/etc/ssh/ssh_host_<type>_key-cert.pub`, "
            "`/etc/ssh/sshd_config.d/trainfleet-mesh.conf` and the KRL "
            "`/etc/ssh/trainfleet_revoked_keys`; columns for node0001, then the range of the total "
            "over all nodes (a host certificate names the node's address, whose length varies)."
        ),
        "",
        "| N | mesh | "
        + " | ".join(MESH_FILE_TITLES[f] for f in MESH_FILES)
        + " | total | total, all nodes |",
        "|---:|---|" + "---:|" * (len(MESH_FILES) + 2),
    ]
    for n in sorted({n for by in setups.values() for n in by}):
        for mesh in found:
            s = setups[mesh].get(n)
            if s and s.get("mesh_files"):
                files, total = s["mesh_files"], s["mesh_files_total"]
                out.append(
                    f"| {n} | {mesh} | "
                    + " | ".join(str(files[f]) for f in MESH_FILES)
                    + f" | {files['total']} | {total['min']}–{total['max']} |"
                )
    out += [
        "",
        (
            "Bytes per run, counted where pyinfra's `@fake` connector sees them "
            "(`bench/controller/wire.py`): read, the stdout it answers with (what a real node "
            "would send back); sent, the commands it is asked to run (what the controller would "
            "send); all nodes together, one run (every valid run of a task at one N counts the "
            "same). The re-run's read bytes are then split by the fact sections they come from: "
            "the SSH mesh's (host keys, sshd, known_hosts, mesh users), /etc/hosts and pdsh (a "
            "line per node in either mesh), and the rest."
        ),
        "",
        "| N | mesh | "
        + " | ".join(f"read MB: {SHORT[t]}" for t in WIRE_TASKS)
        + " | "
        + " | ".join(f"sent MB: {SHORT[t]}" for t in WIRE_TASKS)
        + " | commands (re-run) "
        "| re-run read, MB: ssh mesh | hosts + pdsh | other | read KB per node (re-run) |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({n for by in setups.values() for n in by}):
        for mesh in found:
            s = setups[mesh].get(n)
            w = {task: wire.get((mesh, n, task)) for task in WIRE_TASKS}
            if not s and not any(w.values()):
                continue
            groups = (s or {}).get("fact_bytes_by_group", {})
            rerun = w["re-run"]
            out.append(
                f"| {n} | {mesh} | "
                + " | ".join(_mb2(w[t]["stdout_bytes"] if w[t] else None) for t in WIRE_TASKS)
                + " | "
                + " | ".join(_mb2(w[t]["command_bytes"] if w[t] else None) for t in WIRE_TASKS)
                + f" | {rerun['commands'] if rerun else '—'} | "
                + " | ".join(_mb2(groups.get(g)) for g in GROUPS)
                + f" | {_f(rerun['stdout_bytes'] / n / 1024 if rerun else None, '.1f')} |"
            )
    series = mesh_series(results)
    all_ns = sorted({n for pts in series.values() for n in pts})
    steps_header = [f"{a}→{b}" for a, b in zip(all_ns, all_ns[1:], strict=False)]
    out += [
        "",
        (
            "Growth with N: k, the exponent of bytes ∝ N^k fitted over every measured N (log2 on "
            "log2); then the ratio per doubling of N between consecutive measured N. Constant: k ≈ "
            "0; linear: k ≈ 1; N²: k ≈ 2."
        ),
        "",
        "| quantity | mesh | k | " + " | ".join(steps_header) + " |",
        "|---|---|---:|" + "---:|" * len(steps_header),
    ]
    quantities = [
        "one node's mesh files",
        *(f"sent: {t}" for t in WIRE_TASKS),
        *(f"read: {t}" for t in WIRE_TASKS),
        *(f"read: re-run, {g} sections" for g in GROUPS),
    ]
    for quantity in quantities:
        for mesh in found:
            pts = series.get((mesh, quantity))
            if not pts:
                continue
            k, steps = growth(pts)
            by = {(a, b): r for a, b, r in steps}
            out.append(
                f"| {quantity} | {mesh} | {_f(k)} | "
                + " | ".join(
                    f"{by[(a, b)]:.2f}x" if (a, b) in by else "—"
                    for a, b in zip(all_ns, all_ns[1:], strict=False)
                )
                + " |"
            )
    if len(found) > 1:
        main = found[0]
        tables = {m: cells(results, m) for m in found}
        out += [
            "",
            (
                f"CPU of the mesh-dependent tasks, {main} beside "
                + ", ".join(found[1:])
                + " (medians of the "
                f"valid runs: {results['plan'].get('runs', '?')} of the main mesh, "
                f"{results['plan'].get('compare_runs', '?')} of each compared one)."
            ),
            "",
            "| N | task | "
            + " | ".join(f"{m} CPU s" for m in found)
            + " | "
            + " | ".join(f"{m} / {main}" for m in found[1:])
            + " |",
            "|---:|---|" + "---:|" * (2 * len(found) - 1),
        ]
        for n in sorted({n for (n, _) in tables[main]}):
            for task in WIRE_TASKS:
                cpus = [tables[m].get((n, task)) for m in found]
                if not any(c and c.cpu for c in cpus[1:]):
                    continue
                first = cpus[0].cpu if cpus[0] else None
                out.append(
                    f"| {n} | {task} | "
                    + " | ".join(_f(c.cpu if c else None) for c in cpus)
                    + " | "
                    + " | ".join(
                        _f(c.cpu / first if c and c.cpu and first else None) + "x" for c in cpus[1:]
                    )
                    + " |"
                )
    return out


def render_mesh_targets(results: dict[str, Any]) -> list[str]:
    """Issue #18's targets, for the main mesh when it is a certificate mesh."""
    mesh = main_mesh(results)
    if mesh != "certificates":
        return []
    series = mesh_series(results)
    lines = []

    def target(quantity: str, what: str, limit: float, unit: Any) -> None:
        pts = series.get((mesh, quantity), {})
        k, _ = growth(pts)
        if k is None:
            lines.append(f"- {what}: **not measured**")
            return
        ns = sorted(pts)
        lines.append(
            f"- {what} (fitted k ≤ {limit}, N = {ns[0]}..{ns[-1]}): "
            f"{'met' if k <= limit else '**missed**'}; k = {k:.2f}, {unit(pts[ns[0]])} at "
            f"N={ns[0]}, {unit(pts[ns[-1]])} at N={ns[-1]}"
        )

    target(
        "one node's mesh files",
        "one node's SSH mesh files of constant size (certificates)",
        CONSTANT_K,
        lambda v: f"{v:.0f} bytes",
    )
    for task in WIRE_TASKS:
        target(
            f"sent: {task}",
            f"bytes sent per run grow linearly with N ({task})",
            LINEAR_K,
            lambda v: f"{_mb2(v)} MB",
        )
    target(
        "read: re-run, ssh mesh sections",
        "the SSH mesh's fact bytes read per run grow linearly with N (re-run)",
        LINEAR_K,
        lambda v: f"{_mb2(v)} MB",
    )
    for task in WIRE_TASKS:
        target(
            f"read: {task}",
            f"all fact bytes read per run grow linearly with N ({task})",
            LINEAR_K,
            lambda v: f"{_mb2(v)} MB",
        )
    return lines


def _mb2(count: float | None) -> str:
    if count is None:
        return "—"
    return f"{count / 2**20:.2f}" if count < 10 * 2**20 else f"{count / 2**20:.1f}"


def render_markdown(results: dict[str, Any]) -> str:
    table = cells(results)
    ns = sorted({n for n, _ in table})
    setups = setups_of(results, main_mesh(results))
    largest = max(ns) if ns else None
    out = [
        "# Controller benchmark",
        "",
        (
            f"Measured on {describe_machine(results['machine'])}, at "
            f"{describe_source(results.get('source'))}, by `{results['command']}` "
            f"({results['total_minutes']:.0f} minutes in all). Raw samples: "
            "`docs/controller-benchmark.json`."
        ),
        "",
        (
            "pyinfra drives N fake hosts (pyinfra's `@fake` connector, no delay) that answer "
            "trainfleet's fact commands with the outputs recorded from a lab node "
            f"(`bench/controller/recorded.json`: {results['recorded']['os']}, kernel "
            f"{results['recorded']['kernel']}, {results['recorded']['date']}), made per node that "
            "machine, then every section a capability says a converged node answers (its "
            "`converged(plan)`) answered by that section's fact (its `answer`), so that every node "
            "holds exactly what trainfleet's plan says a converged node holds "
            "(`bench/controller/fleet.py`). Nothing runs on a node; only the controller's own "
            "work is timed: each run is one `pyinfra` process under `bench/child.py` (wall, "
            "user+system CPU, peak RSS from `wait4`). Medians of the valid runs; a run that "
            "changed something, failed, or found drift is reported, never timed. Drift's SSH mesh "
            "probe is pinned to stride `TRAINFLEET_DRIFT_STRIDE` (each node answers `ok` for "
            "exactly the peers `trainfleet.mesh.probe_targets` gives it)."
        ),
        "",
        (
            f"The fleet's SSH mesh (`ssh.mesh`) in every timing below: **{main_mesh(results)}**"
            + (
                f"; the SSH mesh section also measures {', '.join(meshes(results)[1:])} at each N, "
                "for comparison."
                if len(meshes(results)) > 1
                else "."
            )
        ),
        "",
        "| task | what runs |",
        "|---|---|",
        *[f"| {t} | {WHAT[t]} |" for t in TASKS],
        "",
        "## Targets",
        "",
        *render_targets(table, largest),
        *render_mesh_targets(results),
        "",
        "## Every measurement",
        "",
        (
            "× baseline: the task's CPU over the pyinfra baseline's CPU at the same N. machine "
            "busy: the share of both cores busy during the run (other work on this machine shows "
            "here; CPU seconds are the controller's own)."
        ),
        "",
        "| N | task | runs | wall s | CPU s | × baseline (CPU) | peak RSS MB | machine busy | "
        "check |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for n in ns:
        base = table.get((n, "pyinfra baseline"))
        for task in TASKS:
            c = table.get((n, task))
            if c is None:
                continue
            ratio = c.cpu / base.cpu if c.cpu and base and base.cpu else None
            check = (
                _checked(results, n, task) if not c.failed else "**failed**: " + "; ".join(c.failed)
            )
            out.append(
                f"| {n} | {task} | {c.runs} | {_f(c.wall)} | {_f(c.cpu)} | {_f(ratio)} | "
                f"{_f(c.rss_mb, '.0f')} | "
                f"{_f(c.busy * 100 if c.busy is not None else None, '.0f')}% | {check} |"
            )
    probes = {
        s["nodes"]: s.get("mesh_probe")
        for s in results["samples"]
        if s["task"] == "drift" and s["ok"]
    }
    if probes:
        out += [
            "",
            "Drift's SSH mesh probe, as its JSON report names it: "
            + "; ".join(
                f"N={n}: "
                + (
                    f"{p['mode']}, stride {p['stride']}, {p['logins_per_node']} logins per node"
                    if p
                    else "every peer (the report names no mesh_probe)"
                )
                for n, p in sorted(probes.items())
            )
            + ".",
        ]
    out += [
        "",
        "## Growth of CPU with N",
        "",
        f"k: the exponent of CPU ∝ N^k fitted over N = {GROWTH_FROM}..{GROWTH_TO} (log2 CPU on "
        "log2 N); then the CPU ratio per doubling of N between consecutive measured N (geometric "
        "mean over the step).",
        "",
        "| task | k | "
        + " | ".join(f"{a}→{b}" for a, b in zip(ns, ns[1:], strict=False) if a >= GROWTH_FROM)
        + " |",
        "|---|---:|" + "---:|" * len([a for a in ns[:-1] if a >= GROWTH_FROM]),
    ]
    for task in TASKS:
        k, steps = growth(growth_points(table, task))
        by = {(a, b): r for a, b, r in steps}
        out.append(
            f"| {task} | {_f(k)} | "
            + " | ".join(
                _f(by.get((a, b))) + "x" if by.get((a, b)) else "—"
                for a, b in zip(ns, ns[1:], strict=False)
                if a >= GROWTH_FROM
            )
            + " |"
        )
    out += [
        "",
        "## Setup and fact bytes",
        "",
        (
            "Built once per N before the timed runs: the spec, every node's mesh keys (the key "
            "store the deploy reads), the plan (as the deploy builds it) and each node's answers, "
            "pickled for the inventory. Loading that inventory is the responder's own cost inside "
            "every run (floor and baseline included). Fact MB: the stdout the controller reads in "
            "one run, all nodes together."
        ),
        "",
        (
            "| N | build s | inventory MB (converged) | inventory load CPU s | inventory load RSS "
            "MB | fact MB: re-run | drift | first-provision plan |"
        ),
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n in ns:
        s = setups.get(n)
        if s:
            facts = s["fact_bytes"]
            out.append(
                f"| {n} | {s['build_seconds']:.0f} | {s['pickle_mb']['converged']:.0f} | "
                f"{s['responder']['cpu_seconds']:.2f} | {s['responder']['maxrss_kb'] / 1024:.0f} | "
                f"{_mb(facts['re-run'])} | {_mb(facts['drift'])} | "
                f"{_mb(facts['first-provision plan'])} |"
            )
    out += render_mesh(results)
    for prof in results.get("profiles", []):
        out += [
            "",
            f"## Profile: {prof['task']} at N={prof['nodes']}",
            "",
            (
                f"One run through `bench/lab_driver.py --cprofile` (exit {prof['exit']}; cProfile "
                "slows it): the 15 functions with the most own time."
            ),
            "",
            "| function | calls | own s | cumulative s |",
            "|---|---:|---:|---:|",
        ]
        out += [
            f"| `{f['function']}` | {f['calls']} | {f['own_seconds']:.2f} | "
            f"{f['cumulative_seconds']:.2f} |"
            for f in prof["cprofile"]
        ]
    if results.get("notes"):
        out += ["", "## Notes", "", *[f"- {note}" for note in results["notes"]]]
    return "\n".join(out) + "\n"


def _checked(results: dict[str, Any], nodes: int, task: str) -> str:
    """What a valid run showed: the self-check that makes it a measurement."""
    main = main_mesh(results)
    ok = [
        s
        for s in results["samples"]
        if s["nodes"] == nodes and s["task"] == task and s["ok"] and s.get("mesh", main) == main
    ]
    if task == "first-provision plan":
        return "ok: " + ", ".join(
            sorted({f"changes on {s['nodes_with_change']} of {nodes} nodes" for s in ok})
        )
    if task in ("re-run", "pyinfra baseline"):
        return "ok: " + ", ".join(
            sorted({f"{s['changed']} changed, {s['errors']} errors" for s in ok})
        )
    if task == "drift":
        return "ok: no drift, exit 0"
    return f"ok: {nodes} hostnames"


def render_targets(table: dict[tuple[int, str], Cell], largest: int | None) -> list[str]:
    lines = []
    for task in GROWTH_TASKS:
        points = growth_points(table, task)
        k, steps = growth(points)
        if len(points) < 2:
            lines.append(
                f"- {task}: each doubling of N from {GROWTH_FROM} to {GROWTH_TO} at most doubles "
                "CPU (+15%): **not measured**"
            )
            continue
        worst = max(steps, key=lambda s: s[2])
        met = all(r <= GROWTH_LIMIT for _, _, r in steps)
        span = f"{min(points)}→{max(points)}" + (
            "" if max(points) == GROWTH_TO else f" (not {GROWTH_TO}: not measured)"
        )
        lines.append(
            f"- {task}: each doubling of N ({span}) at most doubles CPU (+15%, ≤ "
            f"{GROWTH_LIMIT:.2f}x): {'met' if met else '**missed**'}; worst {worst[0]}→{worst[1]} "
            f"at {worst[2]:.2f}x per doubling, fitted k = {k:.2f}"
        )
    for task in RATIO_TASKS:
        c, base = table.get((largest, task)), table.get((largest, "pyinfra baseline"))
        if not (c and base and c.cpu and base.cpu):
            lines.append(
                f"- {task} at N={largest}: within {RATIO_LIMIT}x of the baseline's CPU: **not "
                "measured**"
            )
            continue
        r = c.cpu / base.cpu
        lines.append(
            f"- {task} at N={largest}: within {RATIO_LIMIT}x of the pyinfra baseline's CPU: "
            f"{'met' if r <= RATIO_LIMIT else '**missed**'} ({c.cpu:.2f} s vs {base.cpu:.2f} s, "
            f"{r:.2f}x)"
        )
    return lines


def plot(results: dict[str, Any], path: Path) -> None:
    """CPU against N, log-log, one line per task; beside it CPU over the baseline's; then (with
    mesh measurements) one node's SSH mesh files and the bytes per run, per mesh."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, NullFormatter

    table = cells(results)
    ns = sorted({n for n, _ in table})
    series = mesh_series(results)
    wide = bool(series)
    fig, axes = plt.subplots(1, 3 if wide else 2, figsize=(18 if wide else 12, 5.4))
    left, right = axes[0], axes[1]
    colors = dict(
        zip(TASKS, ("black", "tab:gray", "tab:orange", "tab:blue", "tab:green"), strict=False)
    )
    for task in TASKS:
        pts = [(n, table[(n, task)].cpu) for n in ns if (n, task) in table and table[(n, task)].cpu]
        if not pts:
            continue
        style = {
            "linestyle": "--" if task in ("floor", "pyinfra baseline") else "-",
            "color": colors[task],
        }
        left.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=task, **style)
        base = {
            n: table[(n, "pyinfra baseline")].cpu for n in ns if (n, "pyinfra baseline") in table
        }
        ratios = [(n, c / base[n]) for n, c in pts if base.get(n)]
        if task != "pyinfra baseline" and ratios:
            right.plot(
                [p[0] for p in ratios], [p[1] for p in ratios], marker="o", label=task, **style
            )
    if ns:
        ref = [n for n in ns if n >= GROWTH_FROM] or ns
        start = table.get((ref[0], "pyinfra baseline"))
        if start and start.cpu:
            left.plot(
                ref,
                [start.cpu * n / ref[0] for n in ref],
                color="red",
                linestyle=":",
                label="∝ N (from baseline)",
            )
    right.axhline(
        RATIO_LIMIT, color="red", linestyle=":", label=f"target {RATIO_LIMIT}x (re-run, drift)"
    )
    panels = [
        (left, "controller CPU per run", "CPU seconds (user + system)"),
        (right, "CPU over the pyinfra no-op baseline", "× baseline"),
    ]
    if wide:
        third = axes[2]
        styles = {"certificates": "-", "keys": "--"}
        shown = (
            ("one node's mesh files", "tab:purple"),
            ("read: re-run", "tab:orange"),
            ("read: re-run, ssh mesh sections", "tab:red"),
            ("sent: re-run", "tab:blue"),
        )
        for mesh in meshes(results):
            for quantity, color in shown:
                pts = sorted(series.get((mesh, quantity), {}).items())
                if pts:
                    third.plot(
                        [p[0] for p in pts],
                        [p[1] / 1024 for p in pts],
                        marker="o",
                        color=color,
                        linestyle=styles.get(mesh, ":"),
                        label=f"{quantity} ({mesh})",
                    )
        panels.append((third, "SSH mesh: one node's files, bytes per run", "KiB"))
    for ax, title, ylabel in panels:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(NullFormatter())
        ax.set_xticks(ns, [str(n) for n in ns])
        ax.set_xlabel("fake nodes")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7 if ax is not left and wide else 8)
    fig.suptitle(
        f"trainfleet controller, fake nodes — {results['machine']['cpu']}, "
        f"{results['machine']['cores']} cores",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
