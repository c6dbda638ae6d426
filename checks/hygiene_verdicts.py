"""Hygiene verdicts: the master port, names, slots, environment, clocks and stale
shared memory, from what each node's hygiene stage saw. No host is touched here.
"""

from __future__ import annotations

import statistics
from typing import Any

from checks.preflight_report import Problem
from trainfleet.model import Cluster
from trainfleet.nccl import checked_env
from trainfleet.text import printable


def hygiene_problems(
    cluster: Cluster,
    seen: dict[str, dict[str, Any]],
    expected_env: dict[str, dict[str, str]],
    launch_slots: dict[str, int],
) -> list[Problem]:
    """Stage 1: the master port is free; hostnames are unique; names resolve alike everywhere;
    slots = GPUs = visible devices; the non-login environment holds the planned variables
    (``env_problems``)."""
    problems: list[Problem] = []
    master = cluster.master.name
    holder = seen.get(master, {}).get("port_holder")
    if holder:
        problems.append(
            Problem(
                "hygiene", master, f"master port {cluster.master_port} is already in use ({holder})"
            )
        )
    problems += duplicate_hostnames(
        {node: data["hostname"] for node, data in seen.items() if data.get("hostname")}
    )
    addresses = cluster.address_of_name()
    for node, data in seen.items():
        for name, got in sorted(data.get("resolves", {}).items()):
            want = addresses.get(name)
            if want and got != want:
                problems.append(
                    Problem("hygiene", node, f"{name} resolves to {got or 'nothing'}, not {want}")
                )
        spec = cluster.node(node)
        visible = data.get("visible_gpus")
        slots = launch_slots.get(node)
        if slots is not None and slots != spec.slots:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"hostfile gives {slots} slots, the spec {spec.slots} ({spec.gpus} GPUs)",
                )
            )
        if spec.gpus and visible is None:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"the spec gives it {spec.gpus} GPUs but nvidia-smi is missing (no driver?)",
                )
            )
        elif spec.gpus and visible is not None and visible < spec.gpus:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"only {visible} GPUs visible (CUDA_VISIBLE_DEVICES="
                    f"{data.get('cuda_visible_devices') or 'unset'}), "
                    f"the spec needs {spec.gpus}",
                )
            )
        if node in expected_env:
            problems += env_problems(node, data.get("env", {}), expected_env[node])
    return problems


def env_problems(node: str, seen: dict[str, str], planned: dict[str, str]) -> list[Problem]:
    """The non-login environment ranks get, judged as drift judges it (trainfleet.nccl's
    ``checked_env``): each planned variable with its planned value, and no variable of an owned
    family the plan does not set (a stray one changes what NCCL, Gloo or UCX do)."""
    checked = checked_env(seen, planned)
    problems = [
        Problem(
            "hygiene",
            node,
            f"{key} is {checked.get(key, 'missing')!r} in the non-login "
            f"environment ranks get, expected {value!r}",
        )
        for key, value in planned.items()
        if checked.get(key) != value
    ]
    problems += [
        Problem(
            "hygiene",
            node,
            f"{printable(key)} is {value!r} in the non-login environment ranks get, "
            "which the plan does not set",
        )
        for key, value in sorted(checked.items())
        if key not in planned
    ]
    return problems


def pair_port_problems(
    seen: dict[str, dict[str, Any]], hosted: dict[str, dict[int, str]]
) -> list[Problem]:
    """A port a pair's rendezvous would listen on (``hosted``: each node's, and which pair's)
    already held there: named on that node before any pair runs, as the master port is (else
    the pair would fail, and its partner be named with it)."""
    return [
        Problem(
            "hygiene",
            node,
            f"port {port}, {hosted[node][port]}'s rendezvous, is already in use ({holder})",
        )
        for node, data in sorted(seen.items())
        for port, holder in sorted((data.get("pair_port_holders") or {}).items())
        if port in hosted.get(node, {})
    ]


def port_listing_problems(
    cluster: Cluster, seen: dict[str, dict[str, Any]], hosted: dict[str, dict[int, str]]
) -> list[Problem]:
    """A node whose ports had to be checked for a holder (the master; a pair's host) but whose
    ``ss`` is missing or failed: named, never taken for "no holder" (a check that saw nothing
    fails)."""
    return [
        Problem("hygiene", node, "cannot list listening ports: ss missing or failed")
        for node, data in sorted(seen.items())
        if data.get("ports_unlisted") and (node == cluster.master.name or hosted.get(node))
    ]


def clock_problems(
    readings: dict[str, tuple[float, float, float]], max_ms: int, expected: set[str]
) -> list[Problem]:
    """Clocks compared across nodes, without trusting any node's own sync status: each node
    read its clock between the controller's sending the stage and its answer, so its offset
    from the controller is known to within half that window. A node further from the median
    node than ``max_ms`` plus both uncertainties is named (rank timeouts, log order and
    certificates assume one time). ``readings``: {node: (its clock, sent, answered)}; a
    node in ``expected`` that gave no reading fails: a check that saw nothing never passes."""
    problems = [
        Problem("hygiene", node, "printed no clock reading (date +%s.%N)")
        for node in sorted(expected - set(readings))
    ]
    if len(readings) < 2:
        return problems
    offsets = {
        node: clock - (sent + answered) / 2 for node, (clock, sent, answered) in readings.items()
    }
    unsure = {node: (answered - sent) / 2 for node, (_, sent, answered) in readings.items()}
    middle = statistics.median(offsets.values())
    slack = max_ms / 1000 + statistics.median(unsure.values())
    for node, offset in sorted(offsets.items()):
        apart = offset - middle
        if abs(apart) > slack + unsure[node]:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"its clock is {abs(apart) * 1000:.0f} ms "
                    f"{'ahead of' if apart > 0 else 'behind'} the other nodes' "
                    f"(gpu.max_clock_offset_ms: {max_ms}; is chrony/timesyncd running?)",
                )
            )
    return problems


def duplicate_hostnames(hostnames: dict[str, str]) -> list[Problem]:
    """Nodes that report the same hostname: ranks, pdsh and DeepSpeed's runner tell nodes
    apart by it (torch.distributed's error messages, MPI's host lists), so each is named."""
    problems = []
    for node, name in sorted(hostnames.items()):
        others = sorted(n for n, h in hostnames.items() if h == name and n != node)
        if others:
            problems.append(
                Problem(
                    "hygiene",
                    node,
                    f"its hostname {name!r} is also the hostname of {', '.join(others)}",
                )
            )
    return problems


def _size(n: float) -> str:
    unit = "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            break
        n /= 1024
    return f"{n:.0f} B" if unit == "B" else f"{n:.1f} {unit}"


def _age(seconds: int) -> str:
    return (
        f"{seconds // 3600} h"
        if seconds >= 3600
        else f"{seconds // 60} min"
        if seconds >= 60
        else f"{seconds} s"
    )


def shm_warnings(seen: dict[str, dict[str, Any]], cleanup: str) -> list[Problem]:
    """Stale System V shared memory (no process attached), per node: a warning, not a failure
    (a crashed run's leftovers cost memory, they do not stop training). ``cleanup`` says how
    to remove them; nothing removes them on its own."""
    warnings = []
    for node, data in sorted(seen.items()):
        stale = data.get("stale_shm") or []
        if not stale:
            continue
        listed = ", ".join(
            f"shmid {s['shmid']} ({_size(s['bytes'])}, idle {_age(s['idle_seconds'])})"
            for s in stale[:5]
        ) + (f" and {len(stale) - 5} more" if len(stale) > 5 else "")
        total = _size(sum(s["bytes"] for s in stale))
        warnings.append(
            Problem(
                "hygiene",
                node,
                f"{len(stale)} stale System V shared memory segment"
                f"{'s' if len(stale) > 1 else ''} ({total}) with no process "
                f"attached: {listed}; remove with: {cleanup}",
            )
        )
    return warnings
