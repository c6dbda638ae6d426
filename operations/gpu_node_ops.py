"""GPU node settings: the locked-memory limit (every node), persistence mode, the NVSwitch
fabric manager at exactly the driver's version (held), nvidia_peermem now and at boot.

Each operation reads the GpuNodeState fact (the one-command bundle) and yields only what must
change; ``settings`` composes them for deploy/cluster.py, a refused part failing the node
before anything on it changes.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import StringCommand, operation

from facts.gpu_node_facts import MEMLOCK_CONF, PEERMEM_CONF, GpuNodeState, GpuNodeStateT
from facts.stack_facts import StackVersions
from operations.packages_ops import install_held, package_change
from operations.remote import FailCommand, fail_command, write_file_command
from operations.stack_ops import held_under_a_job
from runtime.gather import fact
from trainfleet.capabilities.gpu_node import FabricManagerPlan, GpuNodePlan
from trainfleet.defaults import VENV_DIR


def _state() -> GpuNodeStateT:
    return fact(GpuNodeState)


def _systemd_missing(state: GpuNodeStateT, what: str) -> StringCommand | None:
    if state["systemd"]:
        return None
    return fail_command(
        f"{what}: systemd is not running on this node (the service cannot be enabled)"
    )


@operation()
def memlock(conf: str | None):
    """
    The locked-memory limit of every pam session:
    ``/etc/security/limits.d/90-trainfleet-memlock.conf``.

    + conf: the file's content (the plan renders templates/gpu_node/memlock.conf.j2);
      None: unmanaged

    **Example:**

    .. code:: python

        gpu_node.memlock(name="memlock unlimited", conf=plan.gpu_node.memlock_conf)
    """
    if conf is None:
        host.noop("memlock is unmanaged (gpu.memlock: null)")
        return
    if _state()["memlock_conf"] == conf:
        host.noop(f"{MEMLOCK_CONF} is in place")
        return
    yield write_file_command(MEMLOCK_CONF, conf)


STARTED_AT_BOOT = ("enabled", "static", "indirect")  # static: started by udev, as Ubuntu's unit is


@operation()
def persistence(wanted: bool):
    """
    Persistence mode on every GPU: ``nvidia-persistenced`` enabled and running (the driver stays
    initialised between jobs; NVIDIA's supported way, not ``nvidia-smi -pm 1``).

    + wanted: the plan's ``gpu.persistence`` (GPU nodes only)
    """
    if not wanted:
        host.noop("persistence mode is not managed here")
        return
    state = _state()
    if missing := _systemd_missing(state, "persistence"):
        yield missing
        return
    unit = state["units"].get("nvidia-persistenced") or {"enabled": "none", "active": "none"}
    gpus_on = bool(state["gpus"]) and all(g["persistence"] == "Enabled" for g in state["gpus"])
    at_boot = unit["enabled"] in STARTED_AT_BOOT
    if at_boot and unit["active"] == "active" and gpus_on:
        host.noop("nvidia-persistenced is enabled and every GPU is in persistence mode")
        return
    if unit["enabled"] == "static":  # Ubuntu's packaging: udev starts it; nothing to enable
        if unit["active"] != "active":
            yield StringCommand("systemctl", "start", "nvidia-persistenced")
    elif not at_boot or unit["active"] != "active":
        yield StringCommand("systemctl", "enable", "--now", "nvidia-persistenced")
    if not gpus_on:
        # A daemon started with --no-persistence-mode (Ubuntu's unit) leaves GPUs off; asked
        # through nvidia-smi, the running daemon turns persistence on (lost at its restart:
        # drift then shows it, and the next deploy sets it again).
        yield StringCommand("nvidia-smi", "-pm", "1")


@operation()
def peermem(conf: str | None, retired: str | None = None):
    """
    GPUDirect RDMA: ``nvidia_peermem`` loaded now (``modprobe``) and at boot
    (``/etc/modules-load.d/trainfleet-peermem.conf``, unless another file already loads it).

    + conf: the modules-load.d file's content as the plan rendered it (a GPU node with an active
      InfiniBand/RoCE port and no DMA-BUF, or ``gpu.peermem: on``); None: not wanted
    + retired: where ``auto`` no longer wants it (DMA-BUF available, a CPU node): the content
      trainfleet wrote; its file is removed if found unchanged (an edited one is left, and
      drift names it). A loaded module is never unloaded: a running job may use it.
    """
    state = _state()
    if conf is None:
        found = state.get("peermem_conf")
        if retired is None or found is None:
            host.noop("nvidia_peermem is not wanted here")
        elif found != retired:
            host.noop(f"{PEERMEM_CONF} was edited by hand: left in place")
        else:
            yield StringCommand("rm", "-f", "--", PEERMEM_CONF)
        return
    commands = []
    if not state["peermem_boot"]:
        commands.append(write_file_command(PEERMEM_CONF, conf))
    if not state["peermem_loaded"]:
        commands.append(StringCommand("modprobe", "nvidia_peermem"))
    if not commands:
        host.noop("nvidia_peermem is loaded and loads at boot")
        return
    yield from commands


def _same_release(installed: str, pin: str) -> bool:
    """The driver's version, whatever the package release (``565.57.01-2`` is ``565.57.01``)."""
    return installed.split("-")[0] == pin.split("-")[0]


@operation()
def fabric_manager(package: str | None, version: str | None = None, allow_change: bool = False):
    """
    NVSwitch systems: the fabric manager package at exactly the driver's version, held
    (``apt-mark hold``, ``dnf versionlock``), and ``nvidia-fabricmanager`` enabled and running.
    A fabric manager of another version than the driver is CUDA error 802 or a hang at the
    first collective.

    + package: ``nvidia-fabricmanager-550`` (apt) or ``nvidia-fabric-manager`` (dnf/yum);
      None: not wanted
    + version: the driver's exact version, e.g. ``550.54.15``
    + allow_change: replace an installed fabric manager of another version
      (as ``stack.allow_change``)
    """
    if package is None or version is None:
        host.noop("no fabric manager wanted (no NVSwitch, or gpu.fabric_manager: off)")
        return
    want = FabricManagerPlan(package=package, version=version)
    state = _state()
    stack_now = fact(StackVersions, venv=VENV_DIR)
    os_ = stack_now["os"]
    if os_["package_manager"] is None:
        yield fail_command(f"fabric manager: unsupported OS {os_['id']!r}")
        return
    if missing := _systemd_missing(state, "fabric manager"):
        yield missing
        return
    have = state["fabricmanager"].get(want.package)
    others = {name: v for name, v in state["fabricmanager"].items() if name != want.package}
    wrong = [
        f"{name} {v}"
        for name, v in sorted({**others, **({want.package: have} if have else {})}.items())
        if v.split("-")[0] != want.version
    ]
    if wrong and not allow_change:
        yield fail_command(
            f"fabric manager: {', '.join(wrong)} installed, the driver is {want.version}; "
            "not changing it (set stack.allow_change to replace)"
        )
        return
    # NVIDIA's CUDA repository releases the fabric manager as <driver version>-1.
    wanted = {want.package: f"{want.version}-1"}
    installed = {want.package: have} if have else {}
    change = package_change(wanted, installed, state["fabricmanager_held"], same=_same_release)
    install = bool(change.install)
    commands = install_held(
        os_,
        wanted,
        change,
        failure="fabric manager: not at the driver's version",
        replacing=bool(wrong),
        lock_plugin=False,
    )
    if install and held_under_a_job(
        stack_now, [f"{want.package} {want.version} (and its restart)"]
    ):  # a fabric manager restarted under NVSwitch jobs breaks them
        host.noop(f"held back under a running job: {want.package} {want.version}")
        return
    unit = state["units"].get("nvidia-fabricmanager") or {"enabled": "none", "active": "none"}
    if install:  # a running fabric manager of the old version must not stay in charge
        commands.append(
            StringCommand(
                "systemctl",
                "enable",
                "nvidia-fabricmanager",
                "&&",
                "systemctl",
                "restart",
                "nvidia-fabricmanager",
            )
        )
    elif unit["enabled"] != "enabled" or unit["active"] != "active":
        commands.append(StringCommand("systemctl", "enable", "--now", "nvidia-fabricmanager"))
    if not commands:
        host.noop(f"{want.package} {want.version} is installed, held and active")
        return
    yield from commands


@operation()
def settings(gpu: GpuNodePlan):
    """
    The node's GPU settings from its plan's ``gpu_node`` part
    (``trainfleet.capabilities.gpu_node.GpuNodePlan``): memlock (every node), persistence mode,
    the fabric manager, nvidia_peermem. A part the plan could not make, or one refused here,
    fails the node before anything on it changes.

    (``gpu.allow_change``: the stack's, a fabric manager at another version may move)
    """
    if gpu.problems:
        yield fail_command("GPU node settings: " + "; ".join(gpu.problems))
        return
    fabric = gpu.fabric_manager
    commands = [
        *memlock._inner(conf=gpu.memlock_conf),
        *persistence._inner(wanted=gpu.persistence),
        *fabric_manager._inner(
            package=fabric.package if fabric else None,
            version=fabric.version if fabric else None,
            allow_change=gpu.allow_change,
        ),
        *peermem._inner(conf=gpu.peermem_conf, retired=gpu.peermem_retired),
    ]
    refusals = [c for c in commands if isinstance(c, FailCommand)]
    if refusals:
        yield refusals[0]
        return
    if not commands:
        host.noop("GPU node settings are in place")
        return
    yield from commands
