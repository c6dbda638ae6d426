"""Opt-in remediation (deploy/remediate.py): the pure plan over real captures with one line
changed per fault (tests/fixtures/remediation/README.md), the operations against fact data
(pyinfra-testing fixtures), and the reset script run over stub tools that print real output."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

from facts import remediation_facts
from facts.remediation_facts import RemediationState
from operations import remediate_ops
from tests.unit.test_hardware import (
    H100,
    HGX_LSPCI,
    HW,
    bare_metal_hgx,
    change_in_block,
    live_read,
    read,
)
from trainfleet import remediation
from trainfleet.capabilities import hardware
from trainfleet.hw.sources import read_hardware

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "remediation"
BUSY_APPS = HW / "h100_preflight" / "nvidia-smi-query-compute-apps_busy.csv"

TestAcsBootUnit = make_operation_tests(
    "operations", "remediate_ops.acs_boot_unit", FIXTURES / "acs_boot_unit"
)
TestGpuReset = make_operation_tests("operations", "remediate_ops.gpu_reset", FIXTURES / "gpu_reset")
TestVerified = make_operation_tests("operations", "remediate_ops.verified", FIXTURES / "verified")

# gpud's HGX H100: every ACSCtl above its GPUs and NICs reads all off; its PMC-Sierra ports
# above the NVSwitches (82:00.0..82:03.0) read this line, which a fault moves above GPU 19:00.0.
ACS_OFF = "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
ACS_ON = "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
PORT = "0000:17:01.0"  # the PEX890xx downstream port above GPU 0000:19:00.0
# where Debian's pciutils (bookworm, 1:3.9.0-4) installs setpci: its package's file list
SETPCI = "/usr/bin/setpci"


def hgx(acs_on_at: str | None = "17:01.0") -> dict:
    text = read(HGX_LSPCI)
    return bare_metal_hgx(change_in_block(text, acs_on_at, ACS_OFF, ACS_ON) if acs_on_at else text)


def gpus_of(xml: Path, lspci_text: str | None = None) -> dict:
    """The GPUs of ``xml``, beside an lspci -vvv (default: the H100 VM's own, no NVSwitch)."""
    files = {
        "nvidia-smi-q.xml": read(xml),
        "lspci-vvv.txt": lspci_text or read(H100 / "lspci-vvv.txt"),
    }
    return read_hardware({name: "ok" for name in files}, files)


def state(active: tuple[str, ...] = remediation.GPU_USERS, **changes) -> dict:
    units = {
        u: {"enabled": "enabled", "active": "active" if u in active else "inactive"}
        for u in remediation.UNITS
    }
    return {
        "gpu_pids": [],
        "gpu_pids_unknown": False,
        "systemd": True,
        "units": units,
        "acs_unit": None,
    } | changes


def busy_pid() -> int:
    """The pid the lent H100's nvidia-smi --query-compute-apps printed while a job held it."""
    return int(BUSY_APPS.read_text().split(",")[0])


# ---- ACS: the plan ---------------------------------------------------------------------------


def test_acs_plans_exactly_the_port_the_hardware_check_names():
    hw = hgx()
    assert hardware.observed(hw)["PCIe ACS above GPUs/NICs"] == (
        f"{PORT} above 0000:19:00.0: SrcValid ReqRedir CmpltRedir"
    )
    plan = remediation.acs_plan(hw, None, hardware.virtual(hw), SETPCI)
    assert plan.bridges == (PORT,)
    assert plan.found == (f"{PORT} above 0000:19:00.0: SrcValid ReqRedir CmpltRedir",)
    assert (plan.problems, plan.skipped) == ((), "")


def test_a_converged_node_plans_the_same_unit_again():
    fixed = remediation.acs_unit_text([PORT], SETPCI)
    plan = remediation.acs_plan(hgx(acs_on_at=None), fixed, False, SETPCI)  # the port reads off now
    assert plan.found == () and plan.bridges == (PORT,)
    assert remediation.acs_unit_text(list(plan.bridges), SETPCI) == fixed
    assert plan.unit == fixed  # the plan renders the file; the operation writes what it is given


def test_nothing_found_and_no_unit_plans_nothing():
    hw = hgx(acs_on_at=None)
    assert remediation.acs_plan(hw, None, False, SETPCI) == remediation.AcsPlan()
    assert (
        "nothing needs doing on node1"
        in remediation.summary(
            "node1", remediation.AcsPlan(), remediation.gpu_resets(hw), remediation.ResetPlan()
        )[-1]
    )


def test_a_unit_port_no_longer_above_a_gpu_or_nic_is_dropped():
    # 82:00.0 has ACS on, but above the NVSwitches: the check does not judge it, nor the unit
    unit = remediation.acs_unit_text([PORT, "0000:82:00.0"], SETPCI)
    plan = remediation.acs_plan(hgx(acs_on_at=None), unit, False, SETPCI)
    assert plan.bridges == (PORT,)


def test_a_virtual_machine_and_an_unreadable_lspci_change_nothing():
    vm = live_read()  # the lent H100, a KVM guest, read by the hardware fact's own command
    assert remediation.acs_plan(vm, None, hardware.virtual(vm), SETPCI).skipped.startswith(
        "a virtual"
    )
    hw = hgx() | {"pci": None, "problems": {"lspci-vvv.txt": "exit 1"}}
    assert remediation.acs_plan(hw, None, False, SETPCI).problems == (
        "lspci -vvv unreadable (exit 1): ACS left alone",
    )


def test_the_unit_clears_only_the_redirect_bits_of_each_port_and_refuses_other_text():
    text = remediation.acs_unit_text([PORT, PORT], SETPCI)
    assert text.count("ExecStart=") == 1
    assert (
        f"ExecStart=/bin/sh -c 'if [ /sys/bus/pci/devices/{PORT}/driver -ef "
        '/sys/bus/pci/drivers/vfio-pci ]; then echo "trainfleet-acs: '
        f'{PORT} is bound to vfio-pci: left alone"; else exec /usr/bin/setpci -s {PORT} '
        "ECAP_ACS+0x6.w=0000:000d; fi'\n"
    ) in text
    assert "Type=oneshot" in text and "WantedBy=multi-user.target" in text
    assert remediation.unit_bridges(text) == [PORT]
    for bad in ("0000:17:01.0 ; reboot", "17:01.0", "0000:17:01.0\nExecStart=/bin/sh", ""):
        with pytest.raises(ValueError):
            remediation.acs_unit_text([bad], SETPCI)
    for path in ("setpci", "/tmp/setpci", "/usr/bin/setpci; reboot", ""):  # never a PATH lookup
        with pytest.raises(ValueError, match="not one of"):
            remediation.acs_unit_text([PORT], path)


def _exec_start(text: str, sysfs: Path) -> str:
    """The unit's one ExecStart command, its sysfs paths under ``sysfs`` (a tree of links as
    the kernel lays them out) and setpci a stub that says what it was asked."""
    (line,) = [x for x in text.splitlines() if x.startswith("ExecStart=")]
    command = line.removeprefix("ExecStart=/bin/sh -c '").removesuffix("'")
    return command.replace("/sys/", f"{sysfs}/sys/").replace(SETPCI, "echo setpci")


@pytest.mark.parametrize(
    ("driver", "said"),
    [
        ("vfio-pci", f"trainfleet-acs: {PORT} is bound to vfio-pci: left alone"),
        ("pcieport", f"setpci -s {PORT} ECAP_ACS+0x6.w=0000:000d"),
        (None, f"setpci -s {PORT} ECAP_ACS+0x6.w=0000:000d"),
    ],
)
def test_at_boot_the_unit_leaves_a_port_bound_to_vfio_pci_alone(driver, said, tmp_path):
    """The unit's ExecStart run by /bin/sh: the port's driver link read at boot, as sysfs lays
    it out (bus/pci/devices/<bdf> -> ../../../devices/pci0000:00/<bdf>, whose driver ->
    ../../../bus/pci/drivers/<name>)."""
    sys_ = tmp_path / "sys"
    for name in ("vfio-pci", "pcieport"):
        (sys_ / "bus" / "pci" / "drivers" / name).mkdir(parents=True)
    device = sys_ / "devices" / "pci0000:00" / PORT
    device.mkdir(parents=True)
    (sys_ / "bus" / "pci" / "devices").mkdir()
    (sys_ / "bus" / "pci" / "devices" / PORT).symlink_to(f"../../../devices/pci0000:00/{PORT}")
    if driver:
        (device / "driver").symlink_to(f"../../../bus/pci/drivers/{driver}")
    command = _exec_start(remediation.acs_unit_text([PORT], SETPCI), tmp_path)
    run = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=10)
    assert (run.returncode, run.stdout.strip()) == (0, said)


def test_a_port_bound_to_vfio_pci_is_not_planned_and_no_setpci_is_a_problem():
    hw = hgx()
    guest = [dict(d, driver="vfio-pci") if d["address"] == PORT else d for d in hw["pci"]]
    plan = remediation.acs_plan(hw | {"pci": guest}, None, False, SETPCI)
    assert plan.bridges == () and plan.found == ()
    assert plan.left == (f"{PORT} is bound to vfio-pci (a virtual machine's): left alone",)
    missing = remediation.acs_plan(hw, None, False, None)
    assert missing.bridges == () and missing.problems == (
        "setpci not found as root's own file at /usr/bin/setpci, /usr/sbin/setpci, "
        "/sbin/setpci, /bin/setpci (pciutils): ACS left alone",
    )
    assert remediation.acs_plan(hgx(acs_on_at=None), None, False, None) == remediation.AcsPlan()


def test_a_port_address_outside_the_grammar_fails_the_plan_and_renders_no_unit():
    """The plan renders the unit now: a port lspci named outside the PCI address grammar is a
    problem (the node fails, named), never an exception in the middle of the run."""
    hw = hgx()
    for device in hw["pci"]:
        if device["address"] == PORT:
            device["address"] = f"{PORT} $(reboot)"
    plan = remediation.acs_plan(hw, None, False, SETPCI)
    assert plan.bridges == () and plan.unit is None
    assert plan.problems == (f"not PCI addresses: {[f'{PORT} $(reboot)']!r}",)


def test_a_unit_an_earlier_release_wrote_is_read_and_rewritten_with_setpcis_path():
    earlier = f"ExecStart=setpci -s {PORT} ECAP_ACS+0x6.w=0000:000d\n"  # setpci by bare name
    assert remediation.unit_bridges(earlier) == [PORT]
    plan = remediation.acs_plan(hgx(acs_on_at=None), earlier, False, SETPCI)
    assert plan.bridges == (PORT,)
    assert plan.unit == remediation.acs_unit_text(list(plan.bridges), plan.setpci) != earlier


# ---- the GPU reset: the plan -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("xml", "reasons"),
    [
        ("nvidia-smi-q-x_h100_row-remap-pending.xml", ("row remap pending",)),
        ("nvidia-smi-q-x_h100_recovery-reset.xml", ("recovery action Reset",)),
        ("nvidia-smi-q-x_a100_reset-required.xml", ("reset required",)),
    ],
)
def test_a_gpu_is_reset_in_the_drivers_own_words(xml, reasons):
    need = remediation.gpu_resets(gpus_of(FIXTURES / xml))
    assert [g.reasons for g in need.gpus] == [reasons]
    assert need.problems == () and need.every_gpu is False  # the H100 VM: no NVSwitch


def test_on_an_nvswitch_system_every_gpu_is_reset_together():
    hw = gpus_of(FIXTURES / "nvidia-smi-q-x_h100_row-remap-pending.xml", read(HGX_LSPCI))
    assert remediation.gpu_resets(hw).every_gpu is True


def test_a_process_name_asking_for_a_reset_plans_none():
    # the busy H100's own XML, its process name closing the list and adding a
    # <gpu_reset_status> that asks for a reset (a v13 driver prints none): read as the H100 is
    forged = gpus_of(FIXTURES / "nvidia-smi-q-x_h100-busy_forged-name-reset.xml")
    assert forged["gpus"] == gpus_of(HW / "h100_preflight" / "nvidia-smi-q-x_busy.xml")["gpus"]
    assert remediation.gpu_resets(forged) == remediation.ResetNeed()


def test_healthy_gpus_and_a_gpu_that_needs_a_reboot_reset_nothing():
    assert remediation.gpu_resets(gpus_of(H100 / "nvidia-smi-q.xml")) == remediation.ResetNeed()
    need = remediation.gpu_resets(gpus_of(FIXTURES / "nvidia-smi-q-x_h100_recovery-reboot.xml"))
    assert need.gpus == () and need.problems == (
        "GPU 00000000:00:06.0: recovery action Reboot, not a reset",
    )


NEED = remediation.ResetNeed(
    gpus=(remediation.GpuReset("00000000:00:06.0", ("row remap pending",)),)
)
EVERY = remediation.ResetNeed(gpus=NEED.gpus, every_gpu=True)


def test_users_stop_in_order_and_start_in_reverse():
    plan = remediation.reset_plan(EVERY, state())
    assert plan.stops == ("nvidia-persistenced", "nvidia-dcgm", "dcgm", "nvidia-fabricmanager")
    assert plan.starts == plan.stops[::-1]
    assert plan.steps[3:6] == [
        "stop nvidia-fabricmanager",
        "nvidia-smi -r (every GPU: NVLink peers together while the fabric manager is stopped)",
        "start nvidia-fabricmanager",
    ]
    assert plan.steps[-1] == "check nvidia-smi -q -x: every GPU's fabric Completed/Success"
    only = remediation.reset_plan(NEED, state(active=("nvidia-dcgm", "nvidia-persistenced")))
    assert only.stops == ("nvidia-persistenced", "nvidia-dcgm")
    assert only.resets == ("nvidia-smi -r -i 00000000:00:06.0",)


def test_a_busy_gpu_refuses_the_reset_naming_its_pids():
    hw = gpus_of(FIXTURES / "nvidia-smi-q-x_h100-busy_row-remap-pending.xml")
    plan = remediation.reset_plan(remediation.gpu_resets(hw), state(gpu_pids=[busy_pid()]))
    assert plan.refusals == ("GPU processes running (pids 830): no reset under a job",)
    assert plan.stops == () and plan.steps == []


@pytest.mark.parametrize(
    ("need", "changes", "refusal"),
    [
        (NEED, {"gpu_pids_unknown": True}, "the GPU processes could not be listed"),
        (NEED, {"systemd": False}, "systemd is not running"),
        (
            EVERY,
            {"units": state(active=("nvidia-persistenced",))["units"]},
            "nvidia-fabricmanager is not running",
        ),
    ],
)
def test_what_cannot_be_ruled_out_refuses_the_reset(need, changes, refusal):
    (found,) = remediation.reset_plan(need, state(**changes)).refusals
    assert found.startswith(refusal)


# ---- the entry point's one node --------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        (None, "name the one node to remediate"),
        ("node1,node2", "exactly one node, one at a time (got 2"),
        ("node1 node2", "exactly one node, one at a time (got 2"),
        ("nod1", "'nod1' is not a node of the spec; did you mean 'node1'?"),
        (3, "'3' is not a node name"),
        ("node3", "'node3' is not in this run"),
    ],
)
def test_exactly_one_node_of_the_spec_in_this_run_is_named(value, problem):
    found = remediation.target_problem(value, ["node1", "node2", "node3"], ["node1", "node2"])
    assert found is not None and found.startswith(problem)
    assert remediation.target_problem("node2", ["node1", "node2"], ["node1", "node2"]) is None


def test_the_deploy_is_never_part_of_the_cluster_deploy():
    cluster = (Path(__file__).resolve().parents[2] / "deploy" / "cluster.py").read_text()
    assert "remediate" not in cluster


# ---- verified after --------------------------------------------------------------------------


def test_verify_passes_a_fixed_node_and_names_each_step_that_did_not_hold():
    fixed = state(
        units=state()["units"] | {"trainfleet-acs": {"enabled": "enabled", "active": "active"}}
    )
    clean = hgx(acs_on_at=None)
    checks = remediation.verify(clean, fixed, [PORT], [], False, [])
    assert [str(c) for c in checks] == [
        f"pass: ACS redirects off on {PORT} (off)",
        "pass: trainfleet-acs.service enabled and active (enabled, active)",
    ]
    still = remediation.verify(hgx(), state(), [PORT], [], False, [])
    assert [str(c) for c in still if not c.ok] == [
        f"FAIL: ACS redirects off on {PORT} (SrcValid ReqRedir CmpltRedir)",
        "FAIL: trainfleet-acs.service enabled and active (enabled, inactive)",
    ]
    bus = "00000000:00:06.0"
    ok = remediation.verify(
        gpus_of(H100 / "nvidia-smi-q.xml"), state(), [], [bus], False, ["nvidia-persistenced"]
    )
    assert all(c.ok for c in ok) and len(ok) == 2
    bad = gpus_of(FIXTURES / "nvidia-smi-q-x_h100_row-remap-pending.xml")
    (fail,) = [c for c in remediation.verify(bad, state(), [], [bus], True, []) if not c.ok][:1]
    assert str(fail) == f"FAIL: GPU {bus} asks for no reset (row remap pending)"
    fabric = [
        str(c) for c in remediation.verify(bad, state(), [], [bus], True, []) if "fabric" in c.step
    ]
    assert fabric == [f"FAIL: GPU {bus} fabric Completed/Success (N/A/N/A)"]


# ---- the fact ---------------------------------------------------------------------------------


def test_the_fact_reads_pids_units_and_the_unit_file():
    unit = remediation.acs_unit_text([PORT], SETPCI)
    lines = [
        f"gpu_pid {busy_pid()}",
        "systemd yes",
        "unit nvidia-persistenced enabled active",
        "unit nvidia-dcgm not-found inactive",
        "unit sshd enabled active",  # not asked for: dropped
        f"acs_unit {base64.b64encode(unit.encode()).decode()}",
    ]
    got = RemediationState().process(lines)
    assert got["gpu_pids"] == [830] and got["gpu_pids_unknown"] is False and got["systemd"]
    assert got["units"] == {
        "nvidia-persistenced": {"enabled": "enabled", "active": "active"},
        "nvidia-dcgm": {"enabled": "not-found", "active": "inactive"},
    }
    assert got["acs_unit"] == unit
    assert RemediationState().process(["gpu_pids unknown", "systemd no"])["gpu_pids_unknown"]
    for bad in ("99999999999", "-1", "830x", "\u0663"):  # longer than a pid, not one: unknown
        got = RemediationState().process([f"gpu_pid {busy_pid()}", f"gpu_pid {bad}"])
        assert got["gpu_pids"] == [830] and got["gpu_pids_unknown"] is True, bad


FACT = remediation_facts._SCRIPT  # the fact's script as it runs: gpu_pids, then its own

# What nvidia-smi prints where it cannot read a value ([N/A], [Insufficient Permissions]: its
# manual's words) or where it fails (the NVML message), each here with exit status 0.
UNREADABLE = [
    "[N/A]\n",
    "[Insufficient Permissions]\n",
    "Failed to initialize NVML: Driver/library version mismatch\n",
    "830\n[Insufficient Permissions]\n",
]


def run_fact(tmp: Path, apps: str, rc: int = 0, root: Path | None = None) -> list[str]:
    """facts/scripts/remediation.sh over a stub nvidia-smi printing ``apps`` (no unit asked;
    setpci looked for under ``root``, default an empty tree)."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    (tmp / "apps").write_text(apps)
    smi = bin_ / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\ncat "{tmp / "apps"}"\nexit {rc}\n')
    smi.chmod(0o755)
    result = subprocess.run(
        [
            *("sh", "-c", FACT, "trainfleet", "20", str(tmp / "no-unit"), ""),
            *(str(root or tmp / "no-root"), *remediation.SETPCI),
        ],
        env={"PATH": f"{bin_}:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return result.stdout.splitlines()


def test_the_fact_finds_setpci_only_as_roots_own_executable(tmp_path):
    """The first of SETPCI under a tree that is an executable of root's no one else can
    write: a group-writable /usr/bin/setpci is passed over for /usr/sbin/setpci."""
    root = tmp_path / "root"
    for path, mode in (("/usr/bin/setpci", 0o775), ("/usr/sbin/setpci", 0o755)):
        tool = root / path.lstrip("/")
        tool.parent.mkdir(parents=True)
        tool.write_text("#!/bin/sh\n")
        tool.chmod(mode)
    got = RemediationState().process(run_fact(tmp_path, "", root=root))["setpci"]
    assert got == ("/usr/sbin/setpci" if os.geteuid() == 0 else None)
    assert RemediationState().process(run_fact(tmp_path, ""))["setpci"] is None
    lines = ["setpci setpci", "setpci /tmp/setpci", "setpci /usr/bin/setpci"]
    assert RemediationState().process(lines)["setpci"] == "/usr/bin/setpci"  # only one asked for


@pytest.mark.parametrize("apps", UNREADABLE)
def test_a_probe_line_that_is_not_a_pid_reads_unknown_and_refuses_the_reset(tmp_path, apps):
    got = RemediationState().process(run_fact(tmp_path, apps))
    assert got["gpu_pids_unknown"] is True
    seen = state(gpu_pids=got["gpu_pids"], gpu_pids_unknown=got["gpu_pids_unknown"])
    plan = remediation.reset_plan(NEED, seen)
    assert "the GPU processes could not be listed: a job cannot be ruled out" in plan.refusals
    assert plan.stops == () and plan.steps == []


def test_the_fact_reads_the_pids_of_a_clean_probe_and_a_failed_one_as_unknown(tmp_path):
    got = RemediationState().process(run_fact(tmp_path, BUSY_APPS.read_text().split(",")[0]))
    assert got["gpu_pids"] == [830] and got["gpu_pids_unknown"] is False
    got = RemediationState().process(run_fact(tmp_path, ""))  # the idle capture: nothing, 0
    assert got["gpu_pids"] == [] and got["gpu_pids_unknown"] is False
    assert RemediationState().process(run_fact(tmp_path, "", rc=6))["gpu_pids_unknown"]


# ---- the operation fixtures agree with the plan -----------------------------------------------


def test_the_reset_fixtures_kwargs_are_what_the_plan_gives_for_their_capture():
    for path in sorted((FIXTURES / "gpu_reset").glob("*.json")):
        data = json.loads(path.read_text())
        capture = data.get("_capture")
        if not capture:
            continue
        lspci_text = read(HGX_LSPCI) if data.get("_lspci") == "hgx" else None
        need = remediation.gpu_resets(gpus_of(FIXTURES / capture, lspci_text))
        assert data["kwargs"] == {
            "gpus": [{"bus": g.bus, "reasons": list(g.reasons)} for g in need.gpus],
            "every_gpu": need.every_gpu,
            "problems": list(need.problems),
        }, path.name


def test_the_acs_fixtures_units_are_the_template_rendered():
    """Each fixture is one of three cases, each checked; every case has a fixture."""
    refused = "echo 'trainfleet: ACS: the unit given does not list exactly the planned bridges'"
    seen = set()
    for path in sorted((FIXTURES / "acs_boot_unit").glob("*.json")):
        data = json.loads(path.read_text())
        bridges, unit = data["kwargs"]["bridges"], data["kwargs"]["unit"]
        on_node = data["facts"].get("remediation_facts.RemediationState", {}).get("acs_unit")
        commands = data["commands"]
        if unit is None:  # nothing planned to write: a noop or the node failed, no file
            case = "no unit"
            assert not data.get("_converged"), path.name
            assert commands == [] or (len(commands) == 1 and commands[0].endswith("exit 1"))
        elif remediation.unit_bridges(unit) == sorted(set(bridges)):
            case = "rendered"
            assert unit == remediation.acs_unit_text(bridges, SETPCI), path.name
            assert (on_node == unit) is bool(data.get("_converged")), path.name
        else:  # a unit for other bridges: refused before anything is read
            case = "other bridges"
            assert not data.get("_converged"), path.name
            assert [c.split(" 1>&2")[0] for c in commands] == [refused], path.name
        seen.add(case + (" converged" if data.get("_converged") else ""))
    assert seen == {"no unit", "rendered", "rendered converged", "other bridges"}


# ---- the reset script over stub tools ---------------------------------------------------------

STUB_SMI = """#!/bin/sh
echo "nvidia-smi $*" >> "$LOG"
case "$*" in
  *--query-compute-apps*)
    f=$APPS
    [ "$(grep -c -e --query-compute-apps "$LOG")" -gt 1 ] && f=${APPS_AGAIN-$APPS}
    case $f in '') ;; *.csv) cut -d, -f1 "$f" ;; *) cat "$f" ;; esac
    exit 0 ;;
  "-q -x") cat "$XML" ;;
  -r*)
    [ "$*" = "${HANG-}" ] && { echo $$ > "$LOG.hang"; exec sleep 60; }
    [ "$*" = "${RESET_FAIL-}" ] && exit 3
    exit "${RESET_RC:-0}" ;;
esac
"""
STUB_SYSTEMCTL = """#!/bin/sh
case $1 in
  is-active) case " $ACTIVE " in *" ${3%.service} "*) exit 0 ;; *) exit 3 ;; esac ;;
  *) echo "systemctl $*" >> "$LOG"
     [ "$*" = "${HANG-}" ] && { echo $$ > "$LOG.hang"; exec sleep 60; }
     exit 0 ;;
esac
"""
RESET = remediate_ops._RESET  # the reset script as it runs: gpu_pids, then its own


def nvswitch_xml(tmp: Path, state_: str = "Completed") -> Path:
    """The H100's XML as a GPU on a built NVSwitch fabric reads (State Completed, Status Success,
    as the 8x H100 HGX's nvidia-smi -q prints them: tests/fixtures/gpu_node/README.md)."""
    text = read(H100 / "nvidia-smi-q.xml")
    text = text.replace("<state>N/A</state>", f"<state>{state_}</state>", 1)
    text = text.replace("<status>N/A</status>", "<status>Success</status>", 1)
    path = tmp / "fabric.xml"
    path.write_text(text)
    return path


def run_reset(
    tmp: Path, args: list[str], signum: int | None = None, **env: str
) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The reset script over the stubs; with ``signum``, that signal is sent to the script once
    the stub named by HANG hangs, then the hung stub is killed."""
    bin_ = tmp / "bin"
    bin_.mkdir(exist_ok=True)
    for name, text in (("nvidia-smi", STUB_SMI), ("systemctl", STUB_SYSTEMCTL)):
        (bin_ / name).write_text(text)
        (bin_ / name).chmod(0o755)
    log = tmp / "log"
    log.write_text("")
    full = {
        "PATH": f"{bin_}:/usr/bin:/bin",
        "LOG": str(log),
        "APPS": "",
        "XML": str(H100 / "nvidia-smi-q.xml"),
    }
    with subprocess.Popen(
        ["sh", "-c", RESET, "trainfleet", *args],
        env=full | env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # a signal ignored on entry cannot be trapped by sh (POSIX): a test run under nohup
        # would otherwise test nothing of the script's SIGHUP handling
        preexec_fn=lambda: [
            signal.signal(s, signal.SIG_DFL) for s in (signal.SIGHUP, signal.SIGTERM)
        ],
    ) as proc:
        if signum is not None:
            hang = tmp / "log.hang"
            deadline = time.monotonic() + 20
            while not (hang.exists() and hang.read_text().strip()):
                assert time.monotonic() < deadline and proc.poll() is None, "nothing hung"
                time.sleep(0.02)
            proc.send_signal(signum)
            os.kill(int(hang.read_text()), signal.SIGKILL)
        out, err = proc.communicate(timeout=30)
    result = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    return result, log.read_text().splitlines()


QUERY = "nvidia-smi --query-compute-apps=pid --format=csv,noheader"


def test_the_script_stops_in_order_resets_starts_in_reverse_and_checks(tmp_path):
    units = ["nvidia-persistenced", "nvidia-dcgm", "nvidia-fabricmanager"]
    result, log = run_reset(
        tmp_path,
        ["all", "20", "00000000:00:06.0", "0", *units],
        ACTIVE=" ".join(units),
        XML=str(nvswitch_xml(tmp_path)),
    )
    assert result.returncode == 0, result.stderr
    assert log == [
        QUERY,
        "systemctl stop nvidia-persistenced.service",
        "systemctl stop nvidia-dcgm.service",
        "systemctl stop nvidia-fabricmanager.service",
        QUERY,  # again, right before the reset
        "nvidia-smi -r",
        "systemctl start nvidia-fabricmanager.service",
        "systemctl start nvidia-dcgm.service",
        "systemctl start nvidia-persistenced.service",
        "nvidia-smi -q -x",
    ]
    assert result.stdout.splitlines()[-1] == (
        "trainfleet: checked: no GPU asks for a reset, every fabric Completed/Success"
    )


def test_the_script_resets_each_gpu_without_nvswitch_and_skips_stopped_units(tmp_path):
    result, log = run_reset(
        tmp_path,
        ["each", "20", "00000000:00:06.0", "0", "nvidia-persistenced", "dcgm"],
        ACTIVE="nvidia-persistenced",
    )
    assert result.returncode == 0, result.stderr
    assert log[1:5] == [
        "systemctl stop nvidia-persistenced.service",
        QUERY,
        "nvidia-smi -r -i 00000000:00:06.0",
        "systemctl start nvidia-persistenced.service",
    ]


def test_a_job_started_since_the_read_stops_the_script_before_anything(tmp_path):
    result, log = run_reset(
        tmp_path,
        ["each", "20", "00000000:00:06.0", "0", "nvidia-persistenced"],
        ACTIVE="nvidia-persistenced",
        APPS=str(BUSY_APPS),
    )
    assert result.returncode == 1
    assert "GPU processes running (pids 830): nothing stopped" in result.stderr
    assert log == [QUERY]


@pytest.mark.parametrize("apps", UNREADABLE)
def test_a_process_list_that_is_not_all_pids_stops_the_script_before_anything(tmp_path, apps):
    (tmp_path / "apps.txt").write_text(apps)
    result, log = run_reset(
        tmp_path,
        ["each", "20", "00000000:00:06.0", "0", "nvidia-persistenced"],
        ACTIVE="nvidia-persistenced",
        APPS=str(tmp_path / "apps.txt"),
    )
    assert result.returncode == 1
    assert "the GPU processes could not be listed: nothing stopped" in result.stderr
    assert log == [QUERY]


@pytest.mark.parametrize(
    ("again", "why"),
    [
        (BUSY_APPS, "GPU processes running (pids 830) after the stops"),
        ("[Insufficient Permissions]\n", "the GPU processes could not be listed after the stops"),
    ],
)
def test_a_job_started_during_the_stops_starts_them_again_and_resets_nothing(tmp_path, again, why):
    if isinstance(again, str):
        (tmp_path / "again.txt").write_text(again)
        again = tmp_path / "again.txt"
    units = ["nvidia-persistenced", "nvidia-dcgm", "nvidia-fabricmanager"]
    result, log = run_reset(
        tmp_path,
        ["all", "20", "00000000:00:06.0", "0", *units],
        ACTIVE=" ".join(units),
        APPS_AGAIN=str(again),
    )
    assert result.returncode == 1
    assert log == [
        QUERY,
        "systemctl stop nvidia-persistenced.service",
        "systemctl stop nvidia-dcgm.service",
        "systemctl stop nvidia-fabricmanager.service",
        QUERY,
        "systemctl start nvidia-fabricmanager.service",
        "systemctl start nvidia-dcgm.service",
        "systemctl start nvidia-persistenced.service",
    ]
    assert result.stderr.splitlines()[-2:] == [
        f"trainfleet: {why}",
        "trainfleet: where things stand: stopped (not started again): none; GPUs reset: none; "
        "started again: nvidia-fabricmanager nvidia-dcgm nvidia-persistenced",
    ]


def test_a_failed_reset_before_any_gpu_starts_the_services_again(tmp_path):
    units = ["nvidia-persistenced", "nvidia-fabricmanager"]
    result, log = run_reset(
        tmp_path,
        ["all", "20", "00000000:00:06.0", "0", *units],
        ACTIVE=" ".join(units),
        RESET_RC="3",
    )
    assert result.returncode == 1
    assert log[-3:] == [
        "nvidia-smi -r",
        "systemctl start nvidia-fabricmanager.service",  # the fabric manager is not left down
        "systemctl start nvidia-persistenced.service",
    ]
    assert result.stderr.splitlines()[-2:] == [
        "trainfleet: nvidia-smi -r (every GPU) failed",
        "trainfleet: where things stand: stopped (not started again): none; GPUs reset: none; "
        "started again: nvidia-fabricmanager nvidia-persistenced",
    ]
    result, log = each_reset_failing(tmp_path, FIRST)
    first = FIRST
    assert result.returncode == 1
    assert log[-2:] == [f"nvidia-smi -r -i {first}", "systemctl start nvidia-persistenced.service"]


FIRST, SECOND = "00000000:00:06.0", "00000000:00:07.0"


def each_reset_failing(tmp_path, failing: str):
    """The per-GPU reset of two GPUs (persistenced running) where ``nvidia-smi -r -i
    failing`` fails."""
    return run_reset(
        tmp_path,
        ["each", "20", f"{FIRST},{SECOND}", "0", "nvidia-persistenced"],
        ACTIVE="nvidia-persistenced",
        RESET_FAIL=f"-r -i {failing}",
    )


def test_a_failed_reset_after_one_gpu_stops_there_and_says_where_things_stand(tmp_path):
    result, log = each_reset_failing(tmp_path, SECOND)
    first, second = FIRST, SECOND
    assert result.returncode == 1
    assert log[-1] == f"nvidia-smi -r -i {second}" and not any("start" in x for x in log)
    assert result.stderr.splitlines()[-1] == (
        "trainfleet: where things stand: stopped (not started again): nvidia-persistenced; "
        f"GPUs reset: {first}; started again: none"
    )


@pytest.mark.parametrize(
    ("signum", "hang", "said"),
    [
        (
            signal.SIGHUP,
            "stop nvidia-fabricmanager.service",
            "interrupted by SIGHUP during systemctl stop nvidia-fabricmanager",
        ),
        (signal.SIGTERM, "-r", "interrupted by SIGTERM during nvidia-smi -r"),
    ],
)
def test_a_hangup_or_term_says_where_things_stand(tmp_path, signum, hang, said):
    units = ["nvidia-persistenced", "nvidia-fabricmanager"]
    result, log = run_reset(
        tmp_path,
        ["all", "20", "00000000:00:06.0", "0", *units],
        signum,
        ACTIVE=" ".join(units),
        HANG=hang,
    )
    assert result.returncode == 1
    assert not any("start" in x for x in log)
    stopped = "nvidia-persistenced" + (" nvidia-fabricmanager" if hang == "-r" else "")
    assert result.stderr.splitlines()[-2:] == [
        f"trainfleet: {said}",
        f"trainfleet: where things stand: stopped (not started again): {stopped}; "
        "GPUs reset: none; started again: none",
    ]


@pytest.mark.parametrize("lang", ["C.UTF-8", "C"])
def test_a_process_name_of_odd_bytes_after_the_reset_fails_no_check(lang, tmp_path):
    # the lent H200's own XML while a process named with bytes that are not UTF-8 held it
    # (grep in a UTF-8 locale calls such input binary and prints no line of it)
    result, _ = run_reset(
        tmp_path,
        ["each", "20", "00000000:00:06.0", "0"],
        XML=str(HW / "h200_process_names" / "nvidia-smi-q-x_odd-names.xml"),
        LANG=lang,
        LC_ALL=lang,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "trainfleet: checked: no GPU asks for a reset"


def test_a_gpu_still_asking_or_a_fabric_not_built_fails_the_check(tmp_path):
    result, _ = run_reset(
        tmp_path,
        ["each", "20", "00000000:00:06.0", "0"],
        XML=str(FIXTURES / "nvidia-smi-q-x_h100_row-remap-pending.xml"),
    )
    assert result.returncode == 1
    assert (
        "a GPU still asks for a reset: <remapped_row_pending>Yes</remapped_row_pending>"
        in result.stderr
    )
    assert "GPUs reset: 00000000:00:06.0" in result.stderr
    result, _ = run_reset(
        tmp_path,
        ["all", "20", "00000000:00:06.0", "0"],
        XML=str(nvswitch_xml(tmp_path, "In Progress")),
    )
    assert result.returncode == 1
    assert "the fabric is not built 0s after the reset: <state>InProgress</state>" in result.stderr
