"""Parsing what hygiene.sh prints on one node."""

from __future__ import annotations

import re
from typing import Any

from facts.shm_facts import parse_sysvipc_shm
from trainfleet.text import printable


def parse_hygiene(lines: list[str]) -> dict[str, Any]:
    """One node's hygiene output: the holders of the master port and of the pair ports it may
    host, name resolution, its hostname, GPUs visible (``nvidia-smi -L`` lines, limited by
    CUDA_VISIBLE_DEVICES), the non-login NCCL/Gloo env, its hostfile slots."""
    data: dict[str, Any] = {"resolves": {}, "env": {}}
    sysvipc = [line[len("sysvipc ") :] for line in lines if line.startswith("sysvipc ")]
    if sysvipc:
        data["stale_shm"] = parse_sysvipc_shm(sysvipc)
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "holder":  # an `ss -ltnp` line; the process is in users:((...))
            users = re.search(r"users:\(\(.*\)\)", rest)
            # Any user names their own processes: nothing they chose reaches a terminal raw.
            data["port_holder"] = (
                printable(users.group(0)) if users else "by a process ss cannot name"
            )
        elif line == "noss":  # ss missing or failing: no listing, so no "no holder" either
            data["ports_unlisted"] = True
        elif kind == "pairport" and (held := re.fullmatch(r"([0-9]{1,5}) (.*)", rest, re.S)):
            users = re.search(r"users:\(\(.*\)\)", held.group(2))
            data.setdefault("pair_port_holders", {})[int(held.group(1))] = (
                printable(users.group(0)) if users else "by a process ss cannot name"
            )
        elif kind == "resolve":
            name, _, addr = rest.partition(" ")
            data["resolves"][name] = addr.strip()
        elif kind == "hostname":
            data["hostname"] = printable(rest.strip())
        elif kind == "gpus":
            data["visible_gpus"] = 0
        elif kind == "gpu" and rest.startswith("GPU "):
            data["visible_gpus"] = data.get("visible_gpus", 0) + 1
        elif kind == "cvd":
            data["cuda_visible_devices"] = rest
        elif kind == "env":
            key, _, value = rest.partition("=")
            data["env"][key] = value
        elif kind == "clock" and re.fullmatch(r"[0-9]{9,11}\.[0-9]{1,9}", rest, re.ASCII):
            data["clock"] = float(rest)
        elif kind == "kernel" and re.fullmatch(
            r"[0-9a-f-]{36} [0-9]{1,9} ([0-9]{1,10}\.[0-9]{1,9})?", rest, re.ASCII
        ):
            # the boot, its count of GPU/fabric error lines and the last one's time
            data["kernel"] = rest.strip()
        elif kind == "slots" and re.fullmatch(r"[0-9]{1,6}", rest.strip(), re.ASCII):
            data["slots"] = int(rest)
    if data.get("cuda_visible_devices") and "visible_gpus" in data:
        data["visible_gpus"] = min(
            data["visible_gpus"], len(data["cuda_visible_devices"].split(","))
        )
    return data
