"""The node's names: its hostname and the cluster's /etc/hosts block."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainfleet.capabilities.plan_context import Blocks, PlanContext, Sections
from trainfleet.compare import ABSENT, content, digest
from trainfleet.etc_hosts import stale_lines
from trainfleet.model import Cluster, Node
from trainfleet.render import render_lines

if TYPE_CHECKING:
    from trainfleet.compare import Content
    from trainfleet.plan import NodePlan

MAJORITY = ("hosts block",)
UNIQUE = ("hostname",)  # no two nodes may share these
HEALTH: tuple[str, ...] = ()


@dataclass(frozen=True)
class HostsPlan:
    lines: list[str]  # the /etc/hosts block
    names: dict[str, str]  # every cluster name, lower-case -> the address it must resolve to


def hosts_lines(cluster: Cluster) -> list[str]:
    """The /etc/hosts block: every node's address and names (the spec alone decides it)."""
    return render_lines("hosts/hosts_block.j2", entries=cluster.hosts_entries())


def hosts_plan(cluster: Cluster) -> HostsPlan:
    """The cluster's /etc/hosts block, the same on every node (built once per run)."""
    entries = cluster.hosts_entries()
    return HostsPlan(
        lines=hosts_lines(cluster),
        names={name.lower(): address for address, names in entries for name in names},
    )


def deploy_sections(users: list[str], blocks: Blocks) -> Sections:
    expect = {} if blocks.get("hosts") is None else {"expect": blocks["hosts"]}
    return {
        "hostname": ("HostnameState", {"path": "/etc/hostname"}),
        "hosts": ("HostsBlock", expect),  # by digest where the node holds the planned block
    }


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {}


def plan_part(ctx: PlanContext, node: Node) -> dict[str, Any]:
    return {"hostname": node.name, "hosts": ctx.shared["hosts"]}


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    stale = stale_lines(fp["hosts"]["outside"], plan.hosts.names)
    return {
        "hostname": fp["hostname"]["running"],
        "hostname (persistent)": fp["hostname"]["static"] or ABSENT,
        "hosts block": digest(fp["hosts"]["block"]),
        "stale /etc/hosts lines": "; ".join(map(str, stale)) or "none",
    }


def expect(plan: NodePlan) -> dict[str, str]:
    return {
        "hostname": plan.hostname,
        "hostname (persistent)": plan.hostname,
        "hosts block": digest(plan.hosts.lines),
        "stale /etc/hosts lines": "none",
    }


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    return {"hosts block": {"/etc/hosts": content(fp["hosts"]["block"])}}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {"hosts block": {"/etc/hosts": content(plan.hosts.lines)}}


def converged(plan: NodePlan) -> dict[str, Any]:
    return {
        "hostname": {"running": plan.hostname, "static": plan.hostname},
        "hosts": {"block": list(plan.hosts.lines), "outside": []},
    }
