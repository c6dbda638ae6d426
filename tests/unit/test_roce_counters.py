"""RoCE counters under the bandwidth stage's load (#40): the stage's script run over real
captures, one line changed between the readings per fault.

The RoCE port is composed from three real captures (tests/fixtures/rdma/README.md): the sysfs
tree of a ConnectX-6 RoCE v2 port (tests/fixtures/sysfs/roce_v2_cx6: link layer Ethernet, its
GID table's netdev ``ens1f0``), the hw_counters of a RoCE port during an NCCL hang
(NVIDIA/nccl#394's ``grep "" .../hw_counters/*``) laid out as that port's files, and a
ConnectX-4 Lx's ``ethtool -S`` pause counters (printed by an ``ethtool`` stub for ``-S``).
gpud's H100 tree (tests/fixtures/hardware/infiniband) gives a RoCE bond with hw_counters and no
netdev in its tree."""

from __future__ import annotations

import shutil
import stat
from pathlib import Path

from checks.bandwidth_stage import bandwidth_lines
from checks.counters_verdicts import counter_problems, read_counters, roce_figures, roce_lines
from tests.unit.test_counters import reading

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CX6 = FIXTURES / "sysfs" / "roce_v2_cx6" / "class" / "infiniband"
HW_394 = FIXTURES / "rdma" / "hw_counters" / "grep-hw_counters_nccl-394_roce-mlx5_0_TRIMMED.txt"
ETHTOOL = FIXTURES / "rdma" / "ethtool" / "ethtool-S_cx4-lx-25g_eth03_grep-pci-pause-control.txt"
GPUD = FIXTURES / "hardware" / "infiniband" / "sys-class-infiniband-h100.0"
RAIL = "mlx5_0 port 1"


def roce_tree(root: Path, hw_counters: str | None) -> Path:
    """The ConnectX-6 RoCE port's tree under ``root`` with ``hw_counters`` (nccl#394's grep
    output, or a copy of it with one line changed) as its files; None: no hw_counters."""
    sysfs = root / "sys" / "class" / "infiniband"
    if not sysfs.exists():
        shutil.copytree(CX6, sysfs)
    directory = sysfs / "mlx5_0" / "ports" / "1" / "hw_counters"
    shutil.rmtree(directory, ignore_errors=True)
    if hw_counters is not None:
        directory.mkdir()
        for line in hw_counters.splitlines():
            if line.startswith("/sys/"):
                path, _, value = line.partition(":")
                (directory / path.rsplit("/", 1)[1]).write_text(value + "\n")
    return root


def read(root: Path, ethtool: str | None) -> dict:
    """counters.sh's reading of ``root``, with an ``ethtool`` that prints ``ethtool`` for
    ``-S ens1f0`` (None: no ethtool installed)."""
    bin_dir = root / "bin"
    shutil.rmtree(bin_dir, ignore_errors=True)
    bin_dir.mkdir()
    for tool in ("sh", "cat", "sort", "awk", "timeout", "printf", "sed"):
        real = shutil.which(tool)
        if real:
            (bin_dir / tool).symlink_to(real)
    if ethtool is not None:
        (root / "ethtool.txt").write_text(ethtool)
        stub = bin_dir / "ethtool"
        stub.write_text(
            f"#!/bin/sh\n[ \"$*\" = '-S ens1f0' ] && exec cat '{root / 'ethtool.txt'}'\n"
        )
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    return reading(root, str(bin_dir / "sh"), {"PATH": str(bin_dir)})


def changed(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


HW = HW_394.read_text()
PAUSES = ETHTOOL.read_text()


def test_the_script_reads_hw_counters_netdev_and_pause_counters(tmp_path):
    reading = read(roce_tree(tmp_path, HW), PAUSES)
    assert reading[("mlx5_0", "1", "hw_counters/out_of_sequence")] == 6140236
    assert reading[("mlx5_0", "1", "hw_counters/np_cnp_sent")] == 17269947
    assert reading[("mlx5_0", "1", "link_layer/Ethernet")] == 1
    assert reading[("mlx5_0", "1", "netdev/ens1f0")] == 1
    assert reading[("ethtool", "ens1f0", "tx_pause_ctrl_phy")] == 1266552
    assert ("mlx5_0", "1", "hw_counters/packet_seq_err") not in reading  # not asked for
    assert ("ethtool", "ens1f0", "tx_global_pause") not in reading  # not a pause counter read
    # an unchanged reading: nothing grew, every figure read (rp_cnp_handled: not in the capture)
    assert counter_problems({"n1": reading}, {"n1": reading}) == []
    (line,) = roce_lines(roce_figures({"n1": reading}, {"n1": reading}))
    assert line == (
        "RoCE n1 mlx5_0 port 1 under load: retransmits +0, pause frames +0, CNPs sent +0, "
        "ECN-marked +0, CNPs handled not read"
    )


def test_retransmits_without_pause_frames_name_flow_control_not_effective(tmp_path):
    before = read(roce_tree(tmp_path, HW), PAUSES)
    grown = changed(HW, "out_of_sequence:6140236", "out_of_sequence:6140356")  # ONE line
    after = read(roce_tree(tmp_path, grown), PAUSES)
    (problem,) = counter_problems({"n1": before}, {"n1": after}, ["n1"])
    assert (problem.stage, problem.node) == ("bandwidth", "n1")
    assert problem.cause.startswith(
        "flow control not effective on n1 rail mlx5_0 port 1 (ens1f0): retransmits grew under "
        "the bandwidth stage's load (out_of_sequence +120) while no pause frame was sent or "
        "received"
    )


def test_retransmits_with_pause_frames_growing_are_congestion_a_figure(tmp_path):
    before = read(roce_tree(tmp_path, HW), PAUSES)
    grown = changed(HW, "local_ack_timeout_err:91316", "local_ack_timeout_err:91400")
    paused = changed(PAUSES, "tx_pause_ctrl_phy: 1266552", "tx_pause_ctrl_phy: 1267552")
    after = read(roce_tree(tmp_path, grown), paused)
    assert counter_problems({"n1": before}, {"n1": after}, ["n1"]) == []
    figures = roce_figures({"n1": before}, {"n1": after})
    assert figures["n1"][RAIL]["retransmits"] == 84
    assert figures["n1"][RAIL]["pause_frames"] == 1000
    details = {"pairs": {}, "note": "x", "roce": figures}
    assert bandwidth_lines(details)[-1] == (
        "RoCE n1 mlx5_0 port 1 under load: retransmits +84, pause frames +1000 (congestion), "
        "CNPs sent +0, ECN-marked +0, CNPs handled not read"
    )


def test_cnps_and_ecn_marks_are_figures_never_faults(tmp_path):
    before = read(roce_tree(tmp_path, HW), PAUSES)
    marked = changed(
        HW, "np_ecn_marked_roce_packets:11293938", "np_ecn_marked_roce_packets:11300000"
    )
    after = read(roce_tree(tmp_path, marked), PAUSES)
    assert counter_problems({"n1": before}, {"n1": after}) == []
    assert roce_figures({"n1": before}, {"n1": after})["n1"][RAIL]["ecn_marked"] == 6062


def test_pause_counters_not_read_are_named_never_a_pass(tmp_path):
    before = read(roce_tree(tmp_path, HW), None)  # no ethtool on the node
    assert not [key for key in before if key[0] == "ethtool"]
    grown = changed(HW, "out_of_sequence:6140236", "out_of_sequence:6140356")
    (problem,) = counter_problems({"n1": before}, {"n1": read(roce_tree(tmp_path, grown), None)})
    assert "its pause counters were not read (ethtool -S of ens1f0)" in problem.cause
    # gpud's H100 bond: hw_counters read, no netdev in its tree: pauses "not read", and with
    # nothing grown no fault
    gpud = tmp_path / "gpud"
    shutil.copytree(GPUD, gpud / "sys" / "class" / "infiniband")
    reading = read(gpud, PAUSES)
    assert counter_problems({"g": reading}, {"g": reading}) == []
    (line,) = roce_lines(roce_figures({"g": reading}, {"g": reading}))
    assert line.startswith(
        "RoCE g mlx5_bond_0 port 1 under load: retransmits +0, pause frames not read"
    )


def test_a_roce_port_without_hw_counters_is_named_not_read(tmp_path):
    reading = read(roce_tree(tmp_path, None), PAUSES)
    (problem,) = counter_problems({"n1": reading}, {"n1": reading})
    assert problem.cause.startswith("RoCE retransmit counters not read on mlx5_0 port 1")


def test_forged_or_odd_lines_are_not_counters():
    assert (
        read_counters(
            [
                "pause ens1f0 rx_global_pause 3",  # not a pause counter judged
                "pause ../x tx_pause_ctrl_phy 3",
                "ndev mlx5_0 1 bad/name",
                "layer mlx5_0 1 Ethernet extra",
                "hw mlx5_0 1 out_of_sequence -1",
            ]
        )
        == {}
    )
