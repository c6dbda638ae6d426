"""The preflight: prove the cluster can train, stage by stage, each with a hard time bound.

Stages run on every node at once from the controller (one command per node per stage);
every remote process is wrapped in ``timeout`` so nothing outlives its stage even if the
controller is interrupted, and the probe listeners are also ended by PID when the stage is
done. The verdicts are plain functions in ``trainfleet.preflight``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import gevent.pool
from pyinfra.api import QuoteString, State, StringCommand

from facts.shm import parse_sysvipc_shm
from operations.gather import once_per_run
from operations.nccl_env import cluster_nccl_env
from operations.report import publish
from operations.report import report_path as report_file
from trainfleet.defaults import LAUNCH_DIR, VENV_DIR
from trainfleet.model import Cluster
from trainfleet.preflight import (
    PreflightReport,
    Problem,
    collective_problems,
    hygiene_problems,
    isolate,
    reachability_problems,
    shm_warnings,
)

COLLECTIVE = (Path(__file__).resolve().parent.parent / "templates/preflight/collective.py").read_text()
PROBE_PORT_OFFSET = -1  # peers' probe listeners sit at master_port - 1 (29499 by default)
BOUNDS = {"hygiene": 15, "reachability": 20, "collective": 25, "isolation": 20}  # seconds per stage

_HYGIENE = r"""
port=$1 is_master=$2 me=$3 hostfile=$4; shift 4
if [ "$is_master" = 1 ]; then ss -Hltnp "sport = :$port" 2>/dev/null | head -n 1 | sed 's/^/holder /'; fi
for n in "$@"; do echo "resolve $n $(getent ahostsv4 "$n" | awk 'NR==1 {print $1}')"; done
command -v nvidia-smi >/dev/null 2>&1 && { echo "gpus"; nvidia-smi -L 2>/dev/null | sed 's/^/gpu /'; }
echo "cvd ${CUDA_VISIBLE_DEVICES-}"
env | grep -E '^(NCCL|GLOO)_' | sed 's/^/env /'
awk -v me="$me" '$1 == me { sub("slots=", "", $2); print "slots " $2 }' "$hostfile" 2>/dev/null
sed 's/^/sysvipc /' /proc/sysvipc/shm 2>/dev/null; echo "sysvipc now $(date +%s)"
true
"""

# A listener that accepts and closes, for at most $3 seconds; prints its PID.
_LISTEN = r"""
addr=$1 port=$2 seconds=$3
nohup timeout "$seconds" python3 -c '
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(128)
while True:
    c, _ = s.accept(); c.close()
' "$addr" "$port" >/dev/null 2>&1 &
echo "pid $!"
"""

# Connect from this node's cluster address to each target (name=addr:port), 3 s each, in parallel.
_PROBE = r"""
timeout 10 python3 -c '
import socket, sys, threading
src = sys.argv[1]
def probe(spec):
    name, _, target = spec.partition("=")
    addr, _, port = target.rpartition(":")
    try:
        s = socket.socket(); s.settimeout(3); s.bind((src, 0)); s.connect((addr, int(port))); s.close()
        print("ok", name, flush=True)
    except Exception as exc:
        print("fail", name, type(exc).__name__, exc, flush=True)
threads = [threading.Thread(target=probe, args=(t,)) for t in sys.argv[2:]]
[t.start() for t in threads]; [t.join() for t in threads]
' "$@"
"""


def run_everywhere(state: State, commands: dict[str, StringCommand], seconds: float) -> dict[str, list[str]]:
    """Run one command per node, all at once; {node: stdout lines} (nodes that failed: [])."""
    hosts = {h.data.trainfleet_node: h for h in state.inventory.get_active_hosts()}

    def one(name: str) -> tuple[str, list[str]]:
        try:
            status, output = hosts[name].run_shell_command(commands[name], _timeout=seconds + 10)
        except Exception:  # timeout or lost connection: the stage's verdict names the node
            return name, []
        return name, output.stdout_lines

    pool = gevent.pool.Pool(max(1, len(commands)))
    return dict(pool.map(one, [n for n in commands if n in hosts]))


def _sh(script: str, *args: Any, bound: int | None = None) -> StringCommand:
    prefix = ["timeout", "-k", "2", str(bound)] if bound else []
    return StringCommand(*prefix, "sh", "-c", QuoteString(script), "trainfleet", *(QuoteString(str(a)) for a in args))


def _collective_command(rank: int, world: int, master: str, port: int, backend: str, seconds: int) -> StringCommand:
    return StringCommand("cd", "/tmp", "&&", "timeout", "-k", "2", str(seconds + 5), f"{VENV_DIR}/bin/python", "-c",
                         QuoteString(COLLECTIVE), str(rank), str(world), QuoteString(master), str(port), backend,
                         str(seconds))


def _steps(lines: list[str]) -> list[dict[str, Any]]:
    steps = []
    for line in lines:
        try:
            steps.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return steps


def parse_hygiene(lines: list[str]) -> dict[str, Any]:
    """One node's hygiene output: port holder, name resolution, GPUs visible (``nvidia-smi -L``
    lines, limited by CUDA_VISIBLE_DEVICES), the non-login NCCL/Gloo env, its hostfile slots."""
    data: dict[str, Any] = {"resolves": {}, "env": {}}
    sysvipc = [line[len("sysvipc "):] for line in lines if line.startswith("sysvipc ")]
    if sysvipc:
        data["stale_shm"] = parse_sysvipc_shm(sysvipc)
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "holder":  # an `ss -ltnp` line; the process is in users:((...))
            users = re.search(r"users:\(\(.*\)\)", rest)
            data["port_holder"] = users.group(0) if users else "by a process ss cannot name"
        elif kind == "resolve":
            name, _, addr = rest.partition(" ")
            data["resolves"][name] = addr.strip()
        elif kind == "gpus":
            data["visible_gpus"] = 0
        elif kind == "gpu" and rest.startswith("GPU "):
            data["visible_gpus"] = data.get("visible_gpus", 0) + 1
        elif kind == "cvd":
            data["cuda_visible_devices"] = rest
        elif kind == "env":
            key, _, value = rest.partition("=")
            data["env"][key] = value
        elif kind == "slots" and rest.strip().isdigit():
            data["slots"] = int(rest)
    if data.get("cuda_visible_devices") and "visible_gpus" in data:
        data["visible_gpus"] = min(data["visible_gpus"], len(data["cuda_visible_devices"].split(",")))
    return data


def _hygiene(state: State, cluster: Cluster, report: PreflightReport) -> None:
    names = [name for n in cluster.nodes for name in n.names]
    out = run_everywhere(state, {
        n.name: _sh(_HYGIENE, cluster.master_port, int(n.rank == 0), n.name, f"{LAUNCH_DIR}/hostfile", *names,
                    bound=BOUNDS["hygiene"])
        for n in cluster.nodes}, BOUNDS["hygiene"])
    seen = {node: parse_hygiene(lines) for node, lines in out.items() if lines}
    for node in set(out) - set(seen):
        report.problems.append(Problem("hygiene", node, f"no answer within {BOUNDS['hygiene']} s"))
    slots = {node: data.pop("slots") for node, data in seen.items() if "slots" in data}
    derived = cluster_nccl_env(cluster)
    expected = {name: d.env for name, d in derived.items() if not d.problems}
    report.details["hygiene"] = seen
    report.problems += hygiene_problems(cluster, seen, expected, slots)
    report.warnings += shm_warnings(seen, "pyinfra -y <inventory> deploy/shm_cleanup.py")


def _reachability(state: State, cluster: Cluster, report: PreflightReport, master_port_free: bool) -> None:
    probe_port = cluster.master_port + PROBE_PORT_OFFSET
    seconds = BOUNDS["reachability"]
    listeners = {n.name: [(n.address, probe_port)] for n in cluster.nodes}
    if master_port_free:
        listeners[cluster.master.name].append((cluster.master.address, cluster.master_port))
    started = run_everywhere(state, {
        node: StringCommand(*[part for addr, port in pairs for part in (_sh(_LISTEN, addr, port, seconds), ";")])
        for node, pairs in listeners.items()}, seconds)
    pids = {node: [line.split()[1] for line in lines if line.startswith("pid ")] for node, lines in started.items()}
    try:
        targets = [f"{n.name}={n.address}:{probe_port}" for n in cluster.nodes]
        if master_port_free:
            targets.append(f"{cluster.master.name}:{cluster.master_port}={cluster.master.address}:{cluster.master_port}")
        out = run_everywhere(state, {n.name: _sh(_PROBE, n.address, *targets) for n in cluster.nodes}, seconds)
        matrix: dict[str, dict[str, str]] = {}
        for node, lines in out.items():
            row = {t.split("=", 1)[0]: "no answer" for t in targets}
            for line in lines:
                status, _, rest = line.partition(" ")
                name, _, reason = rest.partition(" ")
                if name in row:
                    row[name] = "ok" if status == "ok" else reason
            matrix[node] = row
        report.details["reachability"] = matrix
        report.problems += reachability_problems(cluster, matrix)
    finally:  # end the listeners we started, by PID (timeout ends them anyway)
        run_everywhere(state, {node: StringCommand("kill", *ids, "2>/dev/null;", "true")
                               for node, ids in pids.items() if ids}, 5)


def _collective(state: State, cluster: Cluster, report: PreflightReport) -> bool:
    backend = "nccl" if cluster.uses_gpus else "gloo"
    seconds = BOUNDS["collective"]
    world = len(cluster.nodes)
    out = run_everywhere(state, {
        n.name: _collective_command(n.rank, world, cluster.master.address, cluster.master_port, backend, seconds)
        for n in cluster.nodes}, seconds)
    steps = {node: _steps(lines) for node, lines in out.items()}
    report.details["collective"] = {"backend": backend, "world": world, "steps": steps}
    problems = collective_problems(cluster, steps)
    report.problems += problems
    return not problems


def _isolation(state: State, cluster: Cluster, report: PreflightReport) -> None:
    """2-rank collectives between the master and each node, all at once on separate ports."""
    backend = "nccl" if cluster.uses_gpus else "gloo"
    seconds = BOUNDS["isolation"]
    master = cluster.master
    others = [n for n in cluster.nodes if n.name != master.name]
    master_side = [_collective_command(0, 2, master.address, cluster.master_port + 1 + i, backend, seconds)
                   for i, _ in enumerate(others)]
    commands = {master.name: StringCommand(*[part for c in master_side for part in ("(", c, ")", ">/dev/null", "2>&1", "&")],
                                           "wait")}
    for i, node in enumerate(others):
        commands[node.name] = _collective_command(1, 2, master.address, cluster.master_port + 1 + i, backend, seconds)
    out = run_everywhere(state, commands, seconds)
    pair_ok = {}
    for i, node in enumerate(others):
        theirs = _steps(out.get(node.name, []))
        pair_ok[node.name] = bool(theirs) and theirs[-1].get("step") == "done"
    report.details["isolation"] = pair_ok
    report.problems += isolate(cluster, pair_ok)


def cluster_preflight(cluster: Cluster) -> PreflightReport:
    """Run every stage once per run, print the table and write the JSON report."""
    return once_per_run("preflight", lambda state: _run(state, cluster))


def _run(state: State, cluster: Cluster) -> PreflightReport:
    report = PreflightReport(cluster=cluster.name, nodes=[n.name for n in cluster.nodes])
    active = {h.data.trainfleet_node for h in state.inventory.get_active_hosts()}
    for node in cluster.nodes:
        if node.name not in active:
            report.problems.append(Problem("unreachable", node.name, "cannot be reached over SSH"))
    _hygiene(state, cluster, report)
    report.stages["hygiene"] = "failed" if any(p.stage == "hygiene" for p in report.problems) else "ok"
    master_port_free = not report.details["hygiene"].get(cluster.master.name, {}).get("port_holder")
    _reachability(state, cluster, report, master_port_free)
    report.stages["reachability"] = "failed" if any(p.stage == "reachability" for p in report.problems) else "ok"
    if len(active) < len(cluster.nodes) or not master_port_free:
        report.stages["collective"] = "skipped"  # it cannot succeed: the cause is named above
    else:
        ok = _collective(state, cluster, report)
        report.stages["collective"] = "ok" if ok else "failed"
        joined_all = not any("never joined" in p.cause for p in report.problems)
        # The same error on every rank is the venv's or the script's, not a link's.
        causes = {p.cause for p in report.problems if p.stage == "collective"}
        same_everywhere = len(causes) == 1 and len([p for p in report.problems if p.stage == "collective"]) == len(active)
        if not ok and joined_all and not same_everywhere and len(cluster.nodes) > 2:
            _isolation(state, cluster, report)
            report.stages["isolation"] = "failed" if any(p.stage == "isolation" for p in report.problems) else "ok"
    _publish(report)
    return report


def report_path(cluster: str) -> Path:
    return report_file("preflight", cluster)


def _publish(result: PreflightReport) -> None:
    lines = [f"[{p.node}] {p}" for p in result.problems] + [f"[{w.node}] warning: {w}" for w in result.warnings]
    if result.ok:
        lines.append("the cluster can train: every stage passed")
    publish(f"Preflight for {result.cluster}", result.table(), lines, result.dumps(), report_path(result.cluster),
            "TRAINFLEET_PREFLIGHT_JSON")
