"""The InfiniBand sysfs tree (``/sys/class/infiniband``): each HCA's firmware and board, each
port's state, physical state, rate and link layer, and its error counters."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

# Names as the kernel makes them (drivers/infiniband/core/sysfs.c): HCA and counter names are
# short words; nothing else in a path is taken.
_PATH = re.compile(
    r"([A-Za-z0-9_]{1,32})/(fw_ver|board_id|hca_type|ports/([0-9]{1,3})/"
    r"(state|phys_state|rate|link_layer|counters/([A-Za-z0-9_]{1,64})|"
    r"hw_counters/([A-Za-z0-9_]{1,64})))"
)
# Error counters (counters/): a port whose count grows under load is failing.
ERROR_COUNTERS = (
    "symbol_error",
    "link_error_recovery",
    "link_downed",
    "port_rcv_errors",
    "port_rcv_remote_physical_errors",
    "local_link_integrity_errors",
    "excessive_buffer_overrun_errors",
)
# RoCE under load (hw_counters/, mlx5): a packet lost and sent again. Growing while no pause
# frame was sent or received, the fabric dropped it: flow control (PFC) is not in effect.
RETRANSMIT_COUNTERS = (
    "out_of_sequence",
    "local_ack_timeout_err",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
)
# Congestion notification (DCQCN): CNPs sent and ECN-marked packets received (the notification
# point), CNPs handled (the reaction point). Figures, not faults.
CONGESTION_COUNTERS = ("np_cnp_sent", "np_ecn_marked_roce_packets", "rp_cnp_handled")
ROCE_COUNTERS = RETRANSMIT_COUNTERS + CONGESTION_COUNTERS


def hcas(files: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{hca: {"fw": str, "board": str, "type": str, "ports": {port: {"state", "phys_state",
    "rate", "link_layer", "counters": {name: int}}}}}`` from ``{relative path: content}``."""
    found: dict[str, dict[str, Any]] = {}
    for path, content in sorted(files.items()):
        match = _PATH.fullmatch(path)
        if not match:
            continue
        hca = found.setdefault(
            match.group(1), {"fw": None, "board": None, "type": None, "ports": {}}
        )
        value = content.strip()
        leaf = match.group(2)
        if leaf in ("fw_ver", "board_id", "hca_type"):
            hca[{"fw_ver": "fw", "board_id": "board", "hca_type": "type"}[leaf]] = value
            continue
        port = hca["ports"].setdefault(
            match.group(3),
            {"state": None, "phys_state": None, "rate": None, "link_layer": None, "counters": {}},
        )
        counter = match.group(5) or match.group(6)
        if counter:
            if re.fullmatch(r"[0-9]{1,20}", value):
                port["counters"][counter] = int(value)
        else:
            port[match.group(4)] = value
    return found
