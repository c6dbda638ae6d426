"""The capabilities, one module each, and their registry.

A capability module declares what the machinery loops over; what it leaves out takes
``Capability``'s default (no sections, no shared part, no plan part, no properties, no files):

+ ``deploy_sections(users, blocks)``: the bundle sections the deploy and the plan read, section ->
  (fact name, arguments); ``check_sections(users, peers)``: those only checks read
+ ``blocks(cluster)``: the cluster-wide blocks it wants on every node, known from the spec alone
  (a node holding one answers its digest)
+ ``shared(ctx)``: its cross-node part, a typed value computed once per run (read back with the
  module's ``shared_part(ctx)``, by the capabilities after it too); ``plan_part(ctx, node)``:
  its part of a node's plan, or None (read back with the module's ``part(node_plan)``; layers
  above the core may write ``node_plan.NAME``)
+ ``observe(fingerprint, node_plan, cluster)`` and ``expect(node_plan)``: drift's properties
+ ``found_contents(fingerprint, users)`` and ``wanted_contents(node_plan)``: its managed files
+ ``MAJORITY``: the property prefixes every node must share (majority vote); ``UNIQUE``: the
  properties no two nodes may share; ``HEALTH``: the health gates, properties every node that
  reports them must report as ``none``
+ ``converged(node_plan)``: what a converged node answers, section -> the parsed fact value
+ ``met(prop, have, pin)``: whether a node's value meets a pin of its own property that is not
  written equal (a venv pin as pip's ``==`` reads it, a driver branch); ``ABSENT_ELSEWHERE``:
  the property prefixes where a node lacking one that another node has shows it as absent
+ ``MANAGED``: each ``manage`` key (a step of the deploy the spec may turn off) -> the prefixes
  of the properties ``expect`` gives for that step ("": every one): an unmanaged step's
  properties are still observed (and majority-voted, unique) but not expected
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import ModuleType
from typing import Any

from trainfleet.capabilities import (
    gpu_node,
    hardware,
    hosts,
    identity,
    launchers,
    nccl_env,
    openmpi,
    pdsh,
    ssh_mesh,
    stack,
)
from trainfleet.compare import ABSENT, Content, Rules
from trainfleet.model import Cluster, Node, step_managed
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks

Contents = dict[str, dict[str, Content]]


def _no_sections(users: list[str], other: Any) -> Sections:
    return {}


def _nothing(*args: Any) -> None:
    return None


def _no_properties(*args: Any) -> dict[str, str]:
    return {}


def _no_contents(*args: Any) -> Contents:
    return {}


def _no_answers(plan: NodePlan) -> dict[str, Any]:
    return {}


def _no_blocks(cluster: Cluster) -> dict[str, list[str]]:
    return {}


def _never_met(prop: str, have: str, pin: str) -> bool:
    return False


@dataclass(frozen=True)
class Capability:
    """What the machinery reads of a capability module, each part defaulted."""

    name: str
    MAJORITY: tuple[str, ...] = ()
    UNIQUE: tuple[str, ...] = ()
    HEALTH: tuple[str, ...] = ()
    ABSENT_ELSEWHERE: tuple[str, ...] = ()
    deploy_sections: Callable[[list[str], WantedBlocks], Sections] = _no_sections
    check_sections: Callable[[list[str], list[str]], Sections] = _no_sections
    blocks: Callable[[Cluster], dict[str, list[str]]] = _no_blocks
    shared: Callable[[PlanContext], Any] = _nothing
    plan_part: Callable[[PlanContext, Node], Any] = _nothing
    observe: Callable[[dict[str, Any], NodePlan, Cluster], dict[str, str]] = _no_properties
    expect: Callable[[NodePlan], dict[str, str]] = _no_properties
    found_contents: Callable[[dict[str, Any], list[str]], Contents] = _no_contents
    wanted_contents: Callable[[NodePlan], Contents] = _no_contents
    converged: Callable[[NodePlan], dict[str, Any]] = _no_answers
    met: Callable[[str, str, str], bool] = _never_met
    MANAGED: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def step_of(self, prop: str) -> str | None:
        """The ``manage`` key whose step ``prop`` (one of ``expect``'s) belongs to, if any."""
        for step, prefixes in self.MANAGED.items():
            if prop.startswith(prefixes):
                return step
        return None

    @classmethod
    def of(cls, module: ModuleType) -> Capability:
        declared = {f.name: getattr(module, f.name) for f in fields(cls) if hasattr(module, f.name)}
        return cls(**{**declared, "name": module.__name__.rsplit(".", 1)[1]})


# What a capability module may declare (each defaulted by Capability).
HOOKS = tuple(f.name for f in fields(Capability) if f.name != "name")

# Ordered: the bundle's sections, drift's properties and the shared parts follow this order.
CAPABILITIES: tuple[Capability, ...] = tuple(
    Capability.of(module)
    for module in (
        hosts,
        ssh_mesh,
        pdsh,
        nccl_env,
        launchers,
        stack,
        openmpi,
        gpu_node,
        hardware,
        identity,
    )
)
# What drift's comparison judges beyond the spec: properties every node must share (the
# majority vote names the odd node), those no two nodes may share, and the health gates (every
# node that reports one must report "none").
RULES = Rules(
    majority=tuple(dict.fromkeys(p for cap in CAPABILITIES for p in cap.MAJORITY)),
    unique=tuple(p for cap in CAPABILITIES for p in cap.UNIQUE),
    health=tuple(p for cap in CAPABILITIES for p in cap.HEALTH),
    absent_elsewhere=tuple(p for cap in CAPABILITIES for p in cap.ABSENT_ELSEWHERE),
)


# Every step of the deploy the spec's ``manage`` may turn off, in the registry's order.
MANAGE_STEPS = tuple(dict.fromkeys(step for cap in CAPABILITIES for step in cap.MANAGED))


def expected_steps(plan: NodePlan) -> dict[str, tuple[str, str | None]]:
    """Every property drift expects of the node's plan -> (its value, the ``manage`` step it
    belongs to; None: a property no step of the deploy sets, such as the GPU count)."""
    return {
        prop: (value, cap.step_of(prop))
        for cap in CAPABILITIES
        for prop, value in cap.expect(plan).items()
    }


def managed_expectations(
    steps: Mapping[str, tuple[str, str | None]], manage: Mapping[str, bool]
) -> dict[str, str]:
    """What drift expects of the node, from its ``expected_steps``: every capability's
    ``expect`` less the properties of the steps ``manage`` turned off (observed and voted on,
    never compared with the spec)."""
    return {
        prop: value
        for prop, (value, step) in steps.items()
        if step is None or step_managed(manage, step)
    }


def pins_met(seen: dict[str, str], want: dict[str, str]) -> dict[str, str]:
    """``want`` with each pin the node meets replaced by what it has, as the capability that
    owns the property reads its pins (``met``)."""
    met = dict(want)
    for prop, pin in want.items():
        have = seen.get(prop)
        if have in (None, ABSENT, "none"):
            continue
        if any(cap.met(prop, have, pin) for cap in CAPABILITIES):
            met[prop] = have
    return met
