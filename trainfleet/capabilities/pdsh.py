"""pdsh: installed, ssh as its remote command, and the cluster's nodes for ``pdsh -a``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trainfleet.capabilities.plan_context import Blocks, PlanContext, Sections
from trainfleet.compare import content, digest
from trainfleet.defaults import PDSH_GENDERS
from trainfleet.model import Cluster, Node
from trainfleet.render import render_lines

if TYPE_CHECKING:
    from trainfleet.compare import Content
    from trainfleet.plan import NodePlan

MAJORITY = ("pdsh nodes",)
UNIQUE: tuple[str, ...] = ()
HEALTH: tuple[str, ...] = ()


def genders_lines(nodes: list[str]) -> list[str]:
    """The /etc/genders block ``pdsh -a`` reads on Debian (templates/pdsh/genders.j2):
    ``name trainfleet`` per node."""
    return render_lines("pdsh/genders.j2", nodes=nodes)


def deploy_sections(users: list[str], blocks: Blocks) -> Sections:
    # genders and machines by digest where the node holds the planned blocks
    return {
        "pdsh": (
            "PdshState",
            {"genders": blocks.get("genders"), "machines": blocks.get("machines")},
        )
    }


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {}


def plan_part(ctx: PlanContext, node: Node) -> dict[str, Any]:
    return {"pdsh_nodes": ctx.shared["pdsh_nodes"]}


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    pdsh = fp["pdsh"]
    return {
        "pdsh": ("installed" if pdsh["installed"] else "missing")
        + f", rcmd {pdsh['rcmd_default'] or 'default'}",
        "pdsh nodes": digest(pdsh["genders"]["block"]),
    }


def expect(plan: NodePlan) -> dict[str, str]:
    return {"pdsh nodes": digest(genders_lines(plan.pdsh_nodes))}


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    return {"pdsh nodes": {PDSH_GENDERS: content(fp["pdsh"]["genders"]["block"])}}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {"pdsh nodes": {PDSH_GENDERS: content(genders_lines(plan.pdsh_nodes))}}


def converged(plan: NodePlan) -> dict[str, Any]:
    return {
        "pdsh": {
            "installed": True,
            "rcmd_default": "ssh",
            "genders": {"block": genders_lines(plan.pdsh_nodes), "outside": []},
            "machines": {"block": list(plan.pdsh_nodes), "outside": []},
        }
    }
