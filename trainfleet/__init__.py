"""trainfleet: turn bare-metal GPU servers into one checked multi-node training cluster."""

from trainfleet.model import Cluster, Node
from trainfleet.spec import EXIT_BAD_SPEC, SpecError, load_spec, parse_spec

__all__ = ["Cluster", "Node", "SpecError", "EXIT_BAD_SPEC", "load_spec", "parse_spec"]
