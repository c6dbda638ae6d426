"""Each HCA's PCI function (``hca-pci.txt``: the last component of
``/sys/class/infiniband/<hca>/device``, and that function's netdevs) and, without nvidia-smi,
the GPU affinity ``nvidia-smi topo -m`` would show, from ``lspci -vvv``'s bridges: an HCA is
PIX/PXB to a GPU where both sit below one PCIe switch (trainfleet.hw.lspci.nics_beside, the
relation the ACS check walks). The answer is a ``Topology`` like topo -m's, so the rails rule
(trainfleet.rails.by_affinity) reads both alike.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trainfleet.hw import lspci
from trainfleet.hw.sources import NETDEV
from trainfleet.hw.topo import Topology

PCI_FUNCTION = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HCA = re.compile(r"[A-Za-z0-9_.-]{1,64}")
# what lspci's bridges cannot tell apart: the HCA shares no PCIe switch with the GPU
NOT_BESIDE = "PHB/NODE/SYS"
BESIDE = "PXB"  # one PCIe switch (lspci does not tell PIX from PXB; both are a rail)


@dataclass(frozen=True)
class HcaFunction:
    pci: str  # "0000:0c:00.0"
    netdevs: tuple[str, ...]  # the function's netdevs (its /device/net/), e.g. ("ens1f0np0",)


def hca_functions(text: str) -> dict[str, HcaFunction]:
    """``hca-pci.txt``'s lines (``mlx5_0 0000:0c:00.0 [netdev ...]``), each value by its
    grammar; ValueError naming the first line that is not one (never skipped)."""
    found: dict[str, HcaFunction] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        hca, pci, netdevs = (words[0], words[1], words[2:]) if len(words) > 1 else ("", "", [])
        if (
            not _HCA.fullmatch(hca)
            or not PCI_FUNCTION.fullmatch(pci)
            or not all(NETDEV.fullmatch(n) for n in netdevs)
            or hca in found
        ):
            raise ValueError(f"line {number} is not '<hca> <PCI function> [<netdev> ...]'")
        found[hca] = HcaFunction(pci, tuple(netdevs))
    return found


def lspci_topology(
    devices: Sequence[dict[str, Any]], functions: Mapping[str, HcaFunction]
) -> tuple[Topology, list[str]]:
    """The GPU x HCA relation from ``lspci -vvv``'s devices (trainfleet.hw.lspci.devices) and
    each HCA's PCI function: (a Topology whose GPUs are named by PCI address, never guessed as
    nvidia-smi's indices; its NICs ``<hca> at <function>``), and the HCAs whose function lspci
    does not list, each named (left out of the topology, never guessed)."""
    gpus = [d for d in devices if lspci.is_gpu(d)]
    listed = {d["address"]: d for d in devices}
    beside = {g["address"]: set(lspci.nics_beside(g, list(devices))) for g in gpus}
    nics: dict[str, str] = {}
    relation: dict[tuple[str, str], str] = {}
    problems = []
    for hca, function in sorted(functions.items()):
        where = f"{hca}'s PCI function {function.pci} (its /sys/class/infiniband device link)"
        if function.pci not in listed:
            problems.append(f"{where} is not in lspci -vvv")
            continue
        if not lspci.is_nic(listed[function.pci]):
            problems.append(f"{where} is a {listed[function.pci]['class']} in lspci -vvv")
            continue
        nic = f"{hca} at {function.pci}"
        nics[nic] = hca
        for gpu in gpus:
            near = function.pci in beside[gpu["address"]]
            relation[(gpu_name(gpu["address"]), nic)] = BESIDE if near else NOT_BESIDE
    names = tuple(gpu_name(g["address"]) for g in gpus)
    return Topology(gpus=names, nics=nics, relation=relation), problems


def gpu_name(address: str) -> str:
    return f"GPU {address}"
