"""NCCL's own decisions, as its INFO log (NCCL_DEBUG=INFO, subsystems INIT,NET) states them on
each rank of the preflight's collective: the NCCL version it loaded, its net plugin (loaded,
or none found), whether its network channels use GPUDirect RDMA, and the transport between a
node's GPUs. The odd node is named against the majority; a GPU node with an InfiniBand/RoCE
port active whose NCCL used IB without GPUDirect RDMA is named against the spec, whichever
path it has (DMA-BUF or nvidia_peermem: NCCL marks either as ``/GDRDMA``; "DMA-BUF is
available on GPU device" alone is no GDR, nccl-tests#245) (NVIDIA/nccl#1939, #1537: peermem
loaded, GDR still off; #1676: 180 -> 10 GB/s).
Plain functions over log lines; no host is touched here."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from checks.fabric_verdicts import nccl_network
from checks.preflight_report import Problem
from trainfleet.capabilities.gpu_node import gdr_expected
from trainfleet.compare import majority
from trainfleet.model import Cluster
from trainfleet.text import printable

NOT_LOGGED = "not logged"
_VERSION = re.compile(r"(?:^|NCCL INFO )NCCL version ([0-9][0-9A-Za-z.+_-]{0,40})")
_NO_PLUGIN = re.compile(r"NET/Plugin ?: ?(?:Could not find: .*libnccl-net|.*No plugin found)")
_LOADED = re.compile(r"NET/Plugin ?: ?Loaded net plugin (.{1,60}?)(?: \(v[0-9]+\))?\s*$")
# "via NET/IB/0/GDRDMA", "via NET/AWS Libfabric/0" (a plugin's name may hold a space)
_NET_CHANNEL = re.compile(r"NCCL INFO (?:Channel|Ring) [0-9/]+ : .* via NET/(.+?)\s*$")
_GDR_OFF = re.compile(r"GPU Direct RDMA Disabled for HCA [0-9]+ '([A-Za-z0-9_.:-]{1,32})'")
# the AWS OFI plugin's own word (nccl-tests#245: "NET/OFI ... disabling GDR")
_OFI_GDR_OFF = re.compile(r"NCCL INFO NET/OFI .*disabling GDR\s*$")
_LOCAL_CHANNEL = re.compile(r"NCCL INFO (?:Channel|Ring) [0-9/]+ : .* via (P2P/[A-Za-z/]+|SHM\S*)")
_NVLS = re.compile(r"NCCL INFO NVLS multicast support is available")
PROPERTIES = ("NCCL version", "net plugin", "GPUDirect RDMA", "transport within the node")
# Every rank logs these: a node whose log lacks them while its peers' have them is named.
# Old NCCL prints its version on the world's rank 0 alone, and a one-GPU node has no channel
# between its GPUs: there, "not logged" is no difference.
EVERY_RANK = ("net plugin", "GPUDirect RDMA")


def decisions(ranks: list[list[str]]) -> dict[str, str]:
    """One node's NCCL decisions from its ranks' INFO lines (each value the same on every rank
    where NCCL is consistent; a mix shows as such)."""
    lines = [line for rank in ranks for line in rank]
    versions = sorted({m.group(1) for line in lines if (m := _VERSION.search(line))})
    loaded = sorted({m.group(1) for line in lines if (m := _LOADED.search(line))})
    plugin = (
        "loaded: " + ", ".join(loaded)
        if loaded
        else "none found (NCCL's own)"
        if any(_NO_PLUGIN.search(line) for line in lines)
        else NOT_LOGGED
    )
    channels = [m.group(1) for line in lines if (m := _NET_CHANNEL.search(line))]
    with_gdr = sum(1 for c in channels if c.endswith("/GDRDMA"))
    disabled = sorted(
        {m.group(1) for line in lines if (m := _GDR_OFF.search(line))}
        | ({"NET/OFI"} if any(_OFI_GDR_OFF.search(line) for line in lines) else set())
    )
    if channels:
        gdr = (
            f"on every NET channel ({len(channels)})"
            if with_gdr == len(channels)
            else f"on {with_gdr} of {len(channels)} NET channels"
        )
    elif disabled:
        gdr = "disabled for " + ", ".join(disabled)
    else:
        gdr = NOT_LOGGED
    local = sorted({m.group(1) for line in lines if (m := _LOCAL_CHANNEL.search(line))})
    if any(_NVLS.search(line) for line in lines):
        local.append("NVLS")
    return {
        "NCCL version": ", ".join(versions) or NOT_LOGGED,
        "net plugin": plugin,
        "GPUDirect RDMA": gdr,
        "transport within the node": ", ".join(local) or NOT_LOGGED,
    }


def nccl_decision_problems(
    cluster: Cluster,
    logs: Mapping[str, list[list[str]]],
    networks: Mapping[str, dict[str, Any] | None],
) -> tuple[dict[str, dict[str, str]], list[Problem]]:
    """Every node's decisions and the problems: a node whose decision differs from most nodes'
    (no majority: each node is named), and a GPU node with an active IB/RoCE port (unless
    ``gpu.peermem: off``) whose NCCL used IB without GPUDirect RDMA on every network channel."""
    seen = {node: decisions(ranks) for node, ranks in logs.items() if ranks}
    problems = []
    for prop in PROPERTIES:
        values = {
            node: d[prop] for node, d in seen.items() if d[prop] != NOT_LOGGED or prop in EVERY_RANK
        }
        for finding in majority(prop, values):
            others = (
                "no majority: " + finding.expected
                if finding.kind == "tie"
                else (f"{finding.expected!r} on the other nodes")
            )
            problems.append(
                Problem(
                    "collective",
                    finding.node,
                    f"NCCL's {prop} here is {printable(finding.observed, 120)!r}, {others}",
                )
            )
    for node in cluster.nodes:
        found = seen.get(node.name)
        if not found or not gdr_expected(cluster.gpu, node.gpus, networks.get(node.name)):
            continue
        network, _ = nccl_network([line for rank in logs[node.name] for line in rank])
        gdr = found["GPUDirect RDMA"]
        if network not in (None, "Socket") and not gdr.startswith("on every"):
            problems.append(
                Problem(
                    "collective",
                    node.name,
                    f"GPUDirect RDMA is expected here (an IB/RoCE port is active) but NCCL used "
                    f"{printable(network, 40)} with GPUDirect RDMA {gdr}: inter-node traffic "
                    "goes through host memory; check the node's path (drift's GPUDirect RDMA: "
                    "DMA-BUF needs the open kernel module and Linux 5.12, else nvidia_peermem in "
                    "lsmod), NCCL_DMABUF_ENABLE, NCCL_NET_GDR_LEVEL and ACS on the PCIe switches "
                    "(trainfleet diagnose)",
                )
            )
    return seen, problems
