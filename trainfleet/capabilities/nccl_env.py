"""The NCCL environment: the derived variables in /etc/profile.d, /etc/environment and
/etc/nccl.conf, and what non-login and login shells see."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trainfleet.compare import ABSENT, HEALTHY, Content, content, digest
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.grammar import Key, Section, env_name_problem, env_value_problem, ifname_problem
from trainfleet.model import Cluster, Node
from trainfleet.nccl import Derived, checked_env, uniform_variables
from trainfleet.nccl_cluster import derive_cluster
from trainfleet.nccl_gids import expected_gid_reading, pinned_gid_reading
from trainfleet.nccl_qos import PFC_PRIORITY, TC, TRUST
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render, render_lines

# every property it expects is its step's (manage.nccl_env)
MANAGED = MappingProxyType({"nccl_env": ("",)})

# A node's interface is its own, the spec is what counts; but the host's QoS on its RoCE rails
# must agree across nodes (a PFC priority on one node only drops that node's frames).
QOS_PROPERTIES = MappingProxyType(
    {TRUST: "RoCE QoS trust", PFC_PRIORITY: "RoCE PFC priority", TC: "RoCE traffic class"}
)
MAJORITY = tuple(QOS_PROPERTIES.values())
QOS_HEALTH = "RoCE QoS problems"  # lossy RoCE (no PFC, no ECN), a TC off the PFC priority
HEALTH = (QOS_HEALTH,)
UNREAD = "the node's network could not be read"


@dataclass(frozen=True)
class NcclPlan:
    env: dict[str, str]
    problems: list[str]
    profile: str  # /etc/profile.d/trainfleet-nccl.sh
    environment: list[str]  # the /etc/environment block
    nccl_conf: list[str]  # the /etc/nccl.conf block
    interface: str | None = None  # the cluster interface (the one holding the node's address)
    qos: Mapping[str, str] = field(default_factory=dict)  # the host's RoCE QoS (nccl_qos)
    qos_problems: tuple[str, ...] = ()


def nccl_part(derived: Derived) -> NcclPlan:
    env = derived.env
    return NcclPlan(
        env=dict(env),
        problems=list(derived.problems),
        profile=render("nccl_env/profile.sh.j2", env=env),
        environment=render_lines("nccl_env/environment.j2", env=env),
        nccl_conf=render_lines("nccl_env/nccl.conf.j2", env=env),
        interface=derived.interface,
        qos=dict(derived.qos),
        qos_problems=tuple(derived.qos_problems),
    )


def env_string(env: dict[str, str], planned: dict[str, str]) -> str:
    """What a shell sees (``env``) as drift compares it: every NCCL_/GLOO_/UCX_ variable, and
    the TORCH_/CUDA_ ones the plan names (trainfleet.nccl.checked_env)."""
    return " ".join(f"{k}={v}" for k, v in sorted(checked_env(env, planned).items())) or "none"


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {"network": ("NcclNetwork", {}), "nccl_files": ("NcclEnvFiles", {})}


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {"nccl_seen": ("NcclEnvSeen", {})}


@dataclass(frozen=True)
class NcclShared:
    """Every node's derived NCCL environment (from its own network), built once per run."""

    derived: Mapping[str, Derived]  # node -> its derived environment
    uniform: Sequence[str]  # names of variables alike on every node (the launchers forward them)
    notes: tuple[str, ...] = ()


def shared(ctx: PlanContext) -> NcclShared:
    derived = derive_cluster(ctx.cluster, ctx.gathered.networks, ctx.gathered.stacks)
    interfaces = sorted({d.interface for d in derived.values() if d.interface})
    notes = (
        (
            f"cluster interfaces differ between nodes ({', '.join(interfaces)}): "
            "each node gets its own, but DeepSpeed's and ColossalAI's runners forward "
            "the launching node's NCCL_SOCKET_IFNAME to every node",
        )
        if len(interfaces) > 1
        else ()
    )
    uniform = uniform_variables({name: d.env for name, d in derived.items() if not d.problems})
    return NcclShared(derived=derived, uniform=uniform, notes=notes)


def derived(ctx: PlanContext, node: Node) -> Derived:
    """The node's derived environment (a node whose network was not read: its problem)."""
    return shared_part(ctx).derived.get(node.name) or Derived(problems=[UNREAD])


def shared_part(ctx: PlanContext) -> NcclShared:
    """This capability's cross-node part of the run (typed)."""
    return ctx.shared.get_as("nccl_env", NcclShared)


def part(plan: NodePlan) -> NcclPlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("nccl_env", NcclPlan)


def plan_part(ctx: PlanContext, node: Node) -> NcclPlan:
    return nccl_part(derived(ctx, node))


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    files = fp["nccl_files"]
    network = fp.get("network")
    return {
        **qos_observed(part(plan)),
        "NCCL env plan": "; ".join(part(plan).problems) or "ok",
        # the index a shell sees, read in the node's GID tables now (a GID that moved)
        "NCCL GID index": pinned_gid_reading(
            fp["nccl_seen"]["non_login"], None if network is None else network["ib_ports"]
        ),
        "NCCL env (non-login ssh)": env_string(fp["nccl_seen"]["non_login"], part(plan).env),
        "NCCL env (login shell)": env_string(fp["nccl_seen"]["login"], part(plan).env),
        "NCCL env files": digest(
            [
                files["profile"] or ABSENT,
                *(files["environment"]["block"] or []),
                "--",
                *(files["nccl_conf"]["block"] or []),
            ]
        ),
    }


def qos_observed(nccl: NcclPlan) -> dict[str, str]:
    """The host's QoS on its RoCE rails, as drift compares it across nodes (read with the
    network this run; a node without RoCE rails has none of these)."""
    found = {QOS_PROPERTIES[key]: value for key, value in nccl.qos.items() if key in QOS_PROPERTIES}
    if nccl.qos or nccl.qos_problems:
        found[QOS_HEALTH] = "; ".join(nccl.qos_problems) or HEALTHY
    return found


def expect(plan: NodePlan) -> dict[str, str]:
    nccl = part(plan)
    if nccl.problems:  # the deploy writes nothing; the problems show as the plan's value
        return {"NCCL env plan": "ok"}
    env = env_string(nccl.env, nccl.env)
    return {
        "NCCL env plan": "ok",
        "NCCL GID index": expected_gid_reading(nccl.env),
        "NCCL env (non-login ssh)": env,
        "NCCL env (login shell)": env,
        "NCCL env files": digest([nccl.profile, *nccl.environment, "--", *nccl.nccl_conf]),
    }


def found_contents(fp: dict[str, Any], users: list[str]) -> dict[str, dict[str, Content]]:
    files = fp["nccl_files"]
    return {
        "NCCL env files": {
            NCCL_PROFILE: content(files["profile"]),
            NCCL_ENVIRONMENT: content(files["environment"]["block"]),
            NCCL_CONF: content(files["nccl_conf"]["block"]),
        }
    }


def wanted_contents(plan: NodePlan) -> dict[str, dict[str, Content]]:
    nccl = part(plan)
    return {
        "NCCL env files": {
            NCCL_PROFILE: content(nccl.profile),
            NCCL_CONF: content(nccl.nccl_conf),
            NCCL_ENVIRONMENT: content(nccl.environment),
        }
    }


def converged(plan: NodePlan) -> dict[str, Any]:
    """The planned files, and every shell sees the planned variables. The network is the
    node's own (the plan was derived from it)."""
    nccl = part(plan)
    return {
        "nccl_files": {
            "profile": nccl.profile,
            "environment": {"block": list(nccl.environment), "outside": []},
            "nccl_conf": {"block": list(nccl.nccl_conf), "outside": []},
        },
        "nccl_seen": {"non_login": dict(nccl.env), "login": dict(nccl.env)},
    }


# The spec's section: `nccl` (trainfleet/schema.py composes the spec)

NCCL = Section(
    doc="NCCL network environment. `auto` values are derived per node from its cluster address and "
    "sysfs.",
    keys={
        "socket_ifname": Key(
            str,
            "auto",
            "NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME; `auto` = the interface holding the node's "
            "address.",
            check=ifname_problem,
            accepts="`auto`, or `^`/`=` then names `[A-Za-z0-9_.:@-]{1,15}`, comma-separated",
        ),
        "ib": Key(
            str,
            "auto",
            "`auto` (use active InfiniBand/RoCE ports, else disable) or `disable`.",
            check=lambda v: (
                None if v in ("auto", "disable") else f"{v!r} must be 'auto' or 'disable'"
            ),
            accepts="`auto` or `disable`",
        ),
        "env": Key(
            dict,
            {},
            "Extra variables passed through as given, e.g. `NCCL_DEBUG: WARN`.",
            each_key=env_name_problem,
            each=env_value_problem,
            example={"NCCL_DEBUG": "WARN"},
            accepts="names `(NCCL|GLOO|TORCH|CUDA|UCX)_[A-Z0-9_]+`; values integers or "
            "`[A-Za-z0-9_.,:=^/%+@ -]*`, no leading/trailing space, no marker text",
        ),
    },
)
