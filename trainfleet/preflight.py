"""Preflight verdicts: plain functions over what each stage saw on each node.

Every stage's raw results are dicts keyed by node; the functions here turn them into
problems that name the node (or the link) and the cause. No host is touched here.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any

from trainfleet.model import Cluster


@dataclass(frozen=True)
class Problem:
    stage: str  # hygiene | reachability | ssh | collective | isolation | smoke | unreachable
    node: str
    cause: str

    def __str__(self) -> str:
        return f"{self.stage}: {self.cause}"


@dataclass
class PreflightReport:
    cluster: str
    nodes: list[str]
    problems: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)  # shown, reported, but the cluster can train
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ok" | "failed" | "skipped"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problems_for(self, node: str) -> list[Problem]:
        return [p for p in self.problems if p.node == node]

    def to_json(self) -> dict[str, Any]:
        return {"cluster": self.cluster, "ok": self.ok, "stages": self.stages,
                "problems": [asdict(p) for p in self.problems], "warnings": [asdict(w) for w in self.warnings],
                "details": self.details}

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def table(self) -> str:
        rows = [["stage", *self.nodes]]
        for stage, outcome in self.stages.items():
            cells = [stage]
            for node in self.nodes:
                mine = [p for p in self.problems if p.node == node and p.stage == stage]
                warned = [w for w in self.warnings if w.node == node and w.stage == stage]
                cells.append("skipped" if outcome == "skipped" else
                             ("FAIL" if mine else "ok, warning" if warned else "ok"))
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows)


PID_MAX = 4_194_304  # the kernel's PID_MAX_LIMIT: no PID is larger
_PID_LINE = re.compile(r"pid ([1-9][0-9]{0,6})", re.ASCII)


def listener_pids(lines: list[str]) -> tuple[list[int], list[str]]:
    """The PIDs in a node's ``pid N`` lines, and the ``pid`` lines that are not exactly that
    (digits only, within the kernel's range): those are never put in a command."""
    pids: list[int] = []
    refused: list[str] = []
    for line in lines:
        if not line.startswith("pid"):
            continue
        match = _PID_LINE.fullmatch(line.rstrip("\r\n"))
        if match and int(match.group(1)) <= PID_MAX:
            pids.append(int(match.group(1)))
        else:
            refused.append(line)
    return pids, refused


def hygiene_problems(cluster: Cluster, seen: dict[str, dict[str, Any]], expected_env: dict[str, dict[str, str]],
                     launch_slots: dict[str, int]) -> list[Problem]:
    """Stage 1: the master port is free; hostnames are unique; names resolve alike everywhere;
    slots = GPUs = visible devices; the non-login environment holds the derived NCCL/Gloo variables."""
    problems: list[Problem] = []
    master = cluster.master.name
    holder = seen.get(master, {}).get("port_holder")
    if holder:
        problems.append(Problem("hygiene", master, f"master port {cluster.master_port} is already in use ({holder})"))
    problems += duplicate_hostnames({node: data["hostname"] for node, data in seen.items() if data.get("hostname")})
    addresses = cluster.address_of_name()
    for node, data in seen.items():
        for name, got in sorted(data.get("resolves", {}).items()):
            want = addresses.get(name)
            if want and got != want:
                problems.append(Problem("hygiene", node, f"{name} resolves to {got or 'nothing'}, not {want}"))
        spec = cluster.node(node)
        visible = data.get("visible_gpus")
        slots = launch_slots.get(node)
        if slots is not None and slots != spec.slots:
            problems.append(Problem("hygiene", node, f"hostfile gives {slots} slots, the spec {spec.slots} "
                                                     f"({spec.gpus} GPUs)"))
        if spec.gpus and visible is None:
            problems.append(Problem("hygiene", node, f"the spec gives it {spec.gpus} GPUs but nvidia-smi is missing "
                                                     "(no driver?)"))
        elif spec.gpus and visible is not None and visible < spec.gpus:
            problems.append(Problem("hygiene", node, f"only {visible} GPUs visible (CUDA_VISIBLE_DEVICES="
                                                     f"{data.get('cuda_visible_devices') or 'unset'}), "
                                                     f"the spec needs {spec.gpus}"))
        env = data.get("env", {})
        for key, value in expected_env.get(node, {}).items():
            if not key.startswith(("NCCL_", "GLOO_")):  # what the ranks' network setup depends on
                continue
            if env.get(key) != value:
                problems.append(Problem("hygiene", node, f"{key} is {env.get(key, 'missing')!r} in the non-login "
                                                         f"environment ranks get, expected {value!r}"))
    return problems


def duplicate_hostnames(hostnames: dict[str, str]) -> list[Problem]:
    """Nodes that report the same hostname: ranks, pdsh and DeepSpeed's runner tell nodes
    apart by it (torch.distributed's error messages, MPI's host lists), so each is named."""
    problems = []
    for node, name in sorted(hostnames.items()):
        others = sorted(n for n, h in hostnames.items() if h == name and n != node)
        if others:
            problems.append(Problem("hygiene", node, f"its hostname {name!r} is also the hostname of {', '.join(others)}"))
    return problems


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def _age(seconds: int) -> str:
    return f"{seconds // 3600} h" if seconds >= 3600 else f"{seconds // 60} min" if seconds >= 60 else f"{seconds} s"


def shm_warnings(seen: dict[str, dict[str, Any]], cleanup: str) -> list[Problem]:
    """Stale System V shared memory (no process attached), per node: a warning, not a failure
    (a crashed run's leftovers cost memory, they do not stop training). ``cleanup`` says how
    to remove them; nothing removes them on its own."""
    warnings = []
    for node, data in sorted(seen.items()):
        stale = data.get("stale_shm") or []
        if not stale:
            continue
        listed = ", ".join(f"shmid {s['shmid']} ({_size(s['bytes'])}, idle {_age(s['idle_seconds'])})"
                           for s in stale[:5]) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        total = _size(sum(s["bytes"] for s in stale))
        warnings.append(Problem("hygiene", node, f"{len(stale)} stale System V shared memory segment"
                                                 f"{'s' if len(stale) > 1 else ''} ({total}) with no process "
                                                 f"attached: {listed}; remove with: {cleanup}"))
    return warnings


def reachability_problems(cluster: Cluster, matrix: dict[str, dict[str, str]]) -> list[Problem]:
    """Stage 2: every node reaches every peer's listener on its cluster address, and the
    master's rendezvous port. ``matrix[src][target] = "ok" | reason``."""
    problems = []
    for src, row in matrix.items():
        for target, result in sorted(row.items()):
            if result != "ok":
                problems.append(Problem("reachability", src, f"cannot reach {target}: {result}"))
    return problems


def mesh_problems(cluster: Cluster, proofs: dict[str, dict[str, dict[str, str]] | None], names: list[str],
                  seconds: int) -> list[Problem]:
    """The SSH stage: ``proofs[node][user][peer] = "ok" | reason`` (None: the node's probe
    gave no complete answer) over the reachable ``names``. Every peer of every mesh user must
    be "ok": a probe that did not run, or a peer missing from it, is a failure, never a pass."""
    problems = []
    for node in names:
        users = proofs.get(node)
        if users is None:
            problems.append(Problem("ssh", node, f"its SSH probes gave no complete answer within {seconds} s"))
            continue
        for user in cluster.mesh_users:
            results = users.get(user) or {}
            failed = [(peer, results.get(peer, "not probed")) for peer in names if results.get(peer) != "ok"]
            for peer, why in failed:
                problems.append(Problem("ssh", node, f"as {user}, cannot ssh to {peer}: {printable(why)}"))
    return problems


def printable(text: str, limit: int = 200) -> str:
    """``text`` with anything but printable ASCII escaped (no terminal control sequences)."""
    return "".join(c if " " <= c <= "~" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
                   for c in text[:limit])


def collective_problems(cluster: Cluster, steps: dict[str, list[dict[str, Any]]]) -> list[Problem]:
    """Stage 3: every rank got through all_reduce (right sum) and all_gather (same versions)."""
    problems: list[Problem] = []
    names = [n.name for n in cluster.nodes]
    causes = {node: rank_failure(steps.get(node, [])) for node in names}
    rendezvous = next((s for node in names for s in steps.get(node, []) if s.get("stage") == "rendezvous"), None)
    if rendezvous:
        missing = [names[r] for r in rendezvous["missing"] if 0 <= r < len(names)]
        for node in missing:
            own = causes[node]  # a rank that failed on its own (no venv, no torch) says why
            problems.append(Problem("collective", node, own if own and "timed out" not in own else
                                    f"never joined the rendezvous at {cluster.master.name}:{cluster.master_port} "
                                    f"(joined: {', '.join(names[r] for r in rendezvous['joined'] if 0 <= r < len(names)) or 'none'})"))
        return problems
    problems += [Problem("collective", node, cause) for node, cause in causes.items() if cause]
    for node in names:
        for step in steps.get(node, []):
            if step.get("step") == "all_reduce" and not step.get("ok"):
                problems.append(Problem("collective", node, f"all_reduce gave {step['got']}, expected {step['expected']}"))
    gathered = next((s["versions"] for node in names for s in steps.get(node, []) if s.get("step") == "all_gather"), None)
    if gathered:
        problems += version_problems(names, gathered)
    return problems


TIMEOUT_EXITS = (124, 137)  # timeout(1)'s status, and SIGKILL's after its grace period


def rank_owners(cluster: Cluster) -> dict[int, str]:
    """Global rank -> node, as every launcher numbers them: the nodes in spec (hostfile)
    order, each with its slots."""
    owners: dict[int, str] = {}
    for node in cluster.nodes:
        owners.update({len(owners) + i: node.name for i in range(node.slots)})
    return owners


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
        if isinstance(report, dict) and isinstance(report.get("rank"), int) and not isinstance(report["rank"], bool):
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
            problems.append(Problem("smoke", node, f"through {launcher}: rank {rank} never reported{_last_words(said or [])}"))
        elif report.get("smoke") != "ok":
            problems.append(Problem("smoke", node, f"through {launcher}: rank {rank} failed: "
                                                   f"{printable(str(report.get('error', 'no error given')))}"))
        elif report.get("world") != cluster.total_slots:
            problems.append(Problem("smoke", node, f"through {launcher}: rank {rank} ran in a world of "
                                                   f"{report.get('world')}, the cluster has {cluster.total_slots} ranks"))
    return problems


def _last_words(lines: list[str]) -> str:
    code = next((line[len("exit "):] for line in reversed(lines) if re.fullmatch(r"exit [0-9]{1,3}", line)), None)
    stderr = [line[len("stderr "):] for line in lines if line.startswith("stderr ")]
    if code is None:
        return " (its launcher gave no answer)"
    ended = "timed out" if int(code) in TIMEOUT_EXITS else f"exited with status {code}"
    return f" (its launcher {ended}{': ' + printable(stderr[-1]) if stderr else ''})"


def rank_failure(steps: list[dict[str, Any]]) -> str | None:
    """Why one rank did not finish, in the words of what failed (None: it finished)."""
    progress = [s for s in steps if s.get("step") not in ("exit", "stderr")]
    last = progress[-1] if progress else {"step": "no output"}
    if last.get("step") == "done":
        return None
    if last.get("step") == "error":
        return f"{last.get('stage')} failed: {printable(str(last.get('error')))}"
    code = next((s.get("code") for s in steps if s.get("step") == "exit"), None)
    stderr = [s.get("text", "") for s in steps if s.get("step") == "stderr"]
    if code is None or code in TIMEOUT_EXITS:
        return f"stopped after {last.get('step')!r} (timed out)"
    said = f": {stderr[-1]}" if stderr else " and wrote nothing to stderr"
    return f"python exited with status {code} after {last.get('step')!r}{said}"


def version_problems(names: list[str], versions: list[dict[str, Any]]) -> list[Problem]:
    """The odd node out of the versions every rank reported (majority wins)."""
    problems = []
    for key in ("torch", "cuda", "nccl"):
        values = [v.get(key) for v in versions]
        if len(set(values)) < 2:
            continue
        majority = max(set(values), key=values.count)
        for node, value in zip(names, values):
            if value != majority:
                problems.append(Problem("collective", node, f"{key} {value} differs from the other ranks' {majority}"))
    return problems


def isolate(cluster: Cluster, pair_ok: dict[str, bool]) -> list[Problem]:
    """Stage 4: with the master and one node at a time, the nodes that fail are at fault; if
    every pair fails, the master is."""
    failing = [node for node, ok in pair_ok.items() if not ok]
    if failing and len(failing) == len(pair_ok) and len(pair_ok) > 1:
        return [Problem("isolation", cluster.master.name, "every pair with the master fails: the master is at fault")]
    return [Problem("isolation", node, f"a 2-rank collective between {cluster.master.name} and {node} fails: "
                                       f"the link to {node} (or {node} itself) is at fault") for node in failing]
