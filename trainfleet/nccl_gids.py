"""A RoCE port's GID table as NCCL reads it, per NCCL version.

NCCL before 2.21 uses the GID index it is given (``NCCL_IB_GID_INDEX``, default 0: the
link-local GID, which is not routed: nccl#769). From 2.21 NCCL picks the index itself, per port:
the first GID whose address family is ``NCCL_IB_ADDR_FAMILY`` (default AF_INET), inside
``NCCL_IB_ADDR_RANGE`` when set, neither unset nor link-local, of RoCE version
``NCCL_IB_ROCE_VERSION_NUM`` (default 2) (net_ib.cc, ncclIbGetGidIndex/ncclUpdateGidIndex). So a
GID that moves (nccl#1333: 3 to 4/8 after 12 hours) is followed from 2.21 on, never before.

Plain functions over the NcclNetwork fact's GID lists (``{"index", "type", "gid", "ndev"}``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from ipaddress import IPv6Address, ip_address, ip_network
from typing import Any

AUTO_GID = (2, 21)  # the first NCCL that picks the GID index itself
AF_INET = "AF_INET"
AF_INET6 = "AF_INET6"
_VERSION = re.compile(r"(\d+)\.(\d+)")


def nccl_release(version: str | None) -> tuple[int, int] | None:
    """``(2, 21)`` of ``2.21.5-1+cuda12.4`` / ``2.21.5``; None when unknown or unreadable."""
    match = _VERSION.match(version or "")
    return (int(match[1]), int(match[2])) if match else None


def deciding_release(versions: Iterable[str | None]) -> tuple[int, int] | None:
    """The NCCL release that decides a node's GID settings: the oldest of those known to run
    there (the spec's pinned libnccl2, the NCCL torch was built with). Settings an older NCCL
    would ignore are never trusted to a newer one's choice; None when none is known."""
    known = [r for r in map(nccl_release, versions) if r is not None]
    return min(known) if known else None


def picks_itself(release: tuple[int, int] | None) -> bool:
    """Whether this NCCL picks the GID index itself (unknown: no, the older rule is safer)."""
    return release is not None and release >= AUTO_GID


def release_text(release: tuple[int, int] | None) -> str:
    return "unknown" if release is None else f"{release[0]}.{release[1]}"


def _address(gid: str) -> IPv6Address | None:
    try:
        address = ip_address(gid)
    except ValueError:
        return None
    return address if isinstance(address, IPv6Address) else None


def family(gid: str) -> str | None:
    """AF_INET for an IPv4-mapped GID (``::ffff:a.b.c.d``), AF_INET6 for a routable IPv6 one;
    None for an unset or link-local GID (NCCL never picks those)."""
    address = _address(gid)
    if address is None or address.is_unspecified or address.is_link_local:
        return None
    return AF_INET if address.ipv4_mapped is not None else AF_INET6


def in_range(gid: str, address_range: str | None) -> bool:
    """Whether the GID's address is inside NCCL_IB_ADDR_RANGE (none given: every address)."""
    if not address_range:
        return True
    address = _address(gid)
    if address is None:
        return False
    try:
        network = ip_network(address_range, strict=False)
    except ValueError:
        return False
    if network.version == 4:
        return address.ipv4_mapped is not None and address.ipv4_mapped in network
    return address in network


def v2_candidates(
    gids: Sequence[Mapping[str, Any]], af: str, address_range: str | None = None
) -> list[Mapping[str, Any]]:
    """The port's RoCE v2 GIDs of family ``af`` (inside ``address_range``), by index."""
    return sorted(
        (
            g
            for g in gids
            if g["type"] == "RoCE_v2"
            and family(g["gid"]) == af
            and in_range(g["gid"], address_range)
        ),
        key=lambda g: int(g["index"]),
    )


def families(gids: Sequence[Mapping[str, Any]], address_range: str | None = None) -> list[str]:
    """The families the port has a routable RoCE v2 GID of, AF_INET first."""
    return [af for af in (AF_INET, AF_INET6) if v2_candidates(gids, af, address_range)]


def own_netdev(gids: Sequence[Mapping[str, Any]]) -> str | None:
    """The port's own netdev: the one its default GID (index 0) belongs to."""
    return next((g["ndev"] for g in gids if int(g["index"]) == 0), None)


def nccl_pick(
    gids: Sequence[Mapping[str, Any]], af: str, address_range: str | None = None
) -> Mapping[str, Any] | None:
    """The GID NCCL >= 2.21 takes for ``af`` with RoCE v2 asked for: the lowest index that
    fits (it looks at neither the netdev nor the address beyond family and range)."""
    candidates = v2_candidates(gids, af, address_range)
    return candidates[0] if candidates else None


def own_pick(
    gids: Sequence[Mapping[str, Any]], af: str, address_range: str | None = None
) -> Mapping[str, Any] | None:
    """The GID a pinned index should hold: the first RoCE v2 GID of ``af`` on the port's own
    netdev, else the first of any netdev. One address on two netdevs (a VXLAN over the bond,
    ucx#9484) gives two GIDs; the one of the port's own netdev is the port's."""
    candidates = v2_candidates(gids, af, address_range)
    own = own_netdev(gids)
    mine = [g for g in candidates if own is not None and g["ndev"] == own]
    chosen = mine or candidates
    return chosen[0] if chosen else None


def _hca_listed(hca: str, device: str, port: int) -> bool:
    names = [n for n in hca.lstrip("=").split(",") if n]
    return any(n in (device, f"{device}:{port}") for n in names)


def pinned_gid_reading(env: Mapping[str, str], ports: Sequence[Mapping[str, Any]] | None) -> str:
    """What the GID index ``env`` pins holds on each RoCE port it lists (NCCL_IB_HCA), as
    drift compares it: ``3: RoCE v2 AF_INET`` where every port holds a RoCE v2 GID of the
    family at that index (NCCL_IB_ADDR_FAMILY, default AF_INET), else each port that does
    not, with what it holds there; ``not pinned`` without an index."""
    index = env.get("NCCL_IB_GID_INDEX")
    if index is None:
        return "not pinned"
    af = env.get("NCCL_IB_ADDR_FAMILY", AF_INET)
    if ports is None:
        return f"{index}: the node's GID tables were not read"
    hca = env.get("NCCL_IB_HCA", "")
    listed = [
        p
        for p in ports
        if p["link_layer"] == "Ethernet" and _hca_listed(hca, p["device"], p["port"])
    ]
    if not listed:  # nothing seen is never a pass
        return f"{index}: no RoCE port of NCCL_IB_HCA {hca or '(unset)'} on the node"
    wrong = []
    for port in listed:
        name = f"{port['device']}:{port['port']}"
        held = next((g for g in port["gids"] if str(g["index"]) == index), None)
        if held is not None and held["type"] == "RoCE_v2" and family(held["gid"]) == af:
            continue
        what = "has no GID " + index if held is None else f"holds {held['type']} {held['gid']}"
        now = own_pick(port["gids"], af)  # where the GID went, if anywhere
        wrong.append(f"{name} {what}" + (f" ({af} v2 at {now['index']})" if now else ""))
    return f"{index}: " + ("; ".join(wrong) if wrong else f"RoCE v2 {af}")


def expected_gid_reading(env: Mapping[str, str]) -> str:
    """``pinned_gid_reading`` of a node that holds what the plan pins."""
    index = env.get("NCCL_IB_GID_INDEX")
    if index is None:
        return "not pinned"
    return f"{index}: RoCE v2 {env.get('NCCL_IB_ADDR_FAMILY', AF_INET)}"
