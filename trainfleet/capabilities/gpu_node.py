"""What a GPU node's settings must be, and its observed settings as drift properties.

Plain functions over the GpuNodeState and NcclNetwork facts' data and the spec's ``gpu``
section; no pyinfra, no host. The plan (trainfleet/plan.py) calls ``gpu_part``; drift
(checks/drift_check.py) calls ``observed`` and ``expected``, so the deploy and drift judge a node by
the same rules.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from trainfleet.capabilities import nccl_env
from trainfleet.compare import digest
from trainfleet.driver_pins import driver_branch
from trainfleet.grammar import NULL, Key, Section, memlock_problem, positive_number
from trainfleet.hw.gpudirect import DMA_BUF, PEERMEM, UNKNOWN, GdrPath, gdr_path
from trainfleet.model import Cluster, Node
from trainfleet.plan_types import NodePlan, PlanContext, Sections, WantedBlocks
from trainfleet.render import render

# every property it expects is its step's (manage.gpu_node)
MANAGED = MappingProxyType({"gpu_node": ("",)})

# GPU node settings every node shares (GPU-only ones are the spec's to expect)
MAJORITY = (
    "memlock",
    "cluster MTU",
    "ib ports active",
    "ib active MTU",
    "clock sync",
    "clock offset",
    "persistence mode",
)

PEERMEM_BOOT_FILE = "/etc/modules-load.d/trainfleet-peermem.conf"  # facts/gpu_node_facts.py's

FABRIC_READY = (
    "Completed",
    "N/A",
)  # nvidia-smi -q's Fabric State once the fabric is up, or none to set up


@dataclass(frozen=True)
class FabricManagerPlan:
    package: str  # nvidia-fabricmanager-550 (Debian/Ubuntu), nvidia-fabric-manager (RHEL)
    version: str  # the driver's exact version: 550.54.15 (the package's version is 550.54.15-1)


@dataclass(frozen=True)
class GpuNodePlan:
    gpu_node: bool  # the spec gives the node GPUs
    memlock: str | None  # "unlimited" | KiB; None: unmanaged (every node, GPU or not)
    memlock_conf: str | None  # MEMLOCK_CONF's content; None: unmanaged
    persistence: bool  # nvidia-persistenced enabled and active
    fabric_manager: FabricManagerPlan | None  # None: not wanted (no NVSwitch, CPU node, or off)
    peermem: bool  # nvidia_peermem loaded now and at boot
    driver: str | None  # stack.driver on GPU nodes: a branch ("550") or an exact version
    max_clock_offset_ms: int
    problems: list[str] = field(default_factory=list)  # the parts that cannot be planned
    allow_change: bool = False  # stack.allow_change: a fabric manager at another version may move
    peermem_conf: str | None = None  # the modules-load.d file that loads it at boot (peermem)
    # GPUDirect RDMA's path on a GPU node (None: a CPU node, or its settings not read)
    gdr: GdrPath | None = None
    # trainfleet's own boot file as it wrote it, where ``auto`` no longer wants it (DMA-BUF, a
    # CPU node): removed if found unchanged; the loaded module is left alone (a job may use it)
    peermem_retired: str | None = None


def memlock_conf(value: str | int) -> str:
    return render("gpu_node/memlock.conf.j2", value=value)


def active_ports(network: Mapping[str, Any] | None) -> list[str]:
    """``mlx5_0:1`` for every InfiniBand/RoCE port in state ACTIVE."""
    return sorted(
        f"{p['device']}:{p['port']}"
        for p in (network or {}).get("ib_ports", [])
        if p.get("state", "").endswith("ACTIVE")
    )


def node_gdr(state: Mapping[str, Any] | None) -> GdrPath | None:
    """The GPUDirect RDMA path the GpuNodeState fact shows (None: the fact was not read)."""
    if state is None:
        return None
    return gdr_path(state.get("nvidia_version"), state.get("kernel"))


def gdr_expected(gpu: Mapping[str, Any], gpus: int, network: Mapping[str, Any] | None) -> bool:
    """A GPU node with an active IB/RoCE port uses GPUDirect RDMA, by DMA-BUF or nvidia_peermem
    (unless ``gpu.peermem: off``: the site manages it)."""
    return gpus > 0 and gpu.get("peermem", "auto") != "off" and bool(active_ports(network))


def peermem_wanted(
    gpu: Mapping[str, Any],
    gpus: int,
    network: Mapping[str, Any] | None,
    gdr: GdrPath | None = None,
) -> bool:
    """``gpu.peermem: on``: nvidia_peermem on every GPU node. ``auto``: on a GPU node with an
    active IB/RoCE port whose GPUDirect RDMA path is nvidia_peermem (a proprietary kernel
    module, or a kernel before 5.12); where DMA-BUF is available it is not needed."""
    setting = gpu.get("peermem", "auto")
    if gpus == 0 or setting == "off":
        return False
    if setting == "on":
        return True
    return gdr_expected(gpu, gpus, network) and gdr is not None and gdr.kind == PEERMEM


def _gdr_undecided(
    gpu: Mapping[str, Any], gpus: int, network: Mapping[str, Any] | None, gdr: GdrPath | None
) -> str | None:
    """Why ``auto`` cannot tell whether this node needs nvidia_peermem (never assumed)."""
    if gpu.get("peermem", "auto") != "auto" or not gdr_expected(gpu, gpus, network):
        return None
    if gdr is None or gdr.kind != UNKNOWN:
        return None
    return (
        f"GPUDirect RDMA: DMA-BUF or nvidia_peermem cannot be told apart here ({gdr.why}); "
        "nvidia_peermem was neither loaded nor retired: re-run once the NVIDIA driver is "
        "loaded, or set gpu.peermem to on or off"
    )


def fabric_manager_package(family: str | None, driver: str) -> str | None:
    """NVIDIA's CUDA repository names it per driver branch on apt (``nvidia-fabricmanager-550``)
    and once on dnf (``nvidia-fabric-manager``, the version selects the branch)."""
    if family == "debian":
        return f"nvidia-fabricmanager-{driver_branch(driver)}"
    if family == "rhel":
        return "nvidia-fabric-manager"
    return None


def gpu_part(
    gpu: Mapping[str, Any],
    stack: Mapping[str, Any],
    gpus: int,
    state: Mapping[str, Any] | None,
    network: Mapping[str, Any] | None,
    family: str | None,
) -> GpuNodePlan:
    """A node's GPU settings from the spec (``gpu``, ``stack.driver``), its GPU count in the
    spec and what it was found to be (GpuNodeState, NcclNetwork; None: not read)."""
    gdr = node_gdr(state) if gpus > 0 else None
    peermem = peermem_wanted(gpu, gpus, network, gdr)
    undecided = _gdr_undecided(gpu, gpus, network, gdr)
    memlock = gpu.get("memlock")
    # a version line that was read and cannot be parsed fails the node's GPU settings; no line
    # at all is a driver not loaded yet (a first deploy installs it): peermem waits, the rest
    # of the settings go ahead, and drift shows the path as unknown with why
    problems: list[str] = [undecided] if undecided and gdr and gdr.line is not None else []
    fabric = None
    gpu_node = gpus > 0
    if (
        gpu_node
        and gpu.get("fabric_manager", "auto") == "auto"
        and state
        and state.get("nvswitches")
    ):
        # exactly the running driver's version; before the first driver install, the exact pin's
        driver = state.get("driver") or (
            stack.get("driver") if "." in (stack.get("driver") or "") else None
        )
        package = fabric_manager_package(family, driver) if driver else None
        if driver is None:
            problems.append(
                "fabric manager: the node has NVSwitches but its driver version could not be read "
                "(nvidia-smi) and stack.driver is not an exact version"
            )
        elif package is None:
            problems.append(f"fabric manager: no package name for OS family {family!r}")
        else:
            fabric = FabricManagerPlan(package=package, version=driver)
    if gpu_node and state is None:
        problems.append("the node's GPU settings could not be read")
    elif (
        gpu_node and state is not None and state["smi"].startswith("refused")
    ):  # forged or damaged: nothing is taken
        problems.append(f"nvidia-smi -q -x {state['smi']}")
    return GpuNodePlan(
        gpu_node=gpu_node,
        memlock=None if memlock is None else str(memlock),
        memlock_conf=None if memlock is None else memlock_conf(memlock),
        persistence=gpu_node and bool(gpu.get("persistence", True)),
        fabric_manager=fabric,
        peermem=peermem,
        driver=stack.get("driver") if gpu_node else None,
        max_clock_offset_ms=int(gpu.get("max_clock_offset_ms", 100)),
        problems=problems,
        allow_change=bool(stack.get("allow_change", False)),
        peermem_conf=render("gpu_node/peermem.conf.j2") if peermem else None,
        gdr=gdr,
        peermem_retired=(
            render("gpu_node/peermem.conf.j2")
            if gpu.get("peermem", "auto") == "auto" and not peermem and not undecided
            else None
        ),
    )


# ---- drift properties ----------------------------------------------------------------------

UNREADABLE = "unreadable"


def _smi_unreadable(state: Mapping[str, Any]) -> str | None:
    if state["smi"] == "absent":
        return "no nvidia-smi"
    if state["smi"] != "ok":
        return f"{UNREADABLE} (nvidia-smi {state['smi']})"
    return None


def persistence_value(state: Mapping[str, Any]) -> str:
    """``on`` when every GPU reports Persistence Mode Enabled and nvidia-persistenced is
    enabled where systemd runs; else what is off."""
    if why := _smi_unreadable(state):
        return why
    if not state["gpus"]:
        return "no GPUs"
    off = [g["bus"] for g in state["gpus"] if g["persistence"] != "Enabled"]
    if off:
        return f"off on {len(off)} of {len(state['gpus'])} GPUs"
    unit = state["units"].get("nvidia-persistenced")
    if state["systemd"] and (
        unit is None or unit["enabled"] not in ("enabled", "static", "indirect")
    ):
        return "on, nvidia-persistenced not enabled (lost at reboot)"
    return "on"


def fabric_manager_value(state: Mapping[str, Any]) -> str:
    """``<version> active, held`` of the installed nvidia-fabricmanager, plus the NVLink fabric's
    state when a GPU reports it not ready; ``no NVSwitch`` on other nodes."""
    if why := _smi_unreadable(state):
        return why
    if not state["nvswitches"]:
        return "no NVSwitch"
    # the daemon's package only: a -dev/-devel package beside it is neither planned nor held
    daemon = {
        name: v
        for name, v in state["fabricmanager"].items()
        if not re.search(r"-dev(el)?(-|$)", name)
    }
    versions = sorted(v.split("-")[0] for v in daemon.values())
    unit = state["units"].get("nvidia-fabricmanager")
    parts = [
        " ".join(versions) or "not installed",
        (unit or {}).get("active", "none") if state["systemd"] else "no systemd",
        "held" if daemon and set(daemon) <= set(state["fabricmanager_held"]) else "not held",
    ]
    waiting = sorted(
        {
            g["fabric_state"] or "none"
            for g in state["gpus"]
            if g["fabric_state"] not in FABRIC_READY
        }
    )
    if waiting:
        parts.append("fabric " + "/".join(waiting))
    return ", ".join(parts)


def peermem_text(gdr: GdrPath | None, loaded: bool, at_boot: bool) -> str:
    """``loaded, at boot``; where DMA-BUF is the node's path, ``not needed (DMA-BUF)`` first
    (a module left loaded by an earlier deploy is said so, not a finding)."""
    state = ("loaded" if loaded else "not loaded") + (", at boot" if at_boot else "")
    if gdr is not None and gdr.kind == DMA_BUF:
        return "not needed (DMA-BUF)" + ("" if state == "not loaded" else f"; {state}")
    return state


def peermem_value(state: Mapping[str, Any]) -> str:
    if why := _smi_unreadable(state):
        return why
    return peermem_text(node_gdr(state), state["peermem_loaded"], bool(state["peermem_boot"]))


def gdr_value(state: Mapping[str, Any]) -> str:
    """``DMA-BUF (open kernel module, kernel X)``, ``nvidia_peermem (proprietary ...)``, or
    ``unknown (why)``."""
    gdr = node_gdr(state)
    return gdr.value() if gdr else UNREADABLE


def clock_sync_value(state: Mapping[str, Any]) -> str:
    clock = state["clock"]
    if clock["chrony"]:
        return "chrony " + (
            "synchronised"
            if clock["leap"] and clock["leap"] != "Not synchronised"
            else "not synchronised"
        )
    unit = state["units"].get("systemd-timesyncd")
    if unit and unit["active"] == "active":
        return "timesyncd " + (
            "synchronised" if clock["ntp_synchronized"] == "yes" else "not synchronised"
        )
    return "none"


def clock_offset_value(state: Mapping[str, Any], max_ms: int) -> str:
    """``within N ms`` only for a clock that is synchronised and that close: an unsynchronised
    chrony reports an offset of 0, and no sync service measures nothing (both fail)."""
    sync = clock_sync_value(state)
    if sync == "none":
        return "not synchronised (no chrony or timesyncd active)"
    if sync.endswith("not synchronised"):
        return "not synchronised"
    offset = state["clock"]["offset_ms"]
    if offset is None:
        return UNREADABLE
    return within(max_ms) if abs(offset) <= max_ms else f"{offset:+.0f} ms"


def within(max_ms: int) -> str:
    return f"within {max_ms} ms"


def mtu_values(network: Mapping[str, Any] | None, name: str | None) -> dict[str, str]:
    """The cluster interface's MTU (``name``: the interface the plan derived; None: none) and
    each IB/RoCE port's active MTU (drift compares them across nodes: one node at 1500 among
    9000s fragments or drops NCCL's traffic)."""
    if not network:
        return {
            "cluster MTU": UNREADABLE,
            "ib ports active": UNREADABLE,
            "ib active MTU": UNREADABLE,
        }
    mtu = (
        next((i.get("mtu") for i in network["interfaces"] if i["name"] == name), None)
        if name
        else None
    )
    ports = network["ib_ports"]
    active = active_ports(network)
    mtus = [
        f"{p['device']}:{p['port']} {p.get('active_mtu', UNREADABLE)}"
        for p in ports
        if f"{p['device']}:{p['port']}" in active
    ]
    # the MTU alone: nodes may name their cluster interface differently (eth0, ens1f0np0)
    return {
        "cluster MTU": str(mtu) if name and mtu else UNREADABLE,
        "ib ports active": " ".join(active) or "none",
        "ib active MTU": ", ".join(mtus) or "none",
    }


def observed(
    state: Mapping[str, Any] | None,
    network: Mapping[str, Any] | None,
    interface: str | None,
    max_clock_offset_ms: int,
) -> dict[str, str]:
    """A node's GPU-settings properties. The GPU ones only where nvidia-smi is installed (a
    CPU node has none to compare); where the spec wants them on a GPU node, ``expected`` does."""
    props = mtu_values(network, interface)
    if state is None:
        return {
            **props,
            "memlock (non-login ssh)": UNREADABLE,
            "clock sync": UNREADABLE,
            "clock offset": UNREADABLE,
        }
    props["memlock (non-login ssh)"] = state["memlock"] or UNREADABLE
    props["memlock file"] = digest(state["memlock_conf"])
    props["memlock set elsewhere"] = "; ".join(state.get("memlock_other") or []) or "none"
    props["clock sync"] = clock_sync_value(state)
    props["clock offset"] = clock_offset_value(state, max_clock_offset_ms)
    props["nvidia_peermem file"] = digest(state.get("peermem_conf"))
    if state["smi"] != "absent":
        props["persistence mode"] = persistence_value(state)
        props["fabric manager"] = fabric_manager_value(state)
        props["nvidia_peermem"] = peermem_value(state)
        props["GPUDirect RDMA"] = gdr_value(state)
    return props


def expected(plan: GpuNodePlan) -> dict[str, str]:
    """What the node's properties must be, from its plan: memlock on every node where managed;
    GPU settings, clock sync and offset on GPU nodes only."""
    props: dict[str, str] = {}
    if plan.memlock is not None:
        props["memlock (non-login ssh)"] = plan.memlock
        props["memlock file"] = digest(plan.memlock_conf)
        props["memlock set elsewhere"] = (
            "none"  # another file's line could override ours for the ranks
        )
    if plan.peermem:
        props["nvidia_peermem file"] = digest(plan.peermem_conf)
    elif plan.peermem_retired is not None:
        props["nvidia_peermem file"] = digest(None)  # trainfleet's own file, retired
    if not plan.gpu_node:
        return props
    props["clock offset"] = within(plan.max_clock_offset_ms)
    if plan.persistence:
        props["persistence mode"] = "on"
    if plan.fabric_manager:
        props["fabric manager"] = f"{plan.fabric_manager.version}, active, held"
    if plan.peermem:
        props["nvidia_peermem"] = peermem_text(plan.gdr, True, True)
    return props


# ---- the capability ------------------------------------------------------------------------


def deploy_sections(users: list[str], blocks: WantedBlocks) -> Sections:
    return {"gpu_node": ("GpuNodeState", {})}


def part(plan: NodePlan) -> GpuNodePlan:
    """This capability's part of a node's plan (typed)."""
    return plan.parts.get_as("gpu_node", GpuNodePlan)


def plan_part(ctx: PlanContext, node: Node) -> GpuNodePlan:
    cluster, gathered = ctx.cluster, ctx.gathered
    return gpu_part(
        cluster.gpu,
        cluster.stack,
        node.gpus,
        gathered.gpu_nodes.get(node.name),
        gathered.networks.get(node.name),
        gathered.os_families.get(node.name),
    )


def observe(fp: dict[str, Any], plan: NodePlan, cluster: Cluster) -> dict[str, str]:
    props = observed(
        fp.get("gpu_node"),
        fp.get("network"),
        nccl_env.part(plan).interface,  # the cluster interface, as the plan derived it
        cluster.gpu.get("max_clock_offset_ms", 100),
    )
    props["GPU settings plan"] = "; ".join(part(plan).problems) or "ok"
    return props


def expect(plan: NodePlan) -> dict[str, str]:
    # a part that cannot be planned (fabric manager) is left out; its problems show as the
    # plan property's value
    return {**expected(part(plan)), "GPU settings plan": "ok"}


def converged(plan: NodePlan) -> dict[str, Any]:
    """The planned settings in force: memlock, persistence, the fabric manager held and
    active, nvidia_peermem loaded, the clock synchronised by chrony. A CPU node: the planned
    memlock limit, and none of the rest (no NVIDIA tool or unit, no clock service asked for)."""
    gpu = part(plan)
    fabric = gpu.fabric_manager
    enabled = {"enabled": "enabled", "active": "active"}
    memlock: dict[str, Any] = {
        "memlock": gpu.memlock,
        "memlock_hard": gpu.memlock,
        "memlock_conf": gpu.memlock_conf,
        "memlock_other": [],
    }
    if not gpu.gpu_node:
        return {
            "gpu_node": {
                "smi": "absent",
                "driver": None,
                "gpus": [],
                "nvswitches": [],
                "systemd": False,
                "units": {},
                "fabricmanager": {},
                "fabricmanager_held": [],
                "peermem_loaded": False,
                "peermem_boot": [],
                **memlock,
                "peermem_conf": None,
                "nvidia_version": None,
                "kernel": None,
                "clock": {
                    "chrony": False,
                    "leap": None,
                    "ntp_synchronized": None,
                    "offset_ms": None,
                },
            }
        }
    return {
        "gpu_node": {
            "smi": "ok" if gpu.gpu_node else "absent",
            "driver": gpu.driver if gpu.gpu_node else None,
            "gpus": [
                {"bus": f"00000000:{i:02x}:00.0", "persistence": "Enabled", "fabric_state": "N/A"}
                for i in range(plan.node.gpus)
            ],
            "nvswitches": ["0000:05:00.0"] if fabric else [],
            "systemd": True,
            "units": {"nvidia-persistenced": enabled, "nvidia-fabricmanager": enabled},
            "fabricmanager": {fabric.package: f"{fabric.version}-1"} if fabric else {},
            "fabricmanager_held": [fabric.package] if fabric else [],
            "peermem_loaded": gpu.peermem,
            "peermem_boot": [PEERMEM_BOOT_FILE] if gpu.peermem else [],
            **memlock,
            "peermem_conf": gpu.peermem_conf,
            "nvidia_version": gpu.gdr.line if gpu.gdr else None,
            "kernel": gpu.gdr.kernel if gpu.gdr else None,
            "clock": {
                "chrony": True,
                "leap": "Normal",
                "ntp_synchronized": "yes",
                "offset_ms": 0.0,
            },
        }
    }


# The spec's section: `gpu` (trainfleet/schema.py composes the spec)

GPU = Section(
    doc="Node settings multi-node GPU jobs depend on; set where the node has GPUs (`memlock`: "
    "every node).",
    keys={
        "persistence": Key(
            bool,
            True,
            "`nvidia-persistenced` enabled and active: the driver stays loaded between jobs "
            "(`nvidia-smi -q`: Persistence Mode Enabled).",
            accepts="`true`, `false` (unmanaged)",
        ),
        "fabric_manager": Key(
            str,
            "auto",
            "`auto`: a node whose GPUs sit on NVSwitches gets `nvidia-fabricmanager` at exactly "
            "the driver's version, active (a mismatch is CUDA error 802); `off`: unmanaged.",
            check=lambda v: None if v in ("auto", "off") else f"{v!r} must be 'auto' or 'off'",
            accepts="`auto`, `off`",
        ),
        "peermem": Key(
            str,
            "auto",
            "`auto`: a GPU node with active InfiniBand/RoCE whose GPUDirect RDMA needs it (a "
            "proprietary NVIDIA kernel module, or a kernel before 5.12) loads `nvidia_peermem` now "
            "and at boot; with the open kernel module on Linux 5.12 or later NCCL uses DMA-BUF "
            "and it is not needed (trainfleet's boot file is removed, a loaded module left "
            "alone); `on`: loaded on every GPU node; `off`: unmanaged.",
            check=lambda v: (
                None if v in ("auto", "on", "off") else f"{v!r} must be 'auto', 'on' or 'off'"
            ),
            accepts="`auto`, `on`, `off`",
        ),
        "memlock": Key(
            (str, int, NULL),
            "unlimited",
            "Locked-memory limit of every session (`/etc/security/limits.d`), as a non-login ssh "
            "session's `ulimit -l` shows it; too low and `ibv_reg_mr` fails. null: unmanaged.",
            check=memlock_problem,
            accepts="`unlimited`, or KiB (64 or more)",
        ),
        "max_clock_offset_ms": Key(
            int,
            100,
            "Largest clock offset a node may report (chrony/timesyncd), and spread "
            "between nodes' clocks the preflight accepts.",
            check=positive_number,
            accepts="1 or more",
        ),
    },
)
