"""trainfleet: turn bare-metal GPU servers into one checked multi-node training cluster."""

from trainfleet.model import Cluster, Node
from trainfleet.spec import (
    EXIT_BAD_SPEC,
    SpecError,
    load_cluster,
    load_spec,
    parse_cluster,
    parse_spec,
)

__all__ = [
    "EXIT_BAD_SPEC",
    "Cluster",
    "Node",
    "SpecError",
    "load_cluster",
    "load_spec",
    "parse_cluster",
    "parse_spec",
]
