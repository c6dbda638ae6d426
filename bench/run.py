"""Driving the lab: fresh labs at each N, each task timed as its own ``pyinfra`` child.

Per N, each round brings up a fresh lab and times, in order: the first provision
(``deploy/cluster.py`` on fresh nodes: hostnames, mesh, pdsh from the host's apt cache, ...),
the floor (``fact server.Hostname``), the converged re-run and the drift run. After the last
round, on the same lab: one accounted run of each (``bench.lab_driver``: execs, phases), then,
up to ``preflight_max_nodes``, PyTorch into every node's venv from the wheelhouse
("torch provision", timed once) and the preflight, timed ``runs`` times plus one accounted run.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from lab.netns import Lab
from trainfleet.mesh import probe_stride, probe_targets

REPO = Path(__file__).resolve().parent.parent
PYINFRA = str(Path(sys.executable).with_name("pyinfra"))
LAB_INVENTORY = "inventories/lab.py"
WHEELHOUSE = "/var/cache/trainfleet/wheelhouse"  # filled by `make host-deps`
TORCH_STACK = {"torch": "2.13.0", "torch_cuda": "cpu", "wheelhouse": WHEELHOUSE}
FLOOR_ARGS = ["fact", "server.Hostname"]
DEPLOY = {
    "first provision": "deploy/cluster.py",
    "re-run": "deploy/cluster.py",
    "drift": "deploy/drift.py",
    "torch provision": "deploy/cluster.py",
    "preflight": "deploy/preflight.py",
}
TIMEOUT = 1800  # seconds for any one run: torch into 16 nodes on 2 cores is the longest
TORCH_SECONDS_PER_NODE = 60.0  # the estimate the budget uses before torch was measured here

Log = Callable[[str], None]


def node_counts(text: str) -> list[int]:
    """``--nodes``: comma-separated positive node counts, sorted, each once."""
    values = sorted({int(part) for part in text.split(",") if part.strip()})
    if not values or values[0] < 1:
        raise argparse.ArgumentTypeError("node counts are positive integers, e.g. 1,2,4")
    return values


@dataclass
class Sample:
    """One timed run of one task."""

    task: str
    nodes: int
    round: int
    seconds: float
    cpu_seconds: float  # the controller's user + system time
    maxrss_kb: int  # the controller's peak resident memory (via bench.child)
    returncode: int
    changed: int | None  # host-operations that changed something (None: a fact run)
    errors: int | None
    stderr_tail: str = ""
    machine_busy: float | None = (
        None  # share of all cores busy during the run (controller + every node)
    )
    findings: dict[str, str] = field(
        default_factory=dict
    )  # a check run's failed nodes: node -> problem


@dataclass
class Accounted:
    """One run through ``bench.lab_driver``: its tally (execs, phases, commands, maybe cprofile)."""

    task: str
    nodes: int
    seconds: float
    cprofile: bool
    tally: dict[str, Any] = field(default_factory=dict)


def pyinfra_args(task: str, inventory: str) -> list[str]:
    """The pyinfra arguments of a task: always ``-y --json``."""
    rest = FLOOR_ARGS if task == "floor" else [DEPLOY[task]]
    return ["-y", "--json", inventory, *rest]


def _run_child(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int, str, str]:
    """Run argv in a fresh child; (exit code, stdout, stderr)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(
            argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        )
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        out.seek(0)
        err.seek(0)
        return code, out.read().decode(errors="replace"), err.read().decode(errors="replace")


def _run_measured(
    argv: list[str], env: dict[str, str], timeout: float, usage_file: Path
) -> tuple[int, dict[str, Any], str, str]:
    """Run argv under ``bench.child``: its exit code, its own wall time and rusage, its output."""
    usage_file.unlink(missing_ok=True)
    code, stdout, stderr = _run_child(
        [sys.executable, "-m", "bench.child", str(usage_file), "--", *argv], env, timeout
    )
    if not usage_file.exists():
        raise RuntimeError(f"`{' '.join(argv)}` was not measured (exit {code}): {stderr[-2000:]}")
    return code, json.loads(usage_file.read_text()), stdout, stderr


def cpu_times(text: str) -> tuple[int, int]:
    """(busy, total) clock ticks of all cores from /proc/stat's first line (idle and iowait
    are not busy; guest time is already inside user)."""
    fields = [int(v) for v in text.splitlines()[0].split()[1:9]]
    user, nice, system, idle, iowait, irq, softirq, steal = fields
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait


def busy_share(before: tuple[int, int], after: tuple[int, int]) -> float:
    """The share of all cores' time that was busy between two ``cpu_times`` readings."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else 0.0


CHECK_FAILURE = re.compile(r"\[(?P<node>[^\]]+)\] trainfleet: (?:drift|preflight): (?P<problem>.*)")


def check_findings(stderr: str) -> dict[str, str]:
    """The nodes a drift or preflight run failed, with their problems (the verdict operation's
    ``trainfleet: drift: ...`` line per node)."""
    return {m["node"]: m["problem"].strip() for m in CHECK_FAILURE.finditer(stderr)}


def parse_results(stdout: str) -> tuple[int | None, int | None]:
    """(changed, errors) host-operation totals from pyinfra's ``--json`` output; (None, None)
    for output without results (a fact run)."""
    start = stdout.find("{")
    if start < 0:
        return None, None
    try:
        report = json.loads(stdout[start:])
    except json.JSONDecodeError:
        return None, None
    results = report.get("results") if isinstance(report, dict) else None
    if not isinstance(results, dict) or "operations" not in results:
        return None, None
    ops = results["operations"]
    return sum(len(op["success"]) for op in ops), sum(len(op["error"]) for op in ops)


def section_script(users: list[str], peers: list[str]) -> str:
    """A shell script timing each part of the node fingerprint on the node itself (µs)."""
    from pyinfra.api import StringCommand

    from runtime.bundle import sections

    lines = []
    for name, (fact_cls, kwargs) in sections(users, peers).items():
        command = fact_cls().command(**kwargs)
        raw = (StringCommand(command) if isinstance(command, str) else command).get_raw_value()
        lines.append(
            f"s=$(date +%s%N); ( {raw}\n) >/dev/null 2>&1; e=$(date +%s%N); "
            f'echo "section {name} $(( (e - s) / 1000 ))"'
        )
    return "\n".join(lines) + "\n"


def parse_section_times(stdout: str) -> dict[str, float]:
    """``section NAME MICROSECONDS`` lines -> {name: seconds}; other lines are ignored."""
    out = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "section" and parts[2].isdigit():
            out[parts[1]] = round(int(parts[2]) / 1e6, 4)
    return out


class Runner:
    """One benchmark session: its own key store and temp files, the lab, the samples."""

    def __init__(self, env: dict[str, str], workdir: Path, log: Log) -> None:
        self.env = env
        self.workdir = workdir
        self.log = log
        self.lab = Lab()

    def timed(self, task: str, nodes: int, round_: int, inventory: str = LAB_INVENTORY) -> Sample:
        before = cpu_times(Path("/proc/stat").read_text())
        code, usage, stdout, stderr = _run_measured(
            [PYINFRA, *pyinfra_args(task, inventory)],
            self.env,
            TIMEOUT,
            self.workdir / "usage.json",
        )
        busy = busy_share(before, cpu_times(Path("/proc/stat").read_text()))
        changed, errors = parse_results(stdout)
        sample = Sample(
            task=task,
            nodes=nodes,
            round=round_,
            seconds=round(usage["seconds"], 4),
            cpu_seconds=round(usage["cpu_seconds"], 4),
            maxrss_kb=usage["maxrss_kb"],
            returncode=code,
            changed=changed,
            errors=errors,
            stderr_tail="" if code == 0 else stderr[-2000:],
            machine_busy=busy,
            findings=check_findings(stderr) if task in ("drift", "preflight") else {},
        )
        self.log(
            f"  {task:16} N={nodes:<2} {sample.seconds:7.2f}s cpu {sample.cpu_seconds:6.2f}s busy "
            f"{busy:.0%} rss {sample.maxrss_kb // 1024} MB exit {code} changed {changed}"
        )
        return sample

    def accounted(
        self, task: str, nodes: int, inventory: str = LAB_INVENTORY, cprofile: bool = False
    ) -> Accounted:
        tally_file = self.workdir / f"tally-{task.replace(' ', '-')}-{nodes}.json"
        argv = [
            sys.executable,
            "-m",
            "bench.lab_driver",
            str(tally_file),
            *(["--cprofile"] if cprofile else []),
            "--",
            *pyinfra_args(task, inventory),
        ]
        started = time.perf_counter()
        code, _, stderr = _run_child(argv, self.env, TIMEOUT)
        seconds = time.perf_counter() - started
        if not tally_file.exists():
            raise RuntimeError(
                f"the accounted {task} run wrote no tally (exit {code}): {stderr[-2000:]}"
            )
        tally = json.loads(tally_file.read_text())
        self.log(
            f"  {task:16} N={nodes:<2} accounted{' +cprofile' if cprofile else ''}: "
            f"{sum(tally['execs'].values())} execs in {seconds:.2f}s, exit {code}"
        )
        return Accounted(
            task=task, nodes=nodes, seconds=round(seconds, 4), cprofile=cprofile, tally=tally
        )

    # -- the lab -------------------------------------------------------------------------

    def lab_up(self, nodes: int) -> None:
        if self.lab.is_up():
            raise RuntimeError(
                "a lab is already up: someone else's, or a crashed run's. The benchmark "
                "brings up its own; take the other down (`python -m lab down`) if it is yours."
            )
        self.lab.up(nodes, log=lambda msg: self.log(f"  {msg}"))

    def lab_down(self) -> None:
        left = self.lab.down(log=lambda msg: self.log(f"  {msg}"))
        if left:
            raise RuntimeError(f"the lab left this behind: {left}")

    def section_profile(self, nodes: int) -> dict[str, Any]:
        """Remote seconds of each part of the node fingerprint on node1, one part after another.

        The drift run's one command per node is these parts in one shell (the re-run's is the
        subset ``deploy_sections``): this says which part the nodes spend their time in.
        """
        spec = yaml.safe_load(self.lab.spec.read_text())
        users = spec["cluster"].get("mesh_users") or ["root"]
        names = [n["name"] for n in spec["nodes"]]
        peers = probe_targets(
            names, "node1", probe_stride(len(names), 0)
        )  # whom drift's first run probes
        node = self.lab.node("node1")
        argv = [
            "ssh",
            *self.lab.ssh_options(),
            f"root@{node.address}",
            "sh",
            "-s",
        ]
        proc = subprocess.run(
            argv,
            input=section_script(users, peers),
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        seconds = parse_section_times(proc.stdout)
        self.log(
            f"  fingerprint parts on node1, N={nodes}: "
            + ", ".join(
                f"{k} {v:.2f}s" for k, v in sorted(seconds.items(), key=lambda kv: -kv[1])[:4]
            )
        )
        return {"nodes": nodes, "node": "node1", "seconds": seconds}

    def torch_inventory(self) -> str:
        """The lab's spec with PyTorch pinned from the wheelhouse, as the lab tests do it."""
        spec = yaml.safe_load(self.lab.spec.read_text())
        spec["stack"] = dict(TORCH_STACK)
        spec_file = self.workdir / "torch.yml"
        spec_file.write_text(yaml.safe_dump(spec, sort_keys=False))
        inventory = self.workdir / "torch_inventory.py"
        inventory.write_text(
            textwrap.dedent(f"""\
            from runtime.inventory import load_cluster_or_exit, pyinfra_hosts
            nodes = pyinfra_hosts(load_cluster_or_exit({str(spec_file)!r}))
            """)
        )
        return str(inventory)


@dataclass
class Plan:
    nodes: list[int]
    runs: int
    preflight_max_nodes: int
    budget_seconds: float
    cprofile_at: int  # the N whose re-run and drift also get a cProfile'd run


@dataclass
class Results:
    plan: Plan
    samples: list[Sample] = field(default_factory=list)
    accounted: list[Accounted] = field(default_factory=list)
    not_measured: list[dict[str, Any]] = field(default_factory=list)  # {task, nodes, why}
    sections: list[dict[str, Any]] = field(
        default_factory=list
    )  # fingerprint parts' remote seconds
    round_seconds: dict[int, float] = field(default_factory=dict)  # N -> seconds of one round

    def to_json(self) -> dict[str, Any]:
        return {
            "plan": asdict(self.plan),
            "samples": [asdict(s) for s in self.samples],
            "accounted": [asdict(a) for a in self.accounted],
            "not_measured": self.not_measured,
            "sections": self.sections,
            "round_seconds": {str(k): v for k, v in self.round_seconds.items()},
        }


def estimate_round(results: Results, nodes: int) -> float | None:
    """Seconds one round at ``nodes`` will take, scaled linearly from the largest N measured."""
    if not results.round_seconds:
        return None
    known = max(results.round_seconds)
    return results.round_seconds[known] * max(1.0, nodes / known)


def measure(runner: Runner, plan: Plan, on_progress: Callable[[Results], None]) -> Results:
    """Every N of the plan, within the time budget; what did not fit is recorded, not dropped."""
    results = Results(plan=plan)
    started = time.monotonic()
    for nodes in plan.nodes:
        _measure_rounds(runner, plan, results, nodes, started)
        if nodes > plan.preflight_max_nodes:
            results.not_measured.append(
                {
                    "task": "preflight",
                    "nodes": nodes,
                    "why": (
                        f"not run above {plan.preflight_max_nodes} nodes: PyTorch into every "
                        f"node's venv costs ~{_torch_seconds_per_node(results):.0f} s a node on "
                        "this machine"
                    ),
                }
            )
        on_progress(results)
    return results


def _over_budget(plan: Plan, started: float, cost: float | None) -> bool:
    return cost is not None and time.monotonic() - started + cost > plan.budget_seconds


def _measure_rounds(
    runner: Runner, plan: Plan, results: Results, nodes: int, started: float
) -> None:
    if _over_budget(plan, started, estimate_round(results, nodes)):
        results.not_measured.append(
            {"task": "all", "nodes": nodes, "why": "time budget: not one run fits"}
        )
        runner.log(f"N={nodes}: skipped, over the time budget")
        return
    for round_ in range(plan.runs):
        runner.log(f"N={nodes} round {round_ + 1}/{plan.runs}")
        t0 = time.monotonic()
        runner.lab_up(nodes)
        try:
            for task in ("first provision", "floor", "re-run", "drift"):
                results.samples.append(runner.timed(task, nodes, round_))
            round_cost = time.monotonic() - t0
            # The last round also takes the counts; so does a round after which no other fits.
            last = round_ == plan.runs - 1 or _over_budget(plan, started, round_cost)
            if last:
                _account(runner, plan, results, nodes)
                if nodes <= plan.preflight_max_nodes:
                    _torch_and_preflight(runner, plan, results, nodes, started)
        finally:
            t1 = time.monotonic()
            runner.lab_down()
        results.round_seconds[nodes] = round(round_cost + time.monotonic() - t1, 2)
        if last:
            if round_ + 1 < plan.runs:
                results.not_measured.append(
                    {
                        "task": "all",
                        "nodes": nodes,
                        "why": f"time budget: {round_ + 1} of {plan.runs} runs",
                    }
                )
            return


def _account(runner: Runner, plan: Plan, results: Results, nodes: int) -> None:
    for task in ("floor", "re-run", "drift"):
        results.accounted.append(runner.accounted(task, nodes))
    results.sections.append(runner.section_profile(nodes))
    if nodes == plan.cprofile_at:
        for task in ("re-run", "drift"):
            results.accounted.append(runner.accounted(task, nodes, cprofile=True))


def _torch_and_preflight(
    runner: Runner, plan: Plan, results: Results, nodes: int, started: float
) -> None:
    torch_cost = _torch_seconds_per_node(results) * nodes
    if _over_budget(plan, started, torch_cost):
        results.not_measured.append(
            {
                "task": "preflight",
                "nodes": nodes,
                "why": f"time budget (PyTorch into {nodes} nodes ~{torch_cost:.0f} s)",
            }
        )
        return
    inventory = runner.torch_inventory()
    provision = runner.timed("torch provision", nodes, 0, inventory)
    results.samples.append(provision)
    if provision.returncode != 0:
        results.not_measured.append(
            {"task": "preflight", "nodes": nodes, "why": "torch provision failed"}
        )
        return
    for round_ in range(plan.runs):
        results.samples.append(runner.timed("preflight", nodes, round_, inventory))
    results.accounted.append(runner.accounted("preflight", nodes, inventory))


def _torch_seconds_per_node(results: Results) -> float:
    measured = [
        s.seconds / s.nodes
        for s in results.samples
        if s.task == "torch provision" and s.returncode == 0
    ]
    return max(measured) if measured else TORCH_SECONDS_PER_NODE
