"""Fact of an Ascend node's NPU device IPs: what HCCL's rank table needs from each node."""

from __future__ import annotations

import re

from pyinfra.api import FactBase, StringCommand

from facts.shell import script, shell
from trainfleet.hccl import is_ipv4

HCCN_CONF = "/etc/hccn.conf"  # root-owned; hccn_tool -ip -s writes address_<id>=<ip> here
HCCN_TOOL = "/usr/local/Ascend/driver/tools/hccn_tool"  # the driver's path; often not on PATH

# The script prefixes every line it prints with where it came from ("conf " for the file,
# "tool <id> " for hccn_tool's answer about device <id>), so no line of the file can pass for
# the tool's, nor one device's answer for another's. Absent file or tool print nothing; exit 0.
_SCRIPT = script("npu.sh")

_CONF_ADDRESS = re.compile(r"address_(0|[1-9][0-9]{0,2})=(\S+)")  # the whole (stripped) line
_TOOL_LINE = re.compile(r"tool (0|[1-9][0-9]{0,2}) (.*)")
_TOOL_IPADDR = re.compile(r"ipaddr:(\S+)")


class NpuDeviceIps(FactBase[dict[int, str]]):
    """
    Each NPU's device IP, {device_id: ip}, read as MindSpore's hccl_tools.py reads it: the live
    answer of ``hccn_tool -i <id> -ip -g`` (the driver's tool, else the one on PATH; its first
    line, ``ipaddr:<ip>``) for every /dev/davinci<id>, and /etc/hccn.conf's
    ``address_<id>=<ip>`` lines where the tool gives no answer (hccl_tools falls back to the
    file when the tool fails; HCCL's guidance is that the queried value wins over a rank
    table's). Parsed strictly: only ``address_<n>=<IPv4>`` lines
    of the file (netmask_/netdetect_/gateway_ lines and anything else are ignored), only a
    device's first tool line and only when it is ``ipaddr:<IPv4>``; an id the file gives two
    different addresses is left out. No tool and no file: {}.

    + conf: the hccn.conf to read (tests point it at fixtures)
    + dev: the directory holding the davinci<id> device nodes

    .. code:: python

        {0: "192.168.10.21", 1: "192.168.20.21", 2: "192.168.30.21", 3: "192.168.40.21"}
    """

    def command(self, conf: str = HCCN_CONF, dev: str = "/dev") -> StringCommand:
        return shell(_SCRIPT, conf, dev, HCCN_TOOL)

    def process(self, output: list[str]) -> dict[int, str]:
        conf: dict[int, str | None] = {}
        tool: dict[int, str | None] = {}
        for line in output:
            source, _, rest = line.partition(" ")
            if source == "conf":
                match = _CONF_ADDRESS.fullmatch(rest.strip())
                if match and is_ipv4(match.group(2)):
                    device, ip = int(match.group(1)), match.group(2)
                    conf[device] = (
                        ip if conf.get(device, ip) == ip else None
                    )  # disagreeing: neither
            elif source == "tool":
                match = _TOOL_LINE.fullmatch(line)
                if not match or int(match.group(1)) in tool:
                    continue  # hccl_tools reads the first line of a device's answer only
                device = int(match.group(1))
                answer = _TOOL_IPADDR.fullmatch(match.group(2).strip())
                tool[device] = answer.group(1) if answer and is_ipv4(answer.group(1)) else None

        ips = {device: ip for device, ip in conf.items() if ip is not None}
        ips.update({device: ip for device, ip in tool.items() if ip is not None})
        return dict(sorted(ips.items()))

    @staticmethod
    def default() -> dict[int, str]:
        return {}

    def answer(self, value: dict[int, str], recorded: list[str]) -> list[str]:
        """What the script prints on a node whose devices have ``value``'s IPs: hccn.conf's
        other lines as recorded, an ``address_<id>=<ip>`` line per device, and no tool answer
        (a live one would win over the file)."""
        kept = [
            line
            for line in recorded
            if line.startswith("conf ") and not _CONF_ADDRESS.fullmatch(line[5:].strip())
        ]
        return kept + [f"conf address_{device}={ip}" for device, ip in sorted(value.items())]
