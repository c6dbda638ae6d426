"""NCCL's compute rails by GPU affinity (issue #40, first step), on real captures only:
`nvidia-smi topo -m` with NIC legends (tests/fixtures/rdma/topo, README there), gpud's H100
/sys/class/infiniband tree (tests/fixtures/hardware/infiniband) read both by the hardware
parser and by the NcclNetwork fact's own script. A faulty variant is a copy of one of these
with ONE line changed; each test says which line (tests/fixtures/rdma/README.md lists them)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from facts.nccl_env_facts import NcclNetwork
from trainfleet.diagnose import RAILS_HEALTH, RAILS_PROPERTY, judge
from trainfleet.hw import infiniband
from trainfleet.hw.sources import INFINIBAND, SOURCES, STATUS_FILE
from trainfleet.hw.sources import TOPO as TOPO_FILE
from trainfleet.hw.topo import TopoRefused, parse
from trainfleet.nccl import derive
from trainfleet.nccl_cluster import odd_rails
from trainfleet.rails import (
    HcaPort,
    Rails,
    by_affinity,
    explain,
    ports_from_sysfs,
    without_affinity,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TOPO = FIXTURES / "rdma" / "topo"
H100_1TO1 = TOPO / "topo-m_sglang-30401_h100-8nic-pix-1to1.txt"
DGX_A100 = TOPO / "topo-m_dgx-a100-1mcprddgx05_pxb-rails-storage-sys.txt"
A800_BONDS = TOPO / "topo-m_a800-env-snapshot_8-bonds-2-pix-per-gpu-pair.txt"
NO_LEGEND = [
    TOPO / "topo-m_nccl-1453_h100-nic0-sys-to-all_TRIMMED-no-legend.txt",
    TOPO / "topo-m_nccl-1264_h100-nic3-nic4-sys-to-all_TRIMMED-no-legend.txt",
]
OWN_H100 = FIXTURES / "hardware" / "h100_device" / "nvidia-smi-topo-m.txt"  # one GPU, no NIC
GPUD_H100 = FIXTURES / "hardware" / "infiniband" / "sys-class-infiniband-h100.0"
GPUD_IB = [f"mlx5_{i}:1" for i in (0, 1, 4, 5, 6, 7, 8, 9)]
NDR = "400 Gb/sec (4X NDR)"
AUTO = {"socket_ifname": "auto", "ib": "auto", "env": {}}
INTERFACES = [{"name": "eth0", "addresses": ["198.18.0.11"], "bridge": False}]


def one_line_changed(path: Path, old: str, new: str) -> str:
    """The capture's text with the one line ``old`` (the whole line) replaced by ``new``."""
    lines = path.read_text().split("\n")
    assert lines.count(old) == 1, f"{old!r} is not one line of {path.name}"
    return "\n".join(new if line == old else line for line in lines)


def gpud_tree(change: tuple[str, str] | None = None) -> dict[str, str]:
    """gpud's H100 tree as {relative path: content}; ``change``: (file, its new one line)."""
    files = {
        p.relative_to(GPUD_H100).as_posix(): p.read_text()
        for p in GPUD_H100.rglob("*")
        if p.is_file()
    }
    if change:
        path, line = change
        assert path in files and "\n" not in files[path].strip()  # a one-line sysfs value
        files[path] = line
    return files


def gpud_ports(change: tuple[str, str] | None = None) -> Rails:
    return without_affinity(ports_from_sysfs(infiniband.hcas(gpud_tree(change))))


# The parser


def test_the_one_to_one_h100_names_each_nic_and_its_pix_gpu():
    topology = parse(H100_1TO1.read_text())  # tabs expanded, a trailing space on NIC7's row
    assert topology.gpus == tuple(f"GPU{i}" for i in range(8))
    assert dict(topology.nics) == {f"NIC{i}": f"mlx5_{i}" for i in range(8)}
    assert [topology.gpus_beside(f"NIC{i}") for i in range(8)] == [(f"GPU{i}",) for i in range(8)]
    assert topology.relation[("GPU0", "NIC3")] == "NODE"  # same socket, another switch
    assert topology.relation[("GPU0", "NIC4")] == "SYS"  # across sockets


def test_raw_tabs_and_ansi_underlined_headers_parse_as_nvidia_smi_writes_them():
    assert parse(A800_BONDS.read_text()).relation[("GPU7", "NIC7")] == "PIX"  # raw TABs
    own = parse(OWN_H100.read_text())  # this project's H100: ESC[4m ... ESC[0m around the header
    assert own.gpus == ("GPU0",) and dict(own.nics) == {}


@pytest.mark.parametrize("capture", NO_LEGEND, ids=["nccl-1453", "nccl-1264"])
def test_a_matrix_without_a_nic_legend_is_refused_not_guessed(capture):
    with pytest.raises(TopoRefused, match=r"^no NIC legend: NIC0, NIC1, .* cannot be named"):
        parse(capture.read_text())


def test_a_legend_header_missing_is_refused():
    # Faulty variant: the sglang H100 capture with its "NIC Legend:" line blanked.
    text = one_line_changed(H100_1TO1, "NIC Legend:", "")
    with pytest.raises(TopoRefused, match="^no NIC legend"):
        parse(text)


def test_a_legend_that_disagrees_with_the_matrix_is_refused_naming_both_sides():
    # Faulty variant: the DGX A100 capture's "  NIC9: mlx5_9" legend line made "  NIC10: ...".
    text = one_line_changed(DGX_A100, "  NIC9: mlx5_9", "  NIC10: mlx5_9")
    with pytest.raises(TopoRefused) as refused:
        parse(text)
    assert str(refused.value) == (
        "the NIC legend and the matrix disagree: not in the legend: NIC9; "
        "in the legend, not in the matrix: NIC10"
    )


def test_rows_that_disagree_are_refused_naming_the_cell():
    # Faulty variant: the DGX A100 capture's GPU3 row with its NIC3 cell PXB made SYS.
    row = next(line for line in DGX_A100.read_text().splitlines() if line.startswith("GPU3"))
    changed = row.replace("PXB     PXB", "PXB     SYS", 1)  # the cells of NIC2, NIC3
    with pytest.raises(TopoRefused, match="^GPU3-NIC3 reads SYS in GPU3's row, PXB in NIC3's$"):
        parse(one_line_changed(DGX_A100, row, changed))


# The rule


def test_the_dgx_a100_storage_hca_sys_to_every_gpu_is_left_out():
    rails = by_affinity(parse(DGX_A100.read_text()), None)
    assert [(r.hca, r.gpus) for r in rails.rails] == [
        (f"mlx5_{n}", (f"GPU{n - n % 2}", f"GPU{n - n % 2 + 1}")) for n in range(8)
    ]  # PXB: two GPUs and two NICs behind each PCIe switch
    assert dict(rails.left_out) == {
        device: f"{nic} is SYS to every GPU"
        for nic, device in (("NIC8", "mlx5_8"), ("NIC9", "mlx5_9"))
    }
    assert rails.problems == () and rails.hca_list == "=" + ",".join(f"mlx5_{n}" for n in range(8))


def test_bonds_under_a_gpu_switch_are_rails_a_name_decides_nothing():
    rails = by_affinity(parse(A800_BONDS.read_text()), None)
    assert [r.hca for r in rails.rails] == [f"mlx5_bond_{n}" for n in range(8)]
    assert [r.hca for r in rails.rails if "GPU0" in r.gpus] == ["mlx5_bond_0", "mlx5_bond_1"]
    assert rails.left_out == {} and rails.problems == ()


def test_the_one_to_one_h100_leaves_nothing_out_and_nccl_lists_exactly_its_rails():
    rails = by_affinity(parse(H100_1TO1.read_text()), None)
    assert rails.left_out == {}
    derived = derive("198.18.0.11", AUTO, INTERFACES, [], rails)
    assert derived.problems == []
    assert derived.env["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))
    assert "NCCL_IB_DISABLE" not in derived.env


def test_the_dgx_a100_derivation_never_lists_the_storage_hca():
    derived = derive(
        "198.18.0.11", AUTO, INTERFACES, [], by_affinity(parse(DGX_A100.read_text()), None)
    )
    assert "mlx5_8" not in derived.env["NCCL_IB_HCA"]
    assert derived.env["UCX_NET_DEVICES"] == ",".join(f"mlx5_{n}" for n in range(8))


def test_a_gpu_without_any_nic_disables_ib_rather_than_listing_none():
    rails = by_affinity(parse(OWN_H100.read_text()), [])
    assert rails.rails == () and rails.problems == ()
    assert derive("198.18.0.11", AUTO, INTERFACES, [], rails).env["NCCL_IB_DISABLE"] == "1"


def test_a_topo_legend_and_a_sysfs_tree_that_disagree_are_named_not_reconciled():
    # The sglang H100's topo -m (mlx5_0..7) beside gpud's H100 sysfs (mlx5_0,1,4..9, bond):
    # two real machines, so the names do not match; each side's stray HCA is named.
    ports = ports_from_sysfs(infiniband.hcas(gpud_tree()))
    rails = by_affinity(parse(H100_1TO1.read_text()), ports)
    assert rails.problems == (
        "mlx5_2 (NIC2 of nvidia-smi topo -m, beside GPU2) is not in /sys/class/infiniband",
        "mlx5_3 (NIC3 of nvidia-smi topo -m, beside GPU3) is not in /sys/class/infiniband",
        "mlx5_8 is in /sys/class/infiniband but not in nvidia-smi topo -m's NIC legend",
        "mlx5_9 is in /sys/class/infiniband but not in nvidia-smi topo -m's NIC legend",
        "mlx5_bond_0 is in /sys/class/infiniband but not in nvidia-smi topo -m's NIC legend",
    )
    assert [(r.hca, r.gpus, r.link_layer, r.rate) for r in rails.rails][:1] == [
        ("mlx5_0:1", ("GPU0",), "InfiniBand", NDR)
    ]
    derived = derive("198.18.0.11", AUTO, INTERFACES, [], rails)
    assert "NCCL_IB_HCA" not in derived.env and derived.problems == list(rails.problems)


# Without GPU affinity: today's rule, but never both link layers


def test_gpud_h100_mixes_ib_and_the_roce_bond_a_named_problem_not_a_list():
    # Before #40 this node got NCCL_IB_HCA=mlx5_0:1,...,mlx5_9:1,mlx5_bond_0:1: InfiniBand and
    # the Ethernet bond in one list, which NCCL fails on (ibv_modify_qp Invalid argument). The
    # issue calls that wrong: the node now gets the mix named and no list.
    rails = gpud_ports()
    assert [r.hca for r in rails.rails] == [*GPUD_IB, "mlx5_bond_0:1"]
    assert rails.problems == () and rails.mixed == (
        "the rails mix InfiniBand (" + ", ".join(GPUD_IB) + ") and Ethernet/RoCE (mlx5_bond_0:1):"
        " NCCL fails in ibv_modify_qp (Invalid argument); name one kind in nccl.env NCCL_IB_HCA"
    )


def test_the_fact_on_gpud_h100_gives_the_mix_as_a_problem_and_the_spec_names_one_kind(tmp_path):
    # The NcclNetwork fact's own script over gpud's tree, laid out where sysfs has it.
    shutil.copytree(GPUD_H100, tmp_path / "class" / "infiniband")
    fact = NcclNetwork()
    script = fact.command(sysfs=str(tmp_path)).get_raw_value()
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    ports = fact.process(output.splitlines())["ib_ports"]
    derived = derive("198.18.0.11", AUTO, INTERFACES, ports)
    assert "NCCL_IB_HCA" not in derived.env
    assert len(derived.problems) == 1
    assert derived.problems[0].startswith("the rails mix InfiniBand (mlx5_0:1, mlx5_1:1, ")
    assert derived.problems[0].endswith(
        "Ethernet/RoCE (mlx5_bond_0:1): NCCL fails in "
        "ibv_modify_qp (Invalid argument); name one kind in nccl.env NCCL_IB_HCA"
    )
    # What the problem says to do: the spec names one kind, and the bond (whose GID table gpud
    # did not capture) no longer counts either.
    spec = {**AUTO, "env": {"NCCL_IB_HCA": "=" + ",".join(GPUD_IB)}}
    derived = derive("198.18.0.11", spec, INTERFACES, ports)
    assert derived.problems == [] and derived.env["NCCL_IB_HCA"] == "=" + ",".join(GPUD_IB)
    assert derived.env["UCX_NET_DEVICES"] == ",".join(GPUD_IB)  # OpenMPI's UCX: the same ports
    # The override is checked against what the node has: gpud's H100 has no mlx5_2 (exact
    # name), while NCCL's prefix form "mlx5_" matches its HCAs.
    spec = {**AUTO, "env": {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_2:1"}}
    assert derive("198.18.0.11", spec, INTERFACES, ports).problems == [
        "nccl.env NCCL_IB_HCA names mlx5_2:1, which this node does not have (it has "
        + ", ".join([*GPUD_IB, "mlx5_bond_0:1"])
        + ")"
    ]
    spec = {**AUTO, "env": {"NCCL_IB_HCA": "mlx5_0,mlx5_1"}}
    assert derive("198.18.0.11", spec, INTERFACES, ports).problems == []


# The majority


def test_a_node_with_one_rail_down_is_named_with_that_rail():
    # Faulty variant: n3 = gpud's tree with mlx5_5/ports/1/state "4: ACTIVE" made "1: DOWN".
    nodes = {
        "n1": gpud_ports(),
        "n2": gpud_ports(),
        "n3": gpud_ports(("mlx5_5/ports/1/state", "1: DOWN")),
    }
    found = {(f.node, f.property, f.observed, f.expected) for f in odd_rails(nodes)}
    assert found == {
        ("n3", "rails", "8: Ethernet, InfiniBand", "9: Ethernet, InfiniBand"),
        (
            "n3",
            "rail mlx5_5:1",
            "not a rail: port not active (1: DOWN)",
            f"GPU affinity unknown, InfiniBand, {NDR}",
        ),
    }


def test_a_node_with_a_rail_at_a_lower_rate_is_named_with_that_rail():
    # Faulty variant: n2 = gpud's tree with mlx5_7/ports/1/rate "400 Gb/sec (4X NDR)" made
    # "200 Gb/sec (4X HDR)" (a port that trained at HDR).
    nodes = {
        "n1": gpud_ports(),
        "n2": gpud_ports(("mlx5_7/ports/1/rate", "200 Gb/sec (4X HDR)")),
        "n3": gpud_ports(),
    }
    (finding,) = odd_rails(nodes)
    assert (finding.node, finding.property, finding.kind) == ("n2", "rail mlx5_7:1", "majority")
    assert finding.observed == "GPU affinity unknown, InfiniBand, 200 Gb/sec (4X HDR)"
    assert finding.expected == f"GPU affinity unknown, InfiniBand, {NDR}"


def test_a_node_whose_rails_serve_other_gpus_is_named_rail_by_rail():
    # Two DGX A100s (a PXB pair of GPUs per rail, storage HCA left out) and the sglang H100
    # (PIX 1:1, no storage HCA): real captures of two machine types in one fleet.
    dgx = by_affinity(parse(DGX_A100.read_text()), None)
    nodes = {"a1": dgx, "a2": dgx, "h1": by_affinity(parse(H100_1TO1.read_text()), None)}
    found = {(f.node, f.property): (f.observed, f.expected) for f in odd_rails(nodes)}
    assert {node for node, _ in found} == {"h1"}
    assert found[("h1", "rail mlx5_1")] == (
        "GPU1, link layer unknown, rate unknown",
        "GPU0+GPU1, link layer unknown, rate unknown",
    )
    assert found[("h1", "rail mlx5_8")][0] == "absent"
    assert ("h1", "rails") not in found  # eight rails each: the count alone would not tell


def test_the_explanation_says_per_hca_why_it_is_or_is_not_listed():
    lines = list(explain(by_affinity(parse(DGX_A100.read_text()), None)))
    assert lines[0] == "mlx5_0: a rail (PIX/PXB to GPU0+GPU1)"
    assert lines[-1].startswith("mlx5_9: left out: NIC9 is SYS to every GPU")


# The offline judge (trainfleet diagnose): the rails from each node's captured sources


def capture_node(root: Path, name: str, topo: Path | None, tree: bool = False) -> None:
    """A node folder as deploy/capture.py saves one, holding only ``topo -m`` and/or the
    InfiniBand tree (every other source: absent)."""
    folder = root / name
    folder.mkdir(parents=True)
    status = dict.fromkeys(SOURCES, "absent")
    if topo is not None:
        shutil.copy(topo, folder / TOPO_FILE)
        status[TOPO_FILE] = "ok"
    if tree:
        shutil.copytree(GPUD_H100, folder / INFINIBAND)
        status[INFINIBAND] = "ok"
    (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in status.items()))


def test_the_judge_shows_each_nodes_rails_and_names_the_odd_and_the_unreadable(tmp_path):
    for name in ("a1", "a2", "a3"):
        capture_node(tmp_path, name, DGX_A100)
    capture_node(tmp_path, "h1", H100_1TO1)
    capture_node(tmp_path, "x1", NO_LEGEND[0])
    capture_node(tmp_path, "g1", None, tree=True)  # gpud's H100: no topo -m, its IB tree
    report = judge(tmp_path)
    assert report.observed["a1"][RAILS_PROPERTY] == "=" + ",".join(f"mlx5_{n}" for n in range(8))
    assert report.observed["g1"][RAILS_PROPERTY] == "=" + ",".join([*GPUD_IB, "mlx5_bond_0:1"])
    assert RAILS_PROPERTY not in report.observed["x1"]
    health = {f.node: f.observed for f in report.findings if f.property == RAILS_HEALTH}
    assert set(health) == {"x1", "g1"}
    assert health["x1"].startswith("nvidia-smi topo -m refused: no NIC legend: NIC0, NIC1,")
    assert health["g1"].startswith("the rails mix InfiniBand (mlx5_0:1,")
    odd = {(f.node, f.property) for f in report.findings if f.kind == "majority"}
    assert ("h1", "rail mlx5_0") in odd and ("h1", "rail mlx5_8") in odd
    assert not {node for node, _ in odd} & {"a1", "a2", "a3"}
    table = report.table()  # every finding's row is shown: never "no drift" beside findings
    assert not table.startswith("no drift") and "rail mlx5_8" in table
    assert report.observed["h1"]["rail mlx5_0"] == "GPU0, link layer unknown, rate unknown"


def _dgx_ports(ethernet: set[str]) -> list[HcaPort]:
    """A port per NIC of the DGX A100's topo -m legend, with gpud's real sysfs values: its
    mlx5_0 port's state, rate and link layer, and for ``ethernet`` its bond's link layer."""
    ib = infiniband.hcas(gpud_tree())
    port, bond = ib["mlx5_0"]["ports"]["1"], ib["mlx5_bond_0"]["ports"]["1"]
    legend = parse(DGX_A100.read_text()).nics.values()
    return [
        HcaPort(
            name,
            1,
            bond["link_layer"] if name in ethernet else port["link_layer"],
            port["state"],
            port["rate"],
        )
        for name in legend
    ]


def test_an_ethernet_port_beside_some_gpus_is_left_out_where_the_ib_rails_serve_every_gpu():
    # An HGX node's frontend/storage port can share a GPU's PCIe switch (gpud's HGX H100's
    # ConnectX-6 Dx sits under GPU 19:00.0's switch): by affinity alone it would be a rail,
    # and its Ethernet beside the InfiniBand rails would refuse the node's whole list.
    rails = by_affinity(parse(DGX_A100.read_text()), _dgx_ports({"mlx5_1"}))
    assert rails.mixed is None and rails.problems == ()
    kept = [f"mlx5_{n}:1" for n in (0, 2, 3, 4, 5, 6, 7)]  # mlx5_8/9: storage, SYS to all
    assert [r.hca for r in rails.rails] == kept
    assert rails.left_out["mlx5_1:1"] == (
        "Ethernet beside GPU0+GPU1 only, while the InfiniBand rails serve every GPU: a frontend "
        "or storage port (NCCL cannot mix link layers)"
    )
    derived = derive("198.18.0.11", AUTO, INTERFACES, [], rails)
    assert derived.env["NCCL_IB_HCA"] == "=" + ",".join(kept)


def test_a_mix_where_no_one_link_layer_serves_every_gpu_stays_a_problem():
    # mlx5_0 and mlx5_1 both Ethernet: GPU0 and GPU1 have no InfiniBand rail, the other six no
    # Ethernet one; neither layer serves every GPU, so no list is picked.
    rails = by_affinity(parse(DGX_A100.read_text()), _dgx_ports({"mlx5_0", "mlx5_1"}))
    assert rails.mixed is not None and "mlx5_0:1" in rails.mixed
