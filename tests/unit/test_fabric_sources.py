"""What a capture and the live NcclNetwork fact read of the RDMA fabric (#40): the GID entries in
use, each HCA's PCI function and netdevs, the RoCE QoS readings, and the rails by lspci's PCIe
switches where nvidia-smi is not there. The scripts run for real over sysfs trees laid out from
real captures (tests/fixtures/sysfs, tests/fixtures/rdma: README there, each tree's source);
the tools they call are stand-ins that print real captured output."""

from __future__ import annotations

import base64
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from checks.capture_save import node_files, write_node
from facts.hardware_facts import HardwareSources
from facts.nccl_env_facts import NcclNetwork
from trainfleet.diagnose import judge, node_rails, read_node
from trainfleet.hw import lspci
from trainfleet.hw.pci_tree import HcaFunction, gpu_name, hca_functions, lspci_topology
from trainfleet.hw.sources import HCA_PCI, LSPCI, SOURCES, TOPO
from trainfleet.hw.topo import parse
from trainfleet.nccl import network_rails
from trainfleet.rails import Rails, by_affinity, disagreement

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RDMA = FIXTURES / "rdma"
ROCE_TREE = FIXTURES / "sysfs" / "roce_v2_cx6" / "class" / "infiniband"
LINKS = RDMA / "sysfs_links" / "ls-l_sys-class-infiniband_18-mlx5-dual-port-hcas_TRIMMED.txt"
CENTOS12_QOS = RDMA / "qos" / "mlnx_qos_centos12-doc_ens6_trust-pcp_no-pfc.txt"
TCLASS = RDMA / "qos" / "traffic_class_ucx-pr-11105_mlx5_0_global-tclass-106.txt"
GPUD_LSPCI = (
    FIXTURES / "hardware" / "lspci" / "lspci-vvv_gpud-hgx-h100_acs-srcvalid-and-downgraded.txt"
)
SGLANG_TOPO = RDMA / "topo" / "topo-m_sglang-30401_h100-8nic-pix-1to1.txt"
DGX_TOPO = RDMA / "topo" / "topo-m_dgx-a100-1mcprddgx05_pxb-rails-storage-sys.txt"
# the 18-HCA pod's mapping, as its README reads the `ls -l` capture
POD_MAPPING = {
    "mlx5_0": "0000:48:00.0", "mlx5_1": "0000:48:00.1", "mlx5_2": "0000:4c:00.0",
    "mlx5_3": "0000:4c:00.1", "mlx5_4": "0000:2d:00.0", "mlx5_5": "0000:2d:00.1",
    "mlx5_6": "0000:0c:00.0", "mlx5_7": "0000:0c:00.1", "mlx5_8": "0000:16:00.0",
    "mlx5_9": "0000:16:00.1", "mlx5_10": "0000:c3:00.0", "mlx5_11": "0000:c3:00.1",
    "mlx5_12": "0000:d1:00.0", "mlx5_13": "0000:d1:00.1", "mlx5_14": "0000:8a:00.0",
    "mlx5_15": "0000:8a:00.1", "mlx5_16": "0000:94:00.0", "mlx5_17": "0000:94:00.1",
}  # fmt: skip


def centos12_mlnx_qos() -> str:
    """`mlnx_qos -i ens6`'s output as centos12 printed it (the capture without its prompt)."""
    return CENTOS12_QOS.read_text().split("\n", 1)[1]


def pod_tree(root: Path, only: tuple[str, ...] = ()) -> None:
    """/sys under ``root`` as the 18-HCA pod's `ls -l /sys/class/infiniband` shows it: each
    class entry a link into its PCI function's folder, whose ``device`` link is the kernel's
    (``../../../<function>``, relative to ``<function>/infiniband/<hca>``)."""
    for line in LINKS.read_text().splitlines():
        match = re.search(r" (mlx5_[0-9]+) -> \.\./\.\./(devices/\S+)$", line)
        if not match:
            continue
        hca, target = match.groups()
        if only and hca not in only:
            continue
        folder = root / "sys" / target
        folder.mkdir(parents=True)
        function = folder.parent.parent.name
        (folder / "device").symlink_to(f"../../../{function}")
        (root / "sys" / "class" / "infiniband").mkdir(parents=True, exist_ok=True)
        (root / "sys" / "class" / "infiniband" / hca).symlink_to(f"../../{target}")


def roce_node(tmp: Path, mlnx_qos: str) -> Path:
    """A RoCE node: the real ConnectX-6's GID table (roce_v2_cx6, netdev ens1f0), mlx5_0's
    global traffic class as ucx#11105 read it, ECN on at every priority and rdma_cm's ToS 160
    as spiderpool's doc read them, and ``mlnx_qos`` a stand-in running ``mlnx_qos``."""
    root = tmp / "root"
    ib = root / "sys" / "class" / "infiniband"
    shutil.copytree(ROCE_TREE, ib)
    (ib / "mlx5_0" / "tc" / "1").mkdir(parents=True)
    tclass = TCLASS.read_text().splitlines()[-1]  # the `cat` line's answer
    (ib / "mlx5_0" / "tc" / "1" / "traffic_class").write_text(tclass + "\n")
    for which in ("roce_np", "roce_rp"):
        enable = root / "sys" / "class" / "net" / "ens1f0" / "ecn" / which / "enable"
        enable.mkdir(parents=True)
        for prio in range(8):
            (enable / str(prio)).write_text("1\n")
    cm = root / "sys" / "kernel" / "config" / "rdma_cm" / "mlx5_0" / "ports" / "1"
    cm.mkdir(parents=True)
    (cm / "default_roce_tos").write_text("160\n")
    (root / "proc").mkdir()
    (root / "proc" / "cmdline").write_text("ro quiet\n")
    (root / "proc" / "cpuinfo").write_text("flags\t\t: fpu\n")
    bin_ = tmp / "bin"
    bin_.mkdir()
    (bin_ / "mlnx_qos").write_text(f"#!/bin/sh\n{mlnx_qos}\n")
    (bin_ / "mlnx_qos").chmod(0o755)
    return tmp


def hardware_script(tmp: Path, mode: str = "capture", timeout: int = 30) -> list[str]:
    command = HardwareSources().command(mode=mode, timeout=timeout, root=str(tmp / "root"))
    result = subprocess.run(
        ["/bin/sh", "-c", command.get_raw_value()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp / 'bin'}:/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def quoted(path: Path) -> str:
    return "'" + str(path).replace("'", "'\\''") + "'"


def test_a_capture_holds_the_gids_in_use_the_tclass_the_qos_and_ecn_and_rdma_cms_tos(tmp_path):
    node = roce_node(
        tmp_path, f"[ \"$*\" = '-i ens1f0' ] && cat {quoted(CENTOS12_QOS)} | tail -n +2"
    )
    raw = HardwareSources().process(hardware_script(node))
    files, status = raw["files"], raw["status"]
    gid = "sys-class-infiniband/mlx5_0/ports/1/"
    # the six GID entries whose type reads; slots 6 and 7 (zeros, no type) are not sent
    assert sorted(k for k in files if "/gid" in k) == sorted(
        f"{gid}{kind}/{i}"
        for kind in ("gids", "gid_attrs/types", "gid_attrs/ndevs")
        for i in range(6)
    )
    assert files[f"{gid}gid_attrs/types/5"] == "RoCE v2"
    assert files[f"{gid}gid_attrs/ndevs/5"] == "ens1f0"
    assert files["sys-class-infiniband/mlx5_0/tc/1/traffic_class"] == "Global tclass=106"
    assert status["mlnx-qos/ens1f0.txt"] == "ok"
    assert files["mlnx-qos/ens1f0.txt"] == centos12_mlnx_qos()
    assert {k: v for k, v in files.items() if k.startswith("sys-class-net/")} == {
        f"sys-class-net/ens1f0/ecn/roce_{w}/enable/{p}": "1" for w in ("np", "rp") for p in range(8)
    }
    assert files["rdma_cm/mlx5_0/ports/1/default_roce_tos"] == "160"
    assert status[HCA_PCI] == "ok" and files[HCA_PCI] == ""  # the tree has no device link
    # saved and read back as diagnose reads a capture: the same files, the same status
    write_node(tmp_path / "capture" / "node1", raw)
    problems: list[str] = []
    back_status, back_files = read_node(tmp_path / "capture" / "node1", problems)
    assert problems == [] and back_status == status and back_files == files
    # drift's live read leaves the QoS to the NcclNetwork fact: not read here, never refused
    check = HardwareSources().process(hardware_script(node, "check"))
    assert not any(k.startswith(("mlnx-qos/", "sys-class-net", "rdma_cm")) for k in check["status"])
    assert f"{gid}gid_attrs/types/5" in check["files"]


def test_a_hanging_mlnx_qos_is_bounded_and_read_as_timed_out(tmp_path):
    node = roce_node(tmp_path, "sleep 30")
    raw = HardwareSources().process(hardware_script(node, timeout=1))
    assert raw["status"]["mlnx-qos/ens1f0.txt"] == "exit 124"
    assert "mlnx-qos/ens1f0.txt" not in raw["files"]


def test_a_netdev_name_outside_the_grammar_never_reaches_a_path_or_command(tmp_path):
    # the ConnectX-6's table with ONE line changed: ndevs/5 names a netdev no kernel would
    node = roce_node(tmp_path, 'echo "$*" >> "$0.args"')
    (node / "root/sys/class/infiniband/mlx5_0/ports/1/gid_attrs/ndevs/5").write_text("../x;id\n")
    raw = HardwareSources().process(hardware_script(node))
    assert [n for n in raw["status"] if n.startswith("mlnx-qos/")] == ["mlnx-qos/ens1f0.txt"]
    assert (node / "bin" / "mlnx_qos.args").read_text() == "-i ens1f0\n"
    with pytest.raises(ValueError, match="unknown"):
        HardwareSources().process(["src mlnx-qos/../../etc/x.txt ok eA=="])
    forged = ["src cmdline ok eA==", "net ../../etc/x/ecn/roce_np/enable/1 1", "cm a/b 1"]
    assert HardwareSources().process(forged)["files"] == {"cmdline": "x"}
    for name in ("mlnx-qos/a/b.txt", "sys-class-net/eth0/ecn/../../x", "rdma_cm/x/ports/1/tos"):
        with pytest.raises(ValueError, match="not a capture's names"):
            node_files({"status": {}, "files": {name: "1"}})


def test_each_hcas_pci_function_is_read_from_its_device_link(tmp_path):
    pod_tree(tmp_path / "root")
    (tmp_path / "root" / "proc").mkdir()
    (tmp_path / "root" / "proc" / "cmdline").write_text("ro\n")
    (tmp_path / "root" / "proc" / "cpuinfo").write_text("flags\t\t: fpu\n")
    (tmp_path / "bin").mkdir()
    raw = HardwareSources().process(hardware_script(tmp_path))
    functions = hca_functions(raw["files"][HCA_PCI])
    assert {hca: f.pci for hca, f in functions.items()} == POD_MAPPING
    assert raw["status"]["sys-class-net"] == "skipped"  # no RoCE port: no netdev to read
    assert raw["status"]["rdma_cm"] == "absent"  # no configfs folder, and none made
    assert not (tmp_path / "root" / "sys" / "kernel").exists()


def test_a_capture_made_before_the_fabric_sources_is_judged_with_them_not_read(tmp_path):
    # the H100 machine's own capture output, made before these sources existed
    lines = (FIXTURES / "hardware" / "h100_capture" / "hardware-capture.out").read_text()
    raw = HardwareSources().process(lines.splitlines())
    assert HCA_PCI not in raw["status"]
    write_node(tmp_path / "capture" / "node1", raw)
    write_node(tmp_path / "capture" / "node2", raw)
    report = judge(tmp_path / "capture")  # no CaptureError: a source it lacks is not read
    assert report.findings == []


def gpud_functions() -> dict[str, HcaFunction]:
    """gpud's HGX H100 Mellanox functions, each named by its own address (its HCA names are
    not in any capture found: never guessed)."""
    devices = lspci.devices(GPUD_LSPCI.read_text())
    return {
        "hca-" + d["address"].replace(":", "-"): HcaFunction(d["address"], ())
        for d in devices
        if lspci.is_nic(d)
    }


def test_without_nvidia_smi_the_rails_come_from_lspcis_pcie_switches():
    devices = lspci.devices(GPUD_LSPCI.read_text())
    topology, missing = lspci_topology(devices, gpud_functions())
    assert missing == []
    rails = by_affinity(topology, None)
    served = {r.hca: r.gpus for r in rails.rails}
    # each ConnectX-7 beside one GPU; the ConnectX-6 Dx functions share GPU0's and GPU4's switch
    assert served["hca-0000-1a-00.0"] == (gpu_name("0000:19:00.0"),)
    assert served["hca-0000-dc-00.0"] == (gpu_name("0000:db:00.0"),)
    assert served["hca-0000-1b-00.1"] == (gpu_name("0000:19:00.0"),)
    assert served["hca-0000-9d-00.0"] == (gpu_name("0000:9b:00.0"),)
    assert len(rails.rails) == 12 and rails.notes == ()  # every GPU has a rail


def test_an_hca_whose_pci_function_lspci_lacks_or_lists_as_something_else_is_named():
    # two real captures of two machines: the pod's mapping against gpud's lspci. No function
    # of the pod is a NIC there: most are not listed, some are another device (a GPU at 4c:00.0)
    devices = lspci.devices(GPUD_LSPCI.read_text())
    pod = {hca: HcaFunction(pci, ()) for hca, pci in POD_MAPPING.items()}
    topology, missing = lspci_topology(devices, pod)
    assert topology.nics == {} and len(missing) == 18
    where = "PCI function {} (its /sys/class/infiniband device link)"
    assert (
        f"mlx5_0's {where.format('0000:48:00.0')} is a System peripheral in lspci -vvv" in missing
    )
    assert f"mlx5_2's {where.format('0000:4c:00.0')} is a 3D controller in lspci -vvv" in missing
    assert f"mlx5_10's {where.format('0000:c3:00.0')} is not in lspci -vvv" in missing


def lspci_node(hca_pci: str) -> tuple[dict[str, str], dict[str, str]]:
    status = dict.fromkeys(SOURCES, "absent") | {LSPCI: "ok", HCA_PCI: "ok"}
    return status, {LSPCI: GPUD_LSPCI.read_text(), HCA_PCI: hca_pci}


def test_a_capture_without_nvidia_smi_gets_its_rails_from_lspci_and_a_bad_mapping_is_named():
    text = "".join(f"{hca} {f.pci}\n" for hca, f in gpud_functions().items())
    rails = node_rails(*lspci_node(text))
    assert isinstance(rails, Rails) and rails.by_affinity and len(rails.rails) == 12
    # ONE line changed: a PCI function that is not one
    bad = text.replace("hca-0000-3c-00.0 0000:3c:00.0\n", "hca-0000-3c-00.0 3c:00.0/../x\n")
    assert node_rails(*lspci_node(bad)) == (
        "hca-pci.txt refused: line 4 is not '<hca> <PCI function> [<netdev> ...]'"
    )


def test_where_topo_and_lspci_disagree_topo_decides_and_the_difference_is_named():
    # two machines' rails compared as one node's two sources would be: per HCA, rail or not
    # and how many GPUs it serves (sglang's H100: one each; the DGX A100: two, mlx5_8 storage)
    one_to_one = by_affinity(parse(SGLANG_TOPO.read_text()), None)
    pairs = by_affinity(parse(DGX_TOPO.read_text()), None)
    said = disagreement(one_to_one, pairs)
    assert said[0] == (
        "mlx5_0: nvidia-smi topo -m says a rail beside 1 GPU(s), lspci's PCIe switches say a "
        "rail beside 2 GPU(s) (topo -m decides)"
    )
    assert len(said) == 8 and disagreement(pairs, pairs) == []


def network_script(tmp: Path, topo_text: str | None) -> list[str]:
    root = tmp / "root" / "sys"
    if topo_text is not None:
        smi = tmp / "bin" / "nvidia-smi"
        smi.write_text(f"#!/bin/sh\n[ \"$*\" = 'topo -m' ] && cat {quoted(tmp / 'topo.txt')}\n")
        smi.chmod(0o755)
        (tmp / "topo.txt").write_text(topo_text)
    result = subprocess.run(
        ["/bin/sh", "-c", NcclNetwork().command(sysfs=str(root)).get_raw_value()],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": f"{tmp / 'bin'}:/usr/bin:/bin"},
    )
    return result.stdout.splitlines()


def test_the_live_network_fact_reads_the_qos_the_pci_functions_and_topo(tmp_path):
    node = roce_node(tmp_path, f"cat {quoted(CENTOS12_QOS)} | tail -n +2")
    pod_tree(node / "root", only=("mlx5_6", "mlx5_7"))  # two of the pod's HCAs beside it
    out = network_script(node, SGLANG_TOPO.read_text())
    found = NcclNetwork().process(out)
    assert found["hca_pci"] == {"mlx5_6": "0000:0c:00.0", "mlx5_7": "0000:0c:00.1"}
    assert found["traffic_class"] == {"mlx5_0": "Global tclass=106"}
    assert found["roce_tos"] == {"mlx5_0:1": 160}
    assert found["ecn"] == {"ens1f0": {w: dict.fromkeys(range(8), 1) for w in ("np", "rp")}}
    assert found["qos"] == {"ens1f0": {"status": "ok", "text": centos12_mlnx_qos()}}
    assert found["topo"] == {"status": "ok", "text": SGLANG_TOPO.read_text()}
    assert "refused" not in found
    # the converged node answers the same lines (the controller benchmark's fake node)
    assert NcclNetwork().process(NcclNetwork().answer(found, out)) == found
    # the rails by GPU affinity, live: sglang's legend names mlx5_0..7, this node's sysfs has
    # mlx5_0 (RoCE) and two HCAs without ports: the two sources disagree and are named
    rails = network_rails(found)
    assert rails is not None and rails.by_affinity
    assert rails.problems[0] == (
        "mlx5_1 (NIC1 of nvidia-smi topo -m, beside GPU1) is not in /sys/class/infiniband"
    )


def test_without_nvidia_smi_the_live_rails_stay_as_the_lab_has_them(tmp_path):
    node = roce_node(tmp_path, "exit 3")
    found = NcclNetwork().process(network_script(node, None))
    assert found["topo"] == {"status": "absent", "text": None}
    assert found["qos"] == {"ens1f0": {"status": "exit 3", "text": None}}
    assert network_rails(found) is None


def test_a_network_line_whose_value_fails_its_grammar_is_named_never_used():
    forged = [
        "pci mlx5_0 ../../../home/u",
        "ecn ens1f0 np 9 1",
        "qos ../x ok eA==",
        f"topo ok {base64.b64encode(b'GPU0').decode()}",
    ]
    found = NcclNetwork().process(forged)
    assert "hca_pci" not in found and "ecn" not in found and "qos" not in found
    assert found["topo"] == {"status": "ok", "text": "GPU0"}
    assert found["refused"] == [
        "pci: 'pci mlx5_0 ../../../home/u'",
        "ecn: 'ecn ens1f0 np 9 1'",
        "qos: 'qos ../x ok eA=='",
    ]
    # a topo -m that cannot be read stands in the way of the list, named
    rails = network_rails({"ib_ports": [], **found})
    assert rails is not None and rails.problems == (
        "nvidia-smi topo -m refused: columns without a row: GPU0 (a cut-off matrix?)",
    )
    # and so does one that timed out
    timed_out = network_rails({"ib_ports": [], "topo": {"status": "exit 124", "text": None}})
    assert timed_out is not None and timed_out.problems == ("nvidia-smi topo -m failed (exit 124)",)


def test_with_topo_an_unreadable_hca_pci_is_named_beside_topos_rails():
    text = "".join(f"{hca} {f.pci}\n" for hca, f in gpud_functions().items())
    bad = text.replace("hca-0000-3c-00.0 0000:3c:00.0\n", "hca-0000-3c-00.0 3c:00.0/../x\n")
    status, files = lspci_node(bad)
    status[TOPO], files[TOPO] = "ok", SGLANG_TOPO.read_text()
    rails = node_rails(status, files)
    assert isinstance(rails, Rails) and [r.hca for r in rails.rails] == [
        f"mlx5_{i}" for i in range(8)
    ]  # topo -m decides
    assert rails.notes == (
        "hca-pci.txt refused: line 4 is not '<hca> <PCI function> [<netdev> ...]'",
    )


def test_a_gpu_no_rail_serves_is_named_on_its_node_in_the_judges_report(tmp_path):
    # three nodes of gpud's HGX without nvidia-smi; node2's hca-pci.txt lacks ONE line (its
    # ConnectX-7 beside GPU 0000:db:00.0 did not come up): that GPU has no rail, named
    text = "".join(f"{hca} {f.pci}\n" for hca, f in gpud_functions().items())
    lacking = text.replace("hca-0000-dc-00.0 0000:dc:00.0\n", "")
    for node, hca_pci in (("node1", text), ("node2", lacking), ("node3", text)):
        folder = tmp_path / "capture" / node
        folder.mkdir(parents=True)
        status, files = lspci_node(hca_pci)
        (folder / "sources.txt").write_text("".join(f"{n} {s}\n" for n, s in status.items()))
        for name, body in files.items():
            (folder / name).write_text(body)
    report = judge(tmp_path / "capture")
    rails = [(f.node, f.observed) for f in report.findings if f.property == "NCCL rails problems"]
    assert rails == [
        ("node2", "GPU 0000:db:00.0 is beside no rail: its NCCL traffic crosses the CPU")
    ]
    odd = [
        (f.node, f.property, f.kind, f.observed) for f in report.findings if "rail" in f.property
    ]
    assert odd[1:] == [
        ("node2", "rail hca-0000-dc-00.0", "majority", "absent"),
        ("node2", "rails", "majority", "11: link layer unknown"),
    ]
