"""Node sets in the spec (#42): `gpu[001-200]` expands to one node per name, its addresses a
matching range or counted up, other keys every node's, a later entry overriding one node; every
refusal names the entry's line before any host is touched."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from trainfleet import SpecError
from trainfleet.node_sets import MAX_NODES, count_up, expand, fold, size_problem
from trainfleet.spec import parse_cluster


def cluster(nodes: str):
    return parse_cluster("cluster: {name: big}\nnodes:\n" + textwrap.dedent(nodes), "big.yaml")


def problems(nodes: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        cluster(nodes)
    return caught.value.problems


def test_a_zero_padded_range_expands_in_order_with_a_matching_address_range():
    c = cluster("""\
        - name: gpu[001-200]
          address: 192.0.2.[1-200]
          gpus: 8
        """)
    assert [n.name for n in c.nodes[:3]] == ["gpu001", "gpu002", "gpu003"]
    assert (c.nodes[-1].name, c.nodes[-1].address) == ("gpu200", "192.0.2.200")
    assert len(c.nodes) == 200 and c.total_gpus == 1600
    assert [n.rank for n in c.nodes[:2]] == [0, 1] and c.master.name == "gpu001"


def test_several_ranges_in_one_name_expand_to_their_product_and_a_first_address_counts_up():
    c = cluster("""\
        - name: rack[1-2]-gpu[01-16]
          address: 192.0.2.10
        """)
    names = [n.name for n in c.nodes]
    assert len(names) == 32 and names[:2] == ["rack1-gpu01", "rack1-gpu02"]
    assert names[16] == "rack2-gpu01"
    assert [n.address for n in c.nodes[:2]] == ["192.0.2.10", "192.0.2.11"]
    assert c.nodes[-1].address == "192.0.2.41"


def test_a_later_entry_overrides_one_node_of_a_set_and_keeps_its_place():
    c = cluster("""\
        - name: gpu[01-04]
          address: 192.0.2.[11-14]
          gpus: 8
          nccl: {env: {NCCL_IB_HCA: "=mlx5_0:1"}}
        - name: gpu03
          gpus: 4
          nccl: {socket_ifname: eth1}
        - name: cpu01
          address: 192.0.2.50
          gpus: 0
        """)
    assert [n.name for n in c.nodes] == ["gpu01", "gpu02", "gpu03", "gpu04", "cpu01"]
    odd = c.nodes[2]
    assert (odd.gpus, odd.address) == (4, "192.0.2.13")
    assert [n.gpus for n in c.nodes] == [8, 8, 4, 8, 0]
    # a section is overridden key by key: the set's env stays, the entry's interface joins it
    assert odd.nccl["env"] == {"NCCL_IB_HCA": "=mlx5_0:1"}
    assert odd.nccl["socket_ifname"] == "eth1"
    assert c.nodes[1].nccl["socket_ifname"] == "auto"  # the cluster's, as before


@pytest.mark.parametrize(
    ("nodes", "wanted"),
    [
        (
            "- {name: 'gpu[01-03]', address: '192.0.2.[1-2]'}\n",
            "big.yaml:3: nodes[0].address: 2 addresses (192.0.2.[1-2]) for 3 names (gpu[01-03])",
        ),
        (
            "- {name: 'gpu[001-200]', address: 192.0.2.100}\n",
            "nodes[0].address: 200 addresses counted up from 192.0.2.100 leave its subnet "
            "192.0.2.0/24",
        ),
        (
            "- {name: 'gpu[1-3]', address: 192.0.2.1}\n- {name: 'gpu[3-4]', address: 192.0.2.9}\n",
            "big.yaml:4: nodes[1].name: node set 'gpu[3-4]' gives 'gpu3' again (also nodes[0])",
        ),
        (
            "- {name: gpu2, address: 192.0.2.50}\n- {name: 'gpu[1-3]', address: 192.0.2.1}\n",
            "nodes[1].name: node set 'gpu[1-3]' gives 'gpu2' again (also nodes[0])",
        ),
        (
            "- {name: 'gpu[1-3]', address: 192.0.2.1}\n- {name: gpu2, gpus: 4}\n"
            "- {name: gpu2, gpus: 2}\n",
            "nodes[2].name: duplicate name 'gpu2' (also nodes[1])",
        ),
        ("- {name: 'gpu[1-', address: 192.0.2.1}\n", "nodes[0].name: not a node set"),
        ("- {name: 'gpu[1-3],cpu1', address: 192.0.2.1}\n", "nodes[0].name: not a node set"),
        ("- {name: '@gpu[1-3]', address: 192.0.2.1}\n", "nodes[0].name: not a node set"),
        ("- {name: 'gpu[9-1]', address: 192.0.2.1}\n", "nodes[0].name: range 9-1 runs backwards"),
        (
            "- {name: 'gpu[1-3]', address: gpu.example}\n",
            "nodes[0].address: 'gpu.example' is neither an address range nor an IP address",
        ),
        (
            "- {name: 'gpu[1-3]', address: '192.0.2.[254-256]'}\n",
            "nodes[0].address: '192.0.2.256' is not an IPv4 or IPv6 address",
        ),
    ],
)
def test_a_bad_node_set_is_refused_at_its_line(nodes, wanted):
    found = problems(nodes)
    assert any(wanted in p for p in found), found


def test_a_node_set_too_large_is_refused_before_it_is_expanded():
    # ClusterShell builds every name at once: gpu[1-999999999] would take the controller's
    # memory. The size is read from the text; the test runs under a 1 GiB address-space limit.
    script = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from trainfleet import SpecError\n"
        "from trainfleet.spec import parse_cluster\n"
        "try:\n"
        "    parse_cluster(\"nodes:\\n- {name: 'gpu[1-999999999]', address: 192.0.2.1}\\n"
        "- {name: 'r[1-100]-g[1-100]', address: 192.0.2.1}\\n\")\n"
        "except SpecError as exc:\n"
        "    print('\\n'.join(exc.problems))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.count(f"expands to more than {MAX_NODES} names") == 2, out


def test_a_problem_shared_by_every_node_of_a_set_is_said_once():
    found = problems("- {name: 'gpu[001-200]', address: '192.0.2.[1-200]', gpus: many}\n")
    assert len([p for p in found if "gpus" in p]) == 1, found


def test_each_bad_name_of_a_set_is_named():
    found = problems("- {name: 'gpu-[1-2]-', address: 192.0.2.1}\n")
    assert sum("nodes[0].name" in p for p in found) == 2, found
    assert any("'gpu-1-'" in p for p in found) and any("'gpu-2-'" in p for p in found)


def test_the_pattern_grammar_and_the_helpers():
    assert size_problem("gpu[001-016,020]") is None
    assert expand("gpu[001-003,010]") == ["gpu001", "gpu002", "gpu003", "gpu010"]
    assert count_up("2001:db8::fe", 3) == ["2001:db8::fe", "2001:db8::ff", "2001:db8::100"]
    assert fold(["gpu017", "gpu131"] + [f"gpu{i:03d}" for i in range(1, 17)]) == (
        "gpu[001-017,131]"
    )
    with pytest.raises(ValueError, match="broadcast|leave its subnet"):
        count_up("192.0.2.250", 6)


def test_check_prints_the_node_count_and_the_folded_sets(tmp_path):
    spec = tmp_path / "big.yaml"
    spec.write_text(
        "nodes:\n- {name: 'gpu[001-200]', address: '192.0.2.[1-200]', gpus: 8}\n"
        "- {name: 'cpu[1-2]', address: 198.51.100.1, gpus: 0}\n"
    )
    out = subprocess.run(
        [sys.executable, "-m", "trainfleet", "check", str(spec)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert out == f"{spec}: ok: 202 nodes (cpu[1-2],gpu[001-200]), 1600 GPUs, master gpu001\n"


def test_a_200_node_spec_written_as_two_ranges_validates():
    c = cluster("""\
        - name: gpu[001-100]
          address: 192.0.2.[1-100]
          gpus: 8
        - name: gpu[101-200]
          address: 192.0.2.101
          gpus: 8
        """)
    assert len(c.nodes) == 200 and c.total_gpus == 1600
    assert (c.nodes[100].name, c.nodes[100].address) == ("gpu101", "192.0.2.101")
    assert (c.nodes[-1].name, c.nodes[-1].address, c.nodes[-1].rank) == (
        "gpu200",
        "192.0.2.200",
        199,
    )
