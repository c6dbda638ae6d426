"""The NCCL environment: the derived variables in /etc/profile.d, /etc/environment and
/etc/nccl.conf, and what non-login and login shells see."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trainfleet.capabilities.plan_context import Blocks, PlanContext, Sections
from trainfleet.compare import ABSENT, content, digest
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.model import Cluster, Node
from trainfleet.nccl import Derived, checked_env
from trainfleet.render import render, render_lines

if TYPE_CHECKING:
    from trainfleet.compare import Content
    from trainfleet.plan import NodePlan

MAJORITY: tuple[str, ...] = ()  # a node's interface is its own; the spec is what counts
UNIQUE: tuple[str, ...] = ()
HEALTH: tuple[str, ...] = ()
UNREAD = "the node's network could not be read"


@dataclass(frozen=True)
class NcclPlan:
    env: dict[str, str]
    problems: list[str]
    profile: str  # /etc/profile.d/trainfleet-nccl.sh
    environment: list[str]  # the /etc/environment block
    nccl_conf: list[str]  # the /etc/nccl.conf block


def nccl_part(derived: Derived) -> NcclPlan:
    env = derived.env
    return NcclPlan(
        env=dict(env),
        problems=list(derived.problems),
        profile=render("nccl_env/profile.sh.j2", env=env),
        environment=render_lines("nccl_env/environment.j2", env=env),
        nccl_conf=render_lines("nccl_env/nccl.conf.j2", env=env),
    )


def env_string(env: dict[str, str], planned: dict[str, str]) -> str:
    """What a shell sees (``env``) as drift compares it: every NCCL_/GLOO_/UCX_ variable, and
    the TORCH_/CUDA_ ones the plan names (trainfleet.nccl.checked_env)."""
    return " ".join(f"{k}={v}" for k, v in sorted(checked_env(env, planned).items())) or "none"


def deploy_sections(users: list[str], blocks: Blocks) -> Sections:
    return {"network": ("NcclNetwork", {}), "nccl_files": ("NcclEnvFiles", {})}


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {"nccl_seen": ("NcclEnvSeen", {})}


def derived(ctx: PlanContext, node: Node) -> Derived:
    return ctx.derived.get(node.name) or Derived(problems=[UNREAD])


def plan_part(ctx: PlanContext, node: Node) -> dict[str, Any]:
    return {"nccl": nccl_part(derived(ctx, node))}


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    files = fp["nccl_files"]
    return {
        "NCCL env (non-login ssh)": env_string(fp["nccl_seen"]["non_login"], plan.nccl.env),
        "NCCL env (login shell)": env_string(fp["nccl_seen"]["login"], plan.nccl.env),
        "NCCL env files": digest(
            [
                files["profile"] or ABSENT,
                *(files["environment"]["block"] or []),
                "--",
                *(files["nccl_conf"]["block"] or []),
            ]
        ),
    }


def expect(plan: NodePlan) -> dict[str, str]:
    nccl = plan.nccl
    if nccl.problems:
        return {}
    env = env_string(nccl.env, nccl.env)
    return {
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
    nccl = plan.nccl
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
    nccl = plan.nccl
    return {
        "nccl_files": {
            "profile": nccl.profile,
            "environment": {"block": list(nccl.environment), "outside": []},
            "nccl_conf": {"block": list(nccl.nccl_conf), "outside": []},
        },
        "nccl_seen": {"non_login": dict(nccl.env), "login": dict(nccl.env)},
    }
