"""The software the lab pins when it trains (make demo, the torch lab tests): what `make
host-deps` downloads, so the nodes install it with no network. One place for these versions;
the Makefile's NODE_TORCH and NODE_PYTHON download the same ones."""

from __future__ import annotations

from typing import Any

WHEELHOUSE = "/var/cache/trainfleet/wheelhouse"  # on the host, seen by the nodes below their /


def launch_stack() -> dict[str, Any]:
    """The spec's ``stack`` section: torch (CPU build) with accelerate, DeepSpeed and ColossalAI
    beside it from the wheelhouse, and Debian 12's OpenMPI from the host's apt cache.
    ColossalAI 0.5.0 requires torch<=2.5.1: it goes in without its requirements, beside the
    two its runner imports that nothing else brings (click, fabric)."""
    return {
        "torch": "2.13.0",
        "torch_cuda": "cpu",
        "wheelhouse": WHEELHOUSE,
        "openmpi": "4.1.4-3+b1",
        "python": {
            "accelerate": "1.15.0",
            "deepspeed": "0.19.8",
            "click": "8.5.1",
            "fabric": "3.2.3",
            "colossalai": {"version": "0.5.0", "deps": False},
        },
    }
