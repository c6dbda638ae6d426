"""Launcher files as data: every launcher's files for a node, rendered from the one spec.

Plain functions of the cluster model; operations/launchers_ops.py only puts them in place.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainfleet.capabilities import nccl_env, openmpi
from trainfleet.capabilities.nccl_env import derived
from trainfleet.compare import Content, content, digest
from trainfleet.defaults import LAUNCH_DIR
from trainfleet.hccl import render_rank_table
from trainfleet.model import Cluster, Node
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render_lines, variables
from trainfleet.stamps import cut_to_multiple
from trainfleet.text import printable

# every property it expects is its step's (manage.launchers)
MANAGED = MappingProxyType({"launchers": ("",)})

# file name -> (template, mode)
LAUNCHER_FILES = MappingProxyType(
    {
        "hostfile": ("launchers/hostfile.j2", "644"),
        "colossalai_hostfile": ("launchers/colossalai_hostfile.j2", "644"),
        "accelerate.yaml": ("launchers/accelerate.yaml.j2", "644"),
        "torchrun.sh": ("launchers/torchrun.sh.j2", "755"),
        "mpirun.sh": ("launchers/mpirun.sh.j2", "755"),
        "colossalai.sh": ("launchers/colossalai.sh.j2", "755"),
        "deepspeed.sh": ("launchers/deepspeed.sh.j2", "755"),
        "accelerate.sh": ("launchers/accelerate.sh.j2", "755"),
        "horovod.sh": ("launchers/horovod.sh.j2", "755"),
        "README": ("launchers/README.j2", "644"),
        # Read by DeepSpeed's runner from the directory it is started in. Its parser accepts no
        # blank or comment lines, so the template writes KEY=VALUE lines only.
        ".deepspeed_env": ("launchers/deepspeed_env.j2", "644"),
        # The smoke job every launcher can start: two DDP steps, checked (trainfleet/smoke/train.py)
        "smoke_train.py": ("smoke/train.py", "644"),
        # `colossalai run` over OpenSSH: fabric's paramiko accepts any host key (colossalai.sh)
        "colossalai_run.py": ("launch/colossalai_run.py", "644"),
    }
)
VERBATIM = frozenset({"smoke_train.py", "colossalai_run.py"})
# Ascend clusters also get the HCCL rank table MindSpore reads (RANK_TABLE_FILE), built from
# every NPU node's device IPs (``rank_table_part`` below)
RANK_TABLE = "rank_table.json"
LAUNCH_FILE_NAMES = (*LAUNCHER_FILES, RANK_TABLE)  # every file trainfleet may keep in LAUNCH_DIR
# The same files for the healthy subset (the nodes the last preflight of each did not fail), in
# a folder beside them, on those nodes only: equal to the full ones while no node is left out.
HEALTHY = "healthy"
HEALTHY_README = "launchers/healthy_README.j2"
KEPT_NAMES = (*LAUNCH_FILE_NAMES, *(f"{HEALTHY}/{name}" for name in LAUNCH_FILE_NAMES))
_HERE = Path(__file__).resolve().parent.parent  # trainfleet/: smoke/, launch/


def render_launchers(
    cluster: Cluster,
    node: Node,
    forward: dict[str, str] | None = None,
    mca: dict[str, str] | None = None,
    shared: dict[tuple[Any, ...], str] | None = None,
    launch_dir: str = LAUNCH_DIR,
) -> dict[str, tuple[str, str]]:
    """Every launcher file for ``node``: name -> (content, mode).

    + forward: variables with the same value on every node, which launchers may pass on to
      every rank (``mpirun -x``, ``.deepspeed_env``); per-node values (interface names) are
      left to each node's own environment
    + mca: OpenMPI's MCA parameters (the same on every node), repeated on the mpirun line
    + shared: the files already rendered for other nodes of the same cluster, reused where a
      template does not read ``node`` (hostfiles list every node: rendering them once per
      node would cost N x N)
    + launch_dir: the folder the files will be in (they name each other by path)
    """
    forward = forward or {}
    mca = mca or {}
    # Horovod takes interface names only: given when every node's is the same (GLOO_SOCKET_IFNAME
    # is then uniform), else left to Horovod, which looks for the NICs all workers share.
    nics = forward.get("GLOO_SOCKET_IFNAME")
    context = {
        "cluster": cluster,
        "node": node,
        "launch_dir": launch_dir,
        "venv": cluster.job_env,  # trainfleet's venv, or the env of preflight.python
        "forward": sorted(forward),
        "forward_env": dict(sorted(forward.items())),
        "mca": mca,
        "nics": nics,
    }
    same_for = (id(cluster), launch_dir, tuple(sorted(forward.items())), tuple(sorted(mca.items())))
    shared = {} if shared is None else shared
    # Every node's name, comma-separated: joined once per cluster, not once per node.
    context["host_list"] = shared.setdefault(
        ("host list", id(cluster)), ",".join(n.name for n in cluster.nodes)
    )

    def content(source: str) -> str:
        names = variables(source)
        if names is None or "node" in names:
            return "".join(f"{line}\n" for line in render_lines(source, **context))
        key = (source, *same_for)
        if key not in shared:
            shared[key] = "".join(f"{line}\n" for line in render_lines(source, **context))
        return shared[key]

    return {
        name: ((_HERE / source).read_text() if name in VERBATIM else content(source), mode)
        for name, (source, mode) in LAUNCHER_FILES.items()
    }


@dataclass(frozen=True)
class LaunchersPlan:
    files: dict[str, tuple[str, str]]  # name -> (content, mode)
    problems: list[str]


def rank_table_part(
    cluster: Cluster, npu_ips: Mapping[str, Mapping[int, str]]
) -> tuple[str | None, list[str]]:
    """The HCCL rank table of the cluster's NPU nodes, in spec order, each with devices
    0..npus-1 at the IPs read on it: (the file, None when no node has NPUs; problems)."""
    servers = [n for n in cluster.nodes if n.npus]
    if not servers:
        return None, []
    problems = []
    for node in servers:
        if node.name not in npu_ips:
            problems.append(f"{node.name}'s NPU device IPs could not be read")
            continue
        missing = [d for d in range(node.npus) if d not in npu_ips[node.name]]
        if missing:
            problems.append(
                f"{node.name} has no device IP for NPU {', '.join(map(str, missing))} "
                "(/etc/hccn.conf, hccn_tool -i N -ip -g)"
            )
    if problems:
        return None, problems
    try:
        table = render_rank_table(
            [(n.name, n.address, [(d, npu_ips[n.name][d]) for d in range(n.npus)]) for n in servers]
        )
    except ValueError as exc:
        return None, [str(exc)]
    return table + "\n", []


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {"launchers": ("LauncherFiles", {"directory": LAUNCH_DIR}), "npus": ("NpuDeviceIps", {})}


def healthy_part(
    cluster: Cluster, excluded: Mapping[str, list[str]], multiple_of: int | None
) -> tuple[Cluster | None, dict[str, list[str]]]:
    """The healthy subset's cluster (None: no node is healthy) and who is left out, why: the
    nodes ``excluded`` names (their last preflight failed them), then the last healthy ones in
    rank order until the subset is a multiple of ``multiple_of``. Nobody left out: the
    cluster itself, so its files are the full ones."""
    names = [n.name for n in cluster.nodes]
    out = {name: list(map(printable, excluded[name])) for name in names if name in excluded}
    keep = [name for name in names if name not in out]
    keep, cut = cut_to_multiple(keep, multiple_of)
    out |= cut
    if not out:
        return cluster, {}
    return (cluster.subset(keep) if keep else None), out


@dataclass(frozen=True)
class LaunchersShared:
    """The launchers' cross-node part, built once per run: the NPU nodes' rank table, the
    healthy subset (and its rank table), and the launcher files every node shares, rendered once
    (``rendered``: filled as nodes are planned)."""

    rank_table: tuple[str | None, list[str]]  # the file (None: no NPU node), problems
    healthy: tuple[Cluster | None, dict[str, list[str]]]  # the subset, who is left out and why
    healthy_rank_table: tuple[str | None, list[str]]  # none while nobody is left out
    rendered: dict[tuple[Any, ...], str] = field(default_factory=dict)


def shared(ctx: PlanContext) -> LaunchersShared:
    cluster, npu_ips = ctx.cluster, ctx.gathered.npu_ips
    healthy = healthy_part(cluster, ctx.excluded, cluster.preflight.get("healthy_multiple_of"))
    subset, excluded = healthy
    return LaunchersShared(
        rank_table=rank_table_part(cluster, npu_ips),
        healthy=healthy,
        healthy_rank_table=rank_table_part(subset, npu_ips)
        if subset is not None and excluded
        else (None, []),
    )


def shared_part(ctx: PlanContext) -> LaunchersShared:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("launchers", LaunchersShared)


def part(plan: NodePlan) -> LaunchersPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("launchers", LaunchersPlan)


def plan_part(ctx: PlanContext, node: Node) -> LaunchersPlan:
    """The node's launcher files: the variables every node shares forwarded, the cluster's
    MCA parameters, on NPU nodes the rank table; on a node of the healthy subset the same files
    for that subset in ``healthy/``."""
    mine = derived(ctx, node)
    own = shared_part(ctx)
    uniform = nccl_env.shared_part(ctx).uniform
    rank_table, rank_table_problems = own.rank_table
    forward = {k: v for k, v in mine.env.items() if k in uniform}
    mca = openmpi.shared_part(ctx).params
    files = render_launchers(ctx.cluster, node, forward=forward, mca=mca, shared=own.rendered)
    if node.npus and rank_table:
        files[RANK_TABLE] = (rank_table, "644")
    problems = [f"NCCL environment: {p}" for p in mine.problems]
    problems += [f"rank table: {p}" for p in rank_table_problems] if node.npus else []
    subset, excluded = own.healthy
    if subset is not None and node.name not in excluded:
        files |= _healthy_files(own, subset, excluded, node, files, forward, mca)
    return LaunchersPlan(files=files, problems=problems)


def _healthy_files(
    shared: LaunchersShared,
    subset: Cluster,
    excluded: dict[str, list[str]],
    node: Node,
    full: dict[str, tuple[str, str]],
    forward: dict[str, str],
    mca: dict[str, str],
) -> dict[str, tuple[str, str]]:
    """``healthy/NAME`` for every launcher file: the full ones while no node is left out (the
    README says so), else rendered for the subset, naming each other in ``healthy/``."""
    where = f"{LAUNCH_DIR}/{HEALTHY}"
    me = subset.node(node.name)
    if excluded:
        files = render_launchers(subset, me, forward, mca, shared.rendered, launch_dir=where)
        if node.npus:
            table, _ = shared.healthy_rank_table
            if table:
                files[RANK_TABLE] = (table, "644")
    else:
        files = dict(full)
    readme = "".join(
        f"{line}\n"
        for line in render_lines(
            HEALTHY_README,
            cluster=subset,
            node=me,
            launch_dir=where if excluded else LAUNCH_DIR,
            venv=subset.job_env,
            excluded=excluded,
            full_dir=LAUNCH_DIR,
        )
    )
    files["README"] = (readme, LAUNCHER_FILES["README"][1])
    return {f"{HEALTHY}/{name}": value for name, value in files.items()}


def files_digest(files: Mapping[str, Any], sha_of: Callable[[Any], str]) -> str:
    """The launcher files trainfleet keeps, as one value (``absent``: none of them)."""
    return digest(
        [f"{name} {sha_of(files[name])}" for name in sorted(KEPT_NAMES) if name in files]
        if any(name in files for name in KEPT_NAMES)
        else None
    )


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    return {"launcher files": files_digest(fp["launchers"], lambda f: f["sha256"])}


def expect(plan: NodePlan) -> dict[str, str]:
    if part(plan).problems:
        return {}
    return {"launcher files": files_digest(part(plan).files, lambda f: _sha256(f[0]))}


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    """By digest until drift reads the files that differ (LauncherContents)."""
    return {
        "launcher files": {
            f"{LAUNCH_DIR}/{name}": Content(f["sha256"], None)
            for name, f in fp["launchers"].items()
            if name in KEPT_NAMES
        }
    }


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {
        "launcher files": {
            f"{LAUNCH_DIR}/{name}": content(text) for name, (text, _) in part(plan).files.items()
        }
    }


def converged(plan: NodePlan) -> dict[str, Any]:
    files = part(plan).files
    return {
        "launchers": {
            name: {"mode": mode, "sha256": _sha256(text)} for name, (text, mode) in files.items()
        }
    }
