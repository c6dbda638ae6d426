"""The preflight: prove the cluster can train, stage by stage, each with a hard time bound.

Stages run on every node at once from the controller (one command per node per stage);
every remote process is wrapped in ``timeout`` so nothing outlives its stage even if the
controller is interrupted, and the probe listeners are also ended by PID when the stage is
done. The verdicts are plain functions in ``trainfleet.verdicts``.

Node users are adversaries: every python runs with ``-I`` in a fresh root-only directory
(never /tmp), and what a node prints is used in a later command only after a strict grammar
accepted it (listener PIDs), quoted; what fails is reported for that node and not used.
"""

from __future__ import annotations

import json
import re
import secrets
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType
from typing import Any

import gevent.pool
from pyinfra.api import QuoteString, State, StringCommand

from checks.publish import publish
from checks.publish import report_path as report_file
from facts.fingerprint import MeshProofs
from facts.nccl_env_facts import NcclNetwork
from facts.shm_facts import parse_sysvipc_shm
from runtime.gather import gather_fact, once_per_run, prove_sudo, refused_sudo
from trainfleet.defaults import (
    LAUNCH_DIR,
    MESH_PROBE_PARALLEL,
    MESH_PROBE_TIMEOUT,
    RUN_DIR,
    VENV_DIR,
)
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster
from trainfleet.plan import ClusterPlan, Gathered, plan_cluster
from trainfleet.schema import smoke_launcher_problem
from trainfleet.verdicts import (
    USER_CERTIFICATE,
    PreflightReport,
    Problem,
    bandwidth_failures,
    bandwidth_problems,
    certificate_verdicts,
    clock_problems,
    collective_problems,
    failed_before_the_network,
    hygiene_problems,
    ib_port_problems,
    isolate,
    listener_pids,
    mesh_problems,
    mtu_problems,
    nccl_socket_problems,
    pair_figures,
    pair_name,
    pair_rounds,
    printable,
    rank_failure,
    rank_layout,
    reachability_problems,
    shm_warnings,
    smoke_problems,
    smoke_reports,
)

STAGES = (
    Path(__file__).resolve().parent / "preflight_stages"
)  # the scripts each stage runs on the nodes


def _stage(name: str) -> str:
    return (STAGES / name).read_text()


COLLECTIVE = _stage("collective.py")
_HYGIENE = _stage("hygiene.sh")
_LISTEN = _stage("listen.sh")
_END_LISTENERS = _stage("end_listeners.sh")
_PROBE = _stage("probe.sh")
_COLLECTIVE_RUN = _stage("collective.sh")
_SMOKE = _stage("smoke.sh")
PROBE_PORT_OFFSET = -1  # peers' probe listeners sit at master_port - 1 (29499 by default)
BOUNDS = MappingProxyType(
    {
        "hygiene": 15,
        "reachability": 20,
        "collective": 25,
        "isolation": 20,
        "bandwidth": 30,  # s per round of node pairs (two rounds, three for an odd count)
        "smoke": 120,
    }
)  # s per stage (the smoke job's launchers import a lot)
# The bandwidth stage's buffer: large enough that NCCL reaches its plateau on a fabric (nccl-tests'
# busbw flattens from a few hundred MiB), small enough that gloo on CPU nodes takes seconds.
BANDWIDTH_BYTES = MappingProxyType({"nccl": 256 << 20, "gloo": 16 << 20})
SMOKE_JOB = f"{LAUNCH_DIR}/smoke_train.py"
SMOKE_FROM_MASTER = frozenset(
    {"mpirun", "deepspeed", "colossalai"}
)  # runners that start every node's ranks

# Every python the preflight starts gets a fresh working directory of its own under RUN_DIR
# (root's only), never /tmp or a home directory, whose files another user may have planted.
REFUSED = "trainfleet: refused to run: "  # the line a node prints when its RUN_DIR is not safe
STALE_MINUTES = 10  # a directory older than any stage is an interrupted run's: removed
# (directories only: the node lock and staged uploads of operations/remote.py are files)


def _checked_base(base: str) -> str:
    """Shell lines: ``base`` exists (made 0700 if missing) and is a real directory of ours with
    mode 700, else refuse; leftovers of interrupted runs in it are removed."""
    b = shlex.quote(base)
    refuse = shlex.quote(f"{REFUSED}{base} is not a directory of ours with mode 700")
    return f"""umask 077
install -d -m 700 {b} 2>/dev/null
if [ -L {b} ] || [ ! -d {b} ] || [ "$(stat -c %u:%a {b})" != "$(id -u):700" ]; then echo {refuse}; exit 97; fi
find {b} -mindepth 1 -maxdepth 1 -type d -mmin +{STALE_MINUTES} -exec rm -rf -- {{}} + 2>/dev/null
"""


def private_workdir(base: str = RUN_DIR) -> str:
    """Shell lines that make a fresh directory under ``base``, cd into it, point TMPDIR at it,
    and remove it when the script ends, however it ends. Every python is also started with
    ``-I`` (no working or script directory on sys.path, no PYTHON* variables, no user site)."""
    b = shlex.quote(base)
    failed = shlex.quote(f"{REFUSED}mktemp failed in {base}")
    return (
        _checked_base(base)
        + f"""work=$(mktemp -d {b}/preflight.XXXXXXXX) || {{ echo {failed}; exit 97; }}
trap 'cd / && rm -rf -- "$work"' EXIT
trap 'exit 143' HUP INT TERM
cd "$work" && export TMPDIR="$work" || exit 97
"""
    )


def listener_workdir(token: str, base: str = RUN_DIR) -> str:
    """Like ``private_workdir``, for processes that outlive the script: the directory is named
    by the run's token (never by what a node printed) and removed when they are ended."""
    work = shlex.quote(f"{base}/{token}")
    exists = shlex.quote(f"{REFUSED}{base}/{token} exists")
    return (
        _checked_base(base)
        + f"""mkdir -m 700 {work} || {{ echo {exists}; exit 97; }}
cd {work} && export TMPDIR={work} || exit 97
"""
    )


def run_everywhere(
    state: State,
    commands: dict[str, StringCommand],
    seconds: float,
    windows: dict[str, tuple[float, float]] | None = None,
) -> dict[str, list[str]]:
    """Run one command per node, all at once; {node: stdout lines} (nodes that failed: []).
    ``windows`` gets each node's (sent, answered) controller wall-clock times."""
    hosts = {h.data.trainfleet_node: h for h in state.inventory.get_active_hosts()}

    def one(name: str) -> tuple[str, list[str]]:
        sent = time.time()
        try:
            host = hosts[
                name
            ]  # a sudo login (ssh.become) runs the stage as root, as the deploy does
            status, output = host.run_shell_command(
                commands[name],
                _timeout=seconds + 10,
                _sudo=bool(host.data.get("_sudo")),
                _preserve_sudo_env=bool(host.data.get("_preserve_sudo_env")),
            )
        except Exception:  # timeout or lost connection: the stage's verdict names the node
            return name, []
        if windows is not None:
            windows[name] = (sent, time.time())
        return name, output.stdout_lines

    pool = gevent.pool.Pool(max(1, len(commands)))
    return dict(pool.map(one, [n for n in commands if n in hosts]))


def _sh(script: str, *args: Any, bound: int | None = None) -> StringCommand:
    prefix = ["timeout", "-k", "2", str(bound)] if bound else []
    return StringCommand(
        *prefix, "sh", "-c", QuoteString(script), "trainfleet", *(QuoteString(str(a)) for a in args)
    )


def _python(script: str, *args: Any, bound: int | None = None) -> StringCommand:
    """A stage script that runs python: in a private working directory, removed at the end."""
    return _sh(private_workdir(RUN_DIR) + script, *args, bound=bound)


def _collective_command(
    first: int,
    count: int,
    world: int,
    master: str,
    port: int,
    backend: str,
    seconds: int,
    nbytes: int = 0,
) -> StringCommand:
    """``count`` ranks on one node, global ranks ``first``.. of ``world``; with ``nbytes``, each
    also times an all_reduce of that size (the bandwidth stage)."""
    return _python(
        _COLLECTIVE_RUN,
        f"{VENV_DIR}/bin/python",
        seconds + 5,
        COLLECTIVE,
        first,
        count,
        world,
        master,
        port,
        backend,
        seconds,
        *([nbytes] if nbytes else []),
        bound=seconds + 10,
    )


def _refusals(stage: str, out: dict[str, list[str]]) -> list[Problem]:
    """A node whose private working directory could not be made safely ran nothing: named."""
    return [
        Problem(stage, node, line[len("trainfleet: ") :])
        for node, lines in sorted(out.items())
        for line in dict.fromkeys(lines)
        if line.startswith(REFUSED)
    ]


_EXIT_LINE = re.compile(r"exit ([0-9]{1,3})", re.ASCII)


def _steps(lines: list[str]) -> list[dict[str, Any]]:
    """The collective's JSON steps, and what collective.sh says when python itself failed:
    ``nopython`` (no venv), ``exit N`` and the last ``stderr`` lines (escaped: a user may
    write into what a failing import prints)."""
    steps: list[dict[str, Any]] = []
    for line in lines:
        exited = _EXIT_LINE.fullmatch(line)
        if line == "nopython":
            steps.append(
                {
                    "step": "error",
                    "stage": "python",
                    "error": f"no python at {VENV_DIR}/bin/python: the node has no venv (pin stack.torch and deploy)",
                }
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


def parse_hygiene(lines: list[str]) -> dict[str, Any]:
    """One node's hygiene output: port holder, name resolution, its hostname, GPUs visible (``nvidia-smi -L``
    lines, limited by CUDA_VISIBLE_DEVICES), the non-login NCCL/Gloo env, its hostfile slots."""
    data: dict[str, Any] = {"resolves": {}, "env": {}}
    sysvipc = [line[len("sysvipc ") :] for line in lines if line.startswith("sysvipc ")]
    if sysvipc:
        data["stale_shm"] = parse_sysvipc_shm(sysvipc)
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "holder":  # an `ss -ltnp` line; the process is in users:((...))
            users = re.search(r"users:\(\(.*\)\)", rest)
            # Any user names their own processes: nothing they chose reaches a terminal raw.
            data["port_holder"] = (
                printable(users.group(0)) if users else "by a process ss cannot name"
            )
        elif kind == "resolve":
            name, _, addr = rest.partition(" ")
            data["resolves"][name] = addr.strip()
        elif kind == "hostname":
            data["hostname"] = printable(rest.strip())
        elif kind == "gpus":
            data["visible_gpus"] = 0
        elif kind == "gpu" and rest.startswith("GPU "):
            data["visible_gpus"] = data.get("visible_gpus", 0) + 1
        elif kind == "cvd":
            data["cuda_visible_devices"] = rest
        elif kind == "env":
            key, _, value = rest.partition("=")
            data["env"][key] = value
        elif kind == "clock" and re.fullmatch(r"[0-9]{9,11}\.[0-9]{1,9}", rest, re.ASCII):
            data["clock"] = float(rest)
        elif kind == "slots" and re.fullmatch(r"[0-9]{1,6}", rest.strip(), re.ASCII):
            data["slots"] = int(rest)
    if data.get("cuda_visible_devices") and "visible_gpus" in data:
        data["visible_gpus"] = min(
            data["visible_gpus"], len(data["cuda_visible_devices"].split(","))
        )
    return data


def preflight_plan(
    state: State, cluster: Cluster, networks: dict[str, Any] | None = None
) -> ClusterPlan:
    """The plan's names and NCCL environments, from one NcclNetwork read per node (no key store:
    the preflight plans no SSH mesh)."""
    return plan_cluster(
        cluster,
        Gathered(networks=gather_fact(state, NcclNetwork) if networks is None else networks),
    )


def _hygiene(state: State, cluster: Cluster, report: PreflightReport) -> dict[str, Any]:
    """Stage 1; returns each node's NcclNetwork fact (the collective judges NCCL's choice by it)."""
    names = [name for n in cluster.nodes for name in n.names]
    out = run_everywhere(
        state,
        {
            n.name: _sh(
                _HYGIENE,
                cluster.master_port,
                int(n.rank == 0),
                n.name,
                f"{LAUNCH_DIR}/hostfile",
                *names,
                bound=BOUNDS["hygiene"],
            )
            for n in cluster.nodes
        },
        BOUNDS["hygiene"],
    )
    seen = {node: parse_hygiene(lines) for node, lines in out.items() if lines}
    # Clocks: a command of its own, so the window the controller brackets each read with is one
    # round trip (tens of ms), not the whole stage.
    windows: dict[str, tuple[float, float]] = {}
    read = run_everywhere(
        state, {node: _sh('echo "clock $(date +%s.%N)"', bound=5) for node in seen}, 5, windows
    )
    clocks = {
        node: (clock, *windows[node])
        for node, lines in read.items()
        if node in windows and (clock := parse_hygiene(lines).get("clock")) is not None
    }
    report.problems += clock_problems(
        clocks, cluster.gpu["max_clock_offset_ms"], expected=set(seen)
    )
    for node in set(out) - set(seen):
        report.problems.append(Problem("hygiene", node, f"no answer within {BOUNDS['hygiene']} s"))
    slots = {node: data.pop("slots") for node, data in seen.items() if "slots" in data}
    networks = gather_fact(state, NcclNetwork)
    plan = preflight_plan(state, cluster, networks)
    expected = {name: p.nccl.env for name, p in plan.nodes.items() if not p.nccl.problems}
    report.details["hygiene"] = seen
    report.problems += hygiene_problems(cluster, seen, expected, slots)
    report.problems += ib_port_problems(cluster, networks)
    report.problems += mtu_problems(cluster, networks)
    report.warnings += shm_warnings(seen, "pyinfra -y <inventory> deploy/shm_cleanup.py")
    return networks


def _reachability(
    state: State, cluster: Cluster, report: PreflightReport, master_port_free: bool
) -> None:
    probe_port = cluster.master_port + PROBE_PORT_OFFSET
    seconds = BOUNDS["reachability"]
    listeners = {n.name: [(n.address, probe_port)] for n in cluster.nodes}
    if master_port_free:
        listeners[cluster.master.name].append((cluster.master.address, cluster.master_port))
    token = f"trainfleet-preflight-{secrets.token_hex(8)}"  # this run's listeners carry it
    started = run_everywhere(
        state,
        {
            node: _sh(
                listener_workdir(token, RUN_DIR) + _LISTEN,
                seconds,
                token,
                *[v for pair in pairs for v in pair],
            )
            for node, pairs in listeners.items()
        },
        seconds,
    )
    pids: dict[str, list[int]] = {}
    for node, lines in sorted(started.items()):
        pids[node], refused = listener_pids(lines)
        report.problems += [
            Problem(
                "reachability",
                node,
                f"printed {line[:80]!r} where a listener's PID belongs: "
                "not used (the listener ends by its timeout)",
            )
            for line in refused
        ]
    report.problems += _refusals("reachability", started)
    try:
        targets = [f"{n.name}={n.address}:{probe_port}" for n in cluster.nodes]
        if master_port_free:
            targets.append(
                f"{cluster.master.name}:{cluster.master_port}={cluster.master.address}:{cluster.master_port}"
            )
        out = run_everywhere(
            state, {n.name: _python(_PROBE, n.address, *targets) for n in cluster.nodes}, seconds
        )
        report.problems += [p for p in _refusals("reachability", out) if p not in report.problems]
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
    finally:  # end the listeners we started, by PID (timeout ends them anyway), and their directory
        run_everywhere(
            state, {node: end_listeners_command(token, pids.get(node, [])) for node in started}, 5
        )


def mesh_bound(nodes: int, users: int = 1) -> int:
    """Seconds the SSH stage may take: for each mesh user in turn, every peer probed (a bounded
    number at once, each within MESH_PROBE_TIMEOUT), two rounds of retries, and a margin."""
    rounds = -(-nodes // MESH_PROBE_PARALLEL) + 2
    return max(1, users) * MESH_PROBE_TIMEOUT * rounds + 5


def _ssh_mesh(state: State, cluster: Cluster, report: PreflightReport, active: set[str]) -> None:
    """Every node logs in to every node by name as each mesh user, host keys verified, no
    prompt: the path pdsh, DeepSpeed's runner, mpirun and Horovod take to start ranks. A node
    that cannot be reached is named once, as unreachable, not again by each of its peers."""
    peers = [n.name for n in cluster.nodes if n.name in active]
    seconds = mesh_bound(len(peers), len(cluster.mesh_users))
    facts = {name: MeshProofs() for name in peers}
    out = run_everywhere(
        state,
        {
            node: StringCommand(
                "timeout",
                "-k",
                "2",
                str(seconds),
                "sh",
                "-c",
                QuoteString(fact.command(users=cluster.mesh_users, peers=peers).get_raw_value()),
            )
            for node, fact in facts.items()
        },
        seconds,
    )
    proofs: dict[str, dict[str, dict[str, str]] | None] = {}
    held: dict[str, dict[str, str | None]] = {}  # node -> certificate -> its line
    for node, lines in sorted(out.items()):
        try:
            read = facts[node].process(lines)
        except Exception:  # cut off or unreadable: the verdict says nothing was proven
            proofs[node] = None
            continue
        proofs[node] = {user: read[f"mesh_proof:{user}"] for user in cluster.mesh_users}
        held[node] = {
            **{
                path.rsplit("/", 1)[-1]: line
                for path, line in read["sshd_mesh"]["certificates"].items()
                if line
            },
            **{
                f"{user}{USER_CERTIFICATE}": read[f"mesh_user:{user}"]["certificate"]
                for user in cluster.mesh_users
            },
        }
    report.details["ssh"] = proofs
    report.problems += mesh_problems(cluster, proofs, peers, seconds)
    if cluster.mesh == "certificates":
        now, ca_public = datetime.now(UTC), KeyStore(cluster.name).ca_public()  # read only
        validity, problems, warnings = certificate_verdicts(cluster, held, now, ca_public)
        report.details["certificates"] = validity
        report.problems += problems
        report.warnings += warnings


def end_listeners_command(token: str, pids: list[int]) -> StringCommand:
    """Kill these PIDs (validated ints) if they are still this run's listeners; remove the
    listeners' working directory."""
    return _sh(_END_LISTENERS, f"{RUN_DIR}/{token}", token, *(str(int(pid)) for pid in pids))


def _backend(cluster: Cluster) -> str:
    return "nccl" if cluster.uses_gpus else "gloo"


def _collective(
    state: State, cluster: Cluster, report: PreflightReport, networks: dict[str, Any]
) -> bool:
    """One rank per GPU (per CPU node) over the whole cluster; True when every rank finished
    with the right sum and the same versions. Then NCCL's own choice of network is judged."""
    backend = _backend(cluster)
    seconds = BOUNDS["collective"]
    layout = rank_layout(cluster.nodes)
    out = run_everywhere(
        state,
        {
            n.name: _collective_command(
                *layout[n.name],
                cluster.total_slots,
                cluster.master.address,
                cluster.master_port,
                backend,
                seconds,
            )
            for n in cluster.nodes
        },
        seconds,
    )
    steps = {
        node: node_steps(lines, layout[node][1]) for node, lines in out.items() if node in layout
    }
    report.details["collective"] = {
        "backend": backend,
        "world": cluster.total_slots,
        "steps": steps,
    }
    problems = _refusals("collective", out) + collective_problems(cluster, steps)
    report.problems += problems
    if backend == "nccl" and not problems:
        report.problems += nccl_socket_problems(cluster, nccl_logs(steps), networks)
    return not problems


def nccl_logs(steps: dict[str, list[list[dict[str, Any]]]]) -> dict[str, list[list[str]]]:
    """Each node's finished ranks' NCCL INFO lines (a rank that failed proves nothing about them)."""
    return {
        node: [
            [s.get("text", "") for s in rank if s.get("step") == "nccl"]
            for rank in ranks
            if rank_failure(rank) is None
        ]
        for node, ranks in steps.items()
    }


def _isolation(state: State, cluster: Cluster, report: PreflightReport) -> None:
    """2-rank collectives between the master and each node (one rank each), all at once on separate ports."""
    backend = _backend(cluster)
    seconds = BOUNDS["isolation"]
    master = cluster.master
    others = [n for n in cluster.nodes if n.name != master.name]
    master_side = [
        _collective_command(0, 1, 2, master.address, cluster.master_port + 1 + i, backend, seconds)
        for i, _ in enumerate(others)
    ]
    commands = {
        master.name: StringCommand(
            *[part for c in master_side for part in ("(", c, ")", ">/dev/null", "2>&1", "&")],
            "wait",
        )
    }
    for i, node in enumerate(others):
        commands[node.name] = _collective_command(
            1, 1, 2, master.address, cluster.master_port + 1 + i, backend, seconds
        )
    out = run_everywhere(state, commands, seconds)
    pair_ok = {}
    for i, node in enumerate(others):
        pair_ok[node.name] = rank_failure(node_steps(out.get(node.name, []), 1)[0]) is None
    report.details["isolation"] = pair_ok
    report.problems += isolate(cluster, pair_ok)


def bandwidth_commands(
    cluster: Cluster, pairs: list[tuple[str, ...]], seconds: int
) -> dict[str, StringCommand]:
    """One round's commands: each pair (or a lone node, intra-node) runs every GPU of its nodes
    (one rank per CPU node) in a job of its own, its rendezvous on its first node's cluster
    address, on a port of its own (master_port + 1 + its index in the round)."""
    backend = _backend(cluster)
    commands = {}
    for index, pair in enumerate(pairs):
        nodes = [cluster.node(name) for name in pair]
        layout = rank_layout(nodes)
        world = sum(n.slots for n in nodes)
        for node in nodes:
            commands[node.name] = _collective_command(
                *layout[node.name],
                world,
                nodes[0].address,
                cluster.master_port + 1 + index,
                backend,
                seconds,
                BANDWIDTH_BYTES[backend],
            )
    return commands


def bandwidth_plan(cluster: Cluster) -> tuple[list[list[tuple[str, ...]]], str | None]:
    """The rounds of pairs to measure, or none and why: a single node measures its GPUs alone."""
    names = [n.name for n in cluster.nodes]
    if len(names) > 1:
        return pair_rounds(names), None
    if cluster.nodes[0].slots > 1:
        return [[(names[0],)]], None
    what = "one GPU" if cluster.uses_gpus else "one CPU rank (gloo)"
    return [], f"a single node with {what}: no link to measure"


def _bandwidth(state: State, cluster: Cluster, report: PreflightReport) -> None:
    """Bus bandwidth of a timed all_reduce per node pair, round by round; with the spec's floor
    (``preflight.min_busbw_gbps``) the slow node or link is named, without one it is reported."""
    backend = _backend(cluster)
    floor = cluster.preflight.get("min_busbw_gbps")
    rounds, skipped = bandwidth_plan(cluster)
    details: dict[str, Any] = {
        "backend": backend,
        "bytes": BANDWIDTH_BYTES[backend],
        "floor_gbps": floor,
        "pairs": {},
    }
    report.details["bandwidth"] = details
    if skipped:
        details["note"] = skipped
        report.stages["bandwidth"] = "skipped"
        return
    measured: dict[tuple[str, ...], float] = {}
    for pairs in rounds:
        out = run_everywhere(
            state, bandwidth_commands(cluster, pairs, BOUNDS["bandwidth"]), BOUNDS["bandwidth"]
        )
        report.problems += _refusals("bandwidth", out)
        for pair in pairs:
            steps = {node: node_steps(out.get(node, []), cluster.node(node).slots) for node in pair}
            figures = pair_figures([rank for node in pair for rank in steps[node]])
            if figures is None:
                report.problems += bandwidth_failures(cluster, pair, steps)
                continue
            measured[pair] = figures["busbw_gbps"]
            details["pairs"][pair_name(pair)] = {"nodes": list(pair), **figures}
    report.problems += bandwidth_problems(measured, floor)
    report.stages["bandwidth"] = (
        "failed" if any(p.stage == "bandwidth" for p in report.problems) else "ok"
    )


def smoke_command(cluster: Cluster, launcher: str) -> StringCommand:
    """The smoke job through ``launcher``'s file in LAUNCH_DIR, bounded, from a private
    directory (its stderr lands there) with the launch itself started from /."""
    if problem := smoke_launcher_problem(launcher):
        raise ValueError(f"smoke launcher: {problem}")
    seconds = BOUNDS["smoke"]
    # --deadline: ranks a runner started over ssh on other nodes outlive its timeout; they end themselves
    launch = [f"{LAUNCH_DIR}/{launcher}.sh"]
    job = [SMOKE_JOB, "--timeout", str(seconds // 2), "--deadline", str(seconds - 10)]
    if launcher == "mpirun":  # OpenMPI sets no MASTER_ADDR: the job is told; its daemons' session
        # files go in root's RUN_DIR (every earlier stage made it), not a /tmp a user can reach first
        launch += ["--mca", "orte_tmpdir_base", RUN_DIR]
        job = [
            f"{VENV_DIR}/bin/python",
            *job,
            "--master-addr",
            cluster.master.address,
            "--master-port",
            str(cluster.master_port),
        ]
    return _sh(private_workdir(RUN_DIR) + _SMOKE, seconds, *launch, *job, bound=seconds + 10)


def _smoke(state: State, cluster: Cluster, report: PreflightReport, launcher: str) -> None:
    """The smoke job trained through the launcher the team uses, from its generated file."""
    starters = [cluster.master] if launcher in SMOKE_FROM_MASTER else cluster.nodes
    out = run_everywhere(
        state, {n.name: smoke_command(cluster, launcher) for n in starters}, BOUNDS["smoke"]
    )
    report.details["smoke"] = {
        "launcher": launcher,
        "ranks": {rank: r for lines in out.values() for rank, r in smoke_reports(lines).items()},
    }
    report.problems += _refusals("smoke", out) + smoke_problems(cluster, launcher, out)


def cluster_preflight(cluster: Cluster, smoke: str | None = None) -> PreflightReport:
    """Run every stage once per run, print the table and write the JSON report.

    + smoke: also train the smoke job through this launcher (``SMOKE_LAUNCHERS``)
    """
    return once_per_run("preflight", lambda state: _run(state, cluster, smoke))


def _run(state: State, cluster: Cluster, smoke: str | None = None) -> PreflightReport:
    report = PreflightReport(cluster=cluster.name, nodes=[n.name for n in cluster.nodes])
    prove_sudo(
        state, list(state.inventory.get_active_hosts())
    )  # before any stage runs through sudo
    refused = refused_sudo(state)
    active = {h.data.trainfleet_node for h in state.inventory.get_active_hosts()}
    for node in cluster.nodes:
        if node.name in refused:
            report.problems.append(Problem("unreachable", node.name, refused[node.name]))
        elif node.name not in active:
            report.problems.append(Problem("unreachable", node.name, "cannot be reached over SSH"))
    networks = _hygiene(state, cluster, report)
    report.stages["hygiene"] = (
        "failed" if any(p.stage == "hygiene" for p in report.problems) else "ok"
    )
    master_port_free = not report.details["hygiene"].get(cluster.master.name, {}).get("port_holder")
    _reachability(state, cluster, report, master_port_free)
    report.stages["reachability"] = (
        "failed" if any(p.stage == "reachability" for p in report.problems) else "ok"
    )
    if cluster.mesh_users:
        _ssh_mesh(state, cluster, report, active)
        report.stages["ssh"] = "failed" if any(p.stage == "ssh" for p in report.problems) else "ok"
    if len(active) < len(cluster.nodes) or not master_port_free:
        report.stages["collective"] = "skipped"  # it cannot succeed: the cause is named above
        report.stages["bandwidth"] = "skipped"
    else:
        _collective_stages(state, cluster, report, networks, active)
    if smoke:
        if report.stages.get("collective") == "ok":
            _smoke(state, cluster, report, smoke)
            report.stages["smoke"] = (
                "failed" if any(p.stage == "smoke" for p in report.problems) else "ok"
            )
        else:
            report.stages["smoke"] = "skipped"  # no launcher can train where the collective failed
    _publish(report)
    return report


def _collective_stages(
    state: State,
    cluster: Cluster,
    report: PreflightReport,
    networks: dict[str, Any],
    active: set[str],
) -> None:
    """The collective; when it fails for a link's sake, isolation; when it passes, bandwidth."""
    finished = _collective(state, cluster, report, networks)
    mine = [p for p in report.problems if p.stage == "collective"]
    report.stages["collective"] = "failed" if mine else "ok"
    joined_all = not any("never joined" in p.cause for p in report.problems)
    # The same error on every rank is the venv's or the script's, not a link's; so is a rank
    # that failed before the network (no venv, no torch), whose own words are named already.
    same_everywhere = len({p.cause for p in mine}) == 1 and len(mine) == len(active)
    on_their_own = {p.node for p in mine} <= failed_before_the_network(
        report.details["collective"]["steps"]
    )
    if (
        not finished
        and joined_all
        and not same_everywhere
        and not on_their_own
        and len(cluster.nodes) > 2
    ):
        _isolation(state, cluster, report)
        report.stages["isolation"] = (
            "failed" if any(p.stage == "isolation" for p in report.problems) else "ok"
        )
    if finished:  # (NCCL over sockets is measured too: the figure shows what it costs)
        _bandwidth(state, cluster, report)
    else:
        report.stages["bandwidth"] = "skipped"


def report_path(cluster: str) -> Path:
    return report_file("preflight", cluster)


def bandwidth_lines(details: dict[str, Any]) -> list[str]:
    """The measured figures for people, one line per pair (the floor, if any, after them)."""
    floor = details.get("floor_gbps")
    lines = [
        f"busbw {name}: {p['busbw_gbps']:.2f} GB/s (algbw {p['algbw_gbps']:.2f} GB/s, {p['ranks']} ranks "
        f"{details.get('backend')}, {p['bytes'] >> 20} MiB)"
        for name, p in details.get("pairs", {}).items()
    ]
    if lines:
        lines.append(
            f"busbw floor: {floor:g} GB/s"
            if floor is not None
            else "busbw floor: none (preflight.min_busbw_gbps): measured and reported only"
        )
    elif details.get("note"):
        lines.append(f"bandwidth not measured: {details['note']}")
    return lines


def _publish(result: PreflightReport) -> None:
    lines = bandwidth_lines(result.details.get("bandwidth", {}))
    lines += [f"[{p.node}] {p}" for p in result.problems] + [
        f"[{w.node}] warning: {w}" for w in result.warnings
    ]
    if result.ok:
        lines.append("the cluster can train: every stage passed")
    publish(
        f"Preflight for {result.cluster}",
        result.table(),
        lines,
        result.dumps(),
        report_path(result.cluster),
        "TRAINFLEET_PREFLIGHT_JSON",
    )
