"""The spec is validated before any host is touched: one clear line per problem."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from trainfleet import SpecError, parse_spec
from trainfleet.driver_pins import MIN_DRIVER_FOR_CUDA, version_key
from trainfleet.grammar import Key, Section, type_name
from trainfleet.schema import NODE, SPEC
from trainfleet.spec import dotted, load_cluster, parse_cluster

REPO = Path(__file__).resolve().parents[2]

GOOD = """\
cluster:
  domain: cluster.example.com
nodes:
  - name: gpu-a01
    address: 192.0.2.11
    gpus: 8
  - name: gpu-a02
    address: 192.0.2.12
    gpus: 8
"""


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_spec(textwrap.dedent(text), "bad.yml")
    return info.value.problems


def test_a_good_spec_gets_every_default():
    spec = parse_spec(GOOD, "inventories/prod.yml")
    assert spec["cluster"]["name"] == "prod"
    assert spec["cluster"]["mesh_users"] == ["root"]
    assert spec["cluster"]["master_port"] == 29500
    assert spec["ssh"] == {
        "user": "root",
        "become": None,
        "port": 22,
        "key": None,
        "known_hosts": None,
        "mesh": "certificates",
        "certificate_days": 365,
    }
    assert spec["gpu"]["memlock"] == "unlimited" and spec["preflight"]["min_busbw_gbps"] is None
    assert spec["preflight"]["min_busbw_fraction"] == 0.33
    assert spec["nccl"]["socket_ifname"] == "auto"
    assert spec["stack"]["cuda"] is None


def test_the_example_prod_spec_is_valid():
    cluster = load_cluster(REPO / "inventories/prod.yml")
    assert [n.name for n in cluster.nodes] == ["gpu-a01", "gpu-a02"]
    assert cluster.total_gpus == 16
    assert all(n.address.startswith("192.0.2.") for n in cluster.nodes)  # documentation range


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "nodes: []\n",
            "bad.yml:1: nodes: is empty: the spec needs at least one node; accepts: a list of "
            "nodes, each a mapping of name, address, gpus, npus, ssh, nccl (name and address "
            "required)",
        ),
        ("cluster: {}\n", "bad.yml:1: (top level): missing required key 'nodes'"),
        ("nodes:\n", "bad.yml:1: nodes: no nodes"),
        ("nodes: gpu-a01\n", "nodes: must be a list of nodes, got string"),
        (
            "- 1\n- 2\n",
            "bad.yml:1: (top level): the spec must be a mapping with a 'nodes' list, got list; "
            "accepts: a mapping of cluster, ssh, stack, nccl, openmpi, gpu, preflight, manage, "
            "nodes",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n  - name: a\n    address: 192.0.2.2\n",
            "bad.yml:4: nodes[1].name: duplicate name 'a' (also nodes[0])",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n  - name: A\n    address: 192.0.2.2\n",
            "nodes[1].name: duplicate name 'A'",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n  - name: b\n    address: 192.0.2.1\n",
            "bad.yml:5: nodes[1].address: duplicate address '192.0.2.1' (also nodes[0])",
        ),
        (
            "nodes:\n  - name: gpu_01\n    address: 192.0.2.1\n",
            "nodes[0].name: 'gpu_01' is not a valid hostname",
        ),
        (
            "nodes:\n  - name: -gpu\n    address: 192.0.2.1\n",
            "nodes[0].name: '-gpu' is not a valid hostname",
        ),
        ("nodes:\n  - name: " + "a" * 64 + "\n    address: 192.0.2.1\n", "is not a valid hostname"),
        (
            "nodes:\n  - name: gpu.example.com\n    address: 192.0.2.1\n",
            "must be a short name without dots",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.300\n",
            "nodes[0].address: '192.0.2.300' is not an IPv4 or IPv6 address",
        ),
        (
            "nodes:\n  - name: a\n",
            "bad.yml:2: nodes[0]: missing required key 'address'; address accepts: IPv4 or IPv6, "
            "canonical form, no scope id",
        ),
        ("nodes:\n  - address: 192.0.2.1\n", "nodes[0]: missing required key 'name'"),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n    gpus: -1\n",
            "bad.yml:4: nodes[0].gpus: must be 0 or more, got -1",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n    gpus: eight\n",
            "nodes[0].gpus: must be an integer, got string 'eight'; accepts: 0 or more",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n    gpus: true\n",
            "nodes[0].gpus: must be an integer, got boolean True; accepts: 0 or more",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n    gpu: 8\n",
            "bad.yml:4: nodes[0].gpu: unknown key; did you mean 'gpus'? nodes[0] accepts: a "
            "mapping of name, address, gpus, npus, ssh, nccl",
        ),
        (
            "clustr: {}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "bad.yml:1: clustr: unknown key; did you mean 'cluster'?",
        ),
        (
            "cluster:\n  domian: x.org\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "cluster.domian: unknown key; did you mean 'domain'?",
        ),
        (
            "cluster:\n  domain: bad_domain.org\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "cluster.domain: 'bad_domain.org' is not a valid hostname",
        ),
        (
            "cluster:\n  master_port: 70000\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "cluster.master_port: 70000 is not a TCP port",
        ),
        (
            "cluster:\n  mesh_users: root\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "cluster.mesh_users: must be a list, got string",
        ),
        (
            "cluster:\n  mesh_users: [root, 3]\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "cluster.mesh_users: every item must be a string, got 3; accepts: user names "
            "`[a-z_][a-z0-9_-]{0,31}`, each once",
        ),
        (
            "stack:\n  cuda: 12\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.cuda: must be a string or null, got integer 12",
        ),
        (
            "stack:\n  cuda: '12.x'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "bad.yml:2: stack.cuda: '12.x' is not a valid version (expected the form '12.4'); "
            "accepts: `12.4`, `12.4.1`",
        ),
        (
            "stack:\n  torch: 'latest'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.torch: 'latest' is not a valid version",
        ),
        (
            "stack:\n  nccl: '2.21'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.nccl: '2.21' is not a valid version (expected the form '2.21.5-1')",
        ),
        (
            "stack:\n  torch_cuda: 'cuda124'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.torch_cuda: 'cuda124' is not a valid version",
        ),
        (
            "stack:\n  python: {deepspeed: 0.19}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.python.deepspeed: 0.19 is not an exact version",
        ),
        (
            "stack:\n  python: {deepspeed: '>=0.19'}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.python.deepspeed: '>=0.19' is not an exact version",
        ),
        (
            "stack:\n  python: {'deepspeed; rm -rf /': '1.0'}\nnodes:\n  - {name: a, address: "
            "192.0.2.1}\n",
            "is not a Python package name",
        ),
        (
            "stack:\n  python: {colossalai: {version: '0.5.0', deps: no-thanks}}\nnodes:\n  - "
            "{name: a, address: 192.0.2.1}\n",
            "deps must be true or false, got 'no-thanks'",
        ),
        (
            "stack:\n  python: {colossalai: {deps: false}}\nnodes:\n  - {name: a, address: "
            "192.0.2.1}\n",
            "must be a version or {version: V, deps: false}",
        ),
        (
            "stack:\n  python: {Torch: '2.4.1'}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "torch is pinned by stack.torch",
        ),
        (
            "stack:\n  openmpi: '4.1.4'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.openmpi: '4.1.4' is not a valid version (expected the form '4.1.4-3+b1')",
        ),
        (
            "stack:\n  openmpi: '4.1.4-3 ; reboot'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.openmpi: '4.1.4-3 ; reboot' is not a valid version",
        ),
        (
            "stack:\n  gcc: '11.2'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "stack.gcc: '11.2' is not a valid version",
        ),
        (
            "nccl:\n  ib: maybe\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "bad.yml:2: nccl.ib: 'maybe' must be 'auto' or 'disable'; accepts: `auto` or `disable`",
        ),
        (
            "nccl:\n  env: {FOO: 1}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "bad.yml:2: nccl.env.FOO: 'FOO' is not an NCCL_",
        ),
        (
            "nccl:\n  socket_ifname: 'eth0 eth1'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "nccl.socket_ifname: 'eth0 eth1' is not 'auto'",
        ),
        (
            "openmpi:\n  tcp_include: 10.0.0.0/33\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "openmpi.tcp_include: '10.0.0.0/33' is not a subnet in CIDR form",
        ),
        (
            "openmpi:\n  tcp_include: 'eth0 eth1'\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "openmpi.tcp_include: 'eth0 eth1' is not an interface name or a subnet",
        ),
        (
            "openmpi:\n  params: {btl_tcp_if_include: eth1}\nnodes:\n  - {name: a, address: "
            "192.0.2.1}\n",
            "bad.yml:2: openmpi.params.btl_tcp_if_include: btl_tcp_if_include is set by "
            "openmpi.tcp_include",
        ),
        (
            "openmpi:\n  params: {PML: ucx}\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "bad.yml:2: openmpi.params.PML: 'PML' is not an MCA parameter name",
        ),
        (
            "ssh:\n  port: 0\nnodes:\n  - {name: a, address: 192.0.2.1}\n",
            "ssh.port: 0 is not a TCP port",
        ),
        (
            "nodes:\n  - name: a\n    address: 192.0.2.1\n    ssh: {prot: 22}\n",
            "nodes[0].ssh.prot: unknown key; did you mean 'port'?",
        ),
        ("nodes: [\n", "not valid YAML"),
    ],
)
def test_a_bad_spec_is_rejected_with_file_line_and_key(text, expected):
    found = problems(text)
    assert any(expected in p for p in found), found
    # Each names the file and a line, then the key (the test's name says so; not the file alone).
    assert all(re.match(r"bad\.yml:[0-9]+: [^ ].*?: ", p) for p in found), found


def test_every_problem_is_reported_at_once():
    found = problems("""\
        clustr: {}
        nodes:
          - name: a
            address: nowhere
            gpus: -2
          - name: a
            address: 192.0.2.5
        """)
    assert len(found) == 4, found
    assert [p.split(": ")[1] for p in found] == [
        "clustr",
        "nodes[0].address",
        "nodes[0].gpus",
        "nodes[1].name",
    ]


def test_per_node_overrides_apply_only_to_that_node():
    cluster = parse_cluster(
        textwrap.dedent("""\
        ssh: {key: /keys/admin, port: 2222}
        nccl: {socket_ifname: '=ens1'}
        nodes:
          - {name: a, address: 192.0.2.1, ssh: {port: 22}, nccl: {socket_ifname: '=ens9'}}
          - {name: b, address: 192.0.2.2}
        """)
    )
    a, b = cluster.nodes
    assert a.ssh == {
        "user": "root",
        "become": None,
        "port": 22,
        "key": "/keys/admin",
        "known_hosts": None,
    }
    assert b.ssh["port"] == 2222
    assert a.nccl["socket_ifname"] == "=ens9" and b.nccl["socket_ifname"] == "=ens1"
    assert a.nccl["ib"] == "auto"


def test_ranks_master_and_names_derive_from_order():
    cluster = parse_cluster(GOOD)
    assert [n.rank for n in cluster.nodes] == [0, 1]
    assert cluster.master.name == "gpu-a01"
    assert cluster.hosts_entries()[1] == ("192.0.2.12", ["gpu-a02.cluster.example.com", "gpu-a02"])
    assert cluster.address_of_name()["gpu-a02.cluster.example.com"] == "192.0.2.12"
    assert [p.name for p in cluster.peers("gpu-a01")] == ["gpu-a02"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainfleet", *args], capture_output=True, text=True, cwd=REPO
    )


def test_check_command_exits_2_with_one_line_per_problem(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text(
        "nodes:\n  - {name: a, address: 192.0.2.1, gpus: -1}\n  - {name: a, address: 192.0.2.1}\n"
    )
    result = run_cli("check", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 3, lines
    assert all(line.startswith(f"{bad}:") for line in lines)


def test_check_command_accepts_the_example_and_prints_json():
    result = run_cli("check", "--json", "inventories/prod.yml")
    assert result.returncode == 0, result.stderr
    assert '"master": "gpu-a01"' in result.stdout


@pytest.mark.parametrize(
    "text, expected",
    [
        (
            "stack: {torch: '2.4.1', torch_cuda: cu124, wheelhouse: /srv/wh, torch_index: 'https://m/whl'}\n",
            "stack.torch_index: give stack.wheelhouse or stack.torch_index, not both",
        ),
        ("stack: {nccl: '2.21.5-1'}\n", "stack.nccl: pinning nccl needs stack.cuda"),
        ("stack: {torch: '2.4.1'}\n", "stack.torch: pinning torch needs stack.torch_cuda"),
        (
            "stack: {python: {deepspeed: '0.19.8'}}\n",
            "stack.python: pinning python packages needs stack.torch",
        ),
        (
            "stack: {torch: '2.4.1', torch_cuda: cpu, python: {Deep_Speed: '0.19.8', deep-speed: "
            "'0.19.7'}}\n",
            "stack.python.deep-speed: 'deep-speed' is the same package as 'Deep_Speed'",
        ),
        (
            "stack: {wheelhouse: wh}\n",
            "stack.wheelhouse: 'wh' must be an absolute path on the nodes",
        ),
        (
            "ssh: {user: ubuntu}\n",
            "ssh.user: 'ubuntu' is not root: trainfleet writes /etc as root, so set ssh.become: "
            "sudo",
        ),
        ("ssh: {user: ubuntu, become: doas}\n", "ssh.become: 'doas' must be 'sudo'"),
        (
            "stack: {cuda: '12.4', driver: '470.82.01'}\n",
            "stack.driver: driver 470.82.01 is older than CUDA 12.4 needs (525.60.13 or newer)",
        ),
        (
            "stack: {cuda: '13.0', driver: '575'}\n",
            "stack.driver: driver 575 is older than CUDA 13.0 needs (580.65.06 or newer)",
        ),
        ("stack: {driver: '55'}\n", "stack.driver: '55' is not a valid version"),
        (
            "stack: {torch: '2.4.1', torch_cuda: cu124, driver: '470'}\n",
            "stack.driver: driver 470 is older than CUDA 12.4 needs (525.60.13 or newer) "
            "(torch_cuda: cu124)",
        ),
        ("gpu: {memlock: 8}\n", "gpu.memlock: 8 must be 'unlimited' or KiB (64 or more)"),
        (
            "gpu: {memlock: 'unlimited; reboot'}\n",
            "gpu.memlock: 'unlimited; reboot' must be 'unlimited' or KiB",
        ),
        ("gpu: {fabric_manager: yes}\n", "gpu.fabric_manager: must be a string"),
        (
            "preflight: {min_busbw_gbps: true}\n",
            "preflight.min_busbw_gbps: must be an integer or number or null, got boolean True; "
            "accepts: a number above 0",
        ),
        ("preflight: {min_busbw_gbps: 0}\n", "preflight.min_busbw_gbps: must be more than 0"),
        (
            "preflight: {min_busbw_fraction: 0}\n",
            "preflight.min_busbw_fraction: must be above 0 and at most 1, got 0",
        ),
        (
            "preflight: {min_busbw_fraction: 1.5}\n",
            "preflight.min_busbw_fraction: must be above 0 and at most 1, got 1.5",
        ),
        (
            "preflight: {min_busbw_fraction: null}\n",
            "preflight.min_busbw_fraction: must be an integer or number, got null",
        ),
        (
            "preflight: {healthy_multiple_of: 0}\n",
            "preflight.healthy_multiple_of: must be more than 0",
        ),
        (
            "preflight: {healthy_multiple_of: true}\n",
            "preflight.healthy_multiple_of: must be an integer or null, got boolean True",
        ),
        (
            "preflight: {healthy_multiple_of: 2.5}\n",
            "preflight.healthy_multiple_of: must be an integer or null, got number 2.5",
        ),
    ],
)
def test_rules_between_keys_are_checked_before_any_host(text, expected):
    found = problems(text + "nodes:\n  - {name: a, address: 192.0.2.1}\n")
    assert any(expected in p for p in found), found


def test_full_package_versions_are_valid_pins():
    spec = parse_spec(
        "stack: {cuda: '12.4', nccl: '2.21.5-1+cuda12.4', cudnn: '9.1.0.70-1'}\n"
        "nodes:\n  - {name: a, address: 192.0.2.1}\n"
    )
    assert spec["stack"]["nccl"] == "2.21.5-1+cuda12.4"


def test_a_sudo_login_is_accepted_cluster_wide_or_per_node():
    spec = parse_spec(
        "ssh: {user: admin, become: sudo}\nnodes:\n  - {name: a, address: 192.0.2.1}\n"
        "  - {name: b, address: 192.0.2.2, ssh: {user: root, become: null}}\n"
    )
    assert spec["ssh"]["become"] == "sudo"
    found = problems("nodes:\n  - {name: a, address: 192.0.2.1, ssh: {user: ops}}\n")
    assert any("nodes[0].ssh.user: 'ops' is not root" in p for p in found), found


ONE_NODE = "nodes: [{name: a, address: 192.0.2.1}]\n"


def test_a_pin_its_grammar_refuses_is_reported_once_at_its_key():
    # Not again by the rule between the driver and CUDA pins (which read 'x' as a version).
    assert problems(f"stack: {{cuda: 'x', driver: '550'}}\n{ONE_NODE}") == [
        "bad.yml:1: stack.cuda: 'x' is not a valid version (expected the form '12.4'); "
        "accepts: `12.4`, `12.4.1`"
    ]
    assert problems(f"stack: {{cuda: '12.4', driver: '55'}}\n{ONE_NODE}") == [
        "bad.yml:1: stack.driver: '55' is not a valid version (expected the form '550.54.15'); "
        "accepts: `550`, `550.54.15`"
    ]


@pytest.mark.parametrize(
    "driver, cuda",
    [
        ("525.60.13", "12.4"),
        ("535", "12.8"),
        ("550.54.15", "12.4"),
        ("580.65.06", "13.0"),
        ("450.80.02", "11.8"),
    ],
)
def test_a_driver_at_or_above_what_cuda_needs_is_accepted(driver, cuda):
    def stack(driver: str) -> str:
        return f"stack: {{cuda: '{cuda}', driver: '{driver}'}}\n{ONE_NODE}"

    # The case is what it claims: at or above the minimum (a branch judged by its branch).
    needed = MIN_DRIVER_FOR_CUDA[int(cuda.split(".")[0])]
    have = version_key(driver)
    assert have >= version_key(needed)[: len(have) if len(have) == 1 else None]
    spec = parse_spec(stack(driver))
    assert (spec["stack"]["driver"], spec["stack"]["cuda"]) == (driver, cuda)
    # Accepted at the boundary, not for want of a check: the release and the branch just below
    # the minimum are refused, naming both versions.
    *head, last = needed.split(".")
    for below in (".".join([*head, str(int(last) - 1)]), str(int(head[0]) - 1)):
        assert problems(stack(below)) == [
            f"bad.yml:1: stack.driver: driver {below} is older than CUDA {cuda} needs "
            f"({needed} or newer)"
        ]


# -- every refusal names what the key accepts: the reference's own words (Key.accepts) --------


def _every_entry() -> list[tuple[tuple[str | int, ...], Key | Section]]:
    """Every key and section of the spec (a node's under nodes[0]), with its path."""

    def walk(section: Section, path: tuple[str | int, ...]):
        for name, key in section.keys.items():
            yield (*path, name), key
            if isinstance(key, Section):
                yield from walk(key, (*path, name))

    return [*walk(SPEC, ()), *walk(NODE, ("nodes", 0))]


EVERY_KEY = [(p, k) for p, k in _every_entry() if isinstance(k, Key)]
EVERY_SECTION = [(p, k) for p, k in _every_entry() if isinstance(k, Section)]


def _with(path: tuple[str | int, ...], value: object) -> str:
    """A valid spec that meets the rules between keys (a sudo login, the pins other pins need)
    with ``value`` at ``path``: YAML that reads back as written (yaml.safe_dump quotes)."""
    spec: dict = {
        "ssh": {"become": "sudo"},
        "stack": {"cuda": "12.4", "torch": "2.4.1", "torch_cuda": "cu124"},
        "nodes": [{"name": "a", "address": "192.0.2.1"}, {"name": "b", "address": "192.0.2.2"}],
    }
    here = spec
    for part in path[:-1]:
        here = here.setdefault(part, {}) if isinstance(part, str) else here[part]
    here[path[-1]] = value
    return yaml.safe_dump(spec, sort_keys=False)


def _wrong_type(key: Key) -> object:
    types = key.type if isinstance(key.type, tuple) else (key.type,)
    return next(v for v in ([1], "x") if type(v) not in types)


def _off_grammar(key: Key) -> object:
    """A value of the key's type its grammar refuses: a control character in any string."""
    types = key.type if isinstance(key.type, tuple) else (key.type,)
    if str in types:
        return "x\x07"
    if int in types:
        return -1
    return ["x\x07"] if list in types else {"x\x07": "1"}


def _refused(path: tuple[str | int, ...], value: object) -> list[str]:
    found = problems(_with(path, value))
    assert all(re.match(r"bad\.yml:[0-9]+: ", p) and len(p.splitlines()) == 1 for p in found)
    # Without the FILE:LINE prefix.
    return [p.split(": ", 1)[1] for p in found if p.split(": ")[1].startswith(dotted(path))]


@pytest.mark.parametrize("path, key", EVERY_KEY, ids=[dotted(p) for p, _ in EVERY_KEY])
def test_a_value_of_the_wrong_type_is_refused_naming_what_the_key_accepts(path, key):
    value = _wrong_type(key)
    wanted = type_name(key.type)
    assert _refused(path, value) == [
        f"{dotted(path)}: must be {'an' if wanted[0] in 'aeiou' else 'a'} {wanted}, got "
        f"{type_name(type(value))} {value!r}; accepts: {key.accepts}"
    ]


@pytest.mark.parametrize("path, section", EVERY_SECTION, ids=[dotted(p) for p, _ in EVERY_SECTION])
def test_a_section_that_is_no_mapping_is_refused_naming_its_keys(path, section):
    assert _refused(path, "x") == [
        f"{dotted(path)}: must be a mapping, got string 'x'; accepts: a mapping of "
        + ", ".join(section.keys)
    ]


@pytest.mark.parametrize(
    "path, key",
    [(p, k) for p, k in EVERY_KEY if k.check or k.each or k.each_key],
    ids=[dotted(p) for p, k in EVERY_KEY if k.check or k.each or k.each_key],
)
def test_a_value_its_grammar_refuses_names_what_the_key_accepts(path, key):
    found = _refused(path, _off_grammar(key))
    assert len(found) == 1, found
    assert found[0].endswith(f"; accepts: {key.accepts}"), found


# -- YAML 1.1 booleans: `ib: on` is True to PyYAML; say so, and what the key accepts -----------

QUOTE = (
    "(YAML reads on, off, yes, no, true and false unquoted as booleans: quote such a word where "
)


@pytest.mark.parametrize("word", ["on", "On", "ON", "off", "yes", "NO", "true", "False"])
def test_a_yaml_boolean_for_nccl_ib_says_it_wants_auto_or_disable_and_quotes(word):
    value = word.lower() in ("on", "yes", "true")
    assert problems(f"nccl:\n  ib: {word}\n{ONE_NODE}") == [
        f"bad.yml:2: nccl.ib: must be a string, got boolean {value} {QUOTE}a string is meant, "
        f"but {word!r} is not accepted either); accepts: `auto` or `disable`"
    ]


def test_a_quoted_on_for_nccl_ib_is_no_answer_either_the_accepted_values_are():
    assert problems(f'nccl:\n  ib: "on"\n{ONE_NODE}') == [
        "bad.yml:2: nccl.ib: 'on' must be 'auto' or 'disable'; accepts: `auto` or `disable`"
    ]
    # The same per node.
    assert problems("nodes: [{name: a, address: 192.0.2.1, nccl: {ib: off}}]\n") == [
        f"bad.yml:1: nodes[0].nccl.ib: must be a string, got boolean False {QUOTE}a string is "
        "meant, but 'off' is not accepted either); accepts: `auto` or `disable`"
    ]


@pytest.mark.parametrize(
    "text, expected, quoted",
    [
        (
            "gpu:\n  fabric_manager: off\n",
            "bad.yml:2: gpu.fabric_manager: must be a string, got boolean False "
            f'{QUOTE}a string is meant: "off"); accepts: `auto`, `off`',
            "gpu:\n  fabric_manager: 'off'\n",
        ),
        (  # `Off` quoted would be refused: the word the key takes is suggested
            "gpu:\n  peermem: Off\n",
            "bad.yml:2: gpu.peermem: must be a string, got boolean False "
            f'{QUOTE}a string is meant: "off"); accepts: `auto`, `on`, `off`',
            "gpu:\n  peermem: 'off'\n",
        ),
        (
            "cluster:\n  mesh_users: [root, yes]\n",
            "bad.yml:2: cluster.mesh_users: every item must be a string, got True "
            f'{QUOTE}a string is meant: "yes"); accepts: user names `[a-z_][a-z0-9_-]{{0,31}}`, '
            "each once",
            "cluster:\n  mesh_users: [root, 'yes']\n",
        ),
        (
            "nccl:\n  env: {NCCL_IB_DISABLE: no}\n",
            "bad.yml:2: nccl.env.NCCL_IB_DISABLE: value must be a string or integer, got bool "
            f'{QUOTE}a string is meant: "no"); accepts: names '
            "`(NCCL|GLOO|TORCH|CUDA|UCX)_[A-Z0-9_]+`; values integers or "
            "`[A-Za-z0-9_.,:=^/%+@ -]*`, no leading/trailing space, no marker text",
            "nccl:\n  env: {NCCL_IB_DISABLE: 'no'}\n",
        ),
        (
            "stack:\n  cuda: yes\n",
            "bad.yml:2: stack.cuda: must be a string or null, got boolean True "
            f"{QUOTE}a string is meant, but 'yes' is not accepted either); accepts: `12.4`, "
            "`12.4.1`",
            None,
        ),
    ],
)
def test_a_yaml_boolean_where_a_string_is_wanted_says_what_to_write(text, expected, quoted):
    assert problems(text + ONE_NODE) == [expected]
    if quoted:  # the word suggested, quoted, is accepted
        parse_spec(quoted + ONE_NODE)


def test_a_yaml_boolean_where_no_string_is_accepted_gets_no_quoting_advice():
    assert problems("nodes: [{name: a, address: 192.0.2.1, gpus: yes}]\n") == [
        "bad.yml:1: nodes[0].gpus: must be an integer, got boolean True; accepts: 0 or more"
    ]
