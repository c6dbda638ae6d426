"""What every node must look like: one plan per node, plain data.

Built from the cluster model, the facts gathered once this run (each node's network, host
keys and OS family) and the key store. The deploy applies it (``deploy/cluster.py`` gives each
operation its capability's part whole), drift compares what a node holds with it
(``checks/drift_check.py``), the preflight reads its names and NCCL environment. Each
capability computes its cross-node part once (``shared``) and its part of every node's plan
from it (``plan_part``); a part that cannot be planned carries its problems instead, and then
the deploy fails that node's step and drift expects nothing of it. No pyinfra here, no host
touched.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainfleet.capabilities import CAPABILITIES
from trainfleet.key_material import KeyMaterial
from trainfleet.model import Cluster
from trainfleet.plan_types import ClusterPlan, Gathered, NodePlan, Parts, PlanContext


def cluster_blocks(cluster: Cluster) -> dict[str, list[str]]:
    """The cluster-wide blocks (a line per node) the plan wants on every node, known from the
    spec before any node is read: the bundles' arguments, so a node holding them answers a
    digest instead of N lines (facts/managed_block_facts.py ``tf_block``)."""
    return {name: lines for cap in CAPABILITIES for name, lines in cap.blocks(cluster).items()}


def _notes(shared: object) -> tuple[str, ...]:
    """What a capability's shared part says a person should know (its ``notes``, if any)."""
    notes = getattr(shared, "notes", ())
    if not isinstance(notes, tuple) or not all(isinstance(n, str) for n in notes):
        raise TypeError(f"{type(shared).__name__}.notes must be a tuple of str")
    return notes


def plan_cluster(
    cluster: Cluster,
    gathered: Gathered,
    keys: KeyMaterial | None = None,
    excluded: Mapping[str, list[str]] | None = None,
) -> ClusterPlan:
    """Every node's plan: each capability's cross-node part once, in the registry's order,
    then each node's parts from them. Writes nothing.

    + keys: the key store's snapshot (``KeyStore.snapshot``, or the deploy's ``prepare_keys``);
      None plans no SSH mesh (the preflight needs none)
    + excluded: the nodes the last preflight of each failed, with its causes
      (``trainfleet.stamps.exclusions``): left out of the healthy subset's launch files
    """
    ctx = PlanContext(cluster=cluster, gathered=gathered, keys=keys, excluded=excluded or {})
    for capability in CAPABILITIES:
        shared = capability.shared(ctx)
        if shared is not None:
            ctx.shared.add(capability.name, shared)
    notes = [note for shared in ctx.shared.values() for note in _notes(shared)]
    plans = {}
    for node in cluster.nodes:
        parts = Parts()
        for capability in CAPABILITIES:
            part = capability.plan_part(ctx, node)
            if part is not None:
                parts.add(capability.name, part)
        plans[node.name] = NodePlan(node=node, parts=parts)
    return ClusterPlan(nodes=plans, notes=notes)
