"""NCCL's own decisions read from real INFO logs (tests/fixtures/nccl_debug, each with its
thread; tests/fixtures/hardware/h100_device, captured on an H100): version, net plugin,
GPUDirect RDMA, the transport within a node. A cluster is one real log's hosts, or copies of
one host, one line changed per fault."""

from __future__ import annotations

import re
from pathlib import Path

from checks.nccl_decisions import decisions, nccl_decision_problems
from trainfleet.model import Cluster
from trainfleet.spec import load_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
LOGS = FIXTURES / "nccl_debug"
H100 = FIXTURES / "hardware" / "h100_device"
_HOST = re.compile(r"^(?:\[[0-9,]+\]<stdout>:|\[[0-9]+\] )?([A-Za-z0-9_.<>-]+):[0-9]+:[0-9]+ ")


def by_host(name: str) -> dict[str, list[str]]:
    """A pasted log's lines by the host that printed them (a line without one: the first)."""
    hosts: dict[str, list[str]] = {}
    last = None
    for line in (LOGS / name).read_text().splitlines():
        found = _HOST.match(line)
        last = found.group(1) if found else last
        hosts.setdefault(last or "", []).append(line)
    hosts.pop("", None)
    return hosts


def cluster(tmp_path: Path, nodes: list[str], gpus: int = 8) -> Cluster:
    spec = tmp_path / "spec.yml"
    spec.write_text(
        "cluster: {name: c}\nnodes:\n"
        + "".join(
            f"  - {{name: {n}, address: 192.0.2.{i}, gpus: {gpus}}}\n"
            for i, n in enumerate(nodes, 1)
        )
    )
    return load_cluster(spec)


IB = {"ib_ports": [{"device": "mlx5_10", "port": 1, "state": "4: ACTIVE"}], "interfaces": []}


def changed(lines: list[str], old: str, new: str) -> list[str]:
    """``lines`` with the one line holding ``old`` replaced by ``new``."""
    (index,) = [i for i, line in enumerate(lines) if old in line]
    return [*lines[:index], lines[index].replace(old, new), *lines[index + 1 :]]


def test_the_h100s_own_log_names_its_nccl_plugin_and_socket_gdr():
    text = (H100 / "nccl-1rank-info-all.log").read_text().splitlines()
    assert decisions([text]) == {
        "NCCL version": "2.28.9+cuda13.0",
        "net plugin": "none found (NCCL's own)",
        "GPUDirect RDMA": "disabled for eth0",
        "transport within the node": "not logged",
    }


def test_two_nodes_whose_nccl_builds_differ_are_both_named(tmp_path):
    hosts = by_host("nccl-2.25.1_ib_disabled_socket.log")
    assert sorted(hosts) == ["agzen-master", "agzen-worker"]
    seen, problems = nccl_decision_problems(
        cluster(tmp_path, sorted(hosts)), {h: [lines] for h, lines in hosts.items()}, {}
    )
    assert seen["agzen-master"]["NCCL version"] == "2.25.1+cuda12.4"
    assert seen["agzen-worker"]["NCCL version"] == "2.25.1+cuda12.1"
    named = [(p.node, p.cause) for p in problems if "NCCL version" in p.cause]
    assert [node for node, _ in named] == ["agzen-master", "agzen-worker"]
    assert all(
        "NCCL's NCCL version here is" in cause and "no majority" in cause for _, cause in named
    )


def test_the_node_whose_plugin_differs_is_named_against_the_majority(tmp_path):
    hosts = by_host("nccl-2.19.3_dgxh100_roce.log")
    odd = changed(
        hosts["dgxh100-4"],
        "NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or "
        "directory No plugin found (libnccl-net.so), using internal implementation",
        # the line as NCCL prints a loaded plugin (NVIDIA/nccl#1737, #1357)
        "NET/Plugin: Loaded net plugin NCCL RDMA Plugin v6 (v6)",
    )
    logs = {"node1": [hosts["dgxh100-3"]], "node2": [hosts["dgxh100-4"]], "node3": [odd]}
    seen, problems = nccl_decision_problems(cluster(tmp_path, list(logs), gpus=0), logs, {})
    assert seen["node3"]["net plugin"] == "loaded: NCCL RDMA Plugin v6"
    assert [(p.node, p.cause) for p in problems] == [
        (
            "node3",
            "NCCL's net plugin here is 'loaded: NCCL RDMA Plugin v6', "
            '"none found (NCCL\'s own)" on the other nodes',
        )
    ]


def test_a_node_with_a_channel_off_gpudirect_rdma_is_named(tmp_path):
    (lines,) = by_host("nccl-1453_ibext_plugin_channels.log").values()
    odd = changed(
        lines,
        "Channel 07/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/7/GDRDMA",
        "Channel 07/0 : 0[0] -> 8[0] [send] via NET/IBext_v8/7",
    )
    logs = {"node1": [lines], "node2": [lines], "node3": [odd]}
    networks = {node: IB for node in logs}
    seen, problems = nccl_decision_problems(cluster(tmp_path, list(logs)), logs, networks)
    assert seen["node1"]["GPUDirect RDMA"] == "on every NET channel (12)"
    assert seen["node3"]["GPUDirect RDMA"] == "on 11 of 12 NET channels"
    named = [(p.node, p.cause) for p in problems]
    assert [node for node, _ in named] == ["node3", "node3"]
    assert "GPUDirect RDMA here is 'on 11 of 12 NET channels'" in named[0][1]
    assert named[1][1].startswith(
        "GPUDirect RDMA is expected here (an IB/RoCE port is active) but NCCL used IBext_v8 "
        "with GPUDirect RDMA on 11 of 12 NET channels"
    )


def test_peermem_wanted_and_gdr_disabled_on_ib_is_named_and_sockets_are_not_this_checks(tmp_path):
    hosts = by_host("nccl-2.19.3_dgxh100_roce.log")
    off = changed(
        hosts["dgxh100-3"],
        "NET/Plugin : No plugin found, using internal implementation",
        # NCCL's line for an HCA it will not use GPUDirect RDMA on (NVIDIA/nccl#1537)
        "NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_10'",
    )
    logs = {"gpu1": [off]}
    seen, problems = nccl_decision_problems(cluster(tmp_path, ["gpu1"]), logs, {"gpu1": IB})
    assert seen["gpu1"]["GPUDirect RDMA"] == "disabled for mlx5_10"
    assert [p.node for p in problems] == ["gpu1"] and "GPUDirect RDMA disabled" in problems[0].cause
    # whatever the node's path (DMA-BUF or nvidia_peermem, the spec's peermem auto or on):
    # NCCL's own word is the judge
    for setting in ("auto", "on"):
        spec = cluster(tmp_path, ["gpu1"])
        spec.gpu["peermem"] = setting
        _, named = nccl_decision_problems(spec, logs, {"gpu1": IB})
        assert [p.node for p in named] == ["gpu1"], setting
    # a CPU node, one without an active port, or gpu.peermem: off is not the spec's to judge
    _, none = nccl_decision_problems(cluster(tmp_path, ["gpu1"], gpus=0), logs, {"gpu1": IB})
    assert none == []
    off = cluster(tmp_path, ["gpu1"])
    off.gpu["peermem"] = "off"
    assert nccl_decision_problems(off, logs, {"gpu1": IB})[1] == []
    sockets = {"h": [(H100 / "nccl-1rank-info-all.log").read_text().splitlines()]}
    _, none = nccl_decision_problems(cluster(tmp_path, ["h"]), sockets, {"h": IB})
    assert none == []  # sockets despite an active port: nccl_socket_problems names that


def test_a_node_whose_gpus_talk_over_shared_memory_instead_of_p2p_is_named(tmp_path):
    (lines,) = by_host("nccl-952_socket_channels.log").values()
    assert decisions([lines])["transport within the node"] == "P2P/IPC/read"
    odd = changed(
        lines,
        "Channel 04/0 : 9[1] -> 10[2] via P2P/IPC/read",
        "Channel 04/0 : 9[1] -> 10[2] via SHM/direct/direct",
    )
    logs = {"node1": [lines], "node2": [odd], "node3": [lines]}
    _, problems = nccl_decision_problems(cluster(tmp_path, list(logs)), logs, {})
    assert [(p.node, p.cause) for p in problems] == [
        (
            "node2",
            "NCCL's transport within the node here is 'P2P/IPC/read, SHM/direct/direct', "
            "'P2P/IPC/read' on the other nodes",
        )
    ]


def test_a_plugin_named_in_the_environment_but_missing_and_a_plugin_network_with_a_space():
    missing = (H100 / "nccl-1rank-plugin-missing.log").read_text().splitlines()
    assert decisions([missing])["net plugin"] == "none found (NCCL's own)"
    efa = (LOGS / "nccl-efa_aws_libfabric_ring.log").read_text().splitlines()
    assert decisions([efa])["GPUDirect RDMA"] == "on 0 of 3 NET channels"  # AWS Libfabric/0


def test_dma_buf_channels_count_as_gpudirect_rdma_and_dma_buf_available_alone_does_not(tmp_path):
    # Azure/aks-rdma-infiniband#36: NET/IB channels marked /GDRDMA; NCCL marks a DMA-BUF
    # registration the same way. One line changed: a GDR_LEVEL line -> nccl-tests#245's
    # "DMA-BUF is available on GPU device 0" (the open module's DMA-BUF path)
    (lines,) = by_host("aks-rdma-36_ib_gdrdma_channels.log").values()
    dmabuf = changed(
        lines,
        "[0] NCCL INFO NCCL_NET_GDR_LEVEL set by environment to SYS",
        "[0] NCCL INFO DMA-BUF is available on GPU device 0",
    )
    logs = {"node1": [dmabuf], "node2": [lines]}
    seen, problems = nccl_decision_problems(
        cluster(tmp_path, list(logs)), logs, {node: IB for node in logs}
    )
    assert seen["node1"]["GPUDirect RDMA"] == "on every NET channel (7)"
    assert problems == []
    # nccl-tests#245: DMA-BUF available on the GPU, GDR disabled by the network plugin
    ofi = (LOGS / "nccl-tests-245_ofi_dmabuf_available_gdr_disabled.log").read_text()
    assert decisions([ofi.splitlines()])["GPUDirect RDMA"] == "disabled for NET/OFI"
