"""Preflight verdicts: plain functions over what each stage saw on each node.

Every stage's raw results are dicts keyed by node; the functions here turn them into
problems that name the node (or the link) and the cause. No host is touched here.
"""

from __future__ import annotations

import json
import re
import statistics
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from trainfleet import certificates
from trainfleet.capabilities.gpu_node import mtu_values
from trainfleet.compare import majority
from trainfleet.defaults import RENEW_FRACTION
from trainfleet.mesh import host_principals
from trainfleet.model import Cluster, Node


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
    warnings: list[Problem] = field(
        default_factory=list
    )  # shown, reported, but the cluster can train
    stages: dict[str, str] = field(default_factory=dict)  # stage -> "ok" | "failed" | "skipped"
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def problems_for(self, node: str) -> list[Problem]:
        return [p for p in self.problems if p.node == node]

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster": self.cluster,
            "ok": self.ok,
            "stages": self.stages,
            "problems": [asdict(p) for p in self.problems],
            "warnings": [asdict(w) for w in self.warnings],
            "details": self.details,
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2)

    def table(self) -> str:
        rows = [["stage", *self.nodes]]
        for stage, outcome in self.stages.items():
            cells = [stage]
            for node in self.nodes:
                mine = [p for p in self.problems if p.node == node and p.stage == stage]
                warned = [w for w in self.warnings if w.node == node and w.stage == stage]
                cells.append(
                    "skipped"
                    if outcome == "skipped"
                    else ("FAIL" if mine else "ok, warning" if warned else "ok")
                )
            rows.append(cells)
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        return "\n".join(
            "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)).rstrip()
            for row in rows
        )


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


def hygiene_problems(
    cluster: Cluster,
    seen: dict[str, dict[str, Any]],
    expected_env: dict[str, dict[str, str]],
    launch_slots: dict[str, int],
) -> list[Problem]:
    """Stage 1: the master port is free; hostnames are unique; names resolve alike everywhere;
    slots = GPUs = visible devices; the non-login environment holds the derived NCCL/Gloo variables."""
    problems: list[Problem] = []
    master = cluster.master.name
    holder = seen.get(master, {}).get("port_holder")
    if holder:
        problems.append(
            Problem(
                "hygiene", master, f"master port {cluster.master_port} is already in use ({holder})"
            )
        )
    problems += duplicate_hostnames(
        {node: data["hostname"] for node, data in seen.items() if data.get("hostname")}
    )
    addresses = cluster.address_of_name()
    for node, data in seen.items():
        for name, got in sorted(data.get("resolves", {}).items()):
            want = addresses.get(name)
            if want and got != want:
                problems.append(
                    Problem("hygiene", node, f"{name} resolves to {got or 'nothing'}, not {want}")
                )
        spec = cluster.node(node)
        visible = data.get("visible_gpus")
        slots = launch_slots.get(node)
        if slots is not None and slots != spec.slots:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"hostfile gives {slots} slots, the spec {spec.slots} ({spec.gpus} GPUs)",
                )
            )
        if spec.gpus and visible is None:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"the spec gives it {spec.gpus} GPUs but nvidia-smi is missing (no driver?)",
                )
            )
        elif spec.gpus and visible is not None and visible < spec.gpus:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"only {visible} GPUs visible (CUDA_VISIBLE_DEVICES="
                    f"{data.get('cuda_visible_devices') or 'unset'}), "
                    f"the spec needs {spec.gpus}",
                )
            )
        env = data.get("env", {})
        for key, value in expected_env.get(node, {}).items():
            if not key.startswith(("NCCL_", "GLOO_")):  # what the ranks' network setup depends on
                continue
            if env.get(key) != value:
                problems.append(
                    Problem(
                        "hygiene",
                        node,
                        f"{key} is {env.get(key, 'missing')!r} in the non-login "
                        f"environment ranks get, expected {value!r}",
                    )
                )
    return problems


def clock_problems(
    readings: dict[str, tuple[float, float, float]], max_ms: int, expected: set[str]
) -> list[Problem]:
    """Clocks compared across nodes, without trusting any node's own sync status: each node
    read its clock between the controller's sending the stage and its answer, so its offset
    from the controller is known to within half that window. A node further from the median
    node than ``max_ms`` plus both uncertainties is named (rank timeouts, log order and
    certificates assume one time). ``readings``: {node: (its clock, sent, answered)}; a
    node in ``expected`` that gave no reading fails: a check that saw nothing never passes."""
    problems = [
        Problem("hygiene", node, "printed no clock reading (date +%s.%N)")
        for node in sorted(expected - set(readings))
    ]
    if len(readings) < 2:
        return problems
    offsets = {
        node: clock - (sent + answered) / 2 for node, (clock, sent, answered) in readings.items()
    }
    unsure = {node: (answered - sent) / 2 for node, (_, sent, answered) in readings.items()}
    middle = statistics.median(offsets.values())
    slack = max_ms / 1000 + statistics.median(unsure.values())
    for node, offset in sorted(offsets.items()):
        apart = offset - middle
        if abs(apart) > slack + unsure[node]:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"its clock is {abs(apart) * 1000:.0f} ms "
                    f"{'ahead of' if apart > 0 else 'behind'} the other nodes' "
                    f"(gpu.max_clock_offset_ms: {max_ms}; is chrony/timesyncd running?)",
                )
            )
    return problems


def duplicate_hostnames(hostnames: dict[str, str]) -> list[Problem]:
    """Nodes that report the same hostname: ranks, pdsh and DeepSpeed's runner tell nodes
    apart by it (torch.distributed's error messages, MPI's host lists), so each is named."""
    problems = []
    for node, name in sorted(hostnames.items()):
        others = sorted(n for n, h in hostnames.items() if h == name and n != node)
        if others:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"its hostname {name!r} is also the hostname of {', '.join(others)}",
                )
            )
    return problems


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def _age(seconds: int) -> str:
    return (
        f"{seconds // 3600} h"
        if seconds >= 3600
        else f"{seconds // 60} min"
        if seconds >= 60
        else f"{seconds} s"
    )


def shm_warnings(seen: dict[str, dict[str, Any]], cleanup: str) -> list[Problem]:
    """Stale System V shared memory (no process attached), per node: a warning, not a failure
    (a crashed run's leftovers cost memory, they do not stop training). ``cleanup`` says how
    to remove them; nothing removes them on its own."""
    warnings = []
    for node, data in sorted(seen.items()):
        stale = data.get("stale_shm") or []
        if not stale:
            continue
        listed = ", ".join(
            f"shmid {s['shmid']} ({_size(s['bytes'])}, idle {_age(s['idle_seconds'])})"
            for s in stale[:5]
        ) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        total = _size(sum(s["bytes"] for s in stale))
        warnings.append(
            Problem(
                "hygiene",
                node,
                f"{len(stale)} stale System V shared memory segment"
                f"{'s' if len(stale) > 1 else ''} ({total}) with no process "
                f"attached: {listed}; remove with: {cleanup}",
            )
        )
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


def mesh_problems(
    cluster: Cluster,
    proofs: dict[str, dict[str, dict[str, str]] | None],
    names: list[str],
    seconds: int,
) -> list[Problem]:
    """The SSH stage: ``proofs[node][user][peer] = "ok" | reason`` (None: the node's probe
    gave no complete answer) over the reachable ``names``. Every peer of every mesh user must
    be "ok": a probe that did not run, or a peer missing from it, is a failure, never a pass."""
    problems = []
    for node in names:
        users = proofs.get(node)
        if users is None:
            problems.append(
                Problem("ssh", node, f"its SSH probes gave no complete answer within {seconds} s")
            )
            continue
        for user in cluster.mesh_users:
            results = users.get(user) or {}
            failed = [
                (peer, results.get(peer, "not probed"))
                for peer in names
                if results.get(peer) != "ok"
            ]
            for peer, why in failed:
                problems.append(
                    Problem("ssh", node, f"as {user}, cannot ssh to {peer}: {printable(why)}")
                )
    return problems


def certificate_verdicts(
    cluster: Cluster,
    held: dict[str, dict[str, str | None]],
    now: datetime,
    ca_public: str | None = None,
) -> tuple[dict[str, dict[str, str]], list[Problem], list[Problem]]:
    """The certificate mesh's validity on each node: ``{node: {certificate: "N days left"}}``,
    problems (missing, unreadable, not yet or no longer valid, a signature that does not
    verify, not the cluster CA's ``ca_public`` (None: not known here), the wrong type or
    principals: logins fail) and warnings (in the last third of its validity: the next
    deploy signs it again)."""
    renew = timedelta(days=cluster.certificate_days) / RENEW_FRACTION
    validity: dict[str, dict[str, str]] = {}
    problems, warnings = [], []
    for node, certificates_held in sorted(held.items()):
        mine = validity[node] = {}
        if not any(name.endswith("-cert.pub") for name, line in certificates_held.items() if line):
            problems.append(
                Problem("ssh", node, "sshd presents no host certificate: run the deploy")
            )
        for name, line in sorted(certificates_held.items()):
            if not line:
                problems.append(Problem("ssh", node, f"{name} is missing: run the deploy"))
                continue
            try:
                info = certificates.read(line)
            except certificates.CertificateError as exc:
                problems.append(
                    Problem("ssh", node, f"{name} is unreadable ({exc}): run the deploy")
                )
                continue
            left = info.time_left(now)
            mine[name] = f"{left.days} days left (until {info.valid_before:%Y-%m-%d %H:%M} UTC)"
            kind, principals = wanted_certificate(cluster, node, name)
            why = certificates.problem(line, ca_public, kind, principals, now)
            if info.valid_after > now or left <= timedelta(0):
                problems.append(
                    Problem(
                        "ssh",
                        node,
                        f"{name} is not valid now (from {info.valid_after:%Y-%m-%d %H:%M} "
                        f"to {info.valid_before:%Y-%m-%d %H:%M} UTC): run the deploy",
                    )
                )
            elif why:
                problems.append(
                    Problem("ssh", node, f"{name} is not the cluster's ({why}): run the deploy")
                )
            elif left < renew:
                warnings.append(
                    Problem(
                        "ssh",
                        node,
                        f"{name} has {left.days} days left: the next deploy signs it again",
                    )
                )
    return validity, problems, warnings


USER_CERTIFICATE = "'s certificate"  # the preflight names a user's: "<user>'s certificate"


def wanted_certificate(cluster: Cluster, node: str, name: str) -> tuple[str, list[str]]:
    """(kind, principals) a held certificate must have: ``<user>'s certificate`` is a user
    certificate for ``<user>``, any other a host certificate for the node's names."""
    if name.endswith(USER_CERTIFICATE):
        return "user", [name[: -len(USER_CERTIFICATE)]]
    return "host", host_principals(cluster.node(node))


def printable(text: str, limit: int = 200) -> str:
    """``text`` with anything but printable ASCII escaped (no terminal control sequences)."""
    return "".join(
        c if " " <= c <= "~" else f"\\x{ord(c):02x}" if ord(c) < 256 else f"\\u{ord(c):04x}"
        for c in text[:limit]
    )


def collective_problems(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]]
) -> list[Problem]:
    """Stage 3: every rank of every node (``steps[node][local rank]``) got through all_reduce
    (right sum) and all_gather (same versions). A node whose ranks all failed alike is named
    once with that cause; otherwise each failing rank is named by its local rank and GPU."""
    problems: list[Problem] = []
    names = [n.name for n in cluster.nodes]
    places = rank_places(cluster)
    causes = {node: [rank_failure(s) for s in _ranks_of(cluster, steps, node)] for node in names}
    rendezvous = next(
        (
            s
            for node in names
            for rank in steps.get(node, [])
            for s in rank
            if s.get("stage") == "rendezvous"
        ),
        None,
    )
    if rendezvous:
        return _rendezvous_problems(cluster, steps, causes, rendezvous)
    for node in names:
        problems += [
            Problem("collective", node, cause)
            for cause in _node_causes(cluster, steps, node, causes[node])
        ]
        for local, rank in enumerate(_ranks_of(cluster, steps, node)):
            for step in rank:
                if step.get("step") == "all_reduce" and not step.get("ok"):
                    problems.append(
                        Problem(
                            "collective",
                            node,
                            f"{_who(cluster, steps, node, local)}all_reduce gave "
                            f"{step.get('got')}, expected {step.get('expected')}",
                        )
                    )
    gathered = next(
        (
            s["versions"]
            for node in names
            for rank in steps.get(node, [])
            for s in rank
            if s.get("step") == "all_gather" and isinstance(s.get("versions"), list)
        ),
        None,
    )
    if gathered:
        problems += version_problems(
            [places.get(r, ("?", 0))[0] for r in range(len(gathered))], gathered
        )
    return problems


def _ranks_of(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]], node: str
) -> list[list[dict[str, Any]]]:
    """The node's ranks' steps, one list per local rank (a rank that printed nothing: [])."""
    mine = steps.get(node, [])
    return [mine[i] if i < len(mine) else [] for i in range(cluster.node(node).slots)]


def gpu_label(rank: list[dict[str, Any]], local: int) -> str:
    """The GPU a rank ran on, as it reported it (its CUDA_VISIBLE_DEVICES entry), else its index."""
    start = next((s for s in rank if s.get("step") == "start"), {})
    gpu = start.get("gpu")
    return printable(str(gpu), 40) if gpu is not None else str(local)


def _who(
    cluster: Cluster, steps: dict[str, list[list[dict[str, Any]]]], node: str, local: int
) -> str:
    """ "local rank 3 (GPU 3): " on a node of several ranks, nothing on a node of one."""
    if cluster.node(node).slots == 1:
        return ""
    return f"local rank {local} (GPU {gpu_label(_ranks_of(cluster, steps, node)[local], local)}): "


def _node_causes(
    cluster: Cluster,
    steps: dict[str, list[list[dict[str, Any]]]],
    node: str,
    causes: list[str | None],
) -> list[str]:
    """One cause for the node when every rank failed alike (no venv, no torch), else one per failing rank."""
    if causes and all(causes) and len(set(causes)) == 1:
        return [str(causes[0])]
    return [
        f"{_who(cluster, steps, node, local)}{cause}" for local, cause in enumerate(causes) if cause
    ]


def _rendezvous_problems(
    cluster: Cluster,
    steps: dict[str, list[list[dict[str, Any]]]],
    causes: dict[str, list[str | None]],
    rendezvous: dict[str, Any],
) -> list[Problem]:
    """The ranks the master's store never saw, by node; a rank that failed on its own (no venv,
    no torch) says why instead."""
    places = rank_places(cluster)
    joined_nodes = sorted(
        {places[r][0] for r in _ints(rendezvous.get("joined")) if r in places},
        key=lambda n: cluster.node(n).rank,
    )
    missing: dict[str, list[int]] = {}
    for r in _ints(rendezvous.get("missing")):
        if r in places:
            missing.setdefault(places[r][0], []).append(places[r][1])
    problems = []
    joined = ", ".join(joined_nodes) or "none"
    where = f"the rendezvous at {cluster.master.name}:{cluster.master_port} (joined: {joined})"
    for node, locals_ in missing.items():
        slots = cluster.node(node).slots
        own = [
            causes[node][i] if i in locals_ and "timed out" not in str(causes[node][i]) else None
            for i in range(slots)
        ]
        problems += [
            Problem("collective", node, cause) for cause in _node_causes(cluster, steps, node, own)
        ]
        silent = [i for i in locals_ if own[i] is None]
        if silent and len(silent) == slots:
            problems.append(Problem("collective", node, f"never joined {where}"))
        elif silent:
            ranks = ", ".join(map(str, silent))
            problems.append(
                Problem("collective", node, f"local ranks {ranks} never joined {where}")
            )
    return problems


def _ints(values: Any) -> list[int]:
    return (
        [v for v in values if isinstance(v, int) and not isinstance(v, bool)]
        if isinstance(values, list)
        else []
    )


def failed_before_the_network(steps: dict[str, list[list[dict[str, Any]]]]) -> set[str]:
    """Nodes every rank of which failed before touching the network (no venv, torch not
    importable): their own cause is named, and no pair test can say more about a link."""
    return {
        node
        for node, ranks in steps.items()
        if ranks
        and all(
            any(s.get("step") == "error" and s.get("stage") in ("python", "import") for s in rank)
            for rank in ranks
        )
    }


TIMEOUT_EXITS = (124, 137)  # timeout(1)'s status, and SIGKILL's after its grace period


def rank_owners(cluster: Cluster) -> dict[int, str]:
    """Global rank -> node, as every launcher numbers them: the nodes in spec (hostfile)
    order, each with its slots."""
    return {rank: node for rank, (node, _) in rank_places(cluster).items()}


def rank_layout(nodes: list[Node]) -> dict[str, tuple[int, int]]:
    """Node -> (its first global rank, its number of ranks) for a job over ``nodes`` in this
    order: one rank per GPU (one on a CPU node), numbered as launchers number them."""
    layout: dict[str, tuple[int, int]] = {}
    first = 0
    for node in nodes:
        layout[node.name] = (first, node.slots)
        first += node.slots
    return layout


def rank_places(cluster: Cluster) -> dict[int, tuple[str, int]]:
    """Global rank -> (node, local rank) over the whole cluster."""
    return {
        first + local: (node, local)
        for node, (first, count) in rank_layout(cluster.nodes).items()
        for local in range(count)
    }


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


def rank_failure(steps: list[dict[str, Any]]) -> str | None:
    """Why one rank did not finish, in the words of what failed (None: it finished)."""
    progress = [s for s in steps if s.get("step") not in ("exit", "stderr", "nccl")]
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


def version_problems(owners: list[str], versions: list[dict[str, Any]]) -> list[Problem]:
    """The odd node out of the versions every rank reported (majority wins); ``owners[rank]``
    is the rank's node. A node is named once per differing value, however many ranks it runs."""
    problems: list[Problem] = []
    for key in ("torch", "cuda", "nccl"):
        values = [v.get(key) if isinstance(v, dict) else None for v in versions]
        if len(set(values)) < 2:
            continue
        majority = max(set(values), key=values.count)
        for node, value in zip(owners, values, strict=False):
            problem = Problem(
                "collective",
                node,
                f"{key} {printable(str(value))} differs from the other ranks' "
                f"{printable(str(majority))}",
            )
            if value != majority and problem not in problems:
                problems.append(problem)
    return problems


def isolate(cluster: Cluster, pair_ok: dict[str, bool]) -> list[Problem]:
    """Stage 4: with the master and one node at a time, the nodes that fail are at fault; if
    every pair fails, the master is."""
    failing = [node for node, ok in pair_ok.items() if not ok]
    if failing and len(failing) == len(pair_ok) and len(pair_ok) > 1:
        return [
            Problem(
                "isolation",
                cluster.master.name,
                "every pair with the master fails: the master is at fault",
            )
        ]
    return [
        Problem(
            "isolation",
            node,
            f"a 2-rank collective between {cluster.master.name} and {node} fails: "
            f"the link to {node} (or {node} itself) is at fault",
        )
        for node in failing
    ]


# ---- bandwidth: node pairs, bus bandwidth, the slow node or link -----------------------------


def busbw(algbw: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all_reduce: algbw * 2(n-1)/n, the traffic each rank's
    link carries, comparable across world sizes (0 for a single rank: no bus)."""
    return algbw * 2 * (ranks - 1) / ranks if ranks > 0 else 0.0


def pair_rounds(nodes: list[str]) -> list[list[tuple[str, str]]]:
    """The node pairs of the bandwidth stage, in rounds of disjoint pairs (a node is in at most
    one pair per round, so pairs of a round run at once without sharing a NIC): the ring
    (0,1), (1,2), ... (N-1,0), so every node is in two pairs when N > 2 and a slow node can be
    told from a slow link. Each pair is (lower-ranked, higher-ranked)."""
    n = len(nodes)
    if n < 2:
        return []
    if n == 2:
        return [[(nodes[0], nodes[1])]]
    rounds = [[(nodes[i], nodes[i + 1]) for i in range(start, n - 1, 2)] for start in (0, 1)]
    if n % 2:  # the wrap pair shares a node with both rounds above
        rounds.append([(nodes[0], nodes[n - 1])])
    else:
        rounds[1].append((nodes[0], nodes[n - 1]))
    return [r for r in rounds if r]


def pair_name(pair: tuple[str, ...]) -> str:
    return "-".join(pair)


def pair_figures(ranks: list[list[dict[str, Any]]]) -> dict[str, Any] | None:
    """algbw and busbw (GB/s, 1e9 bytes as nccl-tests) of one pair's timed all_reduce, from
    every rank's ``bandwidth`` step; the time is the ranks' mean (nccl-tests' default). None
    unless every rank reported one sane figure for the same buffer: a partial run is no measure."""
    reports = [next((s for s in rank if s.get("step") == "bandwidth"), None) for rank in ranks]
    if not reports or any(r is None for r in reports):
        return None
    sizes = {r.get("bytes") for r in reports if r}
    seconds = [r.get("seconds") for r in reports if r]
    if len(sizes) != 1 or not all(
        isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0 for t in seconds
    ):
        return None
    (size,) = sizes
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None
    mean = sum(seconds) / len(seconds)
    algbw = size / mean / 1e9
    return {
        "ranks": len(ranks),
        "bytes": size,
        "seconds": mean,
        "algbw_gbps": round(algbw, 4),
        "busbw_gbps": round(busbw(algbw, len(ranks)), 4),
    }


def bandwidth_failures(
    cluster: Cluster, pair: tuple[str, ...], steps: dict[str, list[list[dict[str, Any]]]]
) -> list[Problem]:
    """A pair whose timed all_reduce gave no figure: each failing rank named in its own words,
    by node (and local rank); with no rank failing, the missing figure itself (no pass)."""
    problems = []
    together = f"with {pair[1]}" if len(pair) == 2 else "alone"
    for node in pair:
        causes = [rank_failure(rank) for rank in _ranks_of(cluster, steps, node)]
        with_peer = f"with {_peer(pair, node)}" if len(pair) == 2 else "its GPUs alone"
        problems += [
            Problem("bandwidth", node, f"the timed all_reduce {with_peer} did not finish: {cause}")
            for cause in _node_causes(cluster, steps, node, causes)
        ]
    if not problems:
        problems = [
            Problem(
                "bandwidth",
                node,
                f"the timed all_reduce of {pair[0]} {together} reported no usable figure",
            )
            for node in pair
        ]
    return problems


def bandwidth_problems(
    measured: dict[tuple[str, ...], float], floor: float | None
) -> list[Problem]:
    """With a floor (GB/s): each pair under it fails. A node under the floor in every pair it is
    in (two or more) is the slow node; a slow pair of two nodes that reach the floor elsewhere
    is a slow link, named on both its nodes; with two nodes only, the pair is named (nothing
    tells the node from the link). ``measured``: pair (one node: intra-node) -> busbw."""
    if floor is None:
        return []
    slow = {pair: bw for pair, bw in measured.items() if bw < floor}
    pairs_of: dict[str, list[tuple[str, ...]]] = {}
    for pair in measured:
        for node in pair:
            pairs_of.setdefault(node, []).append(pair)
    # A node reaches the floor somewhere: it is not the slow one in its slow pairs. A node slow
    # in every pair is the slow node only if each of those peers reaches the floor elsewhere
    # (two slow neighbours would make a healthy node look slow in a ring).
    fine = {node for node, pairs in pairs_of.items() if any(p not in slow for p in pairs)}
    slow_nodes = [
        node
        for node, pairs in pairs_of.items()
        if len(pairs) >= 2
        and all(p in slow for p in pairs)
        and all(_peer(p, node) in fine for p in pairs)
    ]
    problems = []
    for node in slow_nodes:
        figures = ", ".join(f"with {_peer(p, node)}: {measured[p]:.2f}" for p in pairs_of[node])
        problems.append(
            Problem(
                "bandwidth",
                node,
                f"bus bandwidth under the floor of {floor:g} GB/s in every pair it "
                f"is in ({figures} GB/s): the node is slow",
            )
        )
    for pair, bw in slow.items():
        if any(node in slow_nodes for node in pair):
            continue
        if len(pair) == 1:
            cause = f"its GPUs' bus bandwidth {bw:.2f} GB/s is under the floor of {floor:g} GB/s"
        elif len(pairs_of[pair[0]]) < 2 or len(pairs_of[pair[1]]) < 2:
            cause = (
                f"bus bandwidth {bw:.2f} GB/s between {pair[0]} and {pair[1]} is under the floor of {floor:g} "
                "GB/s (no third node to tell the slow node from the slow link)"
            )
        elif all(node in fine for node in pair):
            cause = (
                f"the link {pair_name(pair)} is slow: bus bandwidth {bw:.2f} GB/s, under the floor of {floor:g} "
                "GB/s, while both nodes reach it with their other peer"
            )
        else:
            cause = (
                f"bus bandwidth {bw:.2f} GB/s between {pair[0]} and {pair[1]} is under the floor of {floor:g} GB/s, "
                "and not both reach it with another peer: a slow node or link among them, not told apart"
            )
        problems += [Problem("bandwidth", node, cause) for node in pair]
    return problems


def _peer(pair: tuple[str, ...], node: str) -> str:
    return next((n for n in pair if n != node), node)


# ---- NCCL's own choice of network, from its INFO log -----------------------------------------

# What NCCL prints at init (NCCL_DEBUG=INFO, subsystems INIT,NET), strongest evidence first:
# "Using network IB" (2.4+; "Using internal Network Socket" before), then the transport of
# each connection ("Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0", "Ring 00 : ... via
# NET/IB/0"), then which transports found devices ("NET/IB : Using [0]mlx5_0:1/IB ...").
_NAME = r"([A-Za-z][A-Za-z0-9_. -]{0,39}?)"  # "IB", "Socket", "IBext_v8", "AWS Libfabric"
_USING_NETWORK = re.compile(r"NCCL INFO Using (?:internal )?[Nn]etwork " + _NAME + r"\s*$")
_VIA_NET = re.compile(
    r"NCCL INFO (?:Channel|Ring) [0-9]{1,3}(?:/[0-9]{1,3})? : .* via NET/" + _NAME + "/"
)
_NET_IB_USING = re.compile(r"NCCL INFO NET/IB ?: ?Using \[?[0-9]")
_NET_SOCKET_USING = re.compile(r"NCCL INFO NET/Socket ?: ?Using \[?[0-9]")


def nccl_network(lines: list[str]) -> tuple[str | None, str | None]:
    """(the network NCCL used, the log line that says so), or (None, None) when the log does not
    tell. Old NCCL prints "NET/Socket : Using" for its bootstrap even when it then uses IB, so
    a transport's device list counts only when nothing stronger was printed, IB's first."""
    for pattern in (_USING_NETWORK, _VIA_NET):
        for line in lines:
            if found := pattern.search(line):
                return found.group(1), line
    for pattern, network in ((_NET_IB_USING, "IB"), (_NET_SOCKET_USING, "Socket")):
        for line in lines:
            if pattern.search(line):
                return network, line
    return None, None


def active_ib_ports(network: dict[str, Any] | None) -> list[str]:
    """``mlx5_0 port 1`` for each ACTIVE InfiniBand/RoCE port of a node's NcclNetwork fact."""
    ports = (network or {}).get("ib_ports") or []
    return [
        f"{p['device']} port {p['port']}"
        for p in ports
        if "ACTIVE" in str(p.get("state", "")).upper()
    ]


def nccl_socket_problems(
    cluster: Cluster, logs: dict[str, list[list[str]]], networks: dict[str, dict[str, Any] | None]
) -> list[Problem]:
    """A node whose NCCL ranks went over sockets although it has an active IB/RoCE port ("GPU at
    100% but slow"), and one whose log names no network at all (fail closed): ``logs[node]`` is
    each of its ranks' NCCL INFO lines, from ranks that finished their collective. Nodes the
    spec keeps off IB (``nccl.ib: disable``), and single-node clusters (no network), are not
    judged."""
    if len(cluster.nodes) < 2:
        return []
    problems = []
    for node in cluster.nodes:
        active = active_ib_ports(networks.get(node.name))
        ranks = logs.get(node.name) or []
        if not active or node.nccl.get("ib") == "disable" or not ranks:
            continue
        chosen = [nccl_network(lines) for lines in ranks]
        sockets = [line for network, line in chosen if network == "Socket"]
        ports = f"{', '.join(active)} {'is' if len(active) == 1 else 'are'} active"
        if sockets:
            problems.append(
                Problem(
                    "collective",
                    node.name,
                    f"NCCL went over sockets although {ports} "
                    f"({printable(_info(str(sockets[0])), 160)}): training "
                    "runs at a fraction of the fabric's speed; check "
                    "NCCL_IB_DISABLE, NCCL_IB_HCA and the RDMA libraries "
                    "NCCL loads",
                )
            )
        elif any(network is None for network, _ in chosen):
            problems.append(
                Problem(
                    "collective",
                    node.name,
                    f"NCCL's INFO log names no network although {ports}: "
                    "whether it used them is unknown",
                )
            )
    return problems


def _info(line: str) -> str:
    """The part of an NCCL log line after its host:pid:tid [dev] prefix (which a user may name)."""
    at = line.find("NCCL INFO ")
    return line[at:] if at >= 0 else line


# ---- InfiniBand ports down on one node while its peers' are active ---------------------------


def ib_port_problems(cluster: Cluster, networks: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """A port (device, port) that is ACTIVE on a peer with the same HCA layout (the same set of
    ports), or on most nodes, but DOWN/INIT or missing on one node: named for that node. NCCL
    would silently run that node without it (NCCL_IB_HCA leaves it out; with no active port
    left, NCCL_IB_DISABLE=1 on that node alone). Nodes whose spec disables IB are not judged."""
    judged = {
        n.name: _ports(networks[n.name])
        for n in cluster.nodes
        if networks.get(n.name) is not None
        and n.nccl.get("ib") != "disable"
        and (n.gpus > 0 or _ports(networks[n.name]))
    }  # a CPU node without HCAs runs gloo
    problems = []
    for node, ports in judged.items():
        peers = {peer: p for peer, p in judged.items() if peer != node}
        for key in sorted({k for p in judged.values() for k in p}):
            if "ACTIVE" in ports.get(key, "").upper():
                continue
            active_on = sorted(
                (peer for peer, p in peers.items() if "ACTIVE" in p.get(key, "").upper()),
                key=lambda n: cluster.node(n).rank,
            )
            alike = [peer for peer in active_on if set(peers[peer]) == set(ports)]
            if not active_on or not (alike or len(active_on) > len(judged) / 2):
                continue
            state = f"is {_state(ports[key])}" if key in ports else "is missing"
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"InfiniBand {key[0]} port {key[1]} {state} here but ACTIVE on "
                    f"{', '.join(active_on)}: NCCL on this node would run without it",
                )
            )
    return problems


def mtu_problems(cluster: Cluster, networks: dict[str, dict[str, Any] | None]) -> list[Problem]:
    """Every node's cluster interface has the same MTU, and so has each active IB/RoCE port
    on every node that has it: one node at 1500 among 9000s fragments or drops NCCL's and
    Gloo's traffic (RoCE: drops). The odd node is named against the majority; a node whose
    cluster interface's MTU cannot be read fails (a check that saw nothing never passes)."""
    problems: list[Problem] = []
    readings: dict[str, dict[str, str]] = {}
    for node in cluster.nodes:
        network = networks.get(node.name)
        if network is None:
            continue  # unreachable: named by the stages that need it
        mtu = mtu_values(network, node.address)["cluster MTU"]
        if not mtu.isdigit():
            problems.append(
                Problem(
                    "hygiene",
                    node.name,
                    f"the MTU of the interface holding {node.address} cannot be read",
                )
            )
            continue
        readings.setdefault("the cluster interface's MTU", {})[node.name] = mtu
        for port in network.get("ib_ports") or []:
            if "ACTIVE" in str(port.get("state", "")).upper() and port.get("active_mtu"):
                key = f"{printable(str(port['device']), 32)} port {port['port']}'s active MTU"
                readings.setdefault(key, {})[node.name] = printable(str(port["active_mtu"]), 16)
    for what, values in readings.items():
        for finding in majority(what, values):
            if finding.kind == "tie":
                spread = finding.expected.replace("'", "")  # "1500 on 1, 9000 on 1"
                problems.append(
                    Problem(
                        "hygiene",
                        finding.node,
                        f"{what} is {finding.observed}, and no MTU is on most nodes ({spread})",
                    )
                )
            else:
                others = sorted(
                    (n for n, v in values.items() if v == finding.expected),
                    key=lambda n: cluster.node(n).rank,
                )
                problems.append(
                    Problem(
                        "hygiene",
                        finding.node,
                        f"{what} is {finding.observed}, {finding.expected} on "
                        f"{', '.join(others)}: traffic between them fragments or is dropped",
                    )
                )
    return problems


def _ports(network: dict[str, Any] | None) -> dict[tuple[str, int], str]:
    return {
        (str(p["device"]), int(p["port"])): str(p.get("state", ""))
        for p in (network or {}).get("ib_ports") or []
    }


def _state(state: str) -> str:
    """``4:ACTIVE`` -> ``DOWN (1:DOWN)`` style: the name, then the kernel's text."""
    name = state.partition(":")[2] or state or "in no known state"
    return f"{printable(name, 20)} ({printable(state, 20)})" if state else name
