"""NCCL's compute rails: the HCA ports a node's GPUs reach without crossing the CPU.

A rail is an active HCA port whose NIC is PIX or PXB (under the same PCIe switch) to at least
one GPU in ``nvidia-smi topo -m`` or, without nvidia-smi, in ``lspci -vvv``'s bridges with
each HCA's PCI function (trainfleet.hw.pci_tree). A NIC that is PHB, NODE or SYS to every GPU
(a frontend bond, a storage or management HCA) is not a rail: NCCL traffic through it crosses
the host bridge, and NCCL spreads rings over every HCA it is given, so one such port drags
every collective down to its speed. Rails never mix link layers: InfiniBand and RoCE ports in
one NCCL_IB_HCA list fail in ``ibv_modify_qp`` (Invalid argument).

Without a GPU-affinity source (no GPU, no topo: the lab) every active port is a rail, as
before, and still never both link layers. Plain functions over plain data.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfleet.hw.topo import Topology

INFINIBAND, ETHERNET = "InfiniBand", "Ethernet"


@dataclass(frozen=True)
class HcaPort:
    """One HCA port as sysfs shows it (rate unknown where the source has none)."""

    device: str
    port: int
    link_layer: str | None  # "InfiniBand" | "Ethernet"
    state: str | None  # "4: ACTIVE" (sysfs) or "4:ACTIVE" (the NcclNetwork fact)
    rate: str | None = None  # "400 Gb/sec (4X NDR)"

    @property
    def name(self) -> str:
        return f"{self.device}:{self.port}"

    @property
    def active(self) -> bool:
        return "ACTIVE" in (self.state or "").upper()


@dataclass(frozen=True)
class Rail:
    hca: str  # "mlx5_0:1" (the device alone where only topo -m was read)
    gpus: tuple[str, ...]  # the GPUs it serves ("GPU0"); () without affinity data
    link_layer: str | None = None
    rate: str | None = None

    def describe(self) -> str:
        """What the majority compares: the GPUs it serves, its link layer and rate."""
        served = "+".join(self.gpus) if self.gpus else "GPU affinity unknown"
        return f"{served}, {self.link_layer or 'link layer unknown'}, {self.rate or 'rate unknown'}"


@dataclass(frozen=True)
class Rails:
    rails: tuple[Rail, ...]
    left_out: Mapping[str, str]  # HCA (port, or device) -> why it is not a rail
    problems: tuple[str, ...]  # the sources disagree: no list is derived (named, never a pick)
    by_affinity: bool  # True where a GPU-affinity source decided (topo -m, else lspci)
    mixed: str | None = None  # the rails hold InfiniBand and RoCE ports: why that fails
    # named, yet the list stands: topo -m and lspci disagree (topo decides), a GPU no rail serves
    notes: tuple[str, ...] = ()

    @property
    def hca_list(self) -> str:
        """NCCL_IB_HCA's value: exact names ('='), so mlx5_1 does not also match mlx5_10."""
        return "=" + ",".join(r.hca for r in self.rails)


def ports_from_sysfs(hcas: Mapping[str, Mapping[str, Any]]) -> list[HcaPort]:
    """The ports of ``trainfleet.hw.infiniband.hcas``'s reading of /sys/class/infiniband."""
    return [
        HcaPort(device, int(number), port["link_layer"], port["state"], port["rate"])
        for device, hca in sorted(hcas.items())
        for number, port in sorted(hca["ports"].items(), key=lambda item: int(item[0]))
    ]


def _inactive(port: HcaPort) -> str:
    return f"port not active ({port.state or 'state unknown'})"


def _mixed(rails: Sequence[Rail]) -> str | None:
    """The problem of rails holding both link layers (NCCL's ibv_modify_qp Invalid argument)."""
    kinds: dict[str, list[str]] = {}
    for rail in rails:
        kinds.setdefault(rail.link_layer or "unknown", []).append(rail.hca)
    if INFINIBAND in kinds and ETHERNET in kinds:
        return (
            "the rails mix InfiniBand ("
            + ", ".join(kinds[INFINIBAND])
            + ") and Ethernet/RoCE ("
            + ", ".join(kinds[ETHERNET])
            + "): NCCL fails in ibv_modify_qp (Invalid argument); name one kind in "
            "nccl.env NCCL_IB_HCA"
        )
    return None


def without_affinity(ports: Sequence[HcaPort]) -> Rails:
    """Today's rule where no GPU affinity is known: every active port, never both link layers."""
    rails = tuple(Rail(p.name, (), p.link_layer, p.rate) for p in ports if p.active)
    left_out = {p.name: _inactive(p) for p in ports if not p.active}
    return Rails(rails, left_out, (), by_affinity=False, mixed=_mixed(rails))


def by_affinity(topology: Topology, ports: Sequence[HcaPort] | None) -> Rails:
    """The rails by GPU affinity. ``ports``: the node's HCA ports from sysfs, or None where
    sysfs was not read (then a rail is a whole device, its link layer and rate unknown). A NIC
    of topo -m that sysfs lacks, or a port sysfs has that topo -m does not name, is a problem:
    the two sources disagree and neither is taken over the other."""
    rails: list[Rail] = []
    left_out: dict[str, str] = {}
    problems: list[str] = []
    by_device: dict[str, list[HcaPort]] = {}
    for port in ports or ():
        by_device.setdefault(port.device, []).append(port)
    for nic, device in topology.nics.items():
        gpus = topology.gpus_beside(nic)
        if not gpus:
            # not under any GPU's PCIe switch: a frontend bond, storage or management NIC
            left_out[device] = f"{nic} is {topology.nearest(nic)} to every GPU"
            continue
        if ports is None:
            rails.append(Rail(device, gpus))
            continue
        if device not in by_device:
            problems.append(
                f"{device} ({nic} of nvidia-smi topo -m, beside {'+'.join(gpus)}) is not in "
                "/sys/class/infiniband"
            )
            continue
        for port in by_device[device]:
            if port.active:
                rails.append(Rail(port.name, gpus, port.link_layer, port.rate))
            else:
                left_out[port.name] = _inactive(port)
    named = set(topology.nics.values())
    for device, device_ports in sorted(by_device.items()):
        if device not in named:
            for port in device_ports:
                left_out[port.name] = "not in nvidia-smi topo -m's NIC legend: affinity unknown"
            problems.append(
                f"{device} is in /sys/class/infiniband but not in nvidia-smi topo -m's NIC legend"
            )
    rails = _one_link_layer(rails, left_out)
    served = {g for r in rails for g in r.gpus}
    alone = [g for g in topology.gpus if g not in served] if rails else []
    notes = tuple(f"{g} is beside no rail: its NCCL traffic crosses the CPU" for g in alone)
    return Rails(
        tuple(rails), left_out, tuple(problems), by_affinity=True, mixed=_mixed(rails), notes=notes
    )


def _one_link_layer(rails: list[Rail], left_out: dict[str, str]) -> list[Rail]:
    """Where the ports beside the GPUs hold both link layers (an HGX node's InfiniBand compute
    HCAs and a frontend or storage Ethernet port that shares a GPU's PCIe switch), the rails
    are the link layer that serves every GPU the others serve; the other ports are left out
    (``left_out``, with why). Where each layer serves every such GPU, or neither does, the mix
    stays: a problem the spec settles by naming the HCAs, never a pick."""
    layers: dict[str, set[str]] = {}
    for rail in rails:
        layers.setdefault(rail.link_layer or "unknown", set()).update(rail.gpus)
    if set(layers) != {INFINIBAND, ETHERNET}:
        return rails
    served = set().union(*layers.values())
    whole = [layer for layer, gpus in layers.items() if gpus == served]
    if len(whole) != 1:
        return rails
    (keep,) = whole
    for rail in rails:
        if rail.link_layer != keep:
            left_out[rail.hca] = (
                f"{rail.link_layer} beside {'+'.join(rail.gpus)} only, while the {keep} rails "
                "serve every GPU: a frontend or storage port (NCCL cannot mix link layers)"
            )
    return [rail for rail in rails if rail.link_layer == keep]


def disagreement(topo_rails: Rails, lspci_rails: Rails) -> list[str]:
    """Where ``nvidia-smi topo -m``'s rails and ``lspci``'s differ, by HCA: which are rails,
    and how many GPUs each serves (their GPU names differ: topo's indices, lspci's addresses,
    so only the counts are compared). topo -m decides; this only names the difference."""

    def served(rails: Rails) -> dict[str, int]:
        return {r.hca.partition(":")[0]: len(r.gpus) for r in rails.rails}

    by_topo, by_lspci = served(topo_rails), served(lspci_rails)
    said = []
    for hca in sorted(set(by_topo) | set(by_lspci)):
        topo_n, lspci_n = by_topo.get(hca), by_lspci.get(hca)
        if topo_n != lspci_n:
            said.append(
                f"{hca}: nvidia-smi topo -m says "
                + (f"a rail beside {topo_n} GPU(s)" if topo_n else "not a rail")
                + ", lspci's PCIe switches say "
                + (f"a rail beside {lspci_n} GPU(s)" if lspci_n else "not a rail")
                + " (topo -m decides)"
            )
    return said


def explain(rails: Rails) -> Iterable[str]:
    """One line per HCA: why it is or is not in NCCL_IB_HCA (docs/nccl_env.md's rule)."""
    how = "PIX/PXB to" if rails.by_affinity else "active; GPU affinity unknown"
    for rail in rails.rails:
        gpus = f" {'+'.join(rail.gpus)}" if rail.gpus else ""
        yield f"{rail.hca}: a rail ({how}{gpus})"
    for hca, why in rails.left_out.items():
        yield f"{hca}: left out: {why}"
    yield from rails.problems
    yield from rails.notes
    if rails.mixed:
        yield rails.mixed
