"""Deriving the NCCL environment: the fact's script run for real over sysfs trees laid out as
real machines' (tests/fixtures/sysfs), and the derivation rules."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from facts.nccl_env_facts import NcclNetwork
from trainfleet.nccl import derive, gid_disagreement, hca_list, uniform_variables

SYSFS = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs"
AUTO = {"socket_ifname": "auto", "ib": "auto", "env": {}}
# What `ip -o addr` lists on a lab node: the decoy NIC first, the cluster interface second.
INTERFACES = [
    {"name": "lo", "addresses": ["127.0.0.1"], "bridge": False},
    {"name": "eno1", "addresses": ["198.18.0.139"], "bridge": False},
    {"name": "eth0", "addresses": ["198.18.0.11"], "bridge": False},
]


def ib_ports(tree: str) -> list:
    fact = NcclNetwork()
    script = fact.command(sysfs=str(SYSFS / tree)).get_raw_value()
    output = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout
    return fact.process(output.splitlines())["ib_ports"]


@pytest.mark.parametrize(
    ("tree", "expected"),
    [
        ("roce_v2_cx6", {"NCCL_IB_HCA": "=mlx5_0:1", "NCCL_IB_GID_INDEX": "5"}),
        ("ib_two_hcas", {"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"}),
        ("ib_one_of_two_down", {"NCCL_IB_HCA": "=mlx5_0:1"}),
        ("ib_port_down", {"NCCL_IB_DISABLE": "1"}),
        ("no_rdma", {"NCCL_IB_DISABLE": "1"}),
    ],
)
def test_infiniband_and_roce_settings_come_from_sysfs(tree, expected):
    derived = derive("198.18.0.11", AUTO, INTERFACES, ib_ports(tree))
    assert derived.problems == []
    assert {k: v for k, v in derived.env.items() if k.startswith("NCCL_IB")} == expected


def test_the_fact_reads_the_gid_table_as_the_kernel_writes_it():
    (port,) = ib_ports("roce_v2_cx6")
    assert (port["device"], port["port"], port["link_layer"], port["state"]) == (
        "mlx5_0",
        1,
        "Ethernet",
        "4:ACTIVE",
    )
    assert [(g["index"], g["type"]) for g in port["gids"]][-2:] == [
        (4, "IB/RoCE_v1"),
        (5, "RoCE_v2"),
    ]
    assert port["gids"][5]["ndev"] == "ens1f0"


def test_roce_without_a_v2_ipv4_gid_is_a_problem_not_a_guess():
    derived = derive("198.18.0.11", AUTO, INTERFACES, ib_ports("roce_v1_only"))
    assert "NCCL_IB_GID_INDEX" not in derived.env
    assert derived.problems == ["mlx4_0:1 is RoCE but has no RoCE v2 GID with an IPv4 address"]


def test_the_interface_is_the_one_holding_the_cluster_address_not_the_first_listed():
    derived = derive("198.18.0.11", AUTO, INTERFACES, [])
    assert derived.env["NCCL_SOCKET_IFNAME"] == "=eth0"  # exact match: not eth0.100
    assert derived.env["GLOO_SOCKET_IFNAME"] == "eth0"  # Gloo has no '=' syntax
    assert derived.interface == "eth0"


def test_an_address_no_interface_holds_is_named_with_what_the_node_has():
    derived = derive("198.18.0.99", AUTO, INTERFACES, [])
    assert "NCCL_SOCKET_IFNAME" not in derived.env
    assert derived.problems == [
        "no interface holds the cluster address 198.18.0.99 "
        "(interfaces: lo=127.0.0.1, eno1=198.18.0.139, eth0=198.18.0.11)"
    ]


def test_the_cluster_address_on_a_docker_bridge_is_refused():
    interfaces = [{"name": "docker0", "addresses": ["198.18.0.11"], "bridge": True}]
    assert "NCCL must never use" in derive("198.18.0.11", AUTO, interfaces, []).problems[0]


def test_spec_overrides_are_validated_against_the_node_and_pass_through():
    settings = {
        "socket_ifname": "=ens9",
        "ib": "disable",
        "env": {"NCCL_DEBUG": "WARN", "NCCL_IB_TC": 106},
    }
    derived = derive("198.18.0.11", settings, INTERFACES, ib_ports("ib_two_hcas"))
    assert derived.problems == [
        "nccl.socket_ifname names ens9, which this node does not have (it has eno1, eth0, lo)"
    ]
    assert derived.env["NCCL_IB_DISABLE"] == "1" and "NCCL_IB_HCA" not in derived.env
    assert derived.env["NCCL_DEBUG"] == "WARN" and derived.env["NCCL_IB_TC"] == "106"


def test_cross_node_rules():
    assert gid_disagreement({"a": 3, "b": 3, "c": None}) is None
    assert gid_disagreement({"a": 3, "b": 5}) == "NCCL_IB_GID_INDEX differs between nodes: a=3, b=5"
    assert uniform_variables({"a": {"X": "1", "IF": "=eth0"}, "b": {"X": "1", "IF": "=ens1"}}) == [
        "X"
    ]


def test_hca_list_reads_nccl_ib_hca_as_nccl_does():
    assert hca_list("=mlx5_0:1,mlx5_3") == ["mlx5_0:1", "mlx5_3"]  # exact names, '=' gone
    assert hca_list("mlx5,,ibp") == ["mlx5", "ibp"]  # prefixes; an empty entry is none
    assert hca_list("==mlx5_0") == ["=mlx5_0"]  # one '=' is the mark, a second is the name's
    assert hca_list("^mlx5_1") == ["^mlx5_1"] and hca_list("") == []
