"""OpenMPI's network pinning, from the same derived cluster interface as NCCL.

OpenMPI picks its own interfaces for its TCP byte transfer layer (``btl_tcp``) and its
runtime wire-up (``oob_tcp``); left alone it tries every interface, and a second NIC the
peers cannot reach stalls or breaks ``mpirun``. One value pins both on every node:

- the interface name (``eth0``) when every node's cluster interface has the same name;
- otherwise the cluster subnets in CIDR form (``198.18.0.0/24``), which OpenMPI matches
  against each node's own addresses, whatever its interfaces are called.

The value is the same on every node, so it can go on the ``mpirun`` line as well.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from trainfleet.capabilities import nccl_env, ssh_mesh
from trainfleet.compare import ABSENT, Content, content, digest
from trainfleet.defaults import MCA_FILE
from trainfleet.grammar import (
    Key,
    Section,
    env_value_problem,
    mca_name_problem,
    tcp_include_problem,
)
from trainfleet.model import Cluster, Node
from trainfleet.nccl import Derived
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render_lines

# every property it expects is its step's (manage.openmpi)
MANAGED = MappingProxyType({"openmpi": ("",)})

# The MCA parameters trainfleet owns; spec `openmpi.params` may add others, not these.
PINNED = ("btl_tcp_if_include", "oob_tcp_if_include")


def tcp_include(
    derived: Mapping[str, Derived], setting: str = "auto"
) -> tuple[str | None, str | None]:
    """(value for btl/oob_tcp_if_include, None) or (None, why it cannot be derived).

    + derived: every node's derived network environment (nodes with problems left out)
    + setting: spec ``openmpi.tcp_include``: ``auto`` or an explicit value used as given
    """
    if setting != "auto":
        return setting, None
    if not derived:
        return None, "no node's network could be read"
    names = {d.interface for d in derived.values()}
    if len(names) == 1 and None not in names:
        return names.pop(), None
    unknown = sorted(node for node, d in derived.items() if not d.network)
    if unknown:
        return None, (
            f"interface names differ between nodes and the cluster subnet of {', '.join(unknown)} "
            "is unknown; set openmpi.tcp_include in the spec"
        )
    return ",".join(sorted({d.network for d in derived.values() if d.network})), None


def cluster_params(
    derived: Mapping[str, Derived], settings: dict[str, Any]
) -> tuple[dict[str, str], list[str]]:
    """(MCA parameters for every node, problems) from every node's derived network and the
    spec's ``openmpi`` settings; nodes whose network has problems are left out of the choice."""
    usable = {name: d for name, d in derived.items() if not d.problems}
    include, problem = tcp_include(usable, settings["tcp_include"])
    if problem or include is None:
        return {}, [problem or "no OpenMPI interface could be derived"]
    return mca_params(include, settings["params"]), []


def mca_params(include: str, extra: dict[str, Any]) -> dict[str, str]:
    """The MCA parameters for every node's mca-params.conf: the pinned interfaces, then the
    spec's extra parameters (e.g. ``pml: ucx`` where Debian's system file disables UCX)."""
    params = {name: include for name in PINNED}
    params.update({name: str(value) for name, value in extra.items()})
    return params


@dataclass(frozen=True)
class MpiPlan:
    users: list[str]
    params: dict[str, str]
    lines: list[str]  # the ~/.openmpi/mca-params.conf block
    problems: list[str]


def mpi_plan(derived: Mapping[str, Derived], cluster: Cluster) -> MpiPlan:
    """Every node's MCA parameters (one value for the cluster), built once per run."""
    params, problems = cluster_params(derived, cluster.openmpi)
    return MpiPlan(
        users=list(cluster.mesh_users),
        params=params,
        lines=render_lines("openmpi/mca_params.j2", params=params),
        problems=problems,
    )


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {"openmpi": ("OpenMpiState", {"users": list(users)})}


def shared(ctx: PlanContext) -> MpiPlan:
    return mpi_plan(nccl_env.shared_part(ctx).derived, ctx.cluster)


def shared_part(ctx: PlanContext) -> MpiPlan:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("openmpi", MpiPlan)


def part(plan: NodePlan) -> MpiPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("openmpi", MpiPlan)


def plan_part(ctx: PlanContext, node: Node) -> MpiPlan:
    return shared_part(ctx)  # one value for the cluster


def _params(fp: dict[str, Any], user: str) -> list[str] | None:
    found = fp["openmpi"]["users"].get(user)
    return found["params"]["block"] if found else None


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    props = {"openmpi": fp["openmpi"]["version"] or ABSENT}
    for user in cluster.mesh_users:
        props[f"openmpi params ({user})"] = digest(_params(fp, user))
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    if part(plan).problems:
        return {}
    return {
        f"openmpi params ({user.user})": digest(part(plan).lines)
        for user in ssh_mesh.part(plan).users
    }


def _contents(user: str, params: list[str] | None) -> dict[str, dict[str, Content]]:
    return {f"openmpi params ({user})": {f"~{user}/{MCA_FILE}": content(params)}}


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    found: dict[str, dict[str, Content]] = {}
    for user in users:
        found |= _contents(user, _params(fp, user))
    return found


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    wanted: dict[str, dict[str, Content]] = {}
    for user in ssh_mesh.part(plan).users:
        wanted |= _contents(user.user, part(plan).lines)
    return wanted


def converged(plan: NodePlan) -> dict[str, Any]:
    block = {"block": list(part(plan).lines), "outside": []}
    return {
        "openmpi": {
            "version": "4.1.4",
            "users": {
                user.user: {"exists": True, "params": block} for user in ssh_mesh.part(plan).users
            },
        }
    }


# The spec's section: `openmpi` (trainfleet/schema.py composes the spec)

OPENMPI = Section(
    doc="OpenMPI's network, written to every mesh user's `~/.openmpi/mca-params.conf` and the "
    "mpirun line.",
    keys={
        "tcp_include": Key(
            str,
            "auto",
            "btl_tcp_if_include / oob_tcp_if_include; `auto` = the cluster interface's name if all "
            "nodes share it, else the cluster subnets (CIDR).",
            check=tcp_include_problem,
            example="198.18.0.0/24",
            accepts="`auto`, or interface names / IPv4 CIDR subnets, comma-separated",
        ),
        "params": Key(
            dict,
            {},
            "Extra MCA parameters, e.g. `pml: ucx` (Debian's system file disables UCX).",
            each_key=mca_name_problem,
            each=env_value_problem,
            example={"pml": "ucx"},
            accepts="names `[a-z][a-z0-9_]*`; values as `nccl.env`'s",
        ),
    },
)
