"""Hardware truth from real captures (tests/fixtures/hardware, each with its source): the
parsers, the fact's script run over the same files, and the verdicts, drift's and
``trainfleet diagnose``'s alike. Clusters are copies of one real node, one line changed per
fault."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench.report_render import SOURCES as H100_SOURCES
from bench.report_render import h100_node
from checks import drift_check
from checks.capture_save import node_files, save_nodes, write_node
from facts.hardware_facts import HardwareSources, HardwareState
from trainfleet.__main__ import main
from trainfleet.capabilities import RULES, hardware
from trainfleet.compare import compare
from trainfleet.diagnose import CaptureError, judge, read_capture
from trainfleet.diagnose_nccl import is_env_property
from trainfleet.hw import cmdline, infiniband, kernel_log, ledger, lspci, nvlink, smi_xml
from trainfleet.hw.sources import (
    FABRIC_SOURCES,
    MLNX_QOS,
    SOURCES,
    STATUS_FILE,
    read_hardware,
)
from trainfleet.spec import load_cluster

HW = Path(__file__).resolve().parents[1] / "fixtures" / "hardware"
H100 = HW / "h100_device"  # one H100 SXM5 in a KVM guest, captured by capture_on_gpu_machine.sh
GPU_CAPTURES = Path(__file__).resolve().parents[1] / "fixtures" / "gpu_node" / "captures"
HGX_LSPCI = HW / "lspci" / "lspci-vvv_gpud-hgx-h100_acs-srcvalid-and-downgraded.txt"
IB_TREE = HW / "infiniband" / "sys-class-infiniband-h100.0"


def read(path: Path) -> str:
    return path.read_text(encoding="utf-8")


# ---- the parsers -----------------------------------------------------------------------------


def test_the_h100s_own_xml_reads_as_one_healthy_gpu_at_full_link():
    (gpu,) = smi_xml.gpus(smi_xml.smi_root(H100.joinpath("nvidia-smi-q.xml").read_bytes()))
    assert gpu["bus"] == "00000000:00:06.0" and gpu["model"] == "NVIDIA H100 80GB HBM3"
    assert (gpu["vbios"], gpu["ecc_mode"], gpu["mig_mode"]) == (
        "96.00.DA.00.0C",
        "Enabled",
        "Disabled",
    )
    assert (gpu["width"], gpu["max_width"], gpu["gen"], gpu["max_gen"]) == (16, 16, 5, 5)
    assert gpu["uncorrectable"] == 0 and gpu["row_remap_pending"] is False
    assert gpu["fabric"] == {"state": "N/A", "status": "N/A", "clique": "N/A", "cluster": "N/A"}


def test_a_t4_trained_at_x8_of_x16_and_an_a100_in_mig_mode_read_as_they_are():
    t4 = GPU_CAPTURES / "nvidia-smi-q-x_tesla-t4_515.105.01.xml"
    (gpu,) = smi_xml.gpus(smi_xml.smi_root(t4.read_bytes()))
    assert (gpu["width"], gpu["max_width"]) == (8, 16)
    a100 = GPU_CAPTURES / "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03.xml"
    (gpu,) = smi_xml.gpus(smi_xml.smi_root(a100.read_bytes()))
    assert gpu["mig_mode"] == "Enabled" and gpu["reset_required"] is False


def test_xids_are_read_from_the_start_of_a_kernel_line_in_every_stamp_format():
    found = kernel_log.read(read(HW / "dmesg" / "dmesg_gpud_xid48-63-94-peermem.log"))
    assert [x["xid"] for x in found["xids"]][:3] == [48, 63, 94]
    assert {x["pci"] for x in found["xids"]} == {"0000:19:00"}
    gsp = kernel_log.read(read(HW / "dmesg" / "dmesg_gpud-dell-xe9680_xid119-gsp-timeout.log"))
    assert {(x["pci"], x["xid"]) for x in gsp["xids"]} == {("0000:9b:00", 119)}
    boot = kernel_log.read(read(HW / "dmesg" / "dmesg_gpud-hgx_boot-mlx5-cx7-nvswitch.log"))
    assert boot["xids"] == [] and boot["fallen"] == []
    mine = kernel_log.read(read(H100 / "dmesg.txt"))
    assert mine == {"xids": [], "sxids": [], "fallen": [], "hypervisor": "KVM"}


def test_a_process_named_like_an_xid_cannot_forge_one():
    # the kernel starts a segfault line with the process name, cut to 15 characters
    forged = "[ 9.1] NVRM: Xid (PCI:[4242]: segfault at 0 ip 0 sp 0 error 4"
    later = '[ 9.2] audit: comm="NVRM: Xid (PCI:0000:19:00): 79, x"'
    assert kernel_log.read(f"{forged}\n{later}\n")["xids"] == []


def test_the_application_xids_are_not_the_nodes_fault():
    xids = [{"pci": "p", "xid": n} for n in (13, 31, 43, 45, 48, 79, 999)]
    assert [x["xid"] for x in kernel_log.hardware_xids(xids)] == [48, 79, 999]
    assert kernel_log.xid_name(999) == "Xid 999 (not in the catalogue)"


def test_the_hgx_h100_lspci_has_eight_gpus_four_nvswitches_and_acs_only_off_their_path():
    devices = lspci.devices(read(HGX_LSPCI))
    gpus = [d for d in devices if lspci.is_gpu(d)]
    assert len(gpus) == 8 and all(d["link_sta"] == {"speed": "32GT/s", "width": 16} for d in gpus)
    assert sum(d["class"] == "Bridge" and "NVIDIA" in d["name"] for d in devices) == 4
    above = {b["address"] for g in gpus for b in lspci.bridges_above(g, devices)}
    assert "0000:17:01.0" in above
    acs = {d["address"] for d in devices if lspci.acs_enabled(d)}
    assert acs == {"0000:00:0c.0", "0000:00:0e.0"} | {f"0000:82:0{i}.0" for i in range(4)}
    assert not acs & above  # ACS is on above the NVSwitches, not on any GPU's or NIC's path


def test_the_infiniband_tree_reads_every_hca_port_and_counter():
    files = {
        p.relative_to(IB_TREE).as_posix(): p.read_text() for p in IB_TREE.rglob("*") if p.is_file()
    }
    hcas = infiniband.hcas(files)
    assert sorted(hcas) == [f"mlx5_{i}" for i in (0, 1, 4, 5, 6, 7, 8, 9)] + ["mlx5_bond_0"]
    port = hcas["mlx5_0"]["ports"]["1"]
    assert (hcas["mlx5_0"]["fw"], port["state"], port["phys_state"]) == (
        "28.41.1000",
        "4: ACTIVE",
        "5: LinkUp",
    )
    assert hcas["mlx5_1"]["ports"]["1"]["counters"]["link_downed"] == 255


def test_nvlinks_all_active_and_all_inactive():
    a100 = nvlink.links(
        read(HW / "nvidia_smi" / "nvidia-smi-nvlink-s_gpud-a100-sxm4-8gpu_all-active.txt")
    )
    assert sorted(a100) == list(range(8)) and set(a100[3].values()) == {"25 GB/s"}
    assert len(a100[3]) == 12
    down = read(HW / "nvidia_smi" / "nvidia-smi-nvlink-s_azurehpc-a100_all-links-inactive.txt")
    assert nvlink.links(down) == {6: {}}
    assert hardware._nvlinks({"nvlinks": nvlink.links(down)}) == {"NVLink GPU 6": "no link active"}


def test_iommu_and_the_hypervisor_flag():
    assert cmdline.iommu(read(H100 / "cmdline")) == []
    assert cmdline.iommu("ro intel_iommu=on iommu=pt quiet") == ["intel_iommu=on", "iommu=pt"]
    assert cmdline.hypervisor_flag("flags\t\t: fpu vme hypervisor lahf_lm\n")
    assert not cmdline.hypervisor_flag("flags\t\t: fpu vme lahf_lm\n")


# ---- the fact: its script over the same files --------------------------------------------------


def stubs(tmp: Path, xml: Path = H100 / "nvidia-smi-q.xml") -> Path:
    """nvidia-smi, lspci and dmesg that print real captures (the node's tools stand-ins)."""
    bin_ = tmp / "bin"
    bin_.mkdir()
    tools = {
        "nvidia-smi": f"""case "$*" in
  "-q -x") cat '{xml}' ;;
  "nvlink -s") cat '{H100 / "nvidia-smi-nvlink-s.txt"}' ;;
  "topo -m") cat '{H100 / "nvidia-smi-topo-m.txt"}' ;;
  *) exit 2 ;;
esac""",
        "lspci": f"cat '{H100 / 'lspci-vvv.txt'}'",
        "dmesg": f"cat '{H100 / 'dmesg.txt'}'",
    }
    for name, body in tools.items():
        (bin_ / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_ / name).chmod(0o755)
    root = tmp / "root"
    (root / "proc").mkdir(parents=True)
    shutil.copy(H100 / "cmdline", root / "proc" / "cmdline")
    (root / "proc" / "cpuinfo").write_text("")
    shutil.copytree(IB_TREE, root / "sys" / "class" / "infiniband")
    return tmp


def run_script(tmp: Path, mode: str) -> list[str]:
    command = HardwareSources().command(mode=mode, root=str(tmp / "root")).get_raw_value()
    result = subprocess.run(
        ["/bin/sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp / 'bin'}:/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_the_script_sends_each_source_whole_and_the_kernel_lines_drift_reads(tmp_path):
    out = run_script(stubs(tmp_path), "capture")
    raw = HardwareSources().process(out)
    assert raw["files"]["nvidia-smi-q.xml"] == read(H100 / "nvidia-smi-q.xml")
    assert raw["files"]["lspci-vvv.txt"] == read(H100 / "lspci-vvv.txt")
    assert raw["files"]["dmesg.txt"] == read(H100 / "dmesg.txt")
    assert raw["status"]["cpuinfo"] == "ok" and raw["status"]["sys-class-infiniband"] == "ok"
    tree = {p.relative_to(IB_TREE).as_posix() for p in IB_TREE.rglob("*") if p.is_file()}
    read_back = {k.split("/", 1)[1] for k in raw["files"] if k.startswith("sys-class-infiniband/")}
    assert read_back == {p for p in tree if "/ports/" in p or p.count("/") == 1}
    check = HardwareSources().process(run_script(tmp_path, "check"))
    assert check["files"]["dmesg.txt"] == "[    0.000000] Hypervisor detected: KVM\n"
    # the live read and the capture judge alike
    assert (
        HardwareState().process(out)["gpus"] == read_hardware(raw["status"], raw["files"])["gpus"]
    )


def test_a_node_without_gpus_or_hcas_sends_only_its_command_line(tmp_path):
    root = tmp_path / "root"
    (root / "proc").mkdir(parents=True)
    (root / "proc" / "cmdline").write_text("ro quiet\n")
    (root / "proc" / "cpuinfo").write_text("flags\t\t: fpu\n")
    (tmp_path / "bin").mkdir()
    state = HardwareState().process(run_script(tmp_path, "check"))
    assert state["status"]["nvidia-smi-q.xml"] == "absent"
    assert state["status"]["dmesg.txt"] == "skipped" and state["gpus"] is None
    assert hardware.observed(state) == {}  # a CPU node without HCAs: nothing of it to compare


def test_forged_or_unknown_framing_is_refused_or_dropped():
    with pytest.raises(ValueError, match="unknown or given twice"):
        HardwareSources().process(["src ../../etc/passwd ok eA=="])
    with pytest.raises(ValueError, match="status"):
        HardwareSources().process(["src cmdline fine"])
    raw = HardwareSources().process(["src cmdline ok eA==", "ib ../../../etc/x 1", "ib a/fw_ver 2"])
    assert raw["files"] == {"cmdline": "x", "sys-class-infiniband/a/fw_ver": "2"}


# ---- verdicts on a cluster of copies -----------------------------------------------------------


def capture(tmp: Path, nodes: int = 4, faults: dict | None = None) -> Path:
    """A capture of ``nodes`` copies of the H100 node; ``faults``: node -> (file, old line, new
    line), one line changed."""
    root = tmp / "capture"
    for i in range(1, nodes + 1):
        h100_node(root / f"node{i}")
    for node, (name, old, new) in (faults or {}).items():
        path = root / node / name
        text = read(path)
        assert text.count(old) == 1, (name, old)
        path.write_text(text.replace(old, new))
    return root


def findings(report) -> list[tuple[str, str, str, str]]:
    return [(f.node, f.property, f.kind, f.observed) for f in report.findings]


def test_identical_healthy_nodes_have_no_finding(tmp_path):
    report = judge(capture(tmp_path))
    assert findings(report) == []
    assert report.observed["node1"]["machine"] == "virtual machine (KVM)"
    assert report.observed["node1"]["GPU PCIe link degraded"] == "none"
    assert "PCIe ACS above GPUs/NICs" not in report.observed["node1"]  # a VM's ACS: its host's


@pytest.mark.parametrize(
    ("fault", "prop", "kind", "seen"),
    [
        (
            ("nvidia-smi-q.xml", "<current_link_width>16x</", "<current_link_width>8x</"),
            "GPU PCIe link degraded",
            "health",
            "GPU 00000000:00:06.0 x8 of x16",
        ),
        (
            ("nvidia-smi-q.xml", "<remapped_row_pending>No<", "<remapped_row_pending>Yes<"),
            "GPU memory errors",
            "health",
            "GPU 00000000:00:06.0: row remap pending (reset the GPU)",
        ),
        (
            (
                "nvidia-smi-q.xml",
                "<dram_uncorrectable>0</dram_uncorrectable>\n\t\t\t</volatile>",
                "<dram_uncorrectable>2</dram_uncorrectable>\n\t\t\t</volatile>",
            ),
            "GPU memory errors",
            "health",
            "GPU 00000000:00:06.0: 2 uncorrectable ECC errors since the driver loaded",
        ),
        (
            (
                "nvidia-smi-q.xml",
                "<status>N/A</status>\n\t\t\t<cliqueId>",
                "<status>Insufficient Resources</status>\n\t\t\t<cliqueId>",
            ),
            "NVLink fabric problems",
            "health",
            "GPU 00000000:00:06.0: N/A/Insufficient Resources",
        ),
        (
            (
                "nvidia-smi-q.xml",
                "<vbios_version>96.00.DA.00.0C<",
                "<vbios_version>96.00.99.00.01<",
            ),
            "GPU VBIOS",
            "majority",
            "96.00.99.00.01",
        ),
        (
            # one kernel line replaced by a real Xid 48 line (gpud's dmesg, its stamp format)
            (
                "dmesg.txt",
                "[    0.000000] Hypervisor detected: KVM\n",
                "[    0.000000] Hypervisor detected: KVM\n"
                "2024-11-15T12:02:03,470068+00:00 NVRM: Xid (PCI:0000:00:06): 48, "
                "pid='<unknown>', name=<unknown>, An uncorrectable double bit error (DBE) has "
                "been detected on GPU in the framebuffer at partition 6, subpartition 0.\n",
            ),
            "GPU Xid since boot",
            "health",
            "0000:00:06: Xid 48 (double-bit ECC error) x1",
        ),
        (
            (
                "nvidia-smi-q.xml",
                "<state>N/A</state>\n\t\t\t<status>N/A</status>\n\t\t\t<cliqueId>",
                "<state>In Progress</state>\n\t\t\t<status>N/A</status>\n\t\t\t<cliqueId>",
            ),
            "NVLink fabric problems",
            "health",
            "GPU 00000000:00:06.0: In Progress/N/A",
        ),
    ],
    ids=["x8", "row-remap", "ecc", "fabric", "vbios", "xid48", "fabric-state"],
)
def test_one_fault_names_its_node_slot_and_what_differs(tmp_path, fault, prop, kind, seen):
    report = judge(capture(tmp_path, faults={"node3": fault}))
    assert findings(report) == [("node3", prop, kind, seen)]


def test_the_spec_counts_each_nodes_gpus_and_misses_a_node_not_captured(tmp_path):
    spec = tmp_path / "spec.yml"
    spec.write_text(
        "cluster: {name: hgx}\nnodes:\n"
        + "".join(f"  - {{name: node{i}, address: 192.0.2.{i}, gpus: 1}}\n" for i in (1, 2, 3))
        + "  - {name: node5, address: 192.0.2.5, gpus: 8}\n"
    )
    report = judge(capture(tmp_path, nodes=3), load_cluster(spec))
    assert findings(report) == [("node5", "reachable", "unreachable", "not in the capture")]
    spec.write_text(spec.read_text().replace("gpus: 1}\n", "gpus: 8}\n", 1))
    report = judge(capture(tmp_path / "again", nodes=3), load_cluster(spec))
    assert ("node1", "GPU count", "spec", "1") in findings(report)


def test_the_cli_exits_0_clean_1_findings_2_bad_input(tmp_path, capsys):
    clean = capture(tmp_path / "a")
    assert main(["diagnose", str(clean)]) == 0
    assert "no drift: 4 nodes" in capsys.readouterr().out
    bad = capture(
        tmp_path / "b",
        faults={
            "node2": ("nvidia-smi-q.xml", "<current_link_width>16x</", "<current_link_width>4x</")
        },
    )
    assert main(["diagnose", str(bad), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert [(f["node"], f["property"]) for f in report["findings"]] == [
        ("node2", "GPU PCIe link degraded")
    ]
    (clean / "node4" / "dmesg.txt").unlink()
    assert main(["diagnose", str(clean)]) == 2
    err = capsys.readouterr().err
    assert f"{clean / 'node4' / 'dmesg.txt'}: cannot be read" in err and "Traceback" not in err
    assert main(["diagnose", str(tmp_path / "nowhere")]) == 2


def test_a_capture_that_is_not_one_is_refused_naming_the_file(tmp_path):
    root = capture(tmp_path, nodes=1)
    (root / "node1" / STATUS_FILE).write_text("nvidia-smi-q.xml fine\n")
    with pytest.raises(CaptureError, match=r"sources.txt:1: not '<source> <status>'"):
        judge(root)
    (root / "node1" / STATUS_FILE).write_text("cmdline ok\n")
    (root / "node1" / "cmdline").unlink()
    (root / "node1" / "cmdline").symlink_to("/etc/passwd")
    with pytest.raises(CaptureError, match="cmdline: cannot be read"):
        judge(root)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CaptureError, match="no node folders"):
        judge(empty)


# Peak memory of diagnose in a process of its own (ru_maxrss: KiB on Linux), after its imports
# and after judging the capture given: what reading it cost.
_PEAK = """
import resource, sys
from pathlib import Path
from trainfleet.diagnose import CaptureError, judge
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    judge(Path(sys.argv[1]))
except CaptureError as exc:
    print("\\n".join(exc.problems))
print("grew", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before)
"""


def sparse(path: Path, size: int) -> None:
    """``path`` made ``size`` bytes long with nothing on disk (its bytes read as zeros)."""
    with path.open("wb") as file:
        file.truncate(size)


def test_diagnose_reads_a_bounded_amount_and_names_each_file_too_large(tmp_path):
    # node1: 16 sparse sysfs files of 64 MiB (nothing on disk) and a dmesg past its limit;
    # node2: files each within its limit (sparse, 15 and 30 MiB) that pass a node's together
    root = capture(tmp_path, nodes=2)
    node1, node2 = root / "node1", root / "node2"
    (node1 / STATUS_FILE).write_text(
        (node1 / STATUS_FILE).read_text().replace("infiniband absent", "infiniband ok")
    )
    for i in range(16):
        (node1 / "sys-class-infiniband" / f"mlx5_{i}").mkdir(parents=True)
        sparse(node1 / "sys-class-infiniband" / f"mlx5_{i}" / "fw_ver", 64 * 2**20)
    sparse(node1 / "dmesg.txt", 64 * 2**20 + 1)
    (node2 / STATUS_FILE).write_text(
        (node2 / STATUS_FILE).read_text().replace("cpuinfo absent", "cpuinfo ok")
    )
    for name, mib in (("nvidia-smi-q.xml", 15), ("lspci-vvv.txt", 15), ("cpuinfo", 15)):
        sparse(node2 / name, mib * 2**20)
    sparse(node2 / "dmesg.txt", 30 * 2**20)
    run = subprocess.run(
        [sys.executable, "-c", _PEAK, str(root)], capture_output=True, text=True, timeout=120
    )
    *problems, grew = run.stdout.splitlines()
    assert sorted(problems) == sorted(
        [
            f"{node1 / 'dmesg.txt'}: {64 * 2**20 + 1} bytes, more than its {64 * 2**20} (not read)",
            *(
                f"{node1 / 'sys-class-infiniband' / f'mlx5_{i}' / 'fw_ver'}: {64 * 2**20} bytes, "
                "more than its 65536 (not read)"
                for i in range(16)
            ),
            f"{node2 / 'cpuinfo'}: not read: the node's files pass 64 MiB in total",
        ]
    )
    # 1.1 GiB before the bounds; now one node's 45 MiB of text at most, and its parse
    assert int(grew.split()[1]) < 200 * 1024, grew


def test_an_unreadable_source_fails_the_gates_it_feeds(tmp_path):
    hw = read_hardware(
        {**H100_SOURCES, "dmesg.txt": "exit 1"},
        {name: read(H100 / name) for name, s in H100_SOURCES.items() if s == "ok"},
    )
    props = hardware.observed(hw)
    assert props["GPU Xid since boot"] == "unreadable (dmesg.txt: exit 1)"
    assert set(SOURCES) == set(hw["status"])


def change_in_block(text: str, device: str, old: str, new: str) -> str:
    """``text`` with the first ``old`` line after ``device``'s header changed: one line."""
    head, _, block = text.partition(f"\n{device} ")
    assert old in block, (device, old)
    return f"{head}\n{device} {block.replace(old, new, 1)}"


def bare_metal_hgx(lspci_text: str) -> dict:
    """gpud's HGX H100 (its lspci -vvv and boot log: bare metal) with the H100's XML."""
    files = {
        "nvidia-smi-q.xml": read(H100 / "nvidia-smi-q.xml"),
        "lspci-vvv.txt": lspci_text,
        "dmesg.txt": read(HW / "dmesg" / "dmesg_gpud-hgx_boot-mlx5-cx7-nvswitch.log"),
    }
    return read_hardware({name: "ok" for name in files}, files)


def test_acs_on_a_switch_port_above_a_gpu_is_named_on_bare_metal():
    text = read(HGX_LSPCI)
    props = hardware.observed(bare_metal_hgx(text))
    assert props["machine"] == "bare metal" and props["NVSwitches"] == "4"
    assert props["PCIe ACS above GPUs/NICs"] == "none"  # on above the NVSwitches only
    acs_off = (
        "ACSCtl:\tSrcValid- TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-"
    )
    acs_on = (
        "ACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-"
    )
    faulty = change_in_block(text, "17:01.0", acs_off, acs_on)  # the port above GPU 19:00.0
    props = hardware.observed(bare_metal_hgx(faulty))
    assert props["PCIe ACS above GPUs/NICs"] == (
        "0000:17:01.0 above 0000:19:00.0: SrcValid ReqRedir CmpltRedir"
    )


def test_a_nic_trained_at_x8_is_named_and_lspci_without_root_is_unreadable():
    text = read(HGX_LSPCI)
    faulty = change_in_block(
        text,
        "1a:00.0",
        "LnkSta:\tSpeed 32GT/s (ok), Width x16 (ok)",
        "LnkSta:\tSpeed 32GT/s (ok), Width x8 (downgraded)",
    )
    props = hardware.observed(bare_metal_hgx(faulty))
    assert props["GPU PCIe link degraded"] == "NIC 0000:1a:00.0 x8 of x16"
    denied = change_in_block(
        text,
        "17:01.0",
        "\tCapabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00",
        "\tCapabilities: <access denied>",
    )
    props = hardware.observed(bare_metal_hgx(denied))
    assert props["PCIe ACS above GPUs/NICs"].startswith("unreadable (lspci could not read")


# ---- the ledger: parts by slot across runs -------------------------------------------------------


def h100_hardware(serial: str | None = None) -> dict:
    files = {name: read(H100 / name) for name, s in H100_SOURCES.items() if s == "ok"}
    if serial:
        files["nvidia-smi-q.xml"] = files["nvidia-smi-q.xml"].replace(
            "<serial>1652524109717</serial>", f"<serial>{serial}</serial>"
        )
    return read_hardware(H100_SOURCES, files)


def test_the_ledger_records_parts_by_slot_and_names_a_swapped_gpu(tmp_path, monkeypatch):
    before = ledger.parts(h100_hardware())
    assert before == {
        "GPU 00000000:00:06.0 serial": "1652524109717",
        "GPU 00000000:00:06.0 UUID": "GPU-a1c7a0b2-a74d-02d5-4041-02e08bd3f0cd",
        "GPU 00000000:00:06.0 VBIOS": "96.00.DA.00.0C",
    }
    swapped = ledger.parts(h100_hardware(serial="1652524109999"))
    assert ledger.changes(before, swapped) == [
        "GPU 00000000:00:06.0 serial: 1652524109717 -> 1652524109999"
    ]
    ib = {
        p.relative_to(IB_TREE).as_posix(): p.read_text() for p in IB_TREE.rglob("*") if p.is_file()
    }
    hcas = ledger.parts({"infiniband": infiniband.hcas(ib)})
    assert hcas["HCA mlx5_0 firmware"] == "28.41.1000" and len(hcas) == 18
    assert hardware._infiniband({"status": {}, "infiniband": infiniband.hcas(ib)})["IB HCAs"] == (
        "9: mlx5_0, mlx5_1, mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_8, mlx5_9, mlx5_bond_0"
    )
    # kept on the controller across runs: a node first read is recorded, a swap is named once
    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path))
    warnings: list[str] = []
    assert drift_check.read_ledger("c", warnings.append) == {}
    drift_check.write_ledger("c", {}, {"node1": before, "node2": before})
    recorded = drift_check.read_ledger("c", warnings.append)
    found = drift_check.ledger_findings(recorded, {"node1": before, "node2": swapped})
    assert [(f.node, f.property, f.kind, str(f)) for f in found] == [
        (
            "node2",
            "hardware ledger",
            "changed",
            "hardware ledger: GPU 00000000:00:06.0 serial: 1652524109717 -> 1652524109999",
        )
    ]
    drift_check.write_ledger("c", recorded, {"node2": swapped})
    assert drift_check.read_ledger("c", warnings.append) == {"node1": before, "node2": swapped}
    drift_check.ledger_path("c").write_text('{"nodes": {"node1": ["not", "parts"]}}')
    assert drift_check.read_ledger("c", warnings.append) == {} and warnings == [
        f"drift: {drift_check.ledger_path('c')} is not a hardware ledger; it is recorded anew"
    ]


# ---- deploy/capture.py's own command on the H100 machine: live read and capture judge alike ------

CAPTURED = HW / "h100_capture"  # HardwareSources' stdout there, capture and check modes


def raw_lines(name: str) -> list[str]:
    return (CAPTURED / name).read_text().splitlines()


def captured_node(root: Path, node: str, faults: tuple[tuple[str, str, str], ...] = ()) -> None:
    """``node``'s folder in the capture ``root``, as deploy/capture.py writes it from the H100's
    capture output (``faults``: (source, old line, new line), one line each)."""
    raw = HardwareSources().process(raw_lines("hardware-capture.out"))
    for name, old, new in faults:
        assert raw["files"][name].count(old) == 1, (name, old)
        raw["files"][name] = raw["files"][name].replace(old, new)
    write_node(root / node, raw)


def test_one_nodes_bad_output_costs_that_node_only_and_is_named(tmp_path):
    # node2 answers the capture with the InfiniBand tree's lines of the H100 node and one line
    # more: a file at mlx5_0/ports, the folder of mlx5_0/ports/1/state (FileExistsError once)
    lines = raw_lines("hardware-capture.out")
    ib = [
        f"ib {p.relative_to(IB_TREE).as_posix()} {p.read_text().strip()}"
        for p in sorted(IB_TREE.rglob("*"))
        if p.is_file()
    ]
    tree = [
        line.replace("src sys-class-infiniband absent", "src sys-class-infiniband ok")
        for line in lines
    ] + ib
    found = {
        name: HardwareSources().process(out)
        for name, out in {
            "node1": lines,
            "node2": [*tree, "ib mlx5_0/ports 1"],
            "node3": tree,
        }.items()
    }
    assert "sys-class-infiniband/mlx5_0/ports/1/state" in found["node2"]["files"]
    missing = save_nodes(tmp_path, ["node1", "node2", "node3", "node4"], found, {})
    assert missing == {
        "node2": "its output could not be saved (a file and a folder at once: "
        "'sys-class-infiniband/mlx5_0/ports')",
        "node4": "could not connect or read it",
    }
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node1", "node3"]
    assert (
        tmp_path / "node3" / "sys-class-infiniband" / "mlx5_0" / "ports" / "1" / "state"
    ).is_file()
    report = judge(tmp_path)  # the nodes saved are judged, whole
    assert sorted(report.nodes) == ["node1", "node3"]


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({"/etc/passwd": "x"}, "'/etc/passwd'"),
        ({"sys-class-infiniband/../../x": "x"}, "'sys-class-infiniband/../../x'"),
        ({"sys-class-infiniband//etc/cron.d/x": "x"}, "'sys-class-infiniband//etc/cron.d/x'"),
        ({"nvidia-smi-q.xml/../x": "x"}, "'nvidia-smi-q.xml/../x'"),
        ({"sys-class-infiniband/mlx5_0/ports/1/\nstate": "x"}, "'sys-class-infiniband/mlx5_0"),
        ({"cmdline": "\udcff"}, "not text"),
        ({"sys-class-infiniband": "x"}, "'sys-class-infiniband'"),
    ],
)
def test_a_name_outside_the_captures_or_text_that_is_not_text_is_refused_before_writing(
    files, named, tmp_path
):
    raw = {"status": {"cmdline": "ok"}, "files": {"cmdline": "quiet\n", **files}}
    with pytest.raises(ValueError, match=re.escape(named)):
        node_files(raw)
    assert save_nodes(tmp_path, ["node1"], {"node1": raw}, {})["node1"].startswith(
        "its output could not be saved ("
    )
    assert list(tmp_path.iterdir()) == []


def live_read(faults: tuple[tuple[str, str, str], ...] = ()) -> dict:
    """What drift's live read of the H100 gives (its check-mode output), the same lines changed
    in the sources it carries."""
    lines = []
    for line in raw_lines("hardware-check.out"):
        tag, name, state, *rest = line.split(" ") + [""]
        for source, old, new in faults:
            if (tag, name, state) == ("src", source, "ok"):
                text = base64.b64decode(rest[0]).decode().replace(old, new)
                line = f"src {name} ok {base64.b64encode(text.encode()).decode()}"
        lines.append(line)
    return HardwareState().process(lines)


H100_PROPS = {
    "hardware sources": "none",
    "IOMMU (kernel command line)": "kernel default",
    "machine": "virtual machine (KVM)",
    "GPU count": "1",
    "GPU model": "1 x NVIDIA H100 80GB HBM3",
    "GPU VBIOS": "96.00.DA.00.0C",
    "GPU ECC mode": "Enabled",
    "GPU MIG mode": "Disabled",
    "GPU PCIe max": "gen5 x16",
    "GPU memory errors": "none",
    "NVLink fabric problems": "none",
    "GPU PCIe link degraded": "none",
    "GPU Xid since boot": "none",
    "NVSwitches": "0",
    "GPU-NIC affinity": "0000:00:06.0: none",
    "IB HCAs": "none",
}


def test_the_h100_read_live_and_from_its_capture_gives_the_same_properties(tmp_path):
    captured_node(tmp_path / "capture", "h100")
    (from_capture,) = read_capture(tmp_path / "capture").values()
    assert hardware.observed(live_read()) == hardware.observed(from_capture) == H100_PROPS
    written = tmp_path / "capture" / "h100"
    assert (written / "nvidia-smi-q.xml").read_text().startswith('<?xml version="1.0" ?>')
    assert (written / "lspci-vvv.txt").read_text().startswith("00:00.0 Host bridge")
    assert (written / STATUS_FILE).read_text().splitlines()[-1] == "sys-class-infiniband absent"


FAULTS = {
    "node2": (("nvidia-smi-q.xml", "<current_link_width>16x</", "<current_link_width>8x</"),),
    "node3": (("nvidia-smi-q.xml", "<remapped_row_failure>No<", "<remapped_row_failure>Yes<"),),
    "node4": (("cmdline", "pci=realloc=off", "pci=realloc=off intel_iommu=on iommu=pt"),),
}
NAMED = [
    ("node2", "GPU PCIe link degraded", "health", "GPU 00000000:00:06.0 x8 of x16"),
    ("node3", "GPU memory errors", "health", "GPU 00000000:00:06.0: row remap failed"),
    ("node4", "IOMMU (kernel command line)", "majority", "intel_iommu=on iommu=pt"),
]


def test_diagnose_names_each_fault_of_a_four_node_capture_as_drift_does_live(tmp_path, capsys):
    root = tmp_path / "capture"
    for node in ("node1", "node2", "node3", "node4"):
        captured_node(root, node, FAULTS.get(node, ()))
    assert main(["diagnose", str(root), "--json"]) == 1
    offline = json.loads(capsys.readouterr().out)
    named = [(f["node"], f["property"], f["kind"], f["observed"]) for f in offline["findings"]]
    assert named == NAMED
    # drift's live path: the check-mode output, the same lines changed, its observe and compare
    nodes = ["node1", "node2", "node3", "node4"]
    live = {
        n: hardware.observe({"hardware": live_read(FAULTS.get(n, ()))}, None, None) for n in nodes
    }
    report = compare("c", nodes, live, {n: {} for n in nodes}, rules=RULES)
    assert findings(report) == NAMED
    # offline adds the NCCL environment a capture lets it derive (trainfleet.diagnose_nccl)
    hardware_only = {
        n: {k: v for k, v in offline["nodes"][n]["properties"].items() if not is_env_property(k)}
        for n in nodes
    }
    assert report.observed == hardware_only


def judged(nodes: dict[str, dict]) -> list[tuple[str, str, str, str]]:
    """Drift's comparison of nodes' hardware as plain data (no spec)."""
    observed = {n: hardware.observed(hw) for n, hw in nodes.items()}
    return findings(compare("c", list(nodes), observed, {n: {} for n in nodes}, rules=RULES))


def test_an_nvlink_down_on_one_gpu_of_one_node_is_named_by_gpu_index():
    a100 = read(HW / "nvidia_smi" / "nvidia-smi-nvlink-s_gpud-a100-sxm4-8gpu_all-active.txt")
    gpu3 = a100.index("GPU 3:")
    down = a100[:gpu3] + a100[gpu3:].replace("Link 5: 25 GB/s", "Link 5: <inactive>", 1)

    def node(text: str) -> dict:
        return {**h100_hardware(), "nvlinks": nvlink.links(text)}

    assert judged({"n1": node(a100), "n2": node(a100), "n3": node(down)}) == [
        ("n3", "NVLink GPU 3", "majority", "11 at 25 GB/s; inactive: links 5")
    ]
    assert judged({"n1": node(a100), "n2": node(a100)}) == []


def test_an_hca_on_other_firmware_and_a_port_down_are_named_by_hca_and_port():
    tree = {
        p.relative_to(IB_TREE).as_posix(): p.read_text() for p in IB_TREE.rglob("*") if p.is_file()
    }
    old_fw = {**tree, "mlx5_5/fw_ver": tree["mlx5_5/fw_ver"].replace("28.41.1000", "28.39.1002")}
    down = {**tree, "mlx5_7/ports/1/state": "1: DOWN", "mlx5_7/ports/1/phys_state": "3: Disabled"}

    def node(files: dict) -> dict:
        return {**h100_hardware(), "infiniband": infiniband.hcas(files)}

    assert judged({"n1": node(tree), "n2": node(old_fw), "n3": node(down), "n4": node(tree)}) == [
        ("n2", "IB mlx5_5 firmware", "majority", "28.39.1002"),
        ("n3", "IB mlx5_7:1 link", "majority", "1: DOWN, 3: Disabled, InfiniBand"),
    ]


@pytest.mark.parametrize(
    ("old", "new", "prop", "kind", "seen"),
    [
        (
            "<current_ecc>Enabled</",
            "<current_ecc>Disabled</",
            "GPU ECC mode",
            "majority",
            "Disabled",
        ),
        (
            "<current_link_gen>5</",
            "<current_link_gen>3</",
            "GPU PCIe link degraded",
            "health",
            "GPU 00000000:00:06.0 gen3 of gen5 in P0",
        ),
        (
            "<current_mig>Disabled</",
            "<current_mig>Enabled</",
            "GPU MIG mode",
            "majority",
            "Enabled",
        ),
    ],
    ids=["ecc-off", "gen3-in-p0", "mig-on"],
)
def test_modes_and_a_downtrained_generation_in_p0(old, new, prop, kind, seen):
    xml = read(H100 / "nvidia-smi-q.xml")
    assert xml.count(old) == 1
    files = {name: read(H100 / name) for name, s in H100_SOURCES.items() if s == "ok"}
    odd = read_hardware(H100_SOURCES, {**files, "nvidia-smi-q.xml": xml.replace(old, new)})
    same = read_hardware(H100_SOURCES, files)  # the node whole: lspci read (its NICs' links)
    nodes = {"n1": same, "n2": same, "n3": odd}
    assert [f for f in judged(nodes) if f[1] == prop] == [("n3", prop, kind, seen)]


def test_a_reset_required_on_an_a100_is_a_memory_gate():
    a100 = read(GPU_CAPTURES / "nvidia-smi-q-x_a100-sxm4-80gb_535.54.03.xml")
    assert a100.count("<reset_required>No</reset_required>") == 1
    hw = read_hardware(
        {"nvidia-smi-q.xml": "ok"},
        {"nvidia-smi-q.xml": a100.replace("<reset_required>No<", "<reset_required>Yes<")},
    )
    assert hardware.observed(hw)["GPU memory errors"].endswith(": reset required")


def test_gpu_nic_affinity_comes_from_the_pcie_switches_and_a_moved_nic_is_named():
    text = read(HGX_LSPCI)
    props = hardware.observed(bare_metal_hgx(text))
    assert props["GPU-NIC affinity"].startswith(
        "0000:19:00.0: 0000:1a:00.0, 0000:1b:00.0, 0000:1b:00.1; 0000:3b:00.0: 0000:3c:00.0; "
    )
    # the ConnectX-7 beside GPU 3b:00.0 seated in a slot behind GPU 5d:00.0's switch instead
    assert text.count("\n3c:00.0 ") == 1
    moved = text.replace("\n3c:00.0 ", "\n5f:00.0 ")
    nodes = {"n1": bare_metal_hgx(text), "n2": bare_metal_hgx(moved), "n3": bare_metal_hgx(text)}
    ((node, prop, kind, seen),) = [f for f in judged(nodes) if f[1] == "GPU-NIC affinity"]
    assert (node, kind) == ("n2", "majority")
    assert "0000:3b:00.0: none; " in seen and "0000:5d:00.0: 0000:5e:00.0, 0000:5f:00.0" in seen


def test_a_missing_hca_and_a_missing_nvswitch_are_named_by_the_counts():
    tree = {
        p.relative_to(IB_TREE).as_posix(): p.read_text() for p in IB_TREE.rglob("*") if p.is_file()
    }
    short = {path: text for path, text in tree.items() if not path.startswith("mlx5_8/")}
    text = read(HGX_LSPCI)
    switch = next(x for x in text.splitlines() if x.startswith("84:00.0 Bridge"))
    lost = text.replace(
        f"\n{switch}\n", f"\n{switch.replace('Bridge', 'Non-VGA unclassified device')}\n"
    )

    def node(pci: str, ib: dict) -> dict:
        return {**bare_metal_hgx(pci), "infiniband": infiniband.hcas(ib)}

    got = judged({"n1": node(text, tree), "n2": node(text, short), "n3": node(lost, tree)})
    assert [(n, p, v) for n, p, _, v in got if p in ("IB HCAs", "NVSwitches")] == [
        ("n2", "IB HCAs", "8: mlx5_0, mlx5_1, mlx5_4, mlx5_5, mlx5_6, mlx5_7, mlx5_9, mlx5_bond_0"),
        ("n3", "NVSwitches", "3"),
    ]


def test_a_page_retirement_pending_on_a_t4_is_a_memory_gate():
    t4 = read(GPU_CAPTURES / "nvidia-smi-q-x_tesla-t4_515.105.01.xml")
    assert t4.count("<pending_retirement>No</pending_retirement>") == 1
    changed = t4.replace("<pending_retirement>No<", "<pending_retirement>Yes<")
    hw = read_hardware({"nvidia-smi-q.xml": "ok"}, {"nvidia-smi-q.xml": changed})
    assert hardware.observed(hw)["GPU memory errors"].endswith(
        ": page retirement pending (reset the GPU)"
    )
    healthy = read_hardware({"nvidia-smi-q.xml": "ok"}, {"nvidia-smi-q.xml": t4})
    assert hardware.observed(healthy)["GPU memory errors"] == "none"


def test_a_timed_out_nvidia_smi_keeps_the_ledgers_gpus_and_a_sources_list_must_be_whole(tmp_path):
    before = ledger.parts(h100_hardware())
    timed_out = read_hardware({**H100_SOURCES, "nvidia-smi-q.xml": "exit 124"}, {})
    assert ledger.read_now(before, timed_out) == before  # not "gone": unread
    assert hardware.observed(timed_out)["hardware sources"].startswith("nvidia-smi-q.xml: exit 124")
    root = capture(tmp_path, nodes=1)
    status = root / "node1" / STATUS_FILE
    status.write_text("".join(x for x in status.read_text().splitlines(True) if "dmesg" not in x))
    with pytest.raises(CaptureError, match="sources.txt: says nothing of dmesg.txt"):
        judge(root)


def test_the_capture_format_in_the_docs_is_the_one_written():
    """docs/hardware.md's table of a capture's files names exactly the sources the fact sends
    (and sources.txt): a source added or renamed without its row fails here."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "hardware.md").read_text()
    table = page.split("one file per source:", 1)[1].split("\n\n", 2)[1]
    named = {row.split("`")[1].rstrip("/") for row in table.splitlines() if row.startswith("| `")}
    assert named == {*SOURCES, *FABRIC_SOURCES, f"{MLNX_QOS}/<netdev>.txt", STATUS_FILE}


# ---- SXid, a GPU fallen off the bus, the NVLink domain: real kernel logs and Fabric blocks ----


def unquoted(path: Path) -> str:
    """A log quoted in Markdown as found ("> " before each line, ">" between): the log."""
    return "".join(line[2:] + "\n" for line in read(path).splitlines() if line.startswith("> "))


def test_a_fatal_sxid_is_named_by_nvswitch_and_link_and_a_non_fatal_one_is_not():
    incident = kernel_log.read(
        unquoted(HW / "dmesg" / "dmesg_gpud-sxid-readme_xid79-sxid20034.quoted.md")
    )
    # one event per SXid, counted on its description line (not its Data or Severity lines)
    assert [(x["pci"], x["xid"], x["link"]) for x in incident["sxids"]] == [
        ("0000:06:00.0", 20034, 48),
        ("0000:05:00.0", 20034, 63),
        ("0000:07:00.0", 20034, 37),
        ("0000:05:00.0", 20034, 62),
    ]
    assert incident["fallen"] == ["0000:91:00.0"] and [x["xid"] for x in incident["xids"]] == [79]
    assert kernel_log.sxid_name(20034) == "SXid 20034 (LTSSM Fault Up)"
    benign = kernel_log.read(read(HW / "dmesg" / "dmesg_nvtrust-124_hgx-h100-tdx_sxid22013.log"))
    assert [(x["xid"], x["link"]) for x in benign["sxids"]] == [
        (22013, 44),
        (22013, 45),
        (22013, 46),
    ]
    # gpud's catalogue: 22013 can be ignored, the NVSwitch corrects it; 20034 needs a reboot
    assert kernel_log.hardware_sxids(benign["sxids"]) == []
    assert len(kernel_log.hardware_sxids(incident["sxids"])) == 4
    unknown = [{"pci": "p", "xid": 99999, "link": None}]
    assert kernel_log.hardware_sxids(unknown) == unknown
    assert kernel_log.sxid_name(99999) == "SXid 99999 (not in the catalogue)"


def drift_grep(log: str) -> str:
    """The kernel lines drift's live read keeps: the fact's own grep -E of GREP."""
    return subprocess.run(
        ["grep", "-E", kernel_log.GREP], input=log, capture_output=True, text=True, check=False
    ).stdout


@pytest.mark.parametrize(
    ("log", "gone"),
    [
        ("dmesg_kubecon-hk-2024_h100_xid79-fallen.log", "0000:5d:00.0"),  # one-line form
        ("dmesg_kubecon-hk-2024_h100_fallen-probe-failed.log", "0000:5d:00.0"),  # the probe's
        ("dmesg_nvsentinel-155_10de-26b5_fallen-multiline.log", "0000:b3:00.0"),
    ],
)
def test_a_gpu_fallen_off_the_bus_is_read_in_both_forms_the_driver_prints(log, gone):
    text = read(HW / "dmesg" / log)
    assert kernel_log.read(text)["fallen"] == [gone]
    # drift's live read keeps only the lines the parser needs (grep -E GREP): the same answer
    assert kernel_log.read(drift_grep(text))["fallen"] == [gone]


def test_a_continuation_line_alone_is_no_gpu_fallen_off_the_bus():
    text = read(HW / "dmesg" / "dmesg_nvsentinel-155_10de-26b5_fallen-multiline.log")
    first, *rest = text.splitlines(keepends=True)
    assert kernel_log.read("".join(rest))["fallen"] == []  # its GPU line gone: no GPU to name
    # a record's later lines never start one: an indented "NVRM: Xid" is not an Xid
    assert kernel_log.read("               NVRM: Xid (PCI:0000:19:00): 48, x\n")["xids"] == []


def test_the_xid_gate_names_the_fallen_gpu_and_the_fatal_sxids_with_their_links(tmp_path):
    incident = "".join(
        line + "\n"
        for line in unquoted(
            HW / "dmesg" / "dmesg_gpud-sxid-readme_xid79-sxid20034.quoted.md"
        ).splitlines()
    )
    fault = (
        "dmesg.txt",
        "[    0.000000] Hypervisor detected: KVM\n",
        "[    0.000000] Hypervisor detected: KVM\n" + incident,
    )
    report = judge(capture(tmp_path, faults={"node2": fault}))
    ((node, prop, kind, seen),) = findings(report)
    assert (node, prop, kind) == ("node2", "GPU Xid since boot", "health")
    assert seen.split("; ") == [
        "0000:91:00: Xid 79 (GPU has fallen off the bus) x1",
        "0000:91:00.0: GPU has fallen off the bus x1",
        "NVSwitch 0000:06:00.0 link 48: SXid 20034 (LTSSM Fault Up) x1",
        "NVSwitch 0000:05:00.0 link 63: SXid 20034 (LTSSM Fault Up) x1",
        "NVSwitch 0000:07:00.0 link 37: SXid 20034 (LTSSM Fault Up) x1",
        "NVSwitch 0000:05:00.0 link 62: SXid 20034 (LTSSM Fault Up) x1",
    ]


def fabric_values(name: str) -> dict[str, str]:
    """The Fabric block's values of a real `nvidia-smi -q` ("CliqueId : 2")."""
    found = {}
    for line in read(HW / "nvidia_smi" / name).splitlines():
        key, sep, value = line.partition(" : ")
        if sep and key.strip() in ("State", "Status", "CliqueId", "ClusterUUID"):
            found[key.strip()] = value.strip()
    return found


def in_a_domain(values: dict[str, str]) -> list[tuple[str, str]]:
    """The H100's own Fabric elements, each given one value of a real Fabric block."""
    return [
        ("<state>N/A</state>\n\t\t\t<status>", f"<state>{values['State']}</state>\n\t\t\t<status>"),
        (
            "<status>N/A</status>\n\t\t\t<cliqueId>",
            f"<status>{values['Status']}</status>\n\t\t\t<cliqueId>",
        ),
        ("<cliqueId>N/A</cliqueId>", f"<cliqueId>{values['CliqueId']}</cliqueId>"),
        ("<clusterUuid>N/A</clusterUuid>", f"<clusterUuid>{values['ClusterUUID']}</clusterUuid>"),
    ]


def domain_capture(tmp: Path, odd: dict[str, str] | None = None) -> Path:
    """Four H100 nodes in the multi-node NVLink domain of dra-driver#626 (CliqueId 2); node3's
    CliqueId and ClusterUUID those of ``odd``, a node that did not join one."""
    root = capture(tmp)
    member = fabric_values("nvidia-smi-q-fabric_dra-driver-626_clique2.txt")
    for node in ("node1", "node2", "node3", "node4"):
        path = root / node / "nvidia-smi-q.xml"
        text = read(path)
        values = member if node != "node3" or not odd else {**member, **odd}
        for old, new in in_a_domain(values):
            assert text.count(old) == 1, old
            text = text.replace(old, new)
        path.write_text(text)
    return root


def test_a_node_outside_the_others_nvlink_domain_is_named_and_a_whole_domain_is_not(tmp_path):
    healthy = judge(domain_capture(tmp_path / "healthy"))
    assert findings(healthy) == []
    assert healthy.observed["node1"]["NVLink domain"] == "multi-node"
    assert healthy.observed["node1"]["NVLink fabric"] == "Completed/Success"
    # Azure's node of azhpc-images#506: CliqueId 0 and a zero ClusterUUID (its Status aside)
    alone = fabric_values("nvidia-smi-q-fabric_azhpc-images-506_insufficient-resources.txt")
    odd = {key: alone[key] for key in ("CliqueId", "ClusterUUID")}
    report = judge(domain_capture(tmp_path / "odd", odd))
    assert findings(report) == [
        ("node3", "NVLink domain", "majority", "this node alone (CliqueId 0, ClusterUUID zero)")
    ]


def test_an_sxid_seen_only_in_its_detail_lines_is_one_event_and_the_drivers_fatal_counts():
    incident = unquoted(HW / "dmesg" / "dmesg_gpud-sxid-readme_xid79-sxid20034.quoted.md")
    # the description lines rate-limited away: each NVSwitch's Data/Severity lines remain
    details = "".join(line + "\n" for line in incident.splitlines() if "LTSSM Fault Up" not in line)
    found = kernel_log.read(details)["sxids"]
    assert sorted((x["pci"], x["xid"], x["link"]) for x in found) == [
        ("0000:05:00.0", 20034, None),
        ("0000:07:00.0", 20034, None),
    ]
    assert len(kernel_log.hardware_sxids(found)) == 2
    # the driver's own verdict: a Non-fatal 22013 is not named; the same line printed Fatal is
    benign = read(HW / "dmesg" / "dmesg_nvtrust-124_hgx-h100-tdx_sxid22013.log")
    line = "22013, Non-fatal, Link 44 Minion Link DLREQ interrupt"
    assert benign.count(line) == 1
    fatal = kernel_log.read(benign.replace(line, line.replace("Non-fatal", "Fatal")))["sxids"]
    assert [(x["link"], x["fatal"]) for x in kernel_log.hardware_sxids(fatal)] == [(44, True)]


def test_drift_keeps_only_kernel_lines_that_start_as_the_parser_reads_them():
    log = read(HW / "dmesg" / "dmesg_kubecon-hk-2024_h100_fallen-probe-failed.log")
    kept = drift_grep(log).splitlines()
    assert kept == [
        "[14387.209961] NVRM: The NVIDIA GPU 0000:5d:00.0",
        "               NVRM: fallen off the bus and is not responding to commands.",
    ]
    # a user's text mid-line (an audit record's name="...") is not kept: it cannot crowd the
    # kernel's own lines out of the last 2000 drift reads
    audit = '[ 9.2] audit: type=1400 name="NVRM: The NVIDIA GPU fallen off the bus"\n'
    assert drift_grep(audit) == ""
    assert drift_grep(read(H100 / "dmesg.txt")).splitlines() == [
        "[    0.000000] Hypervisor detected: KVM"
    ]


# ---- the offline judge never passes on what it did not read (#40) ------------------------------

XID119 = HW / "dmesg" / "dmesg_gpud-dell-xe9680_xid119-gsp-timeout.log"
NVIDIA_SMI = ("nvidia-smi-q.xml", "nvidia-smi-nvlink-s.txt", "nvidia-smi-topo-m.txt")


def not_captured(root: Path, node: str, *sources: str) -> None:
    """``node``'s capture as a node without those sources' tool writes it: each ``absent`` in
    sources.txt, its file gone (the one fault: the source not read)."""
    status = root / node / STATUS_FILE
    lines = status.read_text().splitlines(True)
    assert all(f"{name} ok\n" in lines for name in sources), sources
    status.write_text(
        "".join(f"{x.split()[0]} absent\n" if x.split()[0] in sources else x for x in lines)
    )
    for name in sources:
        (root / node / name).unlink()


def test_an_xid_is_a_finding_on_a_node_of_twenty_without_nvidia_smi(tmp_path, capsys):
    # node13 of 20 copies of the H100: gpud's real Xid 119 line in its kernel log, no nvidia-smi
    # (the three sources the capture script says absent where the tool is not there)
    xid = next(line for line in read(XID119).splitlines() if ": 119, " in line)
    kvm = "[    0.000000] Hypervisor detected: KVM\n"
    root = capture(tmp_path, nodes=20, faults={"node13": ("dmesg.txt", kvm, f"{kvm}{xid}\n")})
    not_captured(root, "node13", *NVIDIA_SMI)
    assert main(["diagnose", str(root)]) == 1  # it was "no drift: 20 nodes match the spec ..."
    out = capsys.readouterr().out
    assert "[node13] GPU Xid since boot: 0000:9b:00: Xid 119 (GSP RPC timeout) x1" in out
    report = judge(root)
    unread = "unreadable (nvidia-smi-q.xml: absent)"
    assert findings(report) == [  # the GPU gates say nvidia-smi was not read, never "none"
        ("node13", "GPU PCIe link degraded", "health", unread),
        ("node13", "GPU Xid since boot", "health", "0000:9b:00: Xid 119 (GSP RPC timeout) x1"),
        ("node13", "GPU memory errors", "health", unread),
        ("node13", "NVLink fabric problems", "health", unread),
        (
            "node13",
            "hardware sources",
            "health",
            "nvidia-smi-q.xml: absent; nvidia-smi-nvlink-s.txt: absent",
        ),
    ]


# each health gate and the sources it reads (a VM's ACS is not judged: none here)
GATES = {
    "GPU PCIe link degraded": ("nvidia-smi-q.xml", "lspci-vvv.txt"),
    "GPU memory errors": ("nvidia-smi-q.xml",),
    "NVLink fabric problems": ("nvidia-smi-q.xml",),
    "GPU Xid since boot": ("dmesg.txt",),
}


@pytest.mark.parametrize(
    "source", ["lspci-vvv.txt", "dmesg.txt", "nvidia-smi-nvlink-s.txt", "cmdline"]
)
def test_a_gate_whose_source_was_not_read_says_so_and_is_a_finding(tmp_path, source):
    root = capture(tmp_path)
    not_captured(root, "node2", source)
    report = judge(root)
    seen = report.observed["node2"]
    assert ("node2", "hardware sources", "health", f"{source}: absent") in findings(report)
    for gate, sources in GATES.items():
        if source in sources:  # "GPU PCIe link degraded: none" before, without lspci
            assert seen[gate] == f"unreadable ({source}: absent)"
            assert ("node2", gate, "health", seen[gate]) in findings(report)
    assert {f[0] for f in findings(report)} == {"node2"}


def test_without_a_spec_the_summary_says_the_nodes_were_compared_with_each_other(tmp_path, capsys):
    root = capture(tmp_path, nodes=3)
    assert main(["diagnose", str(root)]) == 0
    out = capsys.readouterr().out
    assert "match the spec" not in out
    assert out.startswith("no drift: 3 nodes match each other and pass the health gates (no spec")
    spec = tmp_path / "spec.yml"
    spec.write_text(
        "cluster: {name: hgx}\nnodes:\n"
        + "".join(f"  - {{name: node{i}, address: 192.0.2.{i}, gpus: 1}}\n" for i in (1, 2, 3))
    )
    assert main(["diagnose", str(root), "--spec", str(spec)]) == 0
    assert capsys.readouterr().out.startswith("no drift: 3 nodes match the spec and each other")


def truncated(text: str) -> str:
    return text[: len(text) // 2]


def binary(text: str) -> str:  # bytes 0-255 in the middle of the real text: not a tool's output
    return text[:100] + bytes(range(256)).decode("latin-1") + text[100:]


@pytest.mark.parametrize(
    ("source", "damage", "named"),
    [
        (
            "nvidia-smi-q.xml",
            truncated,
            "nvidia-smi-q.xml: refused: not XML (unclosed token: line 334, column 38)",
        ),
        ("dmesg.txt", binary, "dmesg.txt: refused: not text (it holds a NUL byte)"),
        ("lspci-vvv.txt", binary, "lspci-vvv.txt: refused: not text (it holds a NUL byte)"),
        ("cmdline", binary, "cmdline: refused: not text (it holds a NUL byte)"),
    ],
    ids=["truncated-xml", "binary-dmesg", "binary-lspci", "binary-cmdline"],
)
def test_an_unparsable_source_is_named_on_its_node_never_a_traceback(
    tmp_path, capsys, source, damage, named
):
    root = capture(tmp_path)
    path = root / "node3" / source
    path.write_bytes(damage(read(path)).encode("latin-1" if damage is binary else "utf-8"))
    assert main(["diagnose", str(root)]) == 1
    out, err = capsys.readouterr()
    assert f"[node3] hardware sources: {named}\n" in out and "Traceback" not in out + err
    report = judge(root)
    assert {f[0] for f in findings(report)} == {"node3"}
    for gate, sources in GATES.items():  # each gate it feeds says why, never "none"
        if source in sources:
            assert report.observed["node3"][gate].startswith(f"unreadable ({named}")


@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("lspci-vvv.txt", "lspci-vvv.txt: refused: no PCI device read from it"),
        ("nvidia-smi-nvlink-s.txt", "nvidia-smi-nvlink-s.txt: refused: no 'GPU N:' line read"),
    ],
)
def test_a_source_that_parses_to_nothing_is_refused_not_passed(tmp_path, source, named):
    # the node's own command line saved in the source's place: real text, not the tool's
    root = capture(tmp_path)
    shutil.copy(H100 / "cmdline", root / "node1" / source)
    report = judge(root)
    assert report.observed["node1"]["hardware sources"].startswith(named)
    assert ("node1", "hardware sources", "health") in [f[:3] for f in findings(report)]
    assert {f[0] for f in findings(report)} == {"node1"}


def test_a_source_not_read_reads_the_same_live_and_offline(tmp_path):
    # the H100 without lspci: deploy/capture.py's folder, and drift's live check-mode answer
    captured_node(tmp_path / "capture", "h100")
    not_captured(tmp_path / "capture", "h100", "lspci-vvv.txt")
    (offline,) = read_capture(tmp_path / "capture").values()
    lines = raw_lines("hardware-check.out")
    live = HardwareState().process(
        ["src lspci-vvv.txt absent" if x.startswith("src lspci-vvv.txt ok ") else x for x in lines]
    )
    props = hardware.observed(live)
    assert props == hardware.observed(offline)
    assert props["GPU PCIe link degraded"] == "unreadable (lspci-vvv.txt: absent)"
    assert props["hardware sources"] == "lspci-vvv.txt: absent"


def test_an_infiniband_tree_with_a_nul_byte_is_refused_whole():
    tree = {
        f"sys-class-infiniband/{p.relative_to(IB_TREE).as_posix()}": p.read_text()
        for p in IB_TREE.rglob("*")
        if p.is_file()
    }
    assert read_hardware({"sys-class-infiniband": "ok"}, tree)["infiniband"]
    name = "sys-class-infiniband/mlx5_0/fw_ver"
    hw = read_hardware({"sys-class-infiniband": "ok"}, {**tree, name: tree[name] + "\0"})
    assert hw["infiniband"] is None
    assert hw["problems"]["sys-class-infiniband"] == "refused: not text (it holds a NUL byte)"
