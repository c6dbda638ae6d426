"""The HCCL rank table of an Ascend cluster, and each node's NPU device IPs it is built from:
the NpuDeviceIps fact parsed from published captures (tests/fixtures/npu) and run for real,
and the table checked against a file MindSpore's hccl_tools.py wrote."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from pathlib import Path

import pytest
from pyinfra_testing.facts import make_fact_tests

from facts.npu_facts import NpuDeviceIps
from trainfleet.hccl import NpuServer, rank_table, render_rank_table
from trainfleet.spec import parse_cluster

NPU = Path(__file__).resolve().parents[1] / "fixtures" / "npu"

TestNpuDeviceIps = make_fact_tests("facts", "npu_facts.NpuDeviceIps", NPU / "facts")


def fixture_ips(name: str) -> dict[int, str]:
    """What the fact makes of a fixture's captured output."""
    output = json.loads((NPU / "facts" / f"{name}.json").read_text())["output"]
    return NpuDeviceIps().process(output)


def eight(prefix: str) -> list[tuple[int, str]]:
    return [(i, f"{prefix}.{i + 1}") for i in range(8)]


# The rank table


def test_a_container_s_four_npus_render_byte_for_byte_as_hccl_tools_wrote_them():
    """The PaddlePaddle docs' container: its hccn.conf through the fact, then the table, equals
    the hccl_4p_0123_127.0.0.1.json that hccl_tools.py wrote from that same file."""
    ips = fixture_ips("container_4p_hccn_conf_no_tool")
    written = (NPU / "rank_table" / "hccl_4p_0123_127.0.0.1.json").read_text()
    assert (
        render_rank_table([NpuServer("npu-container", "127.0.0.1", sorted(ips.items()))]) == written
    )


def test_keys_come_in_hccl_tools_order_and_every_value_is_a_string():
    table = rank_table([("node1", "10.0.0.11", [(0, "192.168.1.8"), (1, "192.168.1.9")])])
    assert list(table) == ["version", "server_count", "server_list", "status"]
    (server,) = table["server_list"]
    assert list(server) == ["server_id", "device", "host_nic_ip"]
    assert [list(d) for d in server["device"]] == [["device_id", "device_ip", "rank_id"]] * 2
    assert (table["version"], table["server_count"], table["status"]) == ("1.0", "1", "completed")
    assert server["host_nic_ip"] == "reserve"
    assert server["device"][1] == {"device_id": "1", "device_ip": "192.168.1.9", "rank_id": "1"}


def test_rank_ids_run_over_servers_in_spec_order_then_over_device_ids():
    """node-b comes first in the spec though its address sorts last; its devices are given out of
    order."""
    table = rank_table(
        [
            NpuServer("node-b", "10.0.0.12", [(1, "192.168.2.9"), (0, "192.168.2.8")]),
            NpuServer("node-a", "10.0.0.11", [(0, "192.168.1.8"), (1, "192.168.1.9")]),
        ]
    )
    assert table["server_count"] == "2"
    assert [s["server_id"] for s in table["server_list"]] == ["10.0.0.12", "10.0.0.11"]
    assert [
        (d["device_id"], d["device_ip"], d["rank_id"])
        for s in table["server_list"]
        for d in s["device"]
    ] == [
        ("0", "192.168.2.8", "0"),
        ("1", "192.168.2.9", "1"),
        ("0", "192.168.1.8", "2"),
        ("1", "192.168.1.9", "3"),
    ]


def test_two_full_servers_make_sixteen_ranks_each_server_keeping_device_ids_0_to_7():
    table = rank_table(
        [("node1", "10.0.0.11", eight("192.168.1")), ("node2", "10.0.0.12", eight("192.168.2"))]
    )
    second = table["server_list"][1]["device"]
    assert [d["device_id"] for d in second] == [str(i) for i in range(8)]
    assert [d["rank_id"] for d in second] == [str(i) for i in range(8, 16)]


def test_the_rendered_file_is_four_space_indented_json_without_a_trailing_newline():
    text = render_rank_table([("node1", "10.0.0.11", [(0, "192.168.1.8")])])
    assert text.startswith('{\n    "version": "1.0",\n    "server_count": "1",\n')
    assert text.endswith('\n    "status": "completed"\n}')


@pytest.mark.parametrize(
    ("servers", "message"),
    [
        ([("node1", "10.0.0.11", [(8, "192.168.1.8")])], "node1: device 8: device ids run 0-7"),
        ([("node1", "10.0.0.11", [(-1, "192.168.1.8")])], "node1: device -1: device ids run 0-7"),
        (
            [("node1", "10.0.0.11", [("0", "192.168.1.8")])],
            "node1: device '0': the device id is not an integer",
        ),
        (
            [("node1", "10.0.0.11", [(True, "192.168.1.8")])],
            "node1: device True: the device id is not an integer",
        ),
        (
            [("node1", "10.0.0.11", [(0, "192.168.1.8"), (0, "192.168.1.9")])],
            "node1: device 0: listed twice",
        ),
        (
            [("node1", "10.0.0.11", [(2, "192.168.1.300")])],
            "node1: device 2: device IP '192.168.1.300' is not an IPv4",
        ),
        (
            [("node1", "10.0.0.11", [(2, "fe80::1")])],
            "node1: device 2: device IP 'fe80::1' is not an IPv4",
        ),
        (
            [("node1", "10.0.0.11", [(2, "192.168.01.8")])],
            "node1: device 2: device IP '192.168.01.8' is not an IPv4",
        ),
        (
            [("node1", "10.0.0.11", [(2, "192.168.1.8\n")])],
            "node1: device 2: device IP '192.168.1.8\\n' is not an IPv4",
        ),
        (
            [
                ("node1", "10.0.0.11", [(0, "192.168.1.8")]),
                ("node2", "10.0.0.12", [(3, "192.168.1.8")]),
            ],
            "node2: device 3: device IP 192.168.1.8 is already device 0's on node1",
        ),
        (
            [
                ("node1", "10.0.0.11", eight("192.168.1")),
                ("node2", "10.0.0.12", eight("192.168.2")[:4]),
            ],
            "node2: 4 NPU devices, but node1 has 8",
        ),
        (
            [("node1", "node1.cluster", [(0, "192.168.1.8")])],
            "node1: server address 'node1.cluster' is not an IPv4",
        ),
        (
            [
                ("node1", "10.0.0.11", [(0, "192.168.1.8")]),
                ("node2", "10.0.0.11", [(0, "192.168.2.8")]),
            ],
            "node2: server address 10.0.0.11 is already node1's",
        ),
        ([("node1", "10.0.0.11", [])], "node1: no NPU devices"),
        ([], "a rank table needs at least one server"),
    ],
)
def test_a_table_hccl_would_reject_is_refused_naming_the_server_and_device(servers, message):
    with pytest.raises(ValueError) as raised:
        rank_table(servers)
    assert str(raised.value).startswith(message)


def test_host_and_container_cannot_both_be_servers_the_container_keeps_the_hosts_device_ips():
    """The docs' container renumbers physical NPUs 4-7 as 0-3 but their IPs stay the host's."""
    host, container = (
        fixture_ips("physical_8p_hccn_conf_no_tool"),
        fixture_ips("container_4p_hccn_conf_no_tool"),
    )
    with pytest.raises(
        ValueError,
        match=r"^container: device 0: device IP 192.168.10.22 is already device 4's on host",
    ):
        rank_table(
            [
                ("host", "10.0.0.11", sorted(host.items())),
                ("container", "10.0.0.12", sorted(container.items())),
            ]
        )


def test_a_node_whose_devices_are_only_partly_known_is_refused_beside_a_full_one():
    partly = fixture_ips("atlas_910b_tool_and_hccn_conf")  # the post elides devices 1, 2 and 4-6
    with pytest.raises(ValueError, match=r"^910b: 3 NPU devices, but full has 8"):
        rank_table(
            [
                ("full", "10.0.0.11", eight("192.168.1")),
                ("910b", "10.0.0.12", sorted(partly.items())),
            ]
        )


# The NpuDeviceIps fact


def test_the_tool_s_live_answer_wins_over_the_file_and_the_file_fills_in_the_rest():
    ips = NpuDeviceIps().process(
        [
            "conf address_0=29.1.137.205",
            "conf address_3=29.1.137.208",
            "tool 3 ipaddr:29.1.112.213",
            "tool 3 netmask:255.255.0.0",
            "tool 0",  # device 0 answered nothing usable: the file's value stands
        ]
    )
    assert ips == {0: "29.1.137.205", 3: "29.1.112.213"}


@pytest.mark.parametrize(
    "line",
    [
        "conf tool 5 ipaddr:6.6.6.6",  # a file line dressed as the tool's answer about device 5
        "conf address_1=10.0.0.1 address_2=10.0.0.2",  # two assignments on one line
        "conf address_1=10.0.0.1;address_2=10.0.0.2",
        "conf address_01=10.0.0.1",  # not how hccn_tool writes ids
        "conf address_1=10.0.0.1=10.0.0.2",
        "conf #address_1=10.0.0.1",
        "conf  netmask_1=255.255.255.0",
        "conf address_1=10.0.0.256",
        "conf address_1=fe80::1",
        "tool 1 ipaddr:10.0.0.1 tool 2 ipaddr:10.0.0.2",
        "tool 1 netmask:255.255.255.0",  # the tool's first line must be its ipaddr
        "tool x ipaddr:10.0.0.1",
        "tool  1 ipaddr:10.0.0.1",
        "address_1=10.0.0.1",  # a line without the script's own prefix
        "ipaddr:10.0.0.1",
    ],
)
def test_a_line_that_is_not_exactly_an_address_yields_no_device(line):
    assert NpuDeviceIps().process([line]) == {}


def test_only_a_device_s_first_tool_line_counts_as_hccl_tools_reads_ret_0():
    assert NpuDeviceIps().process(["tool 2 Error: get ip failed", "tool 2 ipaddr:10.0.0.2"]) == {}


def test_a_device_the_file_gives_two_different_addresses_is_left_out_not_guessed():
    ips = NpuDeviceIps().process(
        [
            "conf address_1=10.0.0.1",
            "conf address_1=10.0.0.9",
            "conf address_2=10.0.0.2",
            "conf address_2=10.0.0.2",
        ]
    )
    assert ips == {2: "10.0.0.2"}


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def _run(fact: NpuDeviceIps, conf: Path, dev: Path, path: str) -> tuple[int, list[str]]:
    script = fact.command(conf=str(conf), dev=str(dev)).get_raw_value()
    result = subprocess.run(
        ["/bin/sh", "-c", script],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": path},
    )
    return result.returncode, result.stdout.splitlines()


def test_the_script_asks_the_tool_per_davinci_device_and_a_file_line_cannot_forge_the_tool(
    tmp_path,
):
    """Run the real script: a fake hccn_tool on PATH answers for davinci0 and fails for davinci1;
    the file's last line has no newline and the file holds a line shaped like the tool's output."""
    (tmp_path / "bin").mkdir()
    _executable(
        tmp_path / "bin" / "hccn_tool",
        '#!/bin/sh\n[ "$2" = 0 ] || exit 1\n'
        'printf "ipaddr:192.168.100.101\\nnetmask:255.255.255.0\\n"\n',
    )
    (tmp_path / "dev").mkdir()
    for node in ("davinci0", "davinci1", "davinci_manager"):
        (tmp_path / "dev" / node).touch()
    conf = tmp_path / "hccn.conf"
    conf.write_text("address_0=192.168.10.21\ntool 1 ipaddr:6.6.6.6\naddress_1=192.168.20.21")
    fact = NpuDeviceIps()
    code, output = _run(
        fact,
        conf,
        tmp_path / "dev",
        f"{tmp_path / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}",
    )
    assert code == 0
    assert "conf tool 1 ipaddr:6.6.6.6" in output and "tool 1 ipaddr:6.6.6.6" not in output
    assert fact.process(output) == {0: "192.168.100.101", 1: "192.168.20.21"}


def test_a_node_without_the_tool_or_the_file_exits_zero_with_no_devices(tmp_path):
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "sh").symlink_to("/bin/sh")
    code, output = _run(NpuDeviceIps(), tmp_path / "no-hccn.conf", tmp_path, str(tmp_path / "bin"))
    assert (code, output) == (0, [])
    assert NpuDeviceIps().process(output) == NpuDeviceIps.default() == {}


# ---- the rank table in every NPU node's plan ------------------------------------------------

NPU_CLUSTER = """\
nodes:
  - {name: npu-a01, address: 192.0.2.11, npus: 4}
  - {name: npu-a02, address: 192.0.2.12, npus: 4}
  - {name: cpu-a03, address: 192.0.2.13}
"""


def rank_table_problems(plan) -> list[str]:
    # (this plan reads no network, so every node also has an NCCL problem: not this test's)
    return [p for p in plan.launchers.problems if p.startswith("rank table")]


def _npu_plan(npu_ips):
    from trainfleet.plan import plan_cluster
    from trainfleet.plan_types import Gathered

    cluster = parse_cluster(NPU_CLUSTER)
    return plan_cluster(cluster, Gathered(npu_ips=npu_ips))


def test_every_npu_node_gets_the_same_rank_table_from_the_device_ips_read_on_each():
    conf = {
        int(k): v
        for k, v in json.loads((NPU / "facts" / "physical_8p_hccn_conf_no_tool.json").read_text())[
            "fact"
        ].items()
    }
    ips = {"npu-a01": {d: conf[d] for d in range(4)}, "npu-a02": {d: conf[d + 4] for d in range(4)}}
    plan = _npu_plan(ips)
    tables = {name: p.launchers.files.get("rank_table.json") for name, p in plan.nodes.items()}
    assert tables["cpu-a03"] is None
    assert tables["npu-a01"] == tables["npu-a02"] and tables["npu-a01"][1] == "644"
    table = json.loads(tables["npu-a01"][0])
    assert table["server_count"] == "2" and [s["server_id"] for s in table["server_list"]] == [
        "192.0.2.11",
        "192.0.2.12",
    ]
    assert [(d["device_ip"], d["rank_id"]) for s in table["server_list"] for d in s["device"]] == [
        (conf[r], str(r)) for r in range(8)
    ]
    assert all(not rank_table_problems(p) for p in plan.nodes.values())


def test_a_node_missing_a_device_ip_fails_every_npu_nodes_launcher_files_with_the_reason():
    plan = _npu_plan(
        {
            "npu-a01": {
                0: "192.168.10.21",
                1: "192.168.20.21",
                2: "192.168.30.21",
                3: "192.168.40.21",
            },
            "npu-a02": {0: "192.168.10.22", 1: "192.168.20.22"},
        }
    )
    want = [
        "rank table: npu-a02 has no device IP for NPU 2, 3 (/etc/hccn.conf, hccn_tool -i N -ip -g)"
    ]
    assert (
        rank_table_problems(plan.nodes["npu-a01"]) == want
        and rank_table_problems(plan.nodes["npu-a02"]) == want
    )
    assert rank_table_problems(plan.nodes["cpu-a03"]) == []
    assert "rank_table.json" not in plan.nodes["npu-a01"].launchers.files
