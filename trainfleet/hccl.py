"""The HCCL rank table of an Ascend NPU cluster (MindSpore/HCCL's ``RANK_TABLE_FILE``).

Plain data, no pyinfra: from each server's cluster address and its NPUs' device IPs, in spec
order, the exact structure MindSpore's ``hccl_tools.py`` writes (mindspore-ai/models
utils/hccl_tools/hccl_tools.py; mindspore-ai/mindspore model_zoo/utils/hccl_tools before it)
and ``merge_hccl.py`` extends to several servers:

- keys in the order hccl_tools builds them: ``version``, ``server_count``, ``server_list``,
  ``status``; per server ``server_id``, ``device``, ``host_nic_ip``; per device ``device_id``,
  ``device_ip``, ``rank_id``;
- every value a string: ``"version": "1.0"``, ``"server_count": "2"``, ``"rank_id": "8"``
  (hccl_tools writes ``str(rank_id)``; HCCL's rank table reference documents strings too),
  ``"host_nic_ip": "reserve"``, ``"status": "completed"``;
- ``server_id`` is the server's IP (hccl_tools uses ``--server_ip`` or the host's address);
- rank ids run over the servers in spec order, and within a server over its devices in
  device-id order, as merge_hccl numbers servers in the order of its input files;
- the file is ``json.dump(table, fp, indent=4)``: four-space indent, no trailing newline.

What is checked, each refusal naming the server and the device:
- device ids 0-7: hccl_tools addresses at most 8 chips per server (``--device_num`` within
  [0,8], ``--visible_devices`` 0-7); ids unique within a server;
- device IPs are IPv4 (what ``hccn_tool -i N -ip -g`` and /etc/hccn.conf's ``address_N``
  hold) and unique across the cluster (HCCL: device_ip is globally unique);
- server addresses are IPv4 and unique (HCCL: server_id is globally unique);
- every server has the same number of devices (HCCL: each server takes part with the same
  number of processors, 1*n/2*n/4*n/8*n on Atlas training, (1~8)*n on Atlas A2); hccl_tools
  itself writes one server and merge_hccl does not check this.
Not checked: the Atlas training (910) grouping of chips 0-3 and 4-7 that hccl_tools'
``--device_num`` enforces for 2- and 4-chip servers; it does not hold on Atlas A2.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from ipaddress import IPv4Address
from typing import NamedTuple, TypedDict

RANK_TABLE_VERSION = "1.0"
STATUS = "completed"
HOST_NIC_IP = "reserve"
MAX_DEVICE_ID = 7  # hccl_tools: --device_num within [0,8], --visible_devices "0,1,...,7"


class NpuServer(NamedTuple):
    """One server of the table: a plain ``(name, address, devices)`` tuple works as well."""

    name: str  # the node's name, for messages
    address: str  # its cluster IPv4 address: the table's server_id
    devices: Sequence[tuple[int, str]]  # (device_id, device_ip), e.g. sorted(NpuDeviceIps.items())


class RankTableDevice(TypedDict):
    device_id: str
    device_ip: str
    rank_id: str


class RankTableServer(TypedDict):
    server_id: str
    device: list[RankTableDevice]
    host_nic_ip: str


class RankTable(TypedDict):
    version: str
    server_count: str
    server_list: list[RankTableServer]
    status: str


def is_ipv4(value: object) -> bool:
    """A dotted-quad IPv4 address in its one canonical spelling (no leading zeros, no spaces)."""
    if not isinstance(value, str):
        return False
    try:
        return str(IPv4Address(value)) == value
    except ValueError:
        return False


def _device_id(server: str, device_id: object) -> int:
    if isinstance(device_id, bool) or not isinstance(device_id, int):
        raise ValueError(f"{server}: device {device_id!r}: the device id is not an integer")
    if not 0 <= device_id <= MAX_DEVICE_ID:
        raise ValueError(
            f"{server}: device {device_id}: device ids run 0-{MAX_DEVICE_ID} "
            "(hccl_tools addresses at most 8 chips per server)"
        )
    return device_id


def rank_table(servers: Sequence[tuple[str, str, Sequence[tuple[int, str]]]]) -> RankTable:
    """The rank table of ``servers`` (name, cluster address, [(device_id, device_ip)]), in order.

    Raises ValueError naming the server (and device) that stands in the way.
    """
    if not servers:
        raise ValueError("a rank table needs at least one server")
    owner_of_ip: dict[str, tuple[str, int]] = {}
    server_of_address: dict[str, str] = {}
    counts: list[tuple[str, int]] = []
    server_list: list[RankTableServer] = []
    rank = 0
    for name, address, devices in servers:
        if not is_ipv4(address):
            raise ValueError(
                f"{name}: server address {address!r} is not an IPv4 address "
                "(server_id is the server's cluster IP)"
            )
        if address in server_of_address:
            raise ValueError(
                f"{name}: server address {address} is already {server_of_address[address]}'s"
            )
        server_of_address[address] = name
        if not devices:
            raise ValueError(f"{name}: no NPU devices (no device IP found)")
        by_id: dict[int, str] = {}
        for device_id, device_ip in devices:
            number = _device_id(name, device_id)
            if number in by_id:
                raise ValueError(f"{name}: device {number}: listed twice")
            if not is_ipv4(device_ip):
                raise ValueError(
                    f"{name}: device {number}: device IP {device_ip!r} is not an IPv4 address"
                )
            if device_ip in owner_of_ip:
                other, other_id = owner_of_ip[device_ip]
                raise ValueError(
                    f"{name}: device {number}: device IP {device_ip} is already "
                    f"device {other_id}'s on {other} (device IPs are unique cluster-wide)"
                )
            owner_of_ip[device_ip] = (name, number)
            by_id[number] = device_ip
        counts.append((name, len(by_id)))
        entries: list[RankTableDevice] = []
        for number in sorted(by_id):
            entries.append(
                {"device_id": str(number), "device_ip": by_id[number], "rank_id": str(rank)}
            )
            rank += 1
        server_list.append({"server_id": address, "device": entries, "host_nic_ip": HOST_NIC_IP})

    first, expected = counts[0]
    for name, count in counts[1:]:
        if count != expected:
            raise ValueError(
                f"{name}: {count} NPU devices, but {first} has {expected} "
                "(every server takes part with the same number of devices)"
            )
    return {
        "version": RANK_TABLE_VERSION,
        "server_count": str(len(server_list)),
        "server_list": server_list,
        "status": STATUS,
    }


def render_rank_table(servers: Sequence[tuple[str, str, Sequence[tuple[int, str]]]]) -> str:
    """The rank table file's text, byte for byte as hccl_tools' ``json.dump(..., indent=4)``
    writes it (no trailing newline)."""
    return json.dumps(rank_table(servers), indent=4)
