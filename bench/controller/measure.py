"""Timing the controller against the fake fleet: each task its own ``pyinfra`` child.

Per N: the fleet is built (spec, keys, plan, every node's answers, the two pickled
inventories), then each task runs ``runs`` times under ``bench.child`` (wall, CPU, peak RSS).
A run is a measurement only if it did what a converged cluster must: the re-run changed
nothing, drift found nothing, the first-provision plan has a change on every node; anything
else is recorded as a failed measurement with its reason, never timed into a median.

Every run also counts what crosses the wire (bench/controller/wire.py: the commands the fake
connector is asked to run, the stdout it answers with). The fleet's SSH mesh is ``--mesh``
(certificates, the spec's default); ``--compare`` builds the same N in the other mesh too and
runs the mesh-dependent tasks on it (``compare_runs`` times each), for the certificates-vs-keys
comparison of per-node mesh files, bytes per run and CPU.
"""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.controller import fleet as fleet_mod
from bench.controller import wire
from bench.run import PYINFRA, _run_child, _run_measured, busy_share, cpu_times, parse_results

INVENTORY = "bench/controller/fake_inventory.py"
NOOP_DEPLOY = "bench/controller/noop_deploy.py"
TIMEOUT = 1800  # seconds for one run: the largest N on a loaded 2-core machine
# (task, inventory the fake nodes answer as, pyinfra arguments after the inventory)
TASKS: dict[str, tuple[str, list[str]]] = {
    "floor": ("converged", ["fact", "server.Hostname"]),
    "pyinfra baseline": ("converged", [NOOP_DEPLOY]),
    "re-run": ("converged", ["deploy/cluster.py"]),
    "first-provision plan": ("fresh", ["deploy/cluster.py"]),
    "drift": ("converged", ["deploy/drift.py"]),
}
PROFILED = ("re-run", "drift")
COMPARED = ("re-run", "first-provision plan", "drift")  # the tasks whose work depends on the mesh

Log = Callable[[str], None]


def pyinfra_args(task: str) -> list[str]:
    """Always ``--json``; ``-y`` except for the plan: ``pyinfra -y`` makes
    State(check_for_changes=False), so ``-y --dry`` never runs an operation's body and plans
    nothing. ``--dry`` alone asks no question."""
    _, rest = TASKS[task]
    flags = ["--json", "--dry"] if task == "first-provision plan" else ["-y", "--json"]
    return [*flags, INVENTORY, *rest]


@dataclass
class Sample:
    task: str
    nodes: int
    round: int
    seconds: float
    cpu_seconds: float
    maxrss_kb: int
    returncode: int
    ok: bool  # a valid measurement (see ``judge``)
    problem: str = ""  # why it is not one
    changed: int | None = None
    errors: int | None = None
    nodes_with_change: int | None = None  # the plan: nodes pyinfra would change
    mesh_probe: dict[str, Any] | None = None  # drift's report: which peers each node probed
    machine_busy: float | None = None
    stderr_tail: str = ""
    mesh: str = "certificates"  # the fleet's ssh.mesh
    wire: dict[str, int] | None = (
        None  # what the fake connector was sent and answered (wire.FIELDS)
    )


@dataclass
class Setup:
    """What was built for N before any timed run, and what answering costs."""

    nodes: int
    build_seconds: float
    stride: int
    pickle_mb: dict[str, float]
    responder: dict[
        str, float
    ]  # loading the converged inventory alone: cpu_seconds, maxrss_kb, seconds
    fact_bytes: dict[str, int]  # stdout bytes the controller reads per run, by task
    mesh: str = "certificates"
    mesh_files: dict[str, int] = field(
        default_factory=dict
    )  # fleet_mod.mesh_files of the first node
    mesh_files_total: dict[str, int] = field(
        default_factory=dict
    )  # min and max of the total over the nodes
    # re-run's fact bytes (the converged DeployState bundles, all nodes) by fleet_mod.section_group
    fact_bytes_by_group: dict[str, int] = field(default_factory=dict)


@dataclass
class Results:
    nodes: list[int]
    runs: int
    profile_at: int | None
    mesh: str = "certificates"  # the fleet's ssh.mesh in the main measurements
    compare: list[str] = field(default_factory=list)  # other meshes measured for comparison
    compare_runs: int = 1
    setups: list[Setup] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": {
                "nodes": self.nodes,
                "runs": self.runs,
                "profile_at": self.profile_at,
                "mesh": self.mesh,
                "compare": self.compare,
                "compare_runs": self.compare_runs,
            },
            "setups": [asdict(s) for s in self.setups],
            "samples": [asdict(s) for s in self.samples],
            "profiles": self.profiles,
        }


def _drift_report(fleet: fleet_mod.Fleet) -> dict[str, Any] | None:
    path = fleet.home / "reports" / f"drift-{fleet.cluster.name}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def judge(task: str, sample: Sample, stdout: str, fleet: fleet_mod.Fleet) -> None:
    """Whether the run is a measurement of a converged (or fresh) fleet; sets ok/problem."""
    problems = []
    if sample.returncode != 0:
        problems.append(f"exit {sample.returncode}")
    if task == "floor":
        start = stdout.find("{")
        answers = json.loads(stdout[start:]).get("server.Hostname", {}) if start >= 0 else {}
        if len(answers) != fleet.nodes:
            problems.append(f"{len(answers)} of {fleet.nodes} nodes answered")
    elif task == "first-provision plan":
        start = stdout.find("{")
        plan = json.loads(stdout[start:]).get("plan", []) if start >= 0 else []
        hosts = {h for op in plan for h in op["hosts_with_change"]}
        sample.nodes_with_change = len(hosts)
        if len(hosts) != fleet.nodes:
            problems.append(f"the plan changes {len(hosts)} of {fleet.nodes} fresh nodes")
    else:
        sample.changed, sample.errors = parse_results(stdout)
        if sample.changed is None:
            problems.append("no --json results")
        elif sample.changed or sample.errors:
            problems.append(f"changed {sample.changed}, errors {sample.errors} host-operations")
    if task == "drift":
        report = _drift_report(fleet)
        if report is None:
            problems.append("no drift report")
        else:
            sample.mesh_probe = report.get("mesh_probe")
            if report.get("drift") or report.get("findings"):
                found = report.get("findings", [])
                problems.append(f"drift: {len(found)} findings, first: {found[:1]}")
            # No mesh_probe: a checks/drift_check.py that probes every peer; the full proof answers
            # it.
            if (
                sample.mesh_probe is not None
                and sample.mesh_probe.get("stride") != fleet.stride
                and fleet.nodes >= 4
            ):
                problems.append(
                    f"drift probed with stride {sample.mesh_probe.get('stride')}, not the pinned "
                    f"{fleet.stride}"
                )
    if sample.wire is None:
        problems.append("the run's wire counts are missing (bench/controller/wire.py)")
    sample.ok = not problems
    sample.problem = "; ".join(problems)


class Runner:
    def __init__(self, workdir: Path, env: dict[str, str], log: Log) -> None:
        self.workdir = workdir
        self.env = env
        self.log = log

    def _pickle(self, fleet: fleet_mod.Fleet, state: str) -> Path:
        return self.workdir / f"{fleet.mesh}-{fleet.nodes}-{state}.pkl"

    def _env(self, fleet: fleet_mod.Fleet, state: str) -> dict[str, str]:
        return {**self.env, **fleet.env(), "TRAINFLEET_FLEET": str(self._pickle(fleet, state))}

    def build(
        self, nodes: int, document: dict[str, Any], mesh: str = "certificates"
    ) -> tuple[fleet_mod.Fleet, Setup]:
        import time

        started = time.perf_counter()
        fleet = fleet_mod.build(
            nodes, self.workdir / f"fleet-{mesh}-{nodes}", document, log=self.log, mesh=mesh
        )
        pickles = {
            state: fleet.write_inventory(state, self._pickle(fleet, state))
            for state in ("converged", "fresh")
        }
        seconds = time.perf_counter() - started
        code, usage, _, stderr = _run_measured(
            [
                sys.executable,
                "-c",
                "import pickle, sys; pickle.load(open(sys.argv[1], 'rb'))",
                str(pickles["converged"]),
            ],
            self.env,
            TIMEOUT,
            self.workdir / "usage.json",
        )
        if code != 0:
            raise RuntimeError(f"the converged inventory does not load: {stderr[-2000:]}")

        def bytes_of(pick: Callable[[Any], Any]) -> int:
            return sum(fleet_mod.stdout_bytes(pick(a)) for a in fleet.converged.values())

        totals = [fleet_mod.mesh_files(plan)["total"] for plan in fleet.plan.nodes.values()]
        groups: dict[str, int] = {}
        for answers in fleet.converged.values():
            for name, count in fleet_mod.section_bytes(answers.deploy_state).items():
                groups[fleet_mod.section_group(name)] = (
                    groups.get(fleet_mod.section_group(name), 0) + count
                )
        setup = Setup(
            nodes=nodes,
            mesh=mesh,
            build_seconds=round(seconds, 2),
            stride=fleet.stride,
            mesh_files=fleet_mod.mesh_files(fleet.plan.nodes[fleet.cluster.nodes[0].name]),
            mesh_files_total={"min": min(totals), "max": max(totals)},
            fact_bytes_by_group=dict(sorted(groups.items())),
            pickle_mb={
                state: round(path.stat().st_size / 2**20, 1) for state, path in pickles.items()
            },
            responder={
                "seconds": round(usage["seconds"], 3),
                "cpu_seconds": round(usage["cpu_seconds"], 3),
                "maxrss_kb": usage["maxrss_kb"],
            },
            fact_bytes={
                "floor": bytes_of(lambda a: [a.hostname]),
                "re-run": bytes_of(lambda a: a.deploy_state),
                "drift": bytes_of(lambda a: a.fingerprint),
                "first-provision plan": sum(
                    fleet_mod.stdout_bytes(a.deploy_state) for a in fleet.fresh.values()
                ),
            },
        )
        self.log(
            f"N={nodes} ({mesh}): built in {seconds:.1f}s, inventories {setup.pickle_mb} MB, "
            f"loading one costs {setup.responder['cpu_seconds']:.2f}s CPU; fact bytes per run "
            f"{setup.fact_bytes}; one node's mesh files {setup.mesh_files['total']} bytes"
        )
        return fleet, setup

    def timed(self, task: str, fleet: fleet_mod.Fleet, round_: int) -> Sample:
        state, _ = TASKS[task]
        if task == "drift":  # a run that writes none must not be judged by the last one's
            (fleet.home / "reports" / f"drift-{fleet.cluster.name}.json").unlink(missing_ok=True)
        tally = self.workdir / "wire.json"
        tally.unlink(missing_ok=True)
        before = cpu_times(Path("/proc/stat").read_text())
        code, usage, stdout, stderr = _run_measured(
            [PYINFRA, *pyinfra_args(task)],
            {**self._env(fleet, state), wire.ENV: str(tally)},
            TIMEOUT,
            self.workdir / "usage.json",
        )
        busy = busy_share(before, cpu_times(Path("/proc/stat").read_text()))
        sample = Sample(
            task=task,
            nodes=fleet.nodes,
            round=round_,
            seconds=round(usage["seconds"], 3),
            cpu_seconds=round(usage["cpu_seconds"], 3),
            maxrss_kb=usage["maxrss_kb"],
            returncode=code,
            ok=False,
            machine_busy=busy,
            mesh=fleet.mesh,
            wire=wire.read(str(tally)),
        )
        judge(task, sample, stdout, fleet)
        if not sample.ok:
            sample.stderr_tail = stderr[-3000:]
        read_mb = sample.wire["stdout_bytes"] / 2**20 if sample.wire else float("nan")
        sent_mb = sample.wire["command_bytes"] / 2**20 if sample.wire else float("nan")
        self.log(
            f"  {task:21} N={fleet.nodes:<5} {fleet.mesh[:4]} {sample.seconds:8.2f}s cpu "
            f"{sample.cpu_seconds:7.2f}s rss {sample.maxrss_kb // 1024:5} MB busy {busy:.0%} read "
            f"{read_mb:.2f} MB sent {sent_mb:.2f} MB "
            + ("ok" if sample.ok else f"FAILED: {sample.problem}")
        )
        return sample

    def profiled(self, task: str, fleet: fleet_mod.Fleet) -> dict[str, Any]:
        """One run through ``bench.lab_driver --cprofile``: the 15 functions with the most own
        time."""
        state, _ = TASKS[task]
        tally_file = self.workdir / f"tally-{task}-{fleet.nodes}.json"
        argv = [
            sys.executable,
            "-m",
            "bench.lab_driver",
            str(tally_file),
            "--cprofile",
            "--",
            *pyinfra_args(task),
        ]
        code, _, stderr = _run_child(argv, self._env(fleet, state), TIMEOUT)
        if not tally_file.exists():
            raise RuntimeError(
                f"the profiled {task} wrote no tally (exit {code}): {stderr[-2000:]}"
            )
        tally = json.loads(tally_file.read_text())
        self.log(
            f"  {task:21} N={fleet.nodes:<5} profiled, exit {code}; top: "
            f"{tally['cprofile'][0]['function']}"
        )
        return {
            "task": task,
            "nodes": fleet.nodes,
            "exit": code,
            "end_seconds": tally.get("end"),
            "cprofile": tally["cprofile"][:15],
        }

    def discard(self, fleet: fleet_mod.Fleet) -> None:
        """The fleet's files (its inventories reach hundreds of MB at 1024 nodes)."""
        for state in ("converged", "fresh"):
            self._pickle(fleet, state).unlink(missing_ok=True)
        shutil.rmtree(self.workdir / f"fleet-{fleet.mesh}-{fleet.nodes}", ignore_errors=True)


def measure(
    runner: Runner,
    results: Results,
    document: dict[str, Any],
    on_progress: Callable[[Results], None],
) -> Results:
    for nodes in results.nodes:
        fleet, setup = runner.build(nodes, document, results.mesh)
        results.setups.append(setup)
        for round_ in range(results.runs):
            for task in TASKS:
                results.samples.append(runner.timed(task, fleet, round_))
            on_progress(results)
        if nodes == results.profile_at:
            results.profiles += [runner.profiled(task, fleet) for task in PROFILED]
        runner.discard(fleet)
        on_progress(results)
        for mesh in results.compare:
            other, setup = runner.build(nodes, document, mesh)
            results.setups.append(setup)
            for round_ in range(results.compare_runs):
                for task in COMPARED:
                    results.samples.append(runner.timed(task, other, round_))
            runner.discard(other)
            on_progress(results)
    return results
