"""Opt-in remediation of one node (deploy/remediate.py; never part of deploy/cluster.py): PCIe
ACS redirects off at every boot on the switch ports above GPUs and NICs, a GPU reset where the
driver asks for one, and both read again afterwards.

The plan comes from trainfleet/remediation.py (plain data); these operations read the
RemediationState fact (services, GPU processes, the unit file) and yield only what must change,
else ``host.noop``. A refusal fails the node with its reason before anything on it changes.
"""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import StringCommand, operation

from facts.gpu_node_facts import SMI_TIMEOUT
from facts.hardware_facts import HardwareState
from facts.remediation_facts import RemediationState, RemediationStateT
from facts.shell import shell
from facts.stack_facts import GPU_PIDS
from operations.remote import fail_command, script, write_file_command
from runtime.gather import fact
from trainfleet import remediation
from trainfleet.defaults import ACS_UNIT, ACS_UNIT_PATH, SETPCI
from trainfleet.remediation import ACS_MASK, GpuReset, ResetNeed

FABRIC_WAIT = 180  # seconds the fabric manager may take to build the fabric after a reset
_RESET = GPU_PIDS + script("remediation_reset.sh")
_ACS_CHECK = script("remediation_acs_check.sh")


def _state() -> RemediationStateT:
    return fact(RemediationState)


@operation()
def acs_boot_unit(
    bridges: list[str],
    unit: str | None = None,
    found: list[str] | None = None,
    problems: list[str] | None = None,
    skipped: str = "",
    setpci: str = "",
):
    """
    ``trainfleet-acs.service``: a oneshot unit that clears the ACS redirect bits (SrcValid,
    ReqRedir, CmpltRedir) of each bridge at every boot, before the GPU's services; written,
    enabled and run now, then each bridge's ACS Control register read back.

    + bridges: the plan's bridges (``trainfleet.remediation.acs_plan``)
    + unit: the unit file for them, as the plan rendered it (``AcsPlan.unit``,
      ``trainfleet.remediation.acs_unit_text``): written as given
    + found: the hardware check's findings now (a unit in place while ACS is on runs again)
    + problems: why ACS could not be judged: the node fails, nothing changed
    + skipped: why nothing here is the node's to change (a virtual machine)
    + setpci: its absolute path on the node (the remediation fact's), to read the ports back
    """
    if problems:
        yield fail_command("ACS: " + "; ".join(problems))
        return
    if skipped:
        host.noop(f"ACS left alone: {skipped}")
        return
    if bad := remediation.bad_bdfs(bridges):
        yield fail_command(f"ACS: not PCI addresses: {bad!r}")
        return
    if bridges and (unit is None or remediation.unit_bridges(unit) != sorted(set(bridges))):
        yield fail_command("ACS: the unit given does not list exactly the planned bridges")
        return
    if bridges and setpci not in SETPCI:
        yield fail_command(f"ACS: setpci at {setpci[:80]!r} is not one of its known paths")
        return
    state = _state()
    if not bridges:
        host.noop(
            "no PCIe switch port above a GPU or NIC redirects peer-to-peer (ACS): nothing to do"
            if state["acs_unit"] is None
            else f"{ACS_UNIT_PATH} lists no port of this node now: left as it is"
        )
        return
    if not state["systemd"]:
        yield fail_command("ACS: systemd is not running on this node (no boot unit possible)")
        return
    service = state["units"].get(ACS_UNIT) or {"enabled": "none", "active": "none"}
    commands: list[StringCommand] = []
    written = state["acs_unit"] != unit
    if written:
        commands += [
            write_file_command(ACS_UNIT_PATH, unit),
            StringCommand("systemctl", "daemon-reload"),
        ]
    if service["enabled"] != "enabled":
        commands.append(StringCommand("systemctl", "enable", f"{ACS_UNIT}.service"))
    if written or service["active"] != "active" or found:  # found: on again since the unit ran
        commands.append(StringCommand("systemctl", "restart", f"{ACS_UNIT}.service"))
        commands.append(shell(_ACS_CHECK, ACS_MASK, setpci, *sorted(set(bridges))))
    if not commands:
        host.noop(f"{ACS_UNIT}.service clears ACS on {len(set(bridges))} ports at boot, and ran")
        return
    yield from commands


@operation()
def gpu_reset(gpus: list[dict], every_gpu: bool = False, problems: list[str] | None = None):
    """
    Reset the GPUs whose driver asks for it, as ONE script on the node: the GPU processes listed
    again (any: nothing is stopped), nvidia-persistenced, DCGM and the fabric manager stopped in
    that order (those running), the GPU processes listed once more (any, or unreadable: the
    services started again, nothing reset), ``nvidia-smi -r`` (every GPU in one command on an
    NVSwitch system, as nvidia-smi's manual requires with the fabric manager stopped; else
    ``-i`` per GPU), the services started in reverse, then no GPU may ask for a reset and every
    fabric must be Completed/Success. The first failure stops it, printing what is stopped and
    what reset; before any GPU is reset it first starts again what it stopped.

    + gpus: ``[{"bus": "00000000:18:00.0", "reasons": ["row remap pending"]}]``
      (``trainfleet.remediation.gpu_resets``)
    + every_gpu: an NVSwitch system
    + problems: why no reset is possible (a GPU needs a reboot, nvidia-smi unreadable)
    """
    need = ResetNeed(
        gpus=tuple(GpuReset(bus=g["bus"], reasons=tuple(g["reasons"])) for g in gpus),
        every_gpu=every_gpu,
        problems=tuple(problems or ()),
    )
    if need.problems:  # nothing read: a reset cannot fix what these say
        yield fail_command("GPU reset refused, nothing stopped: " + "; ".join(need.problems))
        return
    if not need.gpus:
        host.noop("no GPU asks for a reset")
        return
    plan = remediation.reset_plan(need, _state())
    if plan.refusals:
        yield fail_command("GPU reset refused, nothing stopped: " + "; ".join(plan.refusals))
        return
    buses = [g.bus for g in need.gpus]
    if bad := remediation.bad_gpu_buses(buses) + remediation.bad_units(plan.stops):
        yield fail_command(f"GPU reset: values outside their grammar: {bad!r}")
        return
    for g in need.gpus:
        logger.info(f"{host.print_prefix}GPU {g.bus} is reset: {', '.join(g.reasons)}")
    yield shell(
        _RESET,
        "all" if need.every_gpu else "each",
        SMI_TIMEOUT,
        ",".join(buses),
        FABRIC_WAIT,
        *plan.stops,
    )


@operation()
def verified(
    bridges: list[str], gpus: list[str], every_gpu: bool = False, started: list[str] | None = None
):
    """
    After the changes run: the hardware and the services read again (HardwareState,
    RemediationState), each remediated step reported pass or fail; a failure fails the node.
    Nothing is changed. Before the run (pyinfra's plan, ``--dry``) it reads nothing.

    + bridges: the ACS unit's bridges; gpus: the GPUs reset (nvidia-smi's addresses)
    + every_gpu: an NVSwitch system (every GPU's fabric checked)
    + started: the services the reset stopped and started again
    """
    if not (bridges or gpus):
        host.noop("nothing was remediated: nothing to verify")
        return
    if not host.state.is_executing:
        host.noop("read again once the remediation has run")
        return
    checks = remediation.verify(
        fact(HardwareState), _state(), bridges, gpus, every_gpu, started or []
    )
    for check in checks:
        logger.info(f"{host.print_prefix}{check}")
    failed = [str(c) for c in checks if not c.ok]
    if failed:
        yield fail_command("remediation not verified: " + "; ".join(failed))
        return
    host.noop(f"verified: {len(checks)} checks pass")
