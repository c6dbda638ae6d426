"""The NCCL network environment trainfleet would write on each captured node, shown by
``trainfleet diagnose`` (docs/nccl_env.md, "Reading diagnose's NCCL environment").

From a node's capture: NCCL_IB_HCA from its compute rails (trainfleet.rails, already derived by
the judge), the GID settings per NCCL version from the GID files of its sysfs tree
(trainfleet.nccl.ib_settings), NCCL_IB_TC from its QoS readings (trainfleet.nccl_qos). What
the capture lacks is named "not read" with the source, never refused and never left out: a
capture made before these sources were saved is still judged.

The capture's layout (paths below a node's folder, statuses in ``sources.txt``):
``mlnx-qos/<netdev>.txt`` (a source of its own: ok / absent / exit N), and the tree sources
``sys-class-net/<netdev>/ecn/roce_np|roce_rp/enable/<N>``,
``rdma_cm/<dev>/ports/<p>/default_roce_tos``, ``sys-class-infiniband/<dev>/tc/1/traffic_class``
and ``sys-class-infiniband/<dev>/ports/<p>/gids|gid_attrs/types|gid_attrs/ndevs/<i>``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from trainfleet.compare import HEALTHY, Finding, Report
from trainfleet.folded import wrapped
from trainfleet.hw.sources import INFINIBAND, RDMA_CM, SYS_CLASS_NET
from trainfleet.model import Cluster
from trainfleet.nccl import Gid, IbPort, ib_settings, ucx_devices
from trainfleet.nccl_gids import deciding_release, release_text
from trainfleet.nccl_qos import (
    MLNX_QOS_FILE,
    PFC_PRIORITY,
    TRUST,
    NodeQos,
    RailQos,
    node_qos,
    odd_qos,
    port_netdev,
)
from trainfleet.node_sets import fold
from trainfleet.rails import ETHERNET, Rails
from trainfleet.rails import INFINIBAND as IB_LINK

NET_TREE = SYS_CLASS_NET  # /sys/class/net's ECN enables
RDMA_CM_TREE = RDMA_CM  # configfs rdma_cm's default_roce_tos (where it was set up)
PROBLEMS = "NCCL env problems"  # a health gate: none, or what stands in the GID or TC's way
NOT_DERIVED = "NCCL env not derived"  # variable: why, per node
WHY = "NCCL env why"  # the explanation: why each rail got its traffic class
SEPARATOR = " | "  # between NOT_DERIVED's variables (their reasons hold "; ")
_GID_PATH = re.compile(
    r"([A-Za-z0-9_]{1,32})/ports/([0-9]{1,3})/(gids|gid_attrs/(types|ndevs))/([0-9]{1,4})"
)
_PORT_PATH = re.compile(r"([A-Za-z0-9_]{1,32})/ports/([0-9]{1,3})/(link_layer|state)")
NO_HCA = ("absent", "skipped")  # the node has no /sys/class/infiniband (sources.py)
NEWER, OLDER = (2, 21), None  # the two GID rules (trainfleet.nccl_gids.AUTO_GID)


def _below(files: Mapping[str, str], tree: str) -> dict[str, str]:
    prefix = tree + "/"
    return {k[len(prefix) :]: v for k, v in files.items() if k.startswith(prefix)}


def ib_ports(tree: Mapping[str, str]) -> list[IbPort]:
    """The sysfs tree's ports in the NcclNetwork fact's shape (``ib_settings`` reads it):
    state and link layer, and each GID whose type file was read (``RoCE v2`` as
    ``RoCE_v2``), with its netdev where that was read."""
    ports: dict[tuple[str, int], IbPort] = {}
    gids: dict[tuple[str, int, int], dict[str, str]] = {}
    for path, text in sorted(tree.items()):
        if match := _PORT_PATH.fullmatch(path):
            port = ports.setdefault(
                (match[1], int(match[2])),
                IbPort(device=match[1], port=int(match[2]), link_layer="", state="", gids=[]),
            )
            value = text.strip()
            if match[3] == "state":
                port["state"] = value.replace(" ", "")
            else:
                port["link_layer"] = value
        elif match := _GID_PATH.fullmatch(path):
            gids.setdefault((match[1], int(match[2]), int(match[5])), {})[match[4] or "gid"] = (
                text.strip()
            )
    for (device, number, index), parts in sorted(gids.items()):
        owner = ports.get((device, number))
        if owner is None or not parts.get("types") or "gid" not in parts:
            continue  # a slot with no type is unused (its type file fails on the host)
        owner["gids"].append(
            Gid(
                index=index,
                type=parts["types"].replace(" ", "_"),
                gid=parts["gid"],
                ndev=parts.get("ndevs") or None,
            )
        )
    return list(ports.values())


def qos_readings(
    status: Mapping[str, str], files: Mapping[str, str], roce: Sequence[IbPort]
) -> list[RailQos]:
    """Each RoCE rail's QoS readings from the capture's files (None where not read)."""
    net = _below(files, NET_TREE)
    readings = []
    for port in roce:
        netdev = port_netdev(port)
        device, number = port["device"], port["port"]
        source = MLNX_QOS_FILE.format(netdev)
        state = status.get(source, "not in the capture") if netdev else "its netdev not read"
        ecn = {
            f"{side}/{p}": net[f"{netdev}/ecn/{side}/enable/{p}"]
            for side in ("roce_np", "roce_rp")
            for p in range(8)
            if f"{netdev}/ecn/{side}/enable/{p}" in net
        }
        readings.append(
            RailQos(
                rail=f"{device}:{number}",
                netdev=netdev,
                mlnx_qos=files.get(source) if state == "ok" else None,
                mlnx_qos_status=state,
                traffic_class=files.get(f"{INFINIBAND}/{device}/tc/1/traffic_class"),
                default_roce_tos=files.get(
                    f"{RDMA_CM_TREE}/{device}/ports/{number}/default_roce_tos"
                ),
                ecn=ecn,
            )
        )
    return readings


@dataclass
class NodeEnv:
    """What trainfleet would write on a node, and why anything is missing."""

    env: dict[str, str] = field(default_factory=dict)  # variable -> value
    not_derived: dict[str, str] = field(default_factory=dict)  # variable -> why
    problems: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    qos: NodeQos | None = None


def capture_readings(status: Mapping[str, str], files: Mapping[str, str]) -> dict[str, Any]:
    """The plain data a node's NCCL environment is derived from (kept by the judge per node;
    the files themselves are not): its ports with their GIDs, its RoCE rails' QoS readings,
    and which sources were read."""
    ports = ib_ports(_below(files, INFINIBAND)) if status.get(INFINIBAND) == "ok" else None
    roce = [p for p in ports or [] if p["link_layer"] == ETHERNET]
    return {
        "ports": ports,
        "qos": qos_readings(status, files, roce),
        "tree_read": status.get(INFINIBAND) == "ok",
        "tree_status": status.get(INFINIBAND, "not in the capture"),
    }


def _labels(
    release: tuple[int, int] | None, known: bool
) -> list[tuple[str, tuple[int, int] | None]]:
    """The NCCL releases whose GID rule is shown: the spec's pin, else both rules."""
    if known:
        return [("", release)]
    return [(" [NCCL >= 2.21]", NEWER), (" [NCCL < 2.21 or unknown]", OLDER)]


def node_env(
    rails: Rails | str | None,
    readings: Mapping[str, Any],
    spec_env: Mapping[str, Any] | None = None,
    release: tuple[int, int] | None = None,
    release_known: bool = False,
) -> NodeEnv:
    """The variables trainfleet would write on the node (``spec_env``: the spec's nccl.env,
    whose values pass through as the deploy's do; ``release``: the spec's pinned NCCL)."""
    spec_env = dict(spec_env or {})
    out = NodeEnv()
    out.not_derived["NCCL_SOCKET_IFNAME"] = "not read: a capture holds no interface addresses"
    ports = readings["ports"]
    if rails is None and readings["tree_status"] in NO_HCA:  # as the live derive: no port
        out.env["NCCL_IB_DISABLE"] = "1"
        out.explanation.append(f"no /sys/class/infiniband ({readings['tree_status']}): no HCA")
    elif not isinstance(rails, Rails):
        why = "not read: neither topo -m nor sys-class-infiniband" if rails is None else rails
        out.not_derived["NCCL_IB_HCA"] = why
    else:
        _ib(out, rails, ports or [], spec_env, release, release_known, readings["tree_read"])
    if isinstance(rails, Rails) and "NCCL_IB_HCA" not in out.not_derived:
        _tc(out, rails, readings, spec_env)
    out.env |= {k: str(v) for k, v in spec_env.items()}
    return out


def _ib(
    out: NodeEnv,
    rails: Rails,
    ports: list[IbPort],
    spec_env: Mapping[str, Any],
    release: tuple[int, int] | None,
    known: bool,
    tree_read: bool,
) -> None:
    """NCCL_IB_HCA and the GID settings, per NCCL rule (trainfleet.nccl.ib_settings)."""
    spec_hca = None if spec_env.get("NCCL_IB_HCA") is None else str(spec_env["NCCL_IB_HCA"])
    untabled = [
        f"{p['device']}:{p['port']}"
        for p in ports
        if p["link_layer"] == ETHERNET
        and not p["gids"]
        and any(r.hca in (f"{p['device']}:{p['port']}", p["device"]) for r in rails.rails)
    ]
    if ports == [] and rails.rails and not tree_read:
        out.not_derived["GID settings"] = (
            "not read: no sys-class-infiniband (the rails' link layer and GIDs unknown)"
        )
    for label, rule in _labels(release, known):
        env, _, problems = ib_settings(ports, rails, spec_hca, rule, spec_env)
        if not env:  # the rails' own problems, already the rails gate's finding
            out.not_derived["NCCL_IB_HCA"] = "not derived: " + "; ".join(problems)
            return
        for name, value in env.items():
            shared = name in ("NCCL_IB_HCA", "NCCL_IB_DISABLE")
            out.env[name if shared else name + label] = value
        if untabled:
            out.not_derived["GID settings" + label] = (
                f"not read: the capture has no GID table for {', '.join(untabled)}"
            )
            continue
        out.problems += [p + label for p in problems]
    if devices := ucx_devices(out.env, None):
        out.env["UCX_NET_DEVICES"] = devices
    if known:
        out.explanation.append(f"GID rule of NCCL {release_text(release)} (the spec's stack.nccl)")


def _tc(
    out: NodeEnv, rails: Rails, readings: Mapping[str, Any], spec_env: Mapping[str, Any]
) -> None:
    """NCCL_IB_TC over the QoS of the RoCE rails NCCL_IB_HCA lists (InfiniBand needs none)."""
    listed = out.env.get("NCCL_IB_HCA", "")
    names = (
        {n for n in listed.lstrip("=").split(",") if n}
        if listed and not listed.startswith("^")
        else {r.hca for r in rails.rails}
    )
    roce = [r for r in readings["qos"] if {r["rail"], r["rail"].split(":")[0]} & names]
    if not roce:
        if any(r.link_layer == IB_LINK for r in rails.rails):
            out.explanation.append("InfiniBand rails: lossless by credits, NCCL_IB_TC not needed")
        elif any(r.link_layer is None for r in rails.rails) and not readings["tree_read"]:
            out.not_derived["NCCL_IB_TC"] = "not read: no sys-class-infiniband (link layer unknown)"
        return
    spec = spec_env.get("NCCL_IB_TC")
    out.qos = node_qos(roce, None if spec is None else str(spec))
    out.env |= out.qos.env
    out.problems += out.qos.problems
    out.explanation += out.qos.explanation
    if "NCCL_IB_TC" not in out.env:
        out.not_derived["NCCL_IB_TC"] = "; ".join(out.qos.unset) or "not derived: " + "; ".join(
            out.qos.problems
        )


def envs_of(
    rails: Mapping[str, Rails | str | None],
    readings: Mapping[str, Mapping[str, Any]],
    cluster: Cluster | None = None,
) -> dict[str, NodeEnv]:
    """Every captured node's NodeEnv (``rails`` and ``readings``: the judge's, per node;
    ``cluster``: the spec, for its nccl.env and pinned NCCL)."""
    settings = {n.name: n.nccl for n in cluster.nodes} if cluster is not None else {}
    release = deciding_release([cluster.stack.get("nccl")]) if cluster is not None else None
    return {
        name: node_env(
            rails[name],
            found,
            (settings.get(name) or {}).get("env"),
            release,
            release_known=release is not None,
        )
        for name, found in readings.items()
    }


def add_to_report(report: Report, envs: Mapping[str, NodeEnv]) -> None:
    """Each node's variables as properties of their own name (``--json``: under the node), what
    was not derived and why, the QoS problems as a health gate, and the nodes whose trust
    state, PFC priority or NCCL_IB_TC differ from the majority."""
    for name, node in envs.items():
        observed = report.observed.setdefault(name, {})
        observed |= node.env
        observed[PROBLEMS] = "; ".join(node.problems) or HEALTHY
        if node.problems:
            report.findings.append(Finding(name, PROBLEMS, "health", observed[PROBLEMS], HEALTHY))
        observed[NOT_DERIVED] = (
            SEPARATOR.join(f"{k}: {v}" for k, v in node.not_derived.items()) or HEALTHY
        )
        if node.explanation:
            observed[WHY] = SEPARATOR.join(node.explanation)
        if node.qos is not None:
            observed |= {k: v for k, v in node.qos.values.items() if k in (TRUST, PFC_PRIORITY)}
    report.findings += odd_qos({n: e.qos for n, e in envs.items() if e.qos is not None})
    order = {n: i for i, n in enumerate(report.nodes)}
    report.findings.sort(key=lambda f: (order.get(f.node, len(order)), f.property))


_VARIABLE = re.compile(r"[A-Z][A-Z0-9_]+(?: \[NCCL [^]]+\])?")


def is_env_property(prop: str) -> bool:
    """Whether ``prop`` is one this module adds to a node's observed properties."""
    return bool(_VARIABLE.fullmatch(prop)) or prop in (
        NOT_DERIVED,
        WHY,
        PROBLEMS,
        TRUST,
        PFC_PRIORITY,
    )


def env_lines(report: Report) -> list[str]:
    """The NCCL environment section of diagnose's text: one line per variable and value, the
    nodes that share it after it; what was not derived, per variable, the same way."""
    groups: dict[str, list[str]] = {}
    for node in report.nodes:
        for prop, value in report.observed.get(node, {}).items():
            if _VARIABLE.fullmatch(prop):
                groups.setdefault(f"{prop}={value}", []).append(node)
            elif prop in (NOT_DERIVED, WHY) and value != HEALTHY:
                for part in value.split(SEPARATOR):
                    label = "not derived" if prop == NOT_DERIVED else "why"
                    groups.setdefault(f"{label}: {part}", []).append(node)
    if not groups:
        return []
    every = len([n for n in report.nodes if n in report.observed])
    lines = ["", "NCCL environment trainfleet would write (docs/nccl_env.md):"]
    for text, nodes in groups.items():
        who = f"all {every} nodes" if len(nodes) == every and every > 1 else fold(nodes)
        lines += wrapped(f"{text}  [{who}]", indent="  ")  # 160 columns at any cluster size
    return lines
