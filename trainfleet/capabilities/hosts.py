"""The node's names: its hostname and the cluster's /etc/hosts block."""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from trainfleet.compare import ABSENT, Content, content, digest
from trainfleet.etc_hosts import stale_lines
from trainfleet.model import Cluster, Node
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render, render_lines

MAJORITY = ("hosts block",)
UNIQUE = ("hostname",)  # no two nodes may share these
# Two steps: the name (hostname and its /etc/hostname) and the block; a stale line in /etc/hosts
# (a cluster name resolving elsewhere) is the job's concern either way, always expected.
MANAGED = MappingProxyType({"hostname": ("hostname",), "hosts": ("hosts block",)})


@dataclass(frozen=True)
class HostsShared:
    """The cluster's /etc/hosts block, the same on every node (built once per run)."""

    lines: list[str]  # the /etc/hosts block
    names: dict[str, str]  # every cluster name, lower-case -> the address it must resolve to


@dataclass(frozen=True)
class HostsPlan:
    hostname: str
    hostname_file: str  # /etc/hostname's content
    lines: list[str]  # the /etc/hosts block
    names: dict[str, str]  # every cluster name, lower-case -> the address it must resolve to


def hosts_lines(cluster: Cluster) -> list[str]:
    """The /etc/hosts block: every node's address and names (the spec alone decides it)."""
    return render_lines("hosts/hosts_block.j2", entries=cluster.hosts_entries())


def shared(ctx: PlanContext) -> HostsShared:
    entries = ctx.cluster.hosts_entries()
    return HostsShared(
        lines=hosts_lines(ctx.cluster),
        names={name.lower(): address for address, names in entries for name in names},
    )


def blocks(cluster: Cluster) -> dict[str, list[str]]:
    return {"hosts": hosts_lines(cluster)}


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    expect = {} if blocks.get("hosts") is None else {"expect": blocks["hosts"]}
    return {
        "hostname": ("HostnameState", {"path": "/etc/hostname"}),
        "hosts": ("HostsBlock", expect),  # by digest where the node holds the planned block
    }


def shared_part(ctx: PlanContext) -> HostsShared:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("hosts", HostsShared)


def part(plan: NodePlan) -> HostsPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("hosts", HostsPlan)


def plan_part(ctx: PlanContext, node: Node) -> HostsPlan:
    hosts = shared_part(ctx)
    return HostsPlan(
        hostname=node.name,
        hostname_file=render("hosts/hostname.j2", hostname=node.name),
        lines=hosts.lines,
        names=hosts.names,
    )


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    stale = stale_lines(fp["hosts"]["outside"], part(plan).names)
    return {
        "hostname": fp["hostname"]["running"],
        "hostname (persistent)": fp["hostname"]["static"] or ABSENT,
        "hosts block": digest(fp["hosts"]["block"]),
        "stale /etc/hosts lines": "; ".join(map(str, stale)) or "none",
    }


def expect(plan: NodePlan) -> dict[str, str]:
    return {
        "hostname": part(plan).hostname,
        "hostname (persistent)": part(plan).hostname,
        "hosts block": digest(part(plan).lines),
        "stale /etc/hosts lines": "none",
    }


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    return {"hosts block": {"/etc/hosts": content(fp["hosts"]["block"])}}


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    return {"hosts block": {"/etc/hosts": content(part(plan).lines)}}


def converged(plan: NodePlan) -> dict[str, Any]:
    return {
        "hostname": {"running": part(plan).hostname, "static": part(plan).hostname},
        "hosts": {"block": list(part(plan).lines), "outside": []},
    }
