"""The capabilities, one module each, and their registry.

Each capability module declares what the machinery loops over (``PARTS``):

+ ``deploy_sections(users, blocks)``: the bundle sections the deploy and the plan read, section ->
  (fact name, arguments); ``check_sections(users, peers)``: those only checks read
+ ``plan_part(ctx, node)``: its NodePlan attributes, from the PlanContext built once per run
+ ``observe(fingerprint, node_plan, cluster)`` and ``expect(node_plan)``: drift's properties
+ ``found_contents(fingerprint, users)`` and ``wanted_contents(node_plan)``: its managed files
+ ``MAJORITY``: the property prefixes every node must share (majority vote); ``UNIQUE``: the
  properties no two nodes may share; ``HEALTH``: the health gates, properties every node that
  reports them must report as ``none``
+ ``converged(node_plan)``: what a converged node answers, section -> the parsed fact value
"""

from __future__ import annotations

from types import ModuleType

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

# Ordered: the bundle's sections and drift's properties follow this order.
CAPABILITIES: tuple[ModuleType, ...] = (
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
PARTS = (
    "deploy_sections",
    "check_sections",
    "plan_part",
    "observe",
    "expect",
    "found_contents",
    "wanted_contents",
    "MAJORITY",
    "UNIQUE",
    "HEALTH",
    "converged",
)
# Properties every node must share: the majority vote names the odd node.
MAJORITY = tuple(dict.fromkeys(p for cap in CAPABILITIES for p in cap.MAJORITY))
# Properties no two nodes may share: drift names every node that shares one.
UNIQUE = tuple(p for cap in CAPABILITIES for p in cap.UNIQUE)
# Health gates: every node that reports one must report "none" (drift names each that does not).
HEALTH = tuple(p for cap in CAPABILITIES for p in cap.HEALTH)


def missing_parts(capability: ModuleType) -> list[str]:
    """The parts a capability module does not declare."""
    return [part for part in PARTS if not hasattr(capability, part)]
