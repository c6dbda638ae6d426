"""The nodes whose compute rails differ from most nodes' (count, link layer, rate, the GPUs
each rail serves), each named with the rail: trainfleet.compare.majority over
trainfleet.rails' plain data. Apart from trainfleet.rails so that the facts, which read
trainfleet.nccl, stay clear of the comparison."""

from __future__ import annotations

from collections.abc import Mapping

from trainfleet.compare import Finding, majority
from trainfleet.rails import Rails


def rail_values(rails: Rails) -> dict[str, str]:
    """A node's rails as the majority compares them: one property for the count and link
    layer, one a rail (a rail the node lacks: why it was left out, or absent)."""
    layers = sorted({r.link_layer or "link layer unknown" for r in rails.rails})
    values = {"rails": f"{len(rails.rails)}: {', '.join(layers) or 'none'}"}
    values |= {f"rail {r.hca}": r.describe() for r in rails.rails}
    values |= {f"rail {hca}": f"not a rail: {why}" for hca, why in rails.left_out.items()}
    return values


def odd_rails(by_node: Mapping[str, Rails]) -> list[Finding]:
    """The nodes whose rails differ from the majority's: count and link layer, and each rail
    (the GPUs it serves, link layer, rate), named with the rail (trainfleet.compare.majority)."""
    values = {node: rail_values(rails) for node, rails in by_node.items()}
    names = sorted({prop for node_values in values.values() for prop in node_values})
    findings: list[Finding] = []
    for prop in names:
        findings += majority(prop, {n: v.get(prop, "absent") for n, v in values.items()})
    return findings
