"""pdsh: installed, ssh as its remote command, and the cluster's nodes for ``pdsh -a``."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from trainfleet.compare import Content, content, digest
from trainfleet.defaults import PDSH_GENDERS
from trainfleet.model import Cluster, Node
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render, render_lines

# every property it expects is its step's (manage.pdsh)
MANAGED = MappingProxyType({"pdsh": ("",)})

MAJORITY = ("pdsh nodes",)


def genders_lines(nodes: list[str]) -> list[str]:
    """The /etc/genders block ``pdsh -a`` reads on Debian (templates/pdsh/genders.j2):
    ``name trainfleet`` per node."""
    return render_lines("pdsh/genders.j2", nodes=nodes)


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    # genders and machines by digest where the node holds the planned blocks
    return {
        "pdsh": (
            "PdshState",
            {"genders": blocks.get("genders"), "machines": blocks.get("machines")},
        )
    }


@dataclass(frozen=True)
class PdshPlan:
    nodes: list[str]  # every node's name, for ``pdsh -a`` (/etc/pdsh/machines)
    genders: list[str]  # the /etc/genders block (templates/pdsh/genders.j2)
    rcmd_default: str  # /etc/pdsh/rcmd_default: ssh as pdsh's remote command (Debian)
    profile: str  # /etc/profile.d's PDSH_RCMD_TYPE=ssh (RHEL-family builds)


def blocks(cluster: Cluster) -> dict[str, list[str]]:
    names = [n.name for n in cluster.nodes]
    return {"genders": genders_lines(names), "machines": names}


def shared(ctx: PlanContext) -> PdshPlan:
    names = [n.name for n in ctx.cluster.nodes]
    return PdshPlan(  # the same on every node
        nodes=names,
        genders=genders_lines(names),
        rcmd_default=render("pdsh/rcmd_default.j2"),
        profile=render("pdsh/profile.sh.j2"),
    )


def shared_part(ctx: PlanContext) -> PdshPlan:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("pdsh", PdshPlan)


def part(plan: NodePlan) -> PdshPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("pdsh", PdshPlan)


def plan_part(ctx: PlanContext, node: Node) -> PdshPlan:
    return shared_part(ctx)


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    pdsh = fp["pdsh"]
    return {
        "pdsh": ("installed" if pdsh["installed"] else "missing")
        + f", rcmd {pdsh['rcmd_default'] or 'default'}",
        "pdsh nodes": digest(pdsh["genders"]["block"]),
    }


def expect(plan: NodePlan) -> dict[str, str]:
    return {"pdsh nodes": digest(part(plan).genders)}


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    return {"pdsh nodes": {PDSH_GENDERS: content(fp["pdsh"]["genders"]["block"])}}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {"pdsh nodes": {PDSH_GENDERS: content(part(plan).genders)}}


def converged(plan: NodePlan) -> dict[str, Any]:
    return {
        "pdsh": {
            "installed": True,
            "rcmd_default": "ssh",
            "genders": {"block": list(part(plan).genders), "outside": []},
            "machines": {"block": list(part(plan).nodes), "outside": []},
        }
    }
