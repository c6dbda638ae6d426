"""OpenMPI's network pinning, from the same derived cluster interface as NCCL.

OpenMPI picks its own interfaces for its TCP byte transfer layer (``btl_tcp``) and its
runtime wire-up (``oob_tcp``); left alone it tries every interface, and a second NIC the
peers cannot reach stalls or breaks ``mpirun``. One value pins both on every node:

- the interface name (``eth0``) when every node's cluster interface has the same name;
- otherwise the cluster subnets in CIDR form (``198.18.0.0/24``), which OpenMPI matches
  against each node's own addresses, whatever its interfaces are called.

The value is the same on every node, so it can go on the ``mpirun`` line as well.
"""

from __future__ import annotations

from typing import Any

from trainfleet.nccl import Derived

# The MCA parameters trainfleet owns; spec `openmpi.params` may add others, not these.
PINNED = ("btl_tcp_if_include", "oob_tcp_if_include")


def tcp_include(
    derived: dict[str, Derived], setting: str = "auto"
) -> tuple[str | None, str | None]:
    """(value for btl/oob_tcp_if_include, None) or (None, why it cannot be derived).

    + derived: every node's derived network environment (nodes with problems left out)
    + setting: spec ``openmpi.tcp_include``: ``auto`` or an explicit value used as given
    """
    if setting != "auto":
        return setting, None
    if not derived:
        return None, "no node's network could be read"
    names = {d.interface for d in derived.values()}
    if len(names) == 1 and None not in names:
        return names.pop(), None
    unknown = sorted(node for node, d in derived.items() if not d.network)
    if unknown:
        return None, (
            f"interface names differ between nodes and the cluster subnet of {', '.join(unknown)} "
            "is unknown; set openmpi.tcp_include in the spec"
        )
    return ",".join(sorted({d.network for d in derived.values() if d.network})), None


def cluster_params(
    derived: dict[str, Derived], settings: dict[str, Any]
) -> tuple[dict[str, str], list[str]]:
    """(MCA parameters for every node, problems) from every node's derived network and the
    spec's ``openmpi`` settings; nodes whose network has problems are left out of the choice."""
    usable = {name: d for name, d in derived.items() if not d.problems}
    include, problem = tcp_include(usable, settings["tcp_include"])
    if problem or include is None:
        return {}, [problem or "no OpenMPI interface could be derived"]
    return mca_params(include, settings["params"]), []


def mca_params(include: str, extra: dict[str, Any]) -> dict[str, str]:
    """The MCA parameters for every node's mca-params.conf: the pinned interfaces, then the
    spec's extra parameters (e.g. ``pml: ucx`` where Debian's system file disables UCX)."""
    params = {name: include for name in PINNED}
    params.update({name: str(value) for name, value in extra.items()})
    return params
