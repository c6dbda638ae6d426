"""NCCL_IB_TC from the host's own QoS: the traffic class that lands RoCE on the lossless
priority, derived per node and compared across nodes (docs/nccl_env.md, "NCCL_IB_TC").

RoCE without flow control drops to a fraction of its rate under load (nccl#378: 0.x GB/s,
"typical of a RoCE fabric not having proper flow control"). With ``trust dscp`` the NIC puts a
packet on the priority its DSCP maps to (``dscp2prio``), and NCCL_IB_TC is the traffic class
byte NCCL gives its QPs: DSCP << 2 (the low two bits are ECN). So the TC must be one whose DSCP
maps to the PFC-enabled priority. With ``trust pcp`` the VLAN priority decides and no TC can
choose it. mlx5's global ``traffic_class`` overrides every QP's, NCCL's included.

Plain functions over plain data: each RoCE rail's readings (``RailQos``) in, the node's
``(env, problems, explanation)`` out (``qos_settings``); the nodes that differ from the
majority named by ``odd_qos`` (trainfleet.compare.majority).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

from trainfleet.compare import Finding, majority
from trainfleet.hw.qos import (
    MlnxQos,
    QosRefused,
    parse_enable,
    parse_mlnx_qos,
    parse_roce_tos,
    parse_traffic_class,
)
from trainfleet.hw.sources import NETDEV

LOSSY = "lossy RoCE: neither PFC nor ECN on the priority NCCL's traffic takes"
NCCL_378 = "(nccl#378: 0.x GB/s under load, a RoCE fabric without flow control)"
# The values the majority compares, per node (absent where the node's QoS was not read).
TRUST, PFC_PRIORITY, TC = "QoS trust", "PFC priority", "NCCL_IB_TC"
MLNX_QOS_FILE = "mlnx-qos/{}.txt"  # where a capture saves a netdev's mlnx_qos output


class RailQos(TypedDict):
    """One RoCE rail's QoS readings, each as its source's text; None where not read."""

    rail: str  # "mlx5_2:1"
    netdev: str | None  # its netdev (the port's default GID's); None: not known
    mlnx_qos: str | None  # ``mlnx_qos -i <netdev>``'s output
    mlnx_qos_status: str  # "ok", "absent", "exit N" (124: timed out), "not in the capture"
    traffic_class: str | None  # /sys/class/infiniband/<dev>/tc/1/traffic_class
    default_roce_tos: str | None  # rdma_cm's default_roce_tos of the port
    ecn: Mapping[str, str]  # "roce_np/3" / "roce_rp/3" -> the enable file's text


@dataclass
class NodeQos:
    """A node's NCCL_IB_TC: the env, what stands in its way, why it is what it is, and the
    values the majority compares."""

    env: dict[str, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    values: dict[str, str] = field(default_factory=dict)
    unset: list[str] = field(default_factory=list)  # per rail without a TC: why, in a few words


@dataclass
class _Rail:
    """One rail's verdict while it is derived."""

    name: str
    tc: int | None = None
    trust: str | None = None
    pfc: tuple[int, ...] | None = None
    problems: list[str] = field(default_factory=list)
    explanation: list[str] = field(default_factory=list)
    unset: str | None = None  # why no traffic class was derived, in a few words


def not_read_why(status: str) -> str:
    """A source's status as the reader says it: ``exit 124`` is ``timed out``."""
    if status == "exit 124":
        return "timed out"
    if status == "absent":
        return "mlnx_qos is not installed"
    if status.startswith("exit "):
        return f"mlnx_qos failed ({status})"
    return status


def spec_tc_problem(value: str) -> str | None:
    """Why the spec's NCCL_IB_TC is no traffic class byte, if it is not."""
    if not value.isdigit() or int(value) > 255:
        return f"nccl.env NCCL_IB_TC={value} is not a traffic class (a number 0-255)"
    return None


def describe_tc(tc: int, qos: MlnxQos) -> str:
    """``106 (DSCP 26 -> priority 3)``: where a traffic class lands by the port's map."""
    dscp = tc >> 2
    priority = (qos.dscp2prio or {}).get(dscp)
    where = "the map does not place it" if priority is None else f"priority {priority}"
    return f"{tc} (DSCP {dscp} -> {where})"


def _lands(tc: int, qos: MlnxQos) -> bool:
    return (qos.dscp2prio or {}).get(tc >> 2) in qos.pfc_priorities


def _ecn(reading: RailQos, priority: int | None, rail: _Rail) -> bool | None:
    """ECN (both roce_np and roce_rp enabled) on ``priority`` (None: on any), or None where
    the enables were not read."""
    enables: dict[str, bool] = {}
    for name, text in reading["ecn"].items():
        try:
            enables[name] = parse_enable(text)
        except QosRefused as exc:
            rail.problems.append(f"{rail.name}: ECN {name}: {exc}")
            return None
    priorities = range(8) if priority is None else (priority,)
    known = [p for p in priorities if f"roce_np/{p}" in enables and f"roce_rp/{p}" in enables]
    if not known:
        return None
    return any(enables[f"roce_np/{p}"] and enables[f"roce_rp/{p}"] for p in known)


def _host_classes(reading: RailQos, rail: _Rail) -> tuple[int | None, int | None]:
    """(the global traffic_class, rdma_cm's default_roce_tos), None where unset or not read."""
    found: list[int | None] = []
    for text, parse in (
        (reading["traffic_class"], parse_traffic_class),
        (reading["default_roce_tos"], parse_roce_tos),
    ):
        try:
            found.append(None if text is None else parse(text))
        except QosRefused as exc:  # named: the node fails, the rest still explained
            rail.problems.append(f"{rail.name}: {exc}")
            found.append(None)
    return found[0], found[1]


def _lossless(reading: RailQos, rail: _Rail, qos: MlnxQos, priority: int | None) -> None:
    """Name a rail with neither PFC nor ECN where NCCL's traffic goes (``priority``: where it
    lands, None where the trust state hides it)."""
    pfc = qos.pfc_priorities
    if pfc and (priority is None or priority in pfc):
        return
    ecn = _ecn(reading, priority, rail)
    where = "any priority" if priority is None else f"priority {priority}"
    if ecn is None:
        rail.explanation.append(f"{rail.name}: no PFC on {where}; the ECN enables were not read")
    elif ecn:
        rail.explanation.append(f"{rail.name}: no PFC on {where}, ECN (DCQCN) on: lossy, paced")
    else:
        rail.problems.append(f"{rail.name}: {LOSSY} ({where}) {NCCL_378}")


def _pcp(rail: _Rail, reading: RailQos, qos: MlnxQos) -> None:
    netdev = reading["netdev"] or "<netdev>"
    pfc = ",".join(map(str, qos.pfc_priorities)) or "none"
    rail.explanation.append(
        f"{rail.name}: trust pcp (PFC on {pfc}): a frame's VLAN priority (PCP) decides its "
        "priority, not the DSCP NCCL_IB_TC sets, so no NCCL_IB_TC is derived; to let it "
        f"choose: mlnx_qos -i {netdev} --trust dscp on every node (PFC on the priority its DSCP "
        "maps to), or carry RoCE on a VLAN whose egress priority is the PFC one"
    )
    rail.unset = "not derived: trust pcp (the VLAN priority decides, not the TC)"
    _lossless(reading, rail, qos, None)


def _chosen(
    qos: MlnxQos, spec: int | None, tclass: int | None, tos: int | None, netdev: str
) -> tuple[int, str] | None:
    """The traffic class and where it comes from: the spec's, else the host's global class
    (the kernel applies it whatever NCCL asks), else rdma_cm's TOS where it lands on the PFC
    priority, else the lowest DSCP of the one PFC priority; None where none fits."""
    pfc = qos.pfc_priorities
    if spec is not None:
        return spec, "nccl.env NCCL_IB_TC"
    if tclass is not None:
        return tclass, "the host's traffic_class (Global tclass)"
    if tos is not None and _lands(tos, qos):
        return tos, "the host's rdma_cm default_roce_tos"
    if len(pfc) == 1 and qos.dscps_of(pfc[0]):
        return qos.dscps_of(pfc[0])[0] << 2, (
            f"the lowest DSCP {netdev} maps to PFC priority {pfc[0]}, << 2"
        )
    return None


def _dscp(rail: _Rail, reading: RailQos, qos: MlnxQos, spec: int | None) -> None:
    tclass, tos = _host_classes(reading, rail)
    pfc = qos.pfc_priorities
    listed = ",".join(map(str, pfc))
    netdev = reading["netdev"] or "its netdev"
    if qos.dscp2prio is None:
        rail.explanation.append(f"{rail.name}: trust dscp but the DSCP map was not read")
        rail.unset = "not derived: the DSCP map was not read"
        return
    if tos is not None and pfc and not _lands(tos, qos):  # rdma_cm's users, not NCCL's QPs
        rail.explanation.append(
            f"{rail.name}: rdma_cm's default_roce_tos {describe_tc(tos, qos)} misses the PFC "
            f"priority {listed}: rdma_cm connections (not NCCL's) go lossy"
        )
    chosen = _chosen(qos, spec, tclass, tos, netdev)
    if chosen is None and pfc:
        which = "several priorities" if len(pfc) > 1 else "a priority no DSCP maps to"
        rail.problems.append(
            f"{rail.name}: PFC on {which} ({listed}) of {netdev} and the host sets no traffic "
            "class landing on one: name NCCL_IB_TC in nccl.env"
        )
        rail.unset = f"not derived: PFC on {which}"
        return
    if chosen is None:
        rail.explanation.append(f"{rail.name}: no PFC priority on {netdev}: NCCL_IB_TC not set")
        rail.unset = "not derived: no PFC priority"
        _lossless(reading, rail, qos, (qos.dscp2prio or {}).get(0))  # NCCL's default TC: 0
        return
    rail.tc, source = chosen
    rail.explanation.append(f"{rail.name}: NCCL_IB_TC {describe_tc(rail.tc, qos)} from {source}")
    if tclass is not None and tclass != rail.tc:
        rail.problems.append(
            f"{rail.name}: the host's traffic_class {describe_tc(tclass, qos)} overrides "
            f"NCCL_IB_TC {rail.tc} for every QP of the port"
        )
    if pfc and not _lands(rail.tc, qos):
        rail.problems.append(
            f"{rail.name}: {source} {describe_tc(rail.tc, qos)} misses the PFC priority "
            f"{listed} of {netdev} (mlnx_qos)"
        )
    _lossless(reading, rail, qos, (qos.dscp2prio or {}).get(rail.tc >> 2))


def rail_qos(reading: RailQos, spec_tc: int | None = None) -> _Rail:
    """One RoCE rail's traffic class, from its host's QoS, and what is wrong with it."""
    rail = _Rail(reading["rail"] + (f" ({reading['netdev']})" if reading["netdev"] else ""))
    status, text = reading["mlnx_qos_status"], reading["mlnx_qos"]
    if status != "ok" or text is None:
        why = not_read_why(status if status != "ok" else "missing")
        rail.explanation.append(f"{rail.name}: QoS not read: {why}; NCCL_IB_TC not derived")
        rail.unset = (
            f"not read: {MLNX_QOS_FILE.format(reading['netdev'])} {why}"
            if reading["netdev"]
            else "not read: the port's netdev (gid_attrs/ndevs) was not read or names no netdev"
        )
        if status.startswith("exit "):  # the tool failed or hung: never a silent pass
            rail.problems.append(f"{rail.name}: mlnx_qos not read: {why}")
        return rail
    try:
        qos = parse_mlnx_qos(text)
    except QosRefused as exc:
        rail.problems.append(f"{rail.name}: mlnx_qos output refused: {exc}")
        rail.unset = f"not derived: {MLNX_QOS_FILE.format(reading['netdev'])} refused"
        return rail
    rail.trust, rail.pfc = qos.trust, qos.pfc_priorities
    if qos.trust == "pcp":
        _pcp(rail, reading, qos)
    else:
        _dscp(rail, reading, qos, spec_tc)
    return rail


def _joined(values: dict[str, str]) -> str:
    """One value where the rails agree, else each rail's."""
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{rail}={value}" for rail, value in values.items())


def qos_settings(
    readings: Sequence[RailQos], spec_tc: str | None = None
) -> tuple[dict[str, str], list[str], list[str]]:
    """The node's NCCL_IB_TC over its RoCE rails' readings: ``(env, problems, explanation)``.
    ``spec_tc``: the spec's NCCL_IB_TC (nccl.env), checked against each rail's PFC priority."""
    node = node_qos(readings, spec_tc)
    return node.env, node.problems, node.explanation


def node_qos(readings: Sequence[RailQos], spec_tc: str | None = None) -> NodeQos:
    """``qos_settings`` with the values the majority compares (``odd_qos``)."""
    node = NodeQos()
    if not readings:
        return node
    spec = None
    if spec_tc is not None:
        if problem := spec_tc_problem(spec_tc):
            node.problems.append(problem)
            return node
        spec = int(spec_tc)
    rails = [rail_qos(r, spec) for r in readings]
    for rail in rails:
        node.problems += rail.problems
        node.explanation += rail.explanation
        node.unset += [f"{rail.name}: {rail.unset}"] if rail.unset else []
    read = [r for r in rails if r.trust is not None]
    if read:
        node.values[TRUST] = _joined({r.name: str(r.trust) for r in read})
        node.values[PFC_PRIORITY] = _joined(
            {r.name: ",".join(map(str, r.pfc or ())) or "none" for r in read}
        )
    classes = {r.name: r.tc for r in rails}
    if all(tc is not None for tc in classes.values()):
        if len(set(classes.values())) > 1:
            node.problems.append(
                "the RoCE rails need different traffic classes ("
                + ", ".join(f"{n}={tc}" for n, tc in classes.items())
                + "): NCCL gives every QP one NCCL_IB_TC"
            )
        else:
            node.env[TC] = str(next(iter(classes.values())))
    derived = {n: str(tc) for n, tc in classes.items() if tc is not None}
    if derived:
        node.values[TC] = _joined(derived)
    return node


def odd_qos(by_node: Mapping[str, NodeQos]) -> list[Finding]:
    """The nodes whose trust state, PFC priority or NCCL_IB_TC differs from most nodes'
    (nodes whose QoS was not read are not counted: they are named where they are shown)."""
    findings: list[Finding] = []
    for prop in (TRUST, PFC_PRIORITY, TC):
        values = {n: q.values[prop] for n, q in by_node.items() if prop in q.values}
        findings += majority(prop, values)
    return findings


def port_netdev(port: Mapping[str, Any]) -> str | None:
    """A RoCE port's netdev: its default GID's (index 0), else any GID's; None where none was
    read or the name is outside the netdev grammar (it names a source, never a path)."""
    gids = port["gids"]
    own = [g["ndev"] for g in gids if g["index"] == 0 and g["ndev"]]
    named = own or [g["ndev"] for g in gids if g["ndev"]]
    return named[0] if named and NETDEV.fullmatch(named[0]) else None


def live_readings(network: Mapping[str, Any], hcas: Sequence[str]) -> list[RailQos]:
    """Each RoCE rail's QoS readings from the NcclNetwork fact (``hcas``: NCCL_IB_HCA's
    entries, ``mlx5_0:1`` or a whole device); an InfiniBand rail has no traffic class here."""
    readings: list[RailQos] = []
    for port in network.get("ib_ports") or []:
        name = f"{port['device']}:{port['port']}"
        if port["link_layer"] != "Ethernet" or not ({name, port["device"]} & set(hcas)):
            continue
        netdev = port_netdev(port)
        tool = (network.get("qos") or {}).get(netdev) if netdev else None
        status = tool["status"] if tool else "not read" if netdev else "its netdev not read"
        enables = (network.get("ecn") or {}).get(netdev, {}) if netdev else {}
        tos = (network.get("roce_tos") or {}).get(name)
        readings.append(
            RailQos(
                rail=name,
                netdev=netdev,
                mlnx_qos=tool["text"] if tool and status == "ok" else None,
                mlnx_qos_status=status,
                traffic_class=(network.get("traffic_class") or {}).get(port["device"]),
                default_roce_tos=None if tos is None else str(tos),
                ecn={
                    f"roce_{side}/{prio}": str(on)
                    for side, prios in enables.items()
                    for prio, on in prios.items()
                },
            )
        )
    return readings
