"""OpenMPI's network pinning and the Horovod line, derived from the same facts as NCCL.

The interface data is what NcclNetwork parses from `ip -o addr show` on a lab node (veth
names carry their peer index, `eth0@if12`) and from sysfs trees laid out as real machines'.
The generated mpirun.sh is run for real by sh, with a stand-in `mpirun` that prints the
argv it was given, so the test sees exactly what OpenMPI would be handed.
"""

from __future__ import annotations

import base64
import os
import shlex
import subprocess
from pathlib import Path

import pytest
from pyinfra.api.exceptions import FactProcessError

from facts.nccl_env_facts import NcclNetwork
from facts.openmpi_facts import OpenMpiState
from tests.unit.test_nccl_env import AUTO, ib_ports
from trainfleet.capabilities.launchers import render_launchers
from trainfleet.capabilities.openmpi import cluster_params, mca_params, tcp_include
from trainfleet.nccl import Derived, derive
from trainfleet.render import render_lines
from trainfleet.spec import parse_cluster

# `ip -o addr show` on lab node1 (iproute2 6.1, Debian 12), as the fact's script reads it.
IP_ADDR = (
    "1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
    "2: eno1@if9    inet 198.18.0.139/25 scope global eno1\\       valid_lft forever preferred_lft "
    "forever\n"
    "4: eth0@if12    inet 198.18.0.11/24 brd 198.18.0.255 scope global eth0\\       valid_lft "
    "forever preferred_lft forever\n"
)


def interfaces_from(ip_output: str) -> list:
    lines = []
    for line in ip_output.splitlines():  # what the fact's `while read` loop prints per address
        _idx, name, family, addr, *_ = line.split()
        lines.append(f"addr {name.split('@')[0]} {family} {addr}")
    return NcclNetwork().process(lines)["interfaces"]


def node(interface: str | None, network: str | None) -> Derived:
    return Derived(env={}, interface=interface, network=network)


def test_the_fact_keeps_each_address_with_its_prefix():
    eth0 = next(i for i in interfaces_from(IP_ADDR) if i["name"] == "eth0")
    assert eth0["addresses"] == ["198.18.0.11"] and eth0["cidrs"] == ["198.18.0.11/24"]


def test_ucx_uses_the_cluster_interface_when_there_is_no_rdma():
    derived = derive("198.18.0.11", AUTO, interfaces_from(IP_ADDR), ib_ports("no_rdma"))
    assert derived.env["UCX_NET_DEVICES"] == "eth0"
    assert derived.network == "198.18.0.0/24"  # from eth0's /24, not the decoy's /25


@pytest.mark.parametrize(
    ("tree", "devices"),
    [
        ("ib_two_hcas", "mlx5_0:1,mlx5_1:1"),  # UCX's device:port form, the ports NCCL uses
        ("ib_one_of_two_down", "mlx5_0:1"),
        ("roce_v2_cx6", "mlx5_0:1"),
        ("ib_port_down", "eth0"),  # no active port: TCP over the cluster interface
    ],
)
def test_ucx_uses_the_same_active_rdma_ports_as_nccl(tree, devices):
    derived = derive("198.18.0.11", AUTO, interfaces_from(IP_ADDR), ib_ports(tree))
    assert derived.env["UCX_NET_DEVICES"] == devices


def test_ib_disabled_in_the_spec_leaves_ucx_on_tcp_and_the_spec_can_override_it():
    derived = derive(
        "198.18.0.11", {**AUTO, "ib": "disable"}, interfaces_from(IP_ADDR), ib_ports("ib_two_hcas")
    )
    assert derived.env["UCX_NET_DEVICES"] == "eth0"
    pinned = derive(
        "198.18.0.11",
        {**AUTO, "env": {"UCX_NET_DEVICES": "mlx5_1:1"}},
        interfaces_from(IP_ADDR),
        ib_ports("ib_two_hcas"),
    )
    assert pinned.env["UCX_NET_DEVICES"] == "mlx5_1:1"


def test_the_same_interface_name_everywhere_is_used_by_name():
    derived = {n: node("eth0", "198.18.0.0/24") for n in ("a", "b", "c")}
    assert tcp_include(derived) == ("eth0", None)


def test_differing_names_fall_back_to_the_cluster_subnet():
    derived = {"a": node("eth0", "198.18.0.0/24"), "b": node("ens5", "198.18.0.0/24")}
    assert tcp_include(derived) == ("198.18.0.0/24", None)


def test_a_routed_cluster_lists_every_subnet():
    derived = {
        "a": node("eth0", "10.1.0.0/24"),
        "b": node("ens5", "10.2.0.0/24"),
        "c": node("ens5", "10.1.0.0/24"),
    }
    assert tcp_include(derived) == ("10.1.0.0/24,10.2.0.0/24", None)


def test_an_unknown_subnet_is_a_problem_not_a_guess():
    derived = {"a": node("eth0", "198.18.0.0/24"), "b": node(None, None)}
    value, problem = tcp_include(derived)
    assert (
        value is None and "subnet of b is unknown" in problem and "openmpi.tcp_include" in problem
    )


def test_the_spec_value_wins_and_extra_parameters_follow_the_pinned_ones():
    derived = {"a": node("eth0", "198.18.0.0/24")}
    params, problems = cluster_params(
        derived, {"tcp_include": "10.9.0.0/16", "params": {"pml": "ucx"}}
    )
    assert problems == []
    assert list(params.items()) == [
        ("btl_tcp_if_include", "10.9.0.0/16"),
        ("oob_tcp_if_include", "10.9.0.0/16"),
        ("pml", "ucx"),
    ]


def test_nodes_whose_network_has_problems_do_not_decide():
    derived = {
        "a": node("eth0", "198.18.0.0/24"),
        "b": Derived(problems=["no interface holds the cluster address"]),
    }
    assert cluster_params(derived, {"tcp_include": "auto", "params": {}}) == (
        {"btl_tcp_if_include": "eth0", "oob_tcp_if_include": "eth0"},
        [],
    )


def test_the_parameter_file_block_is_name_equals_value():
    lines = render_lines(
        "openmpi/mca_params.j2", params=mca_params("198.18.0.0/24", {"pml": "ucx"})
    )
    assert lines[0].startswith("# ")
    assert lines[1:] == [
        "btl_tcp_if_include = 198.18.0.0/24",
        "oob_tcp_if_include = 198.18.0.0/24",
        "pml = ucx",
    ]


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _user_line(name: str, params: str | None) -> str:
    """A user's line as the fact's script prints it: uid, group, home, and the part read as the
    user."""
    record = "file params missing -" if params is None else f"file params regular - {_b64(params)}"
    return f"user {name} 0 root {_b64('/root')} {_b64(record + chr(10))}"


# What the fact's script prints on a node with Debian's openmpi-bin 4.1.4 and the mesh user
# root (its file with trainfleet's block above a line of the user's), and a user that is absent.
OPENMPI_OUTPUT = [
    "version mpirun (Open MPI) 4.1.4",
    _user_line(
        "root",
        "# BEGIN trainfleet managed block: openmpi network (do not edit)\n"
        "btl_tcp_if_include = eth0\n"
        "# END trainfleet managed block: openmpi network\n"
        "mpi_show_mca_params = enviro\n",
    ),
    "user ghost nouser",
]


def test_the_openmpi_fact_reads_the_version_and_each_users_block():
    fact = OpenMpiState()
    state = fact.process(OPENMPI_OUTPUT)
    assert state["version"] == "4.1.4"
    root = state["users"]["root"]
    assert (root["exists"], root["home"], root["group"]) == (True, "/root", "root")
    assert root["params"]["block"] == ["btl_tcp_if_include = eth0"]
    assert root["params"]["outside"] == [(4, "mpi_show_mca_params = enviro")]
    assert state["users"]["ghost"]["exists"] is False


def test_no_mpirun_on_the_node_is_reported_as_absent():
    state = OpenMpiState().process(["version ", _user_line("root", None)])
    assert state["version"] is None
    assert state["users"]["root"]["params"]["exists"] is False


def test_a_users_unreadable_part_fails_that_node_instead_of_reading_as_no_file():
    with pytest.raises(FactProcessError):
        OpenMpiState().process(["version ", f"user root 0 root {_b64('/root')} {_b64('garbage')}"])


SPEC = """\
cluster: {name: demo}
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}
  - {name: gpu-a02, address: 192.0.2.12, gpus: 8}
"""


def run_launcher(tmp_path: Path, script: str, fake: str) -> list[str]:
    """Run a generated launcher with a stand-in program (``fake``) that prints its argv."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stand_in = bin_dir / fake
    stand_in.write_text('#!/bin/sh\nfor a in "$@"; do printf "%s\\n" "$a"; done\n')
    stand_in.chmod(0o755)
    path = tmp_path / "launcher.sh"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    result = subprocess.run(
        ["sh", str(path), "python", "train.py"], capture_output=True, text=True, env=env, check=True
    )
    return result.stdout.splitlines()


def test_mpirun_line_pins_the_network_and_forwards_only_uniform_variables(tmp_path):
    cluster = parse_cluster(SPEC)
    files = render_launchers(
        cluster,
        cluster.nodes[0],
        forward={"NCCL_IB_DISABLE": "1"},
        mca=mca_params("198.18.0.0/24", {}),
    )
    argv = run_launcher(tmp_path, files["mpirun.sh"][0], "mpirun")
    root = ["--allow-run-as-root"] if os.geteuid() == 0 else []
    assert argv == [
        "--hostfile",
        "/etc/trainfleet/launch/hostfile",
        "-np",
        "16",
        "--mca",
        "btl_tcp_if_include",
        "198.18.0.0/24",
        "--mca",
        "oob_tcp_if_include",
        "198.18.0.0/24",
        "-x",
        "NCCL_IB_DISABLE",
        *root,
        "python",
        "train.py",
    ]


def test_horovod_line_lists_every_node_with_its_slots(tmp_path):
    cluster = parse_cluster(SPEC)
    same = render_launchers(cluster, cluster.nodes[0], forward={"GLOO_SOCKET_IFNAME": "eth0"})[
        "horovod.sh"
    ][0]
    command = shlex.split(same.splitlines()[-1])
    assert command[:6] == [
        "exec",
        "/opt/trainfleet/venv/bin/horovodrun",
        "-np",
        "16",
        "-H",
        "gpu-a01:8,gpu-a02:8",
    ]
    assert command[6:] == ["--network-interfaces", "eth0", "$@"]
    differing = render_launchers(cluster, cluster.nodes[0], forward={})["horovod.sh"][0]
    assert "--network-interfaces" not in differing.splitlines()[-1]
    assert "names differ" in differing
