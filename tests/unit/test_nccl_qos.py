"""NCCL_IB_TC from the host's own QoS (issue #40), on real captures only
(tests/fixtures/rdma/qos, each with its source in tests/fixtures/rdma/README.md): the parsers,
the derivation per node, the nodes that differ from the majority, and ``trainfleet diagnose``
showing the NCCL environment per node from a capture directory built from real files. Each
faulty variant is a copy of a real capture with one line changed (noted in the README)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from facts.nccl_env_facts import NcclNetwork
from trainfleet.__main__ import main
from trainfleet.diagnose import CaptureError, judge
from trainfleet.diagnose_nccl import NOT_DERIVED, PROBLEMS, WHY, ib_ports, qos_readings
from trainfleet.hw import qos
from trainfleet.hw.sources import INFINIBAND, SOURCES, STATUS_FILE
from trainfleet.nccl_qos import (
    LOSSY,
    PFC_PRIORITY,
    TC,
    TRUST,
    RailQos,
    node_qos,
    odd_qos,
    qos_settings,
)
from trainfleet.spec import load_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QOS = FIXTURES / "rdma" / "qos"
NETARBITER = QOS / "mlnx_qos_netarbiter_setup-nic-lossless-layer3_OUTPUTSAMPLE.md"
CENTOS12 = QOS / "mlnx_qos_centos12-doc_ens6_trust-pcp_no-pfc.txt"
SPIDERPOOL = QOS / "rdma-qos-q_spiderpool-doc_pfc-prio5_tclass160.txt"
UCX_TCLASS = QOS / "traffic_class_ucx-pr-11105_mlx5_0_global-tclass-106.txt"
ROCE_TREE = FIXTURES / "sysfs" / "roce_v2_cx6" / "class" / "infiniband"  # mlx5_0, ens1f0
GPUD_H100 = FIXTURES / "hardware" / "infiniband" / "sys-class-infiniband-h100.0"
PFC3 = "        enabled     0   0   0   1   0   0   0   0   "
PFC4 = "        enabled     0   0   0   0   1   0   0   0   "  # PFC on priority 4 instead
NO_PFC = "        enabled     0   0   0   0   0   0   0   0   "
TC3 = "tc: 3 ratelimit: unlimited, tsa: vendor"
DCB = "dcb_pfc-app-show_roce-lab-notes_ens6_pfc-prio3_dscp-af31.txt"


def netarbiter(old: str | None = None, new: str | None = None) -> str:
    """The second mlnx_qos output of netarbiter's trace (after ``--pfc 0,0,0,1,0,0,0,0``): the
    lines between its command line and the closing fence, ``old`` changed to ``new``."""
    lines = NETARBITER.read_text().split("\n")
    start = lines.index("+ mlnx_qos -i eth4 --pfc 0,0,0,1,0,0,0,0") + 1
    block = lines[start : lines.index("```", start)]
    if old is not None:
        assert block.count(old) == 1, old
        block[block.index(old)] = str(new)
    return "\n".join(block) + "\n"


def centos12() -> str:
    """centos12's ``mlnx_qos -i ens6`` without the prompt line the note pasted before it."""
    return CENTOS12.read_text().split("\n", 1)[1]


def spiderpool_ecn(old: str | None = None, new: str | None = None) -> dict[str, str]:
    """The ECN enables spiderpool's reading shows (all 1), as ``roce_np/N`` -> text."""
    reading = SPIDERPOOL.read_text()
    if old is not None:
        assert reading.count(old) == 1, old
        reading = reading.replace(old, new or "")
    return {k: "1" if on else "0" for k, on in qos.parse_spiderpool(reading).ecn.items()}


def ucx_tclass() -> str:
    return UCX_TCLASS.read_text().split("\n", 1)[1]  # the reading, without its `$ cat` line


def rail(
    text: str | None,
    status: str = "ok",
    tclass: str | None = None,
    ecn: dict[str, str] | None = None,
    name: str = "mlx5_2:1",
    netdev: str = "eth4",
) -> RailQos:
    return RailQos(
        rail=name,
        netdev=netdev,
        mlnx_qos=text,
        mlnx_qos_status=status,
        traffic_class=tclass,
        default_roce_tos=None,
        ecn=spiderpool_ecn() if ecn is None else ecn,
    )


# ---- the parsers -----------------------------------------------------------------------------


def test_both_netarbiter_outputs_read_as_dscp_trust_with_priority_3_lossless():
    lines = NETARBITER.read_text().split("\n")
    start = lines.index("+ mlnx_qos -i eth4 --trust dscp") + 1
    first = lines[start : next(i for i in range(start, len(lines)) if lines[i].startswith("+"))]
    for text in ("\n".join(first), netarbiter()):
        read = qos.parse_mlnx_qos(text)
        assert (read.trust, read.pfc_priorities, read.buffer) == ("dscp", (3,), None)
        assert read.dscps_of(3) == tuple(range(24, 32))  # the default map: prio N = DSCP 8N..
        assert len(read.dscp2prio or {}) == 64
        assert read.prio2tc[1] == 0 and read.prio2tc[0] == 1 and read.prio2tc[7] == 7
        assert set(read.tsa.values()) == {"vendor"}


def test_the_newer_mlnx_qos_with_a_buffer_row_reads_pcp_trust_and_no_pfc():
    read = qos.parse_mlnx_qos(centos12())
    assert (read.trust, read.pfc_priorities, read.buffer) == ("pcp", (), (0,) * 8)
    assert read.dscp2prio is None


def test_spiderpools_partial_reading_and_the_global_traffic_class():
    read = qos.parse_spiderpool(SPIDERPOOL.read_text())
    assert (read.netdev, read.device) == ("eth0", "mlx5_0")
    assert (read.qos.trust, read.qos.pfc_priorities, read.qos.dscp2prio) == ("dscp", (5,), None)
    assert read.qos.buffer == (0, 0, 0, 0, 0, 1, 0, 0)
    assert (read.cnp_dscp, read.roce_tos, read.traffic_class) == (48, 160, 160)
    assert len(read.ecn) == 16 and all(read.ecn.values())
    assert qos.parse_traffic_class(ucx_tclass()) == 106
    assert qos.parse_traffic_class("") is None  # the file of a port with no global class
    with pytest.raises(qos.QosRefused):
        qos.parse_mlnx_qos(SPIDERPOOL.read_text())  # not a whole mlnx_qos output


@pytest.mark.parametrize(
    "old, new, why",
    [
        (TC3, "tc: 3 ratelimit unlimited tsa vendor", "not a line mlnx_qos prints"),
        (PFC3, "        enabled     0   0   0   2   0   0   0   0   ", "other than 0/1"),
        ("Priority trust state: dscp", "Priority trust state: dcsp", "not one trust state"),
        (
            "        prio:4 dscp:39,38,37,36,35,34,33,32,",
            "        prio:4 dscp:39,38,37,36,35,34,33,31,",
            "mapped twice",
        ),
    ],
)
def test_a_changed_line_is_refused_naming_it_never_guessed(old, new, why):
    with pytest.raises(qos.QosRefused, match=why):
        qos.parse_mlnx_qos(netarbiter(old, new))


# ---- the derivation per node -----------------------------------------------------------------


def test_the_host_traffic_class_that_lands_on_the_pfc_priority_is_kept():
    env, problems, explanation = qos_settings([rail(netarbiter(), tclass=ucx_tclass())])
    assert (env, problems) == ({"NCCL_IB_TC": "106"}, [])
    assert "106 (DSCP 26 -> priority 3) from the host's traffic_class" in explanation[0]


def test_without_a_host_class_the_lowest_dscp_of_the_pfc_priority_is_taken():
    env, problems, explanation = qos_settings([rail(netarbiter())])
    assert (env, problems) == ({"NCCL_IB_TC": "96"}, [])  # DSCP 24 << 2
    assert "the lowest DSCP eth4 maps to PFC priority 3" in explanation[0]


def test_pfc_on_another_priority_names_both():
    # Faulty variant: netarbiter's PFC row with priority 4 lossless instead of 3.
    env, problems, _ = qos_settings([rail(netarbiter(PFC3, PFC4), tclass=ucx_tclass())])
    assert problems == [
        "mlx5_2:1 (eth4): the host's traffic_class (Global tclass) 106 (DSCP 26 -> priority 3) "
        "misses the PFC priority 4 of eth4 (mlnx_qos)"
    ]


def test_a_spec_tc_that_misses_the_pfc_priority_is_named_with_both():
    env, problems, _ = qos_settings([rail(netarbiter())], spec_tc="160")  # spiderpool's 160
    assert env == {"NCCL_IB_TC": "160"}
    assert problems == [
        "mlx5_2:1 (eth4): nccl.env NCCL_IB_TC 160 (DSCP 40 -> priority 5) misses the PFC "
        "priority 3 of eth4 (mlnx_qos)"
    ]
    _, problems, _ = qos_settings([rail(netarbiter())], spec_tc="104")  # DSCP 26: priority 3
    assert problems == []
    _, problems, _ = qos_settings([rail(netarbiter(), tclass=ucx_tclass())], spec_tc="104")
    assert problems == [  # the kernel's global class wins over NCCL's
        "mlx5_2:1 (eth4): the host's traffic_class 106 (DSCP 26 -> priority 3) overrides "
        "NCCL_IB_TC 104 for every QP of the port"
    ]
    assert qos_settings([rail(netarbiter())], spec_tc="0x60")[1] == [
        "nccl.env NCCL_IB_TC=0x60 is not a traffic class (a number 0-255)"
    ]


def test_trust_pcp_says_the_tc_cannot_pick_the_priority_and_what_to_do():
    node = node_qos([rail(centos12(), netdev="ens6")])
    assert (node.env, node.problems) == ({}, [])  # ECN on (spiderpool's enables): paced
    assert node.values == {TRUST: "pcp", PFC_PRIORITY: "none"}
    assert "VLAN priority (PCP) decides" in node.explanation[0]
    assert "mlnx_qos -i ens6 --trust dscp on every node" in node.explanation[0]
    assert node.unset == [
        "mlx5_2:1 (ens6): not derived: trust pcp (the VLAN priority decides, not the TC)"
    ]


def test_roce_with_neither_pfc_nor_ecn_is_lossy_nccl_378():
    # Faulty variants: netarbiter's PFC row all 0; spiderpool's ECN roce_np/enable/0 = 0.
    ecn = spiderpool_ecn(
        "/sys/class/net/eth0/ecn/roce_np/enable/0 = 1",
        "/sys/class/net/eth0/ecn/roce_np/enable/0 = 0",
    )
    _, problems, _ = qos_settings([rail(netarbiter(PFC3, NO_PFC), ecn=ecn)])
    assert problems == [
        f"mlx5_2:1 (eth4): {LOSSY} (priority 0) "
        "(nccl#378: 0.x GB/s under load, a RoCE fabric without flow control)"
    ]
    _, problems, explanation = qos_settings([rail(netarbiter(PFC3, NO_PFC))])  # ECN on
    assert problems == [] and "ECN (DCQCN) on: lossy, paced" in explanation[-1]
    _, problems, explanation = qos_settings([rail(netarbiter(PFC3, NO_PFC), ecn={})])
    assert problems == [] and "the ECN enables were not read" in explanation[-1]


@pytest.mark.parametrize(
    "status, problem, unset",
    [
        ("exit 124", "mlnx_qos not read: timed out", "not read: mlnx-qos/eth4.txt timed out"),
        (
            "exit 1",
            "mlnx_qos not read: mlnx_qos failed (exit 1)",
            "not read: mlnx-qos/eth4.txt mlnx_qos failed (exit 1)",
        ),
        ("absent", None, "not read: mlnx-qos/eth4.txt mlnx_qos is not installed"),
        ("not in the capture", None, "not read: mlnx-qos/eth4.txt not in the capture"),
    ],
)
def test_a_qos_tool_not_read_is_named_and_a_failed_one_is_a_problem(status, problem, unset):
    node = node_qos([rail(None, status=status)])
    assert node.env == {} and node.values == {}
    assert node.problems == ([f"mlx5_2:1 (eth4): {problem}"] if problem else [])
    assert node.unset == [f"mlx5_2:1 (eth4): {unset}"]


def test_an_unparsable_mlnx_qos_is_a_named_refusal():
    # Faulty variant: netarbiter's "tc: 3 ..." line without its colons and comma.
    _, problems, _ = qos_settings([rail(netarbiter(TC3, "tc: 3 ratelimit unlimited tsa vendor"))])
    assert problems == [
        "mlx5_2:1 (eth4): mlnx_qos output refused: not a line mlnx_qos prints: "
        "'tc: 3 ratelimit unlimited tsa vendor'"
    ]


def test_rails_that_need_different_classes_are_named():
    node = node_qos(
        [
            rail(netarbiter(), tclass=ucx_tclass()),
            rail(netarbiter(), name="mlx5_3:1", netdev="eth5"),
        ]
    )
    assert node.env == {} and node.problems[-1].startswith(
        "the RoCE rails need different traffic classes (mlx5_2:1 (eth4)=106, mlx5_3:1 (eth5)=96)"
    )


def test_the_node_whose_trust_pfc_priority_or_tc_differs_from_the_majority_is_named():
    nodes = {f"n{i}": node_qos([rail(netarbiter(), tclass=ucx_tclass())]) for i in (1, 2, 3)}
    nodes["n4"] = node_qos([rail(netarbiter(PFC3, PFC4), tclass=ucx_tclass())])
    nodes["n5"] = node_qos([rail(centos12(), netdev="ens6")])
    nodes["n6"] = node_qos([rail(None, status="exit 124")])  # not read: not counted
    found = {(f.node, f.property, f.observed, f.expected) for f in odd_qos(nodes)}
    assert found == {
        ("n4", PFC_PRIORITY, "4", "3"),
        ("n5", PFC_PRIORITY, "none", "3"),
        ("n5", TRUST, "pcp", "dscp"),
    }
    assert all(n.values[TC] == "106" for name, n in nodes.items() if name in ("n1", "n4"))


# ---- trainfleet diagnose on a capture directory built from real files -------------------------


def roce_node(root: Path, name: str, mlnx_qos: str | None, status: str = "ok") -> None:
    """A RoCE node's folder: roce_v2_cx6's sysfs tree (mlx5_0 on ens1f0, its IPv4 RoCE v2 GID
    at index 5) with ucx#11105's traffic_class reading, ``mlnx_qos`` as its
    ``mlnx-qos/ens1f0.txt`` and spiderpool's ECN enables under ``sys-class-net/ens1f0``."""
    folder = root / name
    shutil.copytree(ROCE_TREE, folder / INFINIBAND)
    (folder / INFINIBAND / "mlx5_0" / "tc" / "1").mkdir(parents=True)
    (folder / INFINIBAND / "mlx5_0" / "tc" / "1" / "traffic_class").write_text(ucx_tclass())
    for key, value in spiderpool_ecn().items():
        side, priority = key.split("/")
        path = folder / "sys-class-net" / "ens1f0" / "ecn" / side / "enable" / priority
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(value + "\n")
    status_of = dict.fromkeys(SOURCES, "absent") | {INFINIBAND: "ok", "sys-class-net": "ok"}
    status_of["rdma_cm"] = "absent"
    status_of["mlnx-qos/ens1f0.txt"] = status
    if mlnx_qos is not None:
        (folder / "mlnx-qos").mkdir()
        (folder / "mlnx-qos" / "ens1f0.txt").write_text(mlnx_qos)
    (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in status_of.items()))


def roce_capture(root: Path) -> Path:
    for name in ("n1", "n2", "n3"):
        roce_node(root, name, netarbiter())
    roce_node(root, "n4", netarbiter(PFC3, PFC4))  # PFC on priority 4
    roce_node(root, "n5", None, status="exit 124")  # mlnx_qos timed out
    return root


def test_diagnose_shows_each_nodes_nccl_env_and_names_the_odd_qos(tmp_path, capsys):
    assert main(["diagnose", str(roce_capture(tmp_path / "c"))]) == 1
    out = capsys.readouterr().out
    section = out[out.index("NCCL environment trainfleet would write") :]
    for line in (
        "  NCCL_IB_HCA==mlx5_0:1  [all 5 nodes]",
        "  NCCL_IB_ROCE_VERSION_NUM [NCCL >= 2.21]=2  [all 5 nodes]",
        "  NCCL_IB_ADDR_FAMILY [NCCL >= 2.21]=AF_INET  [all 5 nodes]",
        "  NCCL_IB_GID_INDEX [NCCL < 2.21 or unknown]=5  [all 5 nodes]",
        "  NCCL_IB_TC=106  [n[1-4]]",
        "  not derived: NCCL_SOCKET_IFNAME: not read: a capture holds no interface addresses"
        "  [all 5 nodes]",
        "  not derived: NCCL_IB_TC: mlx5_0:1 (ens1f0): not read: mlnx-qos/ens1f0.txt timed out"
        "  [n5]",
    ):
        assert line in section.split("\n"), line
    assert "[n4] PFC priority is '4', the other nodes have '3'" in out
    assert "[n4] NCCL env problems: mlx5_0:1 (ens1f0): the host's traffic_class" in out
    assert "[n5] NCCL env problems: mlx5_0:1 (ens1f0): mlnx_qos not read: timed out" in out
    assert main(["diagnose", str(tmp_path / "c"), "--json"]) == 1
    nodes = json.loads(capsys.readouterr().out)["nodes"]
    assert nodes["n1"]["properties"]["NCCL_IB_TC"] == "106"
    assert nodes["n1"]["properties"]["NCCL_IB_GID_INDEX [NCCL < 2.21 or unknown]"] == "5"
    assert nodes["n1"]["properties"][PROBLEMS] == "none"
    assert "NCCL_IB_TC" not in nodes["n5"]["properties"]
    assert "timed out" in nodes["n5"]["properties"][NOT_DERIVED]
    assert "from the host's traffic_class" in nodes["n1"]["properties"][WHY]


def test_with_a_spec_its_pinned_nccl_and_its_tc_decide(tmp_path):
    root = roce_capture(tmp_path / "c")
    spec = tmp_path / "spec.yml"
    spec.write_text(
        "cluster: {name: roce}\nstack: {cuda: '12.4', nccl: 2.21.5}\n"
        "nccl: {env: {NCCL_IB_TC: '160'}}\nnodes:\n"
        + "".join(f"  - {{name: n{i}, address: 192.0.2.{i}, gpus: 0}}\n" for i in range(1, 6))
    )
    report = judge(root, load_cluster(spec))
    n1 = report.observed["n1"]
    assert n1["NCCL_IB_ADDR_FAMILY"] == "AF_INET" and "NCCL_IB_GID_INDEX" not in n1
    assert n1["NCCL_IB_TC"] == "160"  # the spec's, passed through as the deploy does
    assert (
        "nccl.env NCCL_IB_TC 160 (DSCP 40 -> priority 5) misses the PFC priority 3"
        in (n1[PROBLEMS])
    )


def test_an_old_capture_names_what_it_did_not_read_never_refuses(tmp_path):
    # gpud's H100 tree (before #40: no GID files, no QoS sources): its rails mix IB and the
    # RoCE bond, so nothing is derived, and it says so
    folder = tmp_path / "c" / "g1"
    shutil.copytree(GPUD_H100, folder / INFINIBAND)
    status = dict.fromkeys(SOURCES, "absent") | {INFINIBAND: "ok"}
    (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in status.items()))
    report = judge(tmp_path / "c")
    g1 = report.observed["g1"]
    assert "NCCL_IB_HCA: not derived: the rails mix InfiniBand" in g1[NOT_DERIVED]
    assert "NCCL_SOCKET_IFNAME: not read" in g1[NOT_DERIVED]
    assert ib_ports({"mlx5_0/ports/1/state": "4: ACTIVE"})[0]["gids"] == []


def test_a_roce_tree_without_gid_files_names_the_gid_settings_not_read(tmp_path):
    root = tmp_path / "c"
    roce_node(root, "n1", netarbiter())
    for path in (root / "n1" / INFINIBAND).rglob("gid_attrs"):
        shutil.rmtree(path)  # a capture made before the GID files were saved
    n1 = judge(root).observed["n1"]
    assert n1["NCCL_IB_HCA"] == "=mlx5_0:1"
    assert (
        "GID settings [NCCL >= 2.21]: not read: the capture has no GID table for mlx5_0:1"
        in (n1[NOT_DERIVED])
    )
    assert "NCCL_IB_TC" not in n1  # nor whose mlnx_qos to read: the netdev is a GID's
    assert "the port's netdev (gid_attrs/ndevs) was not read or names no netdev" in n1[NOT_DERIVED]


def test_rdma_cms_tos_is_kept_where_it_lands_and_named_where_it_misses():
    tos = SPIDERPOOL.read_text().split("cma_roce_tos: ")[1].split("\n")[0]  # "160"
    reading = rail(netarbiter()) | {"default_roce_tos": tos}
    node = node_qos([reading])  # 160: DSCP 40, priority 5, where netarbiter has no PFC
    assert (node.env, node.problems) == ({"NCCL_IB_TC": "96"}, [])
    assert (
        "default_roce_tos 160 (DSCP 40 -> priority 5) misses the PFC priority 3"
        in (node.explanation[0])
    )
    # Faulty variant: netarbiter's PFC row on priority 5: spiderpool's TOS lands there
    moved = "        enabled     0   0   0   0   0   1   0   0   "
    node = node_qos([rail(netarbiter(PFC3, moved)) | {"default_roce_tos": tos}])
    assert (node.env, node.problems) == ({"NCCL_IB_TC": "160"}, [])
    assert "from the host's rdma_cm default_roce_tos" in node.explanation[0]


def test_several_pfc_priorities_and_no_host_class_ask_for_the_spec():
    # Faulty variant: netarbiter's PFC row with priorities 3 and 4 lossless
    both = "        enabled     0   0   0   1   1   0   0   0   "
    node = node_qos([rail(netarbiter(PFC3, both))])
    assert node.env == {} and node.problems == [
        "mlx5_2:1 (eth4): PFC on several priorities (3,4) of eth4 and the host sets no traffic "
        "class landing on one: name NCCL_IB_TC in nccl.env"
    ]
    assert node_qos([rail(netarbiter(PFC3, both), tclass=ucx_tclass())]).env == {TC: "106"}


@pytest.mark.parametrize("tree", ["roce_v2_cx6", "roce_v1_only", "ib_two_hcas", "ib_port_down"])
def test_the_capture_reads_a_port_and_its_gids_as_the_live_fact_does(tree):
    fact = NcclNetwork()
    script = fact.command(sysfs=str(FIXTURES / "sysfs" / tree)).get_raw_value()
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True)
    live = fact.process(output.stdout.splitlines())["ib_ports"]
    root = FIXTURES / "sysfs" / tree / "class" / "infiniband"
    files = {p.relative_to(root).as_posix(): p.read_text() for p in root.rglob("*") if p.is_file()}
    assert ib_ports(files) == live


def test_a_capture_with_topo_only_lists_the_rails_and_names_gids_and_tc_not_read(tmp_path):
    topo = FIXTURES / "rdma" / "topo" / "topo-m_dgx-a100-1mcprddgx05_pxb-rails-storage-sys.txt"
    folder = tmp_path / "c" / "a1"
    folder.mkdir(parents=True)
    shutil.copy(topo, folder / "nvidia-smi-topo-m.txt")
    status = dict.fromkeys(SOURCES, "absent") | {"nvidia-smi-topo-m.txt": "ok"}
    (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in status.items()))
    a1 = judge(tmp_path / "c").observed["a1"]
    assert a1["NCCL_IB_HCA"] == "=" + ",".join(f"mlx5_{i}" for i in range(8))  # no storage HCA
    assert a1[NOT_DERIVED].split(" | ")[1:] == [
        "GID settings: not read: no sys-class-infiniband (the rails' link layer and GIDs unknown)",
        "NCCL_IB_TC: not read: no sys-class-infiniband (link layer unknown)",
    ]


def test_a_netdev_file_that_names_no_netdev_is_never_a_source_name():
    files = {
        "mlx5_0/ports/1/link_layer": "Ethernet\n",
        "mlx5_0/ports/1/state": "4: ACTIVE\n",
        "mlx5_0/ports/1/gids/0": "fe80:0000:0000:0000:0e42:a1ff:fe5d:4db8\n",
        "mlx5_0/ports/1/gid_attrs/types/0": "IB/RoCE v1\n",
        "mlx5_0/ports/1/gid_attrs/ndevs/0": "../../etc\n",
    }
    (reading,) = qos_readings({"mlnx-qos/...txt": "ok"}, {}, ib_ports(files))
    assert (reading["netdev"], reading["mlnx_qos"]) == (None, None)
    assert node_qos([reading]).unset == [
        "mlx5_0:1: not read: the port's netdev (gid_attrs/ndevs) was not read or names no netdev"
    ]


def test_dcbs_pfc_and_dscp_tables_read_where_mlnx_qos_is_absent():
    pfc_show, app_show = (
        block.split("\n", 1)[1]  # each tool's output without its `$ dcb ...` line
        for block in (QOS / DCB).read_text().split("\n\n")
    )
    pfc = qos.parse_dcb_pfc(pfc_show)
    assert tuple(p for p in range(8) if pfc[p]) == (3,)
    assert qos.parse_dcb_app(app_show) == {26: 3}  # AF31: DSCP 26, NCCL's 106 >> 2
    # Faulty variants, one line changed each: a cell missing, a name dcb does not print
    with pytest.raises(qos.QosRefused, match="each priority 0..7 once"):
        qos.parse_dcb_pfc(pfc_show.replace(" 7:off", " 6:on"))
    with pytest.raises(qos.QosRefused, match="not a DSCP dcb prints"):
        qos.parse_dcb_app(app_show.replace("AF31", "AF51"))
    with pytest.raises(qos.QosRefused, match="not a line dcb pfc show prints"):
        qos.parse_dcb_pfc(pfc_show.replace("prio-pfc", "pg-pfc"))  # dcb's first draft's name


def test_a_node_without_an_infiniband_tree_gets_ib_disabled_as_the_deploy_gives_it(tmp_path):
    # the lab's nodes, and a CPU node: no topo -m, /sys/class/infiniband absent
    for name in ("c1", "c2"):
        folder = tmp_path / "c" / name
        folder.mkdir(parents=True)
        status = dict.fromkeys(SOURCES, "absent")
        (folder / STATUS_FILE).write_text("".join(f"{n} {s}\n" for n, s in status.items()))
    report = judge(tmp_path / "c")
    assert report.findings == []
    assert report.observed["c1"]["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_HCA" not in report.observed["c1"][NOT_DERIVED]


def test_a_traffic_class_file_that_is_no_reading_is_refused_and_named():
    # Faulty variant: ucx#11105's reading with its "=" lost
    node = node_qos([rail(netarbiter(), tclass="Global tclass 106")])
    assert node.problems == [
        "mlx5_2:1 (eth4): not 'Global tclass=<0-255>' nor empty: 'Global tclass 106'"
    ]


def test_a_linked_mlnx_qos_folder_is_refused_not_followed(tmp_path):
    root = tmp_path / "c"
    roce_node(root, "n1", netarbiter())
    elsewhere = tmp_path / "elsewhere"
    (root / "n1" / "mlnx-qos").rename(elsewhere)
    (root / "n1" / "mlnx-qos").symlink_to(elsewhere)
    with pytest.raises(CaptureError, match="mlnx-qos: a link, not a directory"):
        judge(root)
    (root / "n1" / "mlnx-qos").unlink()
    (root / "n1" / "mlnx-qos").mkdir()
    (root / "n1" / "mlnx-qos" / "ens1f0.txt").symlink_to(elsewhere / "ens1f0.txt")
    with pytest.raises(CaptureError, match="ens1f0.txt: cannot be read"):
        judge(root)
