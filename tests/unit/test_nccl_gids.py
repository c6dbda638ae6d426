"""GIDs per node, per NCCL version (#40), on real GID tables (tests/fixtures/rdma/gids, each
with its source in the README there; a faulty variant is a capture with one line changed, listed
there too): what NCCL 2.18 and 2.21 get on the same table, IPv6-only tables, one address on two
netdevs, nodes on different address families, and drift naming a GID that moved."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tests.unit.test_plan import SPEC, plain_network, three_node_plan
from tests.unit.test_rails import one_line_changed
from trainfleet.capabilities import nccl_env
from trainfleet.hw.gid_tables import GidsRefused, parse_ibv_devinfo, parse_show_gids
from trainfleet.model import Node
from trainfleet.nccl import derive
from trainfleet.nccl_gids import (
    AF_INET,
    deciding_release,
    nccl_pick,
    own_pick,
    pinned_gid_reading,
)
from trainfleet.plan_types import NodePlan, Parts
from trainfleet.spec import parse_cluster

RDMA = Path(__file__).resolve().parents[1] / "fixtures" / "rdma"
GIDS = RDMA / "gids"
NCCL_769 = GIDS / "ibv_devinfo-v_nccl-769_mlx5_bond_0_gid-lines_TRIMMED.txt"
CENTOS12 = GIDS / "show_gids_centos12-doc_8-mlx5_ib-port-v1-only_ipv4-mapped-idx3.txt"
CENTOS12_LINKS = RDMA / "ibdev2netdev" / "ibdev2netdev_centos12-doc_8-mlx5_mixed-eth-ib.txt"
MI355 = GIDS / "show_gids_mooncake-1617_mi355-rocep_ipv6-only_TRIMMED.txt"
VXLAN = GIDS / "show_gids_ucx-pr-9484_mlx5_bond_0_bond1-vxlan_ipv4-mapped.txt"
MI355_RAILS = ["rocep105s0", "rocep121s0", "rocep137s0", "rocep153s0"]
NCCL_2_18, NCCL_2_21 = (2, 18), (2, 21)
INTERFACES = plain_network("198.18.0.11")["interfaces"]
# centos12's mlx5_2 IPv4 v2 GID, and the faulty variant where it moved from index 3 to 4
# (nccl#1333's move), the index column of that one row changed.
MLX5_2_V2 = (
    "mlx5_2  1       3       0000:0000:0000:0000:0000:ffff:ac11:f238 172.17.242.56   v2      ens6"
)
MLX5_2_V2_MOVED = MLX5_2_V2.replace("1       3       ", "1       4       ")


def settings(hca: str | None = None, **env: str) -> dict[str, Any]:
    return {
        "socket_ifname": "auto",
        "ib": "auto",
        "env": {**({"NCCL_IB_HCA": hca} if hca else {}), **env},
    }


def link_states(text: str) -> dict[str, tuple[str, str]]:
    """ibdev2netdev's ``mlx5_5 port 1 ==> ib0 (Up)``: device -> (link layer, state), the link
    layer read from the netdev's name as ibdev2netdev pairs them (ib* is IPoIB)."""
    rows = re.findall(r"(\S+) port \d+ ==> (\S+) \((Up|Down)\)", text)
    return {
        dev: ("InfiniBand" if net.startswith("ib") else "Ethernet", f"{state}")
        for dev, net, state in rows
    }


def ports(table: dict[tuple[str, int], list], links: dict[str, tuple[str, str]] | None = None):
    """The NcclNetwork fact's ib_ports of a GID table. A capture without link states (show_gids
    alone) is read as what it lists: RoCE ports, active."""
    out = []
    for (device, port), gids in table.items():
        layer, state = (links or {}).get(device, ("Ethernet", "Up"))
        out.append(
            {
                "device": device,
                "port": port,
                "link_layer": layer,
                "state": "4:ACTIVE" if state == "Up" else "1:DOWN",
                "gids": gids,
            }
        )
    return out


def centos12(text: str | None = None) -> list:
    gids = parse_show_gids(text if text is not None else CENTOS12.read_text())
    return ports(gids, link_states(CENTOS12_LINKS.read_text()))


def gid_env(derived) -> dict[str, str]:
    return {k: v for k, v in derived.env.items() if "GID" in k or "ROCE" in k or "ADDR" in k}


def test_the_captures_read_as_their_readmes_say():
    (bond,) = parse_ibv_devinfo(NCCL_769.read_text(), "mlx5_bond_0").values()
    assert [(g["index"], g["type"]) for g in bond] == [
        (0, "IB/RoCE_v1"),
        (1, "RoCE_v2"),
        (2, "IB/RoCE_v1"),
        (3, "RoCE_v2"),
    ]
    table = parse_show_gids(CENTOS12.read_text())
    assert sum(len(g) for g in table.values()) == 19  # the capture's own n_gids_found=19
    assert table[("mlx5_5", 1)] == [
        {"index": 0, "type": "IB/RoCE_v1", "gid": "fe80:0000:0000:0000:08c0:eb03:00b6:a0b4",
         "ndev": None}
    ]  # fmt: skip
    assert [g["ndev"] for g in parse_show_gids(VXLAN.read_text())[("mlx5_bond_0", 1)]] == [
        "bond1", "bond1", "b3.vxlan.30100", "b3.vxlan.30100", "bond1", "bond1"
    ]  # fmt: skip
    with pytest.raises(GidsRefused, match="not a show_gids row"):
        parse_show_gids(one_line_changed(VXLAN, VXLAN.read_text().split("\n")[2], "mlx5 garbage"))


@pytest.mark.parametrize(
    ("versions", "release"),
    [
        (["2.21.5-1", None], (2, 21)),
        (["2.21.5-1+cuda12.4", "2.18.3"], (2, 18)),  # torch's older NCCL decides
        ([None, "2.20.5"], (2, 20)),
        ([None, None], None),
    ],
)
def test_the_oldest_nccl_known_to_run_decides(versions, release):
    assert deciding_release(versions) == release


def test_nccl_769_table_pins_the_ipv4_gid_on_2_18_and_is_left_to_nccl_on_2_21():
    """The index that worked in nccl#769 (3, not the link-local v2 at 1) is the one pinned for
    2.18 and the one NCCL 2.21 picks itself from the settings written."""
    node = ports(parse_ibv_devinfo(NCCL_769.read_text(), "mlx5_bond_0"))
    old = derive("198.18.0.11", settings(), INTERFACES, node, release=NCCL_2_18)
    new = derive("198.18.0.11", settings(), INTERFACES, node, release=NCCL_2_21)
    unknown = derive("198.18.0.11", settings(), INTERFACES, node, release=None)
    assert (old.problems, new.problems, unknown.problems) == ([], [], [])
    assert gid_env(old) == gid_env(unknown) == {"NCCL_IB_GID_INDEX": "3"}
    assert gid_env(new) == {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}
    assert nccl_pick(node[0]["gids"], AF_INET)["index"] == 3
    assert (old.gid_index, new.gid_index) == (3, None)  # only 2.18's index is held cluster-wide


def test_centos12_rails_named_by_the_spec_get_index_3_on_2_18_and_nccls_choice_on_2_21():
    """The 19-GID table: IB port mlx5_5 (one v1 GID), RoCE mlx5_2/mlx5_3 with the IPv4 v2 GID
    at 3, mlx5_7 up with link-local GIDs only."""
    named = settings("=mlx5_2:1,mlx5_3:1")
    old = derive("198.18.0.11", named, INTERFACES, centos12(), release=NCCL_2_18)
    new = derive("198.18.0.11", named, INTERFACES, centos12(), release=NCCL_2_21)
    assert (old.problems, new.problems) == ([], [])
    assert gid_env(old) == {"NCCL_IB_GID_INDEX": "3"}
    assert gid_env(new) == {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET"}
    # mlx5_7 (up, link-local GIDs only) among the rails: refused on both, named.
    with_7 = settings("=mlx5_2:1,mlx5_7:1")
    assert derive("198.18.0.11", with_7, INTERFACES, centos12(), release=NCCL_2_18).problems == [
        "mlx5_7:1 is RoCE but has no RoCE v2 GID with an IPv4 address"
    ]
    assert derive("198.18.0.11", with_7, INTERFACES, centos12(), release=NCCL_2_21).problems == [
        "RoCE ports have no address family of routable RoCE v2 GIDs in common (families with a "
        "non-link-local v2 GID: mlx5_2:1=AF_INET, mlx5_7:1=none)"
    ]


def test_the_spec_address_range_narrows_nccls_choice_and_a_range_no_gid_fits_is_named():
    inside = settings("=mlx5_2:1", NCCL_IB_ADDR_RANGE="172.17.0.0/16")
    outside = settings("=mlx5_2:1", NCCL_IB_ADDR_RANGE="10.0.0.0/8")
    ok = derive("198.18.0.11", inside, INTERFACES, centos12(), release=NCCL_2_21)
    assert ok.problems == [] and ok.env["NCCL_IB_ADDR_RANGE"] == "172.17.0.0/16"
    assert ok.env["NCCL_IB_ADDR_FAMILY"] == "AF_INET"
    assert derive("198.18.0.11", outside, INTERFACES, centos12(), release=NCCL_2_21).problems == [
        "RoCE ports have no address family of routable RoCE v2 GIDs inside NCCL_IB_ADDR_RANGE "
        "10.0.0.0/8 in common (families with a non-link-local v2 GID: mlx5_2:1=none)"
    ]


def test_an_ipv6_only_table_is_accepted_on_2_21_and_refused_saying_why_on_2_18():
    table = parse_show_gids(MI355.read_text())
    rails = ports({k: v for k, v in table.items() if k[0] in MI355_RAILS})
    new = derive("198.18.0.11", settings(), INTERFACES, rails, release=NCCL_2_21)
    assert new.problems == []
    assert gid_env(new) == {"NCCL_IB_ROCE_VERSION_NUM": "2", "NCCL_IB_ADDR_FAMILY": "AF_INET6"}
    assert {nccl_pick(p["gids"], "AF_INET6")["index"] for p in rails} == {1}  # the ULA, not fe80
    for release in (NCCL_2_18, None):
        old = derive("198.18.0.11", settings(), INTERFACES, rails, release=release)
        assert "NCCL_IB_GID_INDEX" not in old.env and len(old.problems) == 4
        assert old.problems[0] == (
            "rocep105s0:1 is RoCE with IPv6 RoCE v2 GIDs only: NCCL "
            f"{'2.18' if release else 'unknown'} (not known to be 2.21 or later) uses the GID "
            "index it is given and trainfleet pins only an IPv4 one; pin stack.nccl to 2.21 or "
            "later, where NCCL picks the IPv6 GID itself (NCCL_IB_ADDR_FAMILY=AF_INET6)"
        )


def test_one_address_on_the_bond_and_a_vxlan_pins_the_bonds_own_gid_on_either_nccl():
    """ucx#9484's table: 30.153.10.175 is v2 at 3 (b3.vxlan.30100) and at 5 (bond1, the
    port's own netdev). NCCL 2.21 would take 3 (the lowest index that fits; it never looks at
    the netdev), so 5 is pinned on that node for 2.21 as for 2.18."""
    node = ports(parse_show_gids(VXLAN.read_text()))
    gids = node[0]["gids"]
    assert (nccl_pick(gids, AF_INET)["index"], own_pick(gids, AF_INET)["index"]) == (3, 5)
    old = derive("198.18.0.11", settings(), INTERFACES, node, release=NCCL_2_18)
    new = derive("198.18.0.11", settings(), INTERFACES, node, release=NCCL_2_21)
    assert (old.problems, new.problems) == ([], [])
    assert gid_env(old) == {"NCCL_IB_GID_INDEX": "5"}
    assert gid_env(new) == {
        "NCCL_IB_ROCE_VERSION_NUM": "2",
        "NCCL_IB_ADDR_FAMILY": "AF_INET",
        "NCCL_IB_GID_INDEX": "5",
    }
    assert new.gid_index is None  # the node's own pin: other nodes need not agree


def roce_node(address: str, ib_ports: list) -> dict:
    network = plain_network(address)
    network["ib_ports"] = ib_ports
    return network


def test_a_node_whose_rails_use_another_address_family_is_named_by_the_majority(tmp_path):
    mi355 = parse_show_gids(MI355.read_text())
    ipv6 = ports({k: v for k, v in mi355.items() if k[0] in MI355_RAILS})
    ipv4 = ports(parse_ibv_devinfo(NCCL_769.read_text(), "mlx5_bond_0"))
    networks = {
        "gpu-a01": roce_node("198.18.0.11", ipv4),
        "gpu-a02": roce_node("198.18.0.12", ipv4),
        "gpu-a03": roce_node("198.18.0.13", ipv6),
    }
    _, plan = three_node_plan(tmp_path, networks)  # SPEC pins NCCL 2.21.5-1
    assert plan.nodes["gpu-a03"].nccl_env.problems == [
        "NCCL_IB_ADDR_FAMILY is AF_INET6 here but AF_INET on most nodes"
    ]
    assert [plan.nodes[n].nccl_env.problems for n in ("gpu-a01", "gpu-a02")] == [[], []]
    # Two against two families: every node named, a tie.
    networks["gpu-a02"] = roce_node("198.18.0.12", ipv6)
    networks.pop("gpu-a03")
    networks["gpu-a03"] = plain_network("198.18.0.13")  # no RoCE: not counted
    _, tied = three_node_plan(tmp_path / "tie", networks)
    assert tied.nodes["gpu-a01"].nccl_env.problems == [
        "nodes split evenly on NCCL_IB_ADDR_FAMILY ('AF_INET' on 1, 'AF_INET6' on 1): AF_INET here"
    ]
    assert tied.nodes["gpu-a03"].nccl_env.problems == []


def drift(before: list, after: list, spec: dict[str, Any], release) -> dict[str, tuple]:
    """nccl_env's drift properties of a node deployed from ``before``'s table whose table is
    now ``after``: {property: (expected, observed)} where they differ."""
    node = Node("gpu-a01", "198.18.0.11", 0, 8, {}, spec)

    def plan(table: list) -> NodePlan:
        derived = derive(node.address, spec, INTERFACES, table, release=release)
        return NodePlan(node, Parts({"nccl_env": nccl_env.nccl_part(derived)}))

    deployed = nccl_env.converged(plan(before))  # what the deploy left, from the old table
    replanned = plan(after)  # drift plans from what the node has now
    fp = {**deployed, "network": {"interfaces": INTERFACES, "ib_ports": after}}
    expected, seen = nccl_env.expect(replanned), nccl_env.observe(fp, replanned, None)
    return {p: (v, seen.get(p)) for p, v in expected.items() if seen.get(p) != v}


def test_drift_names_the_gid_that_moved_from_the_pinned_index():
    """The faulty variant: centos12's mlx5_2 IPv4 v2 GID moved from index 3 to 4 (one row's
    index changed), as nccl#1333's did after 12 hours."""
    moved = centos12(one_line_changed(CENTOS12, MLX5_2_V2, MLX5_2_V2_MOVED))
    one_rail = settings("=mlx5_2:1")
    found = drift(centos12(), moved, one_rail, NCCL_2_18)
    assert found["NCCL GID index"] == (
        "4: RoCE v2 AF_INET",
        "3: mlx5_2:1 has no GID 3 (AF_INET v2 at 4)",
    )
    assert "NCCL_IB_GID_INDEX=3" in found["NCCL env (non-login ssh)"][1]
    # Two rails whose GIDs now sit at 3 and 4: the plan cannot pin one index, and says so.
    two_rails = settings("=mlx5_2:1,mlx5_3:1")
    found = drift(centos12(), moved, two_rails, NCCL_2_18)
    assert found == {
        "NCCL env plan": ("ok", "RoCE ports disagree on the RoCE v2 GID index ([3, 4])")
    }
    # NCCL 2.21 follows the GID itself: nothing pinned, nothing drifted.
    assert drift(centos12(), moved, two_rails, NCCL_2_21) == {}


def test_what_a_pinned_index_holds_is_read_not_assumed():
    env = {"NCCL_IB_HCA": "=mlx5_2:1", "NCCL_IB_GID_INDEX": "1"}
    assert pinned_gid_reading(env, centos12()) == (
        "1: mlx5_2:1 holds RoCE_v2 fe80:0000:0000:0000:0ac0:ebff:feda:e2ca (AF_INET v2 at 3)"
    )
    assert pinned_gid_reading({**env, "NCCL_IB_GID_INDEX": "3"}, centos12()) == "3: RoCE v2 AF_INET"
    assert pinned_gid_reading({**env, "NCCL_IB_GID_INDEX": "3"}, None) == (
        "3: the node's GID tables were not read"
    )
    assert pinned_gid_reading({"NCCL_IB_HCA": "=mlx5_9:1", "NCCL_IB_GID_INDEX": "3"}, []) == (
        "3: no RoCE port of NCCL_IB_HCA =mlx5_9:1 on the node"
    )
    assert pinned_gid_reading({}, centos12()) == "not pinned"


def test_the_spec_family_and_range_pass_the_grammar_and_steer_nccls_choice():
    """`nccl.env` takes NCCL_IB_ADDR_FAMILY and an IPv6 NCCL_IB_ADDR_RANGE as given; they
    narrow the family derived, and a node whose rails have no GID of them is named."""
    env = '{NCCL_IB_ADDR_RANGE: "fd93:16d3:59b6::/48", NCCL_IB_ADDR_FAMILY: AF_INET6}'
    node = parse_cluster(SPEC + f"nccl: {{env: {env}}}\n").nodes[0]
    mi355 = parse_show_gids(MI355.read_text())
    ipv6 = ports({k: v for k, v in mi355.items() if k[0] in MI355_RAILS})
    ipv4 = ports(parse_ibv_devinfo(NCCL_769.read_text(), "mlx5_bond_0"))
    ok = derive(node.address, node.nccl, INTERFACES, ipv6, release=NCCL_2_21)
    assert ok.problems == []
    assert (ok.env["NCCL_IB_ADDR_FAMILY"], ok.env["NCCL_IB_ADDR_RANGE"]) == (
        "AF_INET6",
        "fd93:16d3:59b6::/48",
    )
    assert derive(node.address, node.nccl, INTERFACES, ipv4, release=NCCL_2_21).problems == [
        "RoCE ports have no address family of routable RoCE v2 GIDs inside NCCL_IB_ADDR_RANGE "
        "fd93:16d3:59b6::/48 in common with NCCL_IB_ADDR_FAMILY AF_INET6 (families with a "
        "non-link-local v2 GID: mlx5_bond_0:1=none)"
    ]
