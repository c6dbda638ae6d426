"""Opt-in remediation of ONE node, on request only, never part of deploy/cluster.py:
``pyinfra inventories/prod.py deploy/remediate.py --data trainfleet_remediate=<node>``.

On that node: PCIe ACS redirects turned off at every boot on the switch ports above GPUs and
NICs that the hardware check names (``trainfleet-acs.service``), and a GPU reset where the
driver asks for one (a pending row remap or page retirement, ``reset required``, a recovery
action ``Reset``): its services stopped in order, the reset, the services started in reverse,
the GPUs and the fabric checked; refused while any GPU process runs. Then both are read again
and each step reported pass or fail. The node is named and checked against the spec before any
host is touched (else exit 2); every other host does nothing.
"""

import sys

from pyinfra import host, logger
from pyinfra.context import ctx_host, ctx_state

from facts.hardware_facts import HardwareState
from facts.remediation_facts import RemediationState
from operations import remediate_ops
from runtime import inventory
from runtime.faults import name_step_faults
from runtime.gather import fact, once_per_run, prove_sudo
from trainfleet import remediation
from trainfleet.capabilities.hardware import virtual
from trainfleet.spec import EXIT_BAD_SPEC

TARGET = "trainfleet_remediate"

# The spec only (loaded by the inventory already): nothing has run on any host yet.
cluster, node = inventory.this_node()
state = ctx_state.get()
in_run = [h.data.get("trainfleet_node", h.name) for h in state.inventory.get_active_hosts()]
wanted = host.data.get(TARGET)
if problem := remediation.target_problem(wanted, [n.name for n in cluster.nodes], in_run):
    print(f"trainfleet: {TARGET}: {problem}; no host was touched", file=sys.stderr)
    raise SystemExit(EXIT_BAD_SPEC)

if node.name == wanted:
    once_per_run("step faults", name_step_faults)
    me = ctx_host.get()
    if me not in prove_sudo(state, [me]):  # this node's sudo alone: the others stay untouched
        hw = fact(HardwareState)
        now = fact(RemediationState)
        acs = remediation.acs_plan(hw, now["acs_unit"], bool(hw) and virtual(hw), now["setpci"])
        need = remediation.gpu_resets(hw)
        reset = remediation.reset_plan(need, now)
        for line in remediation.summary(node.name, acs, need, reset):
            logger.info(f"{host.print_prefix}{line}")

        remediate_ops.acs_boot_unit(
            name="PCIe ACS redirects off at boot above GPUs and NICs (trainfleet-acs.service)",
            bridges=list(acs.bridges),
            unit=acs.unit,
            found=list(acs.found),
            problems=list(acs.problems),
            skipped=acs.skipped,
            setpci=acs.setpci,
        )
        remediate_ops.gpu_reset(
            name="GPU reset where the driver asks for one (services stopped, reset, started)",
            gpus=[{"bus": g.bus, "reasons": list(g.reasons)} for g in need.gpus],
            every_gpu=need.every_gpu,
            problems=list(need.problems),
        )
        remediate_ops.verified(
            name="Remediation read again: each step pass or fail",
            bridges=list(acs.bridges),
            gpus=[g.bus for g in need.gpus],
            every_gpu=need.every_gpu,
            started=list(reset.starts),
        )
