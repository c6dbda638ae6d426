"""Run GpuNodeState's real script over real captured tool output (tests/fixtures/gpu_node).

Each tool the script calls is a stub on PATH that prints a capture (``nvidia-smi -q -x``,
``chronyc tracking``, ``lsmod``, ``timedatectl timesync-status``) or a systemctl answer; files
it reads lie in a root tree (PCI devices as sysfs lays them out, /run/systemd/system). The
scenarios below make the fact fixtures (``python -m tests.unit.gpu_node_captures`` rewrites
tests/fixtures/gpu_node/facts/*.json), and the tests run them again to prove the fixtures'
output is what the script prints over those captures.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path
from typing import Any

from pyinfra_testing.facts import _make_command
from pyinfra_testing.util import get_command_string

from facts.gpu_node_facts import MEMLOCK_CONF, GpuNodeState

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_node"
CAPTURES = FIXTURES / "captures"
H100 = FIXTURES.parent / "hardware" / "h100_device"  # the lent H100's own captures
# its kernel release: `uname -a`'s third field (uname.txt), as /proc/sys/kernel/osrelease has it
H100_RELEASE = (H100 / "uname.txt").read_text().split()[2]
# NVSwitches and GPUs of an HGX H200 board as `lspci -nn` lists them (bigstack-oss/cubecos#259):
# bridges of class 0680 are the NVSwitches (10de:22a3), 3D controllers 0302 the GPUs (10de:2335).
HGX_PCI = {
    "0000:05:00.0": ("0x10de", "0x068000"),
    "0000:06:00.0": ("0x10de", "0x068000"),
    "0000:07:00.0": ("0x10de", "0x068000"),
    "0000:18:00.0": ("0x10de", "0x030200"),
    "0000:2a:00.0": ("0x10de", "0x030200"),
    "0000:3a:00.0": ("0x15b3", "0x020700"),
}  # + a ConnectX
PCIE_PCI = {"0000:ad:00.0": ("0x10de", "0x030200"), "0000:ae:00.0": ("0x10de", "0x030200")}

# name -> (what it is, the tool stubs' captures and answers, the root tree)
SCENARIOS: dict[str, dict[str, Any]] = {
    "hgx_a100_converged": {
        "_source": "HGX A100 board GPU (nvidia-smi -q -x of an A100-SXM4-80GB, driver 535.54.03, "
        "influxdata/telegraf testdata/a100-sxm4-v12.xml, persistence mode turned on: the one line "
        "changed), NVSwitch bridges as on an HGX H200 (cubecos#259), chronyc tracking of a "
        "synchronised server (socallinuxexpo/scale-network#121), lsmod with nvidia_peermem "
        "(leptonai/gpud#39); systemd running, every unit enabled and active, fabric manager "
        "package held.",
        "smi": "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03_persistence-on.xml",
        "chrony": "chronyc-tracking_in-sync.txt",
        "lsmod": "lsmod_peermem.txt",
        "pci": HGX_PCI,
        "systemd": True,
        "units": {
            "nvidia-persistenced": "enabled active",
            "nvidia-fabricmanager": "enabled active",
            "chrony": "enabled active",
        },
        "dpkg": "hold ok installed nvidia-fabricmanager-535 535.54.03-1",
        "modules_load": {"trainfleet-peermem.conf": "nvidia_peermem\n"},
        "memlock_conf": "* soft memlock unlimited\n",
        # the proprietary module's /proc/driver/nvidia/version (535.161.08: another machine's)
        "nvidia_version": CAPTURES / "proc-driver-nvidia-version_proprietary_535.161.08.txt",
    },
    "h100_open_module_converged_under_peermem": {
        "_source": "The lent H100 (tests/fixtures/hardware/h100_device: nvidia-smi -q -x, "
        "/proc/driver/nvidia/version of the open kernel module 580.159.04, /proc/modules, kernel "
        "6.18.44 from uname -a) as a node converged under the old rule: lsmod shows "
        "nvidia_peermem (leptonai/gpud#39) and trainfleet's modules-load.d file is in place; "
        "systemd running, nvidia-persistenced enabled and active.",
        "smi": H100 / "nvidia-smi-q.xml",
        "lsmod": "lsmod_peermem.txt",
        "proc_modules": H100 / "proc-modules.txt",
        "nvidia_version": H100 / "nvidia-driver-version.txt",
        "osrelease": H100_RELEASE,
        "systemd": True,
        "units": {"nvidia-persistenced": "enabled active"},
        "modules_load": {"trainfleet-peermem.conf": "nvidia_peermem\n"},
    },
    "pcie_rtx4000_timesyncd_1s_slow": {
        "_source": "An RTX 4000 SFF Ada on PCIe running 4 processes (nvidia-smi -q -x of driver "
        "595.84, influxdata/telegraf testdata/rtx-4000-sff-ada-v13.xml): no NVSwitch, fabric state "
        "N/A; systemd-timesyncd 1.09 s slow (timedatectl timesync-status, systemd/systemd#16492); "
        "nvidia-persistenced disabled though the GPU reports persistence on; no fabric manager "
        "package, no peermem.",
        "smi": "nvidia-smi-q-x_rtx-4000-sff-ada_595.84.xml",
        "timesync": "timedatectl-timesync-status_1s-slow.txt",
        "pci": PCIE_PCI,
        "systemd": True,
        "ntpsync": "yes",
        "units": {
            "nvidia-persistenced": "disabled inactive",
            "systemd-timesyncd": "enabled active",
        },
    },
    "cpu_node_chrony_7s_slow": {
        "_source": "A CPU node: no nvidia-smi; chrony 7.8 s slow of NTP time (chronyc tracking, "
        "omniosorg/omnios-build#2576); systemd running, no NVIDIA units.",
        "chrony": "chronyc-tracking_7.8s-slow.txt",
        "systemd": True,
        "units": {"chrony": "enabled active"},
    },
    "lab_node_no_systemd": {
        "_source": "A lab node as the namespaces lab runs it: no nvidia-smi, no systemd (PID 1 is "
        "tini), no chronyc; trainfleet's memlock file in place.",
        "memlock_conf": "*    soft memlock unlimited\n",
    },
    "nvidia_smi_hangs": {
        "_source": "A wedged GPU: nvidia-smi never answers (the stub sleeps); timeout ends it "
        "(exit 124).",
        "smi_hang": True,
        "systemd": False,
    },
}


def _stub(bin_dir: Path, name: str, body: str) -> None:
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def run_scenario(tmp: Path, scenario: dict[str, Any], timeout: int = 20) -> list[str]:
    """The script's output (the lines pyinfra would hand to ``process``) for ``scenario``."""
    bin_dir, root = tmp / "bin", tmp / "root"
    bin_dir.mkdir(parents=True)
    root.mkdir()
    # The real tools the script needs besides the stubs (awk, sed, base64, timeout, cat, ...).
    for tool in (
        "awk",
        "sed",
        "base64",
        "timeout",
        "cat",
        "head",
        "tr",
        "sleep",
        "sh",
        "printf",
        "grep",
    ):
        real = subprocess.run(
            ["sh", "-c", f"command -v {tool}"], capture_output=True, text=True
        ).stdout.strip()
        if real.startswith("/"):
            (bin_dir / tool).symlink_to(real)
    if "smi" in scenario:
        # only `nvidia-smi -q -x` answers: the fact must ask for XML (a path may be the test's own)
        _stub(
            bin_dir,
            "nvidia-smi",
            f"[ \"$*\" = '-q -x' ] && exec cat '{CAPTURES / scenario['smi']}'\nexit 2\n",
        )
    if scenario.get("smi_hang"):
        _stub(bin_dir, "nvidia-smi", "exec sleep 30\n")
    if "chrony" in scenario:
        _stub(
            bin_dir, "chronyc", f"[ \"$1\" = tracking ] && cat '{CAPTURES / scenario['chrony']}'\n"
        )
    _stub(
        bin_dir,
        "lsmod",
        f"cat '{CAPTURES / scenario['lsmod']}'\n"
        if "lsmod" in scenario
        else "echo 'Module                  Size  Used by'\n",
    )
    if scenario.get("systemd"):
        (root / "run/systemd/system").mkdir(parents=True)
        answers = "\n".join(
            f'  {unit}.service) set -- "$1" {states} ;;'
            for unit, states in scenario["units"].items()
        )
        _stub(
            bin_dir,
            "systemctl",
            f"""q=$1; u=$2
case $u in
{answers}
  *) [ "$q" = is-active ] && echo inactive; exit 4 ;;
esac
[ "$q" = is-enabled ] && echo "$2"
[ "$q" = is-active ] && echo "$3"
exit 0
""",
        )
        sync = scenario.get("ntpsync", "no")
        capture = CAPTURES / scenario["timesync"] if "timesync" in scenario else None
        _stub(
            bin_dir,
            "timedatectl",
            f"""case $1 in
  show) echo {sync} ;;
  timesync-status) {f"cat '{capture}'" if capture else "exit 1"} ;;
esac
""",
        )
    if "dpkg" in scenario:
        _stub(bin_dir, "dpkg-query", f"echo 'fmpkg {scenario['dpkg']}'\n")
    for address, (vendor, klass) in scenario.get("pci", {}).items():
        device = root / "sys/bus/pci/devices" / address
        device.mkdir(parents=True)
        (device / "vendor").write_text(vendor + "\n")
        (device / "class").write_text(klass + "\n")
    for name, content in scenario.get("modules_load", {}).items():
        (root / "etc/modules-load.d").mkdir(parents=True, exist_ok=True)
        (root / "etc/modules-load.d" / name).write_text(content)
    for path, content in (
        ("proc/driver/nvidia/version", scenario.get("nvidia_version")),
        ("proc/modules", scenario.get("proc_modules")),
    ):
        if content is not None:
            (root / path).parent.mkdir(parents=True, exist_ok=True)
            (root / path).write_bytes(Path(content).read_bytes())
    if "osrelease" in scenario:
        (root / "proc/sys/kernel").mkdir(parents=True, exist_ok=True)
        (root / "proc/sys/kernel/osrelease").write_text(scenario["osrelease"] + "\n")
    if "memlock_conf" in scenario:
        target = root / MEMLOCK_CONF.lstrip("/")
        target.parent.mkdir(parents=True)
        target.write_text(scenario["memlock_conf"])
    command = GpuNodeState().command(root=str(root), timeout=timeout).get_raw_value()
    result = subprocess.run(
        [str(bin_dir / "sh"), "-c", command],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": str(bin_dir), "HOME": str(tmp)},
    )
    assert result.returncode == 0, result.stderr
    # The root prefix is the test's own: the node sees "" there.
    return [line.replace(str(root), "") for line in result.stdout.splitlines()]


def fixture(name: str, output: list[str]) -> dict[str, Any]:
    fact = GpuNodeState()
    command = get_command_string(_make_command(fact.command, {}))
    return {
        "_source": SCENARIOS[name]["_source"],
        "arg": {},
        "command": command,
        "output": output,
        "fact": fact.process(output),
    }


def write_fixtures() -> None:
    import tempfile

    (FIXTURES / "facts").mkdir(exist_ok=True)
    for name, scenario in SCENARIOS.items():
        with tempfile.TemporaryDirectory() as tmp:
            output = run_scenario(Path(tmp), scenario, timeout=2)
        (FIXTURES / "facts" / f"{name}.json").write_text(
            json.dumps(fixture(name, output), indent=4) + "\n"
        )


if __name__ == "__main__":
    os.chdir(Path(__file__).resolve().parents[2])
    write_fixtures()
