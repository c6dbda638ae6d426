"""Hostile specs: every value is checked by its grammar before any host, and quoted where it lands.

Each case is a spec file that `python -m trainfleet check` must refuse with
``FILE:LINE: KEY: ...`` naming the key that carries the hostile value, on one line.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from trainfleet import SpecError
from trainfleet.grammar import Key, Section
from trainfleet.render import (
    UnsafeValue,
    pam_env_quote,
    render,
    shell_quote,
    ssh_config_word,
    yaml_scalar,
)
from trainfleet.schema import NODE, SPEC
from trainfleet.spec import load_cluster, load_spec, parse_cluster

REPO = Path(__file__).resolve().parents[2]

NODES = "nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n"


def node(name: str = "gpu-a01", address: str = "192.0.2.11") -> str:
    """A one-node spec whose name is on line 2 and address on line 3 (YAML double-quoted)."""
    return f'nodes:\n  - name: "{name}"\n    address: "{address}"\n'


def section(top: str, key: str, value: str) -> str:
    """``top:`` on line 1, ``key: "value"`` on line 2, then a valid node."""
    return f'{top}:\n  {key}: "{value}"\n' + NODES


def mapping(top: str, key: str, name: str, value: str) -> str:
    """``top.key.name: "value"`` with ``name`` on line 3, then a valid node."""
    return f'{top}:\n  {key}:\n    "{name}": "{value}"\n' + NODES


# (id, spec text, line, key, a fragment of the message)
HOSTILE = [
    # -- addresses: they land in ~/.ssh/config, /etc/hosts and launcher command lines
    (
        "scope id carrying ProxyCommand",
        node(address=r"fe80::1%eth0\nProxyCommand sh -c id"),
        3,
        "nodes[0].address",
        "control or line-separator character U+000A",
    ),
    ("scope id", node(address="fe80::1%eth0"), 3, "nodes[0].address", "has a scope id"),
    (
        "command substitution in an address",
        node(address="192.0.2.11$(touch /tmp/pwned)"),
        3,
        "nodes[0].address",
        "is not an IPv4 or IPv6 address",
    ),
    (
        "backticks in an address",
        node(address="192.0.2.11`id`"),
        3,
        "nodes[0].address",
        "is not an IPv4 or IPv6",
    ),
    (
        "trailing newline on an address",
        node(address=r"192.0.2.11\n"),
        3,
        "nodes[0].address",
        "U+000A",
    ),
    (
        "space in an address",
        node(address="192.0.2.11 -oProxyCommand=id"),
        3,
        "nodes[0].address",
        "not an IPv4",
    ),
    (
        "upper-case IPv6",
        node(address="2001:DB8::1"),
        3,
        "nodes[0].address",
        "write it as '2001:db8::1'",
    ),
    (
        "uncompressed IPv6",
        node(address="2001:db8:0:0:0:0:0:1"),
        3,
        "nodes[0].address",
        "canonical form",
    ),
    # -- node names: hostnames, /etc/hosts, hostfiles, ssh_config Host lines
    (
        "name with a trailing newline beside the same name",
        'nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n  - {name: "gpu-a01\\n", address: '
        "192.0.2.12}\n",
        3,
        "nodes[1].name",
        "U+000A",
    ),
    (
        "name with a Kelvin sign (matches [a-z] under IGNORECASE)",
        node(name="gpu-\u212a1"),
        2,
        "nodes[0].name",
        "not a valid hostname",
    ),
    ("name with a long s", node(name="gpu-\u017f1"), 2, "nodes[0].name", "not a valid hostname"),
    ("name with a space", node(name="gpu a01"), 2, "nodes[0].name", "not a valid hostname"),
    ("name with a carriage return", node(name=r"gpu-a01\rHost *"), 2, "nodes[0].name", "U+000D"),
    ("name with U+2028", node(name="gpu-a01\u2028x"), 2, "nodes[0].name", "U+2028"),
    (
        "name that is an option",
        node(name="-oProxyCommand"),
        2,
        "nodes[0].name",
        "not a valid hostname",
    ),
    (
        "domain with a newline",
        section("cluster", "domain", r"example.com\nHost *"),
        2,
        "cluster.domain",
        "U+000A",
    ),
    # -- nccl.env: /etc/environment, nccl.conf, profile.d, .deepspeed_env
    (
        "env value with a newline and LD_PRELOAD",
        mapping("nccl", "env", "NCCL_DEBUG", r"WARN\nLD_PRELOAD=/tmp/evil.so"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+000A",
    ),
    (
        "env value holding the END marker",
        mapping("nccl", "env", "NCCL_DEBUG", "# END trainfleet managed block: nccl environment"),
        3,
        "nccl.env.NCCL_DEBUG",
        "marker text",
    ),
    (
        "env value holding the marker text without '#'",
        mapping("nccl", "env", "NCCL_DEBUG", "x Trainfleet Managed Block"),
        3,
        "nccl.env.NCCL_DEBUG",
        "marker text",
    ),
    (
        "env value with a carriage return",
        mapping("nccl", "env", "NCCL_DEBUG", r"WARN\rNCCL_P2P_DISABLE=1"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+000D",
    ),
    (
        "env value with U+2028",
        mapping("nccl", "env", "NCCL_DEBUG", "WARN\u2028LD_PRELOAD=x"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+2028",
    ),
    (
        "env value with U+2029",
        mapping("nccl", "env", "NCCL_DEBUG", "WARN\u2029x"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+2029",
    ),
    (
        "env value with NEL U+0085",
        mapping("nccl", "env", "NCCL_DEBUG", r"WARN\Nx"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+0085",
    ),
    (
        "env value with NUL",
        mapping("nccl", "env", "NCCL_DEBUG", r"WARN\0x"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+0000",
    ),
    (
        "env value with a bidi override",
        mapping("nccl", "env", "NCCL_DEBUG", "WARN\u202ex"),
        3,
        "nccl.env.NCCL_DEBUG",
        "U+202E",
    ),
    (
        "env value with a command substitution",
        mapping("nccl", "env", "NCCL_DEBUG", "$(id)"),
        3,
        "nccl.env.NCCL_DEBUG",
        "may contain only",
    ),
    (
        "env value with a double quote",
        mapping("nccl", "env", "NCCL_DEBUG", 'a\\" b'),
        3,
        "nccl.env.NCCL_DEBUG",
        "may contain only",
    ),
    (
        "env value ending in a backslash (pam_env joins the next line)",
        mapping("nccl", "env", "NCCL_DEBUG", "WARN\\\\"),
        3,
        "nccl.env.NCCL_DEBUG",
        "may contain only",
    ),
    (
        "env value with '#' (pam_env cuts there)",
        mapping("nccl", "env", "NCCL_DEBUG", "WARN#x"),
        3,
        "nccl.env.NCCL_DEBUG",
        "may contain only",
    ),
    (
        "env value with a leading space",
        mapping("nccl", "env", "NCCL_DEBUG", " WARN"),
        3,
        "nccl.env.NCCL_DEBUG",
        "space",
    ),
    (
        "env name carrying a newline",
        mapping("nccl", "env", r"NCCL_X\nLD_PRELOAD", "1"),
        3,
        r"nccl.env['NCCL_X\nLD_PRELOAD']",
        "is not an NCCL_",
    ),
    (
        "env name outside the allowed prefixes",
        mapping("nccl", "env", "LD_PRELOAD", "/tmp/evil.so"),
        3,
        "nccl.env.LD_PRELOAD",
        "is not an NCCL_",
    ),
    (
        "per-node env value with a newline",
        "nodes:\n  - name: gpu-a01\n    address: 192.0.2.11\n    nccl:\n      env: {NCCL_DEBUG: "
        '"WARN\\nX=1"}\n',
        5,
        "nodes[0].nccl.env.NCCL_DEBUG",
        "U+000A",
    ),
    (
        "socket_ifname with a newline",
        section("nccl", "socket_ifname", r"=eth0\nLD_PRELOAD=x"),
        2,
        "nccl.socket_ifname",
        "is not 'auto' or an interface name list",
    ),
    (
        "socket_ifname with a repeated prefix",
        section("nccl", "socket_ifname", "^=^eth0"),
        2,
        "nccl.socket_ifname",
        "is not 'auto'",
    ),
    # -- openmpi: mca-params.conf and the mpirun line
    (
        "MCA value with a carriage return",
        mapping("openmpi", "params", "pml", r"ucx\rbtl_tcp_if_include = eth9"),
        3,
        "openmpi.params.pml",
        "U+000D",
    ),
    (
        "MCA value with U+2028",
        mapping("openmpi", "params", "pml", "ucx\u2028btl_tcp_if_include = eth9"),
        3,
        "openmpi.params.pml",
        "U+2028",
    ),
    (
        "MCA value with a newline",
        mapping("openmpi", "params", "pml", r"ucx\noob_tcp_if_include = eth9"),
        3,
        "openmpi.params.pml",
        "U+000A",
    ),
    (
        "MCA name with a newline",
        mapping("openmpi", "params", r"pml\nbtl", "ucx"),
        3,
        r"openmpi.params['pml\nbtl']",
        "is not an MCA parameter name",
    ),
    (
        "tcp_include with a newline",
        section("openmpi", "tcp_include", r"198.18.0.0/24\n"),
        2,
        "openmpi.tcp_include",
        "is not a subnet",
    ),
    (
        "tcp_include with a shell separator",
        section("openmpi", "tcp_include", "eth0;id"),
        2,
        "openmpi.tcp_include",
        "is not an interface name",
    ),
    # -- stack: package sources and paths on the nodes
    (
        "cuda_repo adding [trusted=yes]",
        section("stack", "cuda_repo", "[trusted=yes] https://mirror.example.com/cuda"),
        2,
        "stack.cuda_repo",
        "must be an https:// URL",
    ),
    (
        "cuda_repo with [trusted=yes] after a space",
        section("stack", "cuda_repo", "https://mirror.example.com/cuda [trusted=yes]"),
        2,
        "stack.cuda_repo",
        "may contain only",
    ),
    (
        "cuda_repo over plain http",
        section("stack", "cuda_repo", "http://mirror.example.com/cuda"),
        2,
        "stack.cuda_repo",
        "is plain http",
    ),
    (
        "cuda_repo with credentials",
        section("stack", "cuda_repo", "https://user:secret@mirror.example.com/cuda"),
        2,
        "stack.cuda_repo",
        "may contain only",
    ),
    (
        "cuda_repo with a newline",
        section("stack", "cuda_repo", r"https://m.example.com/cuda\ndeb http://evil/ /"),
        2,
        "stack.cuda_repo",
        "U+000A",
    ),
    (
        "cuda_repo file:// outside itself",
        section("stack", "cuda_repo", "file:///srv/../etc"),
        2,
        "stack.cuda_repo",
        "absolute path on the nodes",
    ),
    (
        "cuda_repo over ftp",
        section("stack", "cuda_repo", "ftp://mirror.example.com/cuda"),
        2,
        "stack.cuda_repo",
        "https://",
    ),
    (
        "cuda_repo with a bad host",
        section("stack", "cuda_repo", "https://-evil/cuda"),
        2,
        "stack.cuda_repo",
        "valid host",
    ),
    (
        "torch_index over plain http",
        section("stack", "torch_index", "http://mirror.example.com/whl"),
        2,
        "stack.torch_index",
        "is plain http",
    ),
    (
        "torch_index with pip options",
        section("stack", "torch_index", "https://m.example.com/whl --trusted-host m"),
        2,
        "stack.torch_index",
        "may contain only",
    ),
    (
        "torch_index as file:// (cuda_repo only)",
        section("stack", "torch_index", "file:///srv/whl"),
        2,
        "stack.torch_index",
        "https://",
    ),
    (
        "keyring fingerprint in lower case",
        section("stack", "cuda_keyring_fingerprint", "eb693b3035cd5710e231e123a4b469963bf863cc"),
        2,
        "stack.cuda_keyring_fingerprint",
        "not an OpenPGP v4 fingerprint",
    ),
    (
        "wheelhouse with '..'",
        section("stack", "wheelhouse", "/srv/../etc"),
        2,
        "stack.wheelhouse",
        "must not contain '..'",
    ),
    (
        "wheelhouse with a shell command",
        section("stack", "wheelhouse", "/srv/wh; rm -rf /"),
        2,
        "stack.wheelhouse",
        "may contain only",
    ),
    (
        "relative wheelhouse",
        section("stack", "wheelhouse", "wheels"),
        2,
        "stack.wheelhouse",
        "absolute path",
    ),
    (
        "version in other digits",
        section("stack", "cuda", "\u0661\u0662.\u0664"),
        2,
        "stack.cuda",
        "not a valid version",
    ),
    (
        "version with a trailing newline",
        section("stack", "gcc", r"11\n"),
        2,
        "stack.gcc",
        "not a valid version",
    ),
    # -- cluster name: a directory of the controller's key store
    (
        "cluster name climbing out of the key store",
        section("cluster", "name", "../../etc"),
        2,
        "cluster.name",
        "not a valid cluster name",
    ),
    (
        "cluster name with a slash",
        section("cluster", "name", "prod/.."),
        2,
        "cluster.name",
        "not a valid cluster name",
    ),
    (
        "hidden cluster name",
        section("cluster", "name", ".ssh"),
        2,
        "cluster.name",
        "not a valid cluster name",
    ),
    (
        "cluster name with a newline",
        section("cluster", "name", r"prod\nx"),
        2,
        "cluster.name",
        "not a valid cluster name",
    ),
    # -- users: paths of home directories, ssh_config User lines
    (
        "mesh user carrying ProxyCommand",
        'cluster:\n  mesh_users: ["root\\nProxyCommand id"]\n' + NODES,
        2,
        "cluster.mesh_users[0]",
        "not a valid user name",
    ),
    (
        "mesh user climbing out of /home",
        "cluster:\n  mesh_users:\n    - root\n    - ../../tmp\n" + NODES,
        4,
        "cluster.mesh_users[1]",
        "not a valid user name",
    ),
    (
        "mesh user that is an option",
        "cluster:\n  mesh_users: [-oProxyCommand=id]\n" + NODES,
        2,
        "cluster.mesh_users[0]",
        "not a valid user name",
    ),
    (
        "machine-account mesh user",
        "cluster:\n  mesh_users: [host$]\n" + NODES,
        2,
        "cluster.mesh_users[0]",
        "not a valid user name",
    ),
    (
        "mesh user twice",
        "cluster:\n  mesh_users:\n    - root\n    - root\n" + NODES,
        4,
        "cluster.mesh_users[1]",
        "duplicate mesh user 'root'",
    ),
    (
        "ssh user carrying an option",
        section("ssh", "user", "root -oProxyCommand=id"),
        2,
        "ssh.user",
        "not a valid user name",
    ),
    (
        "ssh key with a newline",
        section("ssh", "key", r"~/.ssh/id\nProxyCommand id"),
        2,
        "ssh.key",
        "U+000A",
    ),
    (
        "known_hosts with a NUL",
        section("ssh", "known_hosts", r"/etc/ssh/kh\0"),
        2,
        "ssh.known_hosts",
        "U+0000",
    ),
    # -- YAML itself
    (
        "repeated key (the loader keeps the last silently)",
        "nodes:\n  - name: gpu-a01\n    name: gpu-a02\n    address: 192.0.2.11\n",
        3,
        "nodes[0].name",
        "repeated key (also line 2)",
    ),
    (
        "unknown key carrying a newline",
        'nodes:\n  - name: gpu-a01\n    address: 192.0.2.11\n    "gpus\\nx": 1\n',
        4,
        r"nodes[0]['gpus\nx']",
        "unknown key",
    ),
]


def write(tmp_path: Path, text: str, name: str = "hostile.yml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refusals(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


@pytest.mark.parametrize(
    "text, line, key, fragment", [case[1:] for case in HOSTILE], ids=[case[0] for case in HOSTILE]
)
def test_a_hostile_value_is_refused_naming_file_line_and_key(tmp_path, text, line, key, fragment):
    path = write(tmp_path, text)
    found = refusals(path)
    prefix = f"{path}:{line}: {key}: "
    assert any(p.startswith(prefix) and fragment in p for p in found), found
    # A problem is one line: nothing a hostile value carries reaches the report raw.
    assert all(len(p.splitlines()) == 1 for p in found), found


def test_check_exits_2_with_one_line_per_problem_before_any_host(tmp_path):
    path = write(
        tmp_path,
        node(address=r"fe80::1%eth0\nProxyCommand sh -c id")
        + 'cluster:\n  name: "../x"\n  mesh_users: ["a\\u2028b"]\n',
    )
    result = subprocess.run(
        [sys.executable, "-m", "trainfleet", "check", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert [line.split(": ")[1] for line in lines] == [
        "cluster.name",
        "cluster.mesh_users[0]",
        "nodes[0].address",
    ], lines
    assert all(line.startswith(f"{path}:") for line in lines)
    assert "ProxyCommand" not in result.stdout


def test_a_cluster_name_from_a_hostile_file_name_is_refused(tmp_path):
    path = write(tmp_path, NODES, name="prod cluster.yml")
    found = refusals(path)
    assert found == [
        f"{path}:1: cluster.name: not set, and the spec file's name is no cluster name: "
        "'prod cluster' is not a valid cluster name (1-64 letters, digits and '._-', "
        "starting with a letter or digit); accepts: `[A-Za-z0-9][A-Za-z0-9._-]{0,63}`"
    ]


def test_nested_aliases_are_walked_once(tmp_path):
    # 2**40 paths if every alias were walked again: must finish at once, refused.
    levels = ["a0: &a0 [x, x]"] + [f"a{i}: &a{i} [*a{i - 1}, *a{i - 1}]" for i in range(1, 41)]
    path = write(
        tmp_path,
        "x:\n"
        + "".join(f"  {level}\n" for level in levels)
        + "cluster:\n  mesh_users: *a40\n"
        + NODES,
    )
    start = time.monotonic()
    found = refusals(path)
    assert time.monotonic() - start < 2
    assert any(p.startswith(f"{path}:1: x: unknown key") for p in found), found
    assert any(
        p.startswith(f"{path}:44: cluster.mesh_users: every item must be a string") for p in found
    ), found


# -- accepted: the lab's spec, the example and every grammar's ordinary values -----------------


def lab_spec() -> str:
    """The spec `python -m lab up` writes (lab/netns.py: _write_spec)."""
    return yaml.safe_dump(
        {
            "cluster": {"name": "lab", "domain": "lab.trainfleet.test", "mesh_users": ["root"]},
            "ssh": {
                "user": "root",
                "port": 22,
                "key": "/root/.cache/trainfleet-lab/id_ed25519",
                "known_hosts": "/root/.cache/trainfleet-lab/known_hosts",
            },
            "nodes": [
                {"name": f"node{i}", "address": f"198.18.0.{10 + i}", "gpus": 0} for i in (1, 2, 3)
            ],
        },
        sort_keys=False,
    )


ORDINARY = """\
cluster: {name: gpu-a.prod_2, domain: cluster.example.com,
          mesh_users: [root, alice, _svc, build-bot]}
ssh: {key: ~/.ssh/id_ed25519, known_hosts: ~/My Keys/known_hosts}
stack:
  cuda: "12.4"
  nccl: "2.21.5-1+cuda12.4"
  cuda_repo: http://198.18.0.1:8080/nvidia/cuda/repos
  torch: "2.4.1"
  torch_cuda: cu124
  torch_index: http://mirror.example.com/whl/cu124
  insecure: true
  cuda_keyring_fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC
nccl:
  socket_ifname: ^=docker0,lo
  env: {NCCL_DEBUG: WARN, NCCL_IB_HCA: "=mlx5_0:1,mlx5_1:1", NCCL_DEBUG_FILE: /tmp/nccl.%h.%p,
        NCCL_PROTO: ^LL128, TORCH_CUDA_ARCH_LIST: "8.0 9.0", NCCL_NCHANNELS_PER_NET_PEER: 4}
openmpi: {tcp_include: "eth0,198.18.0.0/24",
          params: {pml: ucx, btl: "self,vader,tcp", btl_openib_warn_no_device_params_found: 0}}
nodes:
  - {name: gpu-a01, address: "2001:db8::11", gpus: 8}
  - {name: GPU-A02, address: 192.0.2.12, gpus: 8, nccl: {socket_ifname: =ens1f0}}
"""


@pytest.mark.parametrize("source", ["inventories/prod.yml", "lab", "ordinary"])
def test_ordinary_specs_are_accepted(tmp_path, source):
    if source == "inventories/prod.yml":
        path = REPO / source
    else:
        path = write(tmp_path, lab_spec() if source == "lab" else ORDINARY, f"{source}.yml")
    cluster = load_cluster(path)
    assert cluster.nodes and cluster.name in ("prod", "lab", "gpu-a.prod_2")


def test_a_file_mirror_and_https_need_no_insecure(tmp_path):
    path = write(
        tmp_path,
        "stack: {cuda_repo: 'file:///srv/nvidia-mirror', torch_index: 'https://m.example.com:8443/whl'}\n"
        + NODES,
    )
    assert load_spec(path)["stack"]["insecure"] is False


def _keys(section: Section):
    for key in section.keys.values():
        if isinstance(key, Section):
            yield from _keys(key)
        else:
            yield key


def test_every_key_has_a_grammar():
    for key in [*_keys(SPEC), *_keys(NODE)]:
        assert isinstance(key, Key)
        types = key.type if isinstance(key.type, tuple) else (key.type,)
        if str in types:
            assert key.check is not None, key.doc
        if list in types:
            assert key.each is not None, key.doc
        if dict in types:
            assert key.each is not None and key.each_key is not None, key.doc
        assert key.accepts, key.doc  # documented in the reference


# -- where values land: quoted for the format, never a new line ----------------------------


def test_shell_quote_gives_back_the_value_as_one_word():
    hostile = 'a b\'c$(id)`id`;"x"'
    assert shlex.split(f"cmd {shell_quote(hostile)}") == ["cmd", hostile]
    assert (
        shell_quote("eth0") == "eth0"
        and shell_quote("198.18.0.11") == "198.18.0.11"
        and shell_quote(8) == "8"
    )


def test_mpirun_line_passes_each_value_as_one_argument():
    cluster = parse_cluster(NODES)
    text = render(
        "launchers/mpirun.sh.j2",
        cluster=cluster,
        node=cluster.master,
        launch_dir="/etc/trainfleet/launch",
        venv="/opt/venv",
        mca={"pml": "ucx x'$(id)"},
        forward=["NCCL_DEBUG"],
    )
    exec_line = next(line for line in text.splitlines() if line.startswith("exec "))
    argv = shlex.split(exec_line)
    assert argv[argv.index("--mca") + 2] == "ucx x'$(id)"
    assert argv[argv.index("-x") + 1] == "NCCL_DEBUG"


def test_torchrun_line_with_ipv6_and_a_quoted_venv():
    cluster = parse_cluster(
        "nodes:\n  - {name: a, address: '2001:db8::1', gpus: 2}\n  - {name: b, address: "
        "'2001:db8::2'}\n"
    )
    text = render(
        "launchers/torchrun.sh.j2",
        cluster=cluster,
        node=cluster.nodes[1],
        launch_dir="/l",
        venv="/opt/my venv",
    )
    argv = shlex.split(" ".join(text.split("\\\n")).splitlines()[-1])
    assert argv[:2] == ["exec", "/opt/my venv/bin/torchrun"]
    assert "--master-addr=2001:db8::1" in argv and "--node-rank=1" in argv


def test_no_template_value_may_start_a_new_line():
    for value in ("a\nb", "a\rb", "a\u2028b", "a\x85b", "a\x00b"):
        with pytest.raises(UnsafeValue):
            render("hosts/hosts_block.j2", entries=[("192.0.2.1", [value])])
        with pytest.raises(UnsafeValue):
            render("nccl_env/nccl.conf.j2", env={"NCCL_DEBUG": value})


def test_ssh_config_refuses_what_it_cannot_hold():
    for value in ("a b", "%h", 'a"b', "a#b", "a=b", "a\\b", ""):
        with pytest.raises(UnsafeValue):
            ssh_config_word(value)
    cluster = parse_cluster(NODES)
    assert render(
        "ssh_mesh/ssh_config.j2", nodes=cluster.nodes, user="root", key_name="id_trainfleet"
    ).splitlines()[:2] == ["Host gpu-a01", "    HostName 192.0.2.11"]


def test_pam_env_quote_refuses_what_pam_env_would_change():
    assert pam_env_quote("8.0 9.0") == '"8.0 9.0"' and pam_env_quote("WARN") == "WARN"
    for value in ('a"b', "a'b", "a#b", "a\\"):
        with pytest.raises(UnsafeValue):
            pam_env_quote(value)


@pytest.mark.parametrize(
    "value", ["198.18.0.11", "2001:db8::1", "1:2:3:4:5:6:7:8", "yes", "a: b", "a #b", "*x", "null"]
)
def test_yaml_scalar_reads_back_as_the_same_string(value):
    assert yaml.safe_load(f"k: {yaml_scalar(value)}\n") == {"k": value}


def test_accelerate_config_keeps_an_ipv6_master_a_string():
    # YAML 1.1 reads 1:2:3:4:5:6:7:8 as a base-60 integer when written plain.
    cluster = parse_cluster("nodes:\n  - {name: a, address: '1:2:3:4:5:6:7:8'}\n")
    text = render(
        "launchers/accelerate.yaml.j2", cluster=cluster, node=cluster.master, launch_dir="/l"
    )
    assert yaml.safe_load(text)["main_process_ip"] == "1:2:3:4:5:6:7:8"
