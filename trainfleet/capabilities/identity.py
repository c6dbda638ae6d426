"""The machine's identity and hardware: what makes it this machine (drift's uniqueness) and
what every node must share (OS, kernel, GPU driver). No operation: nothing here is managed."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from trainfleet.capabilities import gpu_node, hosts
from trainfleet.compare import ABSENT
from trainfleet.driver_pins import satisfies_driver
from trainfleet.model import Cluster
from trainfleet.plan_types import NodePlan, Sections

MAJORITY = ("os", "kernel", "gpu driver")
UNIQUE = ("boot_id", "machine-id")  # no two nodes may share these
# the driver is the stack's pin, installed with it
MANAGED = MappingProxyType({"stack": ("gpu driver",)})


def check_sections(users: list[str], peers: list[str]) -> Sections:
    return {"identity": ("Identity", {})}


def met(prop: str, have: str, pin: str) -> bool:
    """A driver branch pin (550) is met by any release of that branch."""
    return prop == "gpu driver" and satisfies_driver(have, pin)


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    ident = fp["identity"]
    gpus = ident.get("gpus", [])
    return {
        "boot_id": ident.get("boot_id") or ABSENT,
        "machine-id": ident.get("machine_id") or ABSENT,
        "os": ident.get("os", ABSENT),
        "kernel": ident.get("kernel", ABSENT),
        "gpus": f"{len(gpus)}x {gpus[0]['name']}" if gpus else "none",
        "gpu driver": gpus[0]["driver"] if gpus else "none",
    }


def expect(plan: NodePlan) -> dict[str, str]:
    props = {}
    if plan.node.gpus == 0:  # a GPU node's count and model are the preflight's to check
        props["gpus"] = "none"
    if driver := gpu_node.part(plan).driver:  # a branch pin is met by any release (pins_met)
        props["gpu driver"] = driver
    return props


def converged(plan: NodePlan) -> dict[str, Any]:
    """A GPU node reports the planned driver on each of its GPUs (model: the spec does not
    say); every node its own ids (no two alike). Its OS and kernel are the machine's, no plan's
    to say (a converged node keeps those it has)."""
    gpu = {"name": "NVIDIA GPU", "driver": gpu_node.part(plan).driver or "unknown"}
    return {
        "identity": {
            "boot_id": f"boot-{hosts.part(plan).hostname}",
            "machine_id": f"machine-{hosts.part(plan).hostname}",
            "gpus": [gpu] * plan.node.gpus,
        }
    }
