"""Values of the right shape that are most likely wrong (#43): `trainfleet check` warns of each,
naming its key and why, `--strict` fails on them as on a bad spec, `--json` carries them, and
the front door prints them before pyinfra runs. A good spec has none."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from checks.pair_ports import hosted_ports
from tests.unit.cli_run import run_cli
from trainfleet import parse_cluster
from trainfleet.driver_pins import MIN_DRIVER_FOR_CUDA, version_key
from trainfleet.releases import CUDA
from trainfleet.spec import load_cluster
from trainfleet.spec_warnings import (
    TOOLKIT_DRIVER,
    UNSUPPORTED_PTX,
    preflight_ports,
    spec_warnings,
)

REPO = Path(__file__).resolve().parents[2]
TWO = "nodes: [{name: a, address: 192.0.2.1, gpus: 8}, {name: b, address: 192.0.2.2, gpus: 8}]\n"


def warned(text: str) -> list[str]:
    cluster = parse_cluster(textwrap.dedent(text), "w.yml")
    return [warning.line("w.yml") for warning in spec_warnings(cluster)]


def stack(values: str, nodes: str = TWO) -> list[str]:
    return warned(f"stack: {values}\n{nodes}")


# --- the driver against the CUDA it runs


def test_every_cuda_release_with_minor_version_compatibility_has_its_toolkit_driver():
    assert [v for v in CUDA if int(v.split(".")[0]) >= 11] == list(TOOLKIT_DRIVER)
    keys = [version_key(d) for d in TOOLKIT_DRIVER.values()]
    assert keys == sorted(keys)  # each toolkit ships a newer driver than the one before
    for cuda, driver in TOOLKIT_DRIVER.items():  # never below the major's floor (refused)
        if cuda == "11.0":  # NVIDIA's exception: 11.x runs on 450.80.02, newer than 11.0's own
            continue
        assert version_key(driver) >= version_key(MIN_DRIVER_FOR_CUDA[int(cuda.split(".")[0])])
    assert TOOLKIT_DRIVER["13.0"] == MIN_DRIVER_FOR_CUDA[13]  # a major's first minor: the same


@pytest.mark.parametrize(
    ("values", "needed", "source"),
    [
        ("{cuda: '12.4', driver: '535.104.05'}", "550.54.14", "stack.cuda: 12.4"),
        ("{cuda: '12.4.1', driver: '535'}", "550.54.14", "stack.cuda: 12.4.1"),
        ("{cuda: '12.8', driver: '570.25.99'}", "570.26", "stack.cuda: 12.8"),
        (
            "{torch: '2.7.1', torch_cuda: cu128, driver: '550.54.15'}",
            "570.26",
            "stack.torch_cuda: cu128",
        ),
        ("{torch: '2.9.0', torch_cuda: cu130, driver: '580'}", None, None),
        ("{cuda: '12.4', driver: '550'}", None, None),  # the branch's newest release
        ("{cuda: '12.4', driver: '550.54.14'}", None, None),
        ("{cuda: '12.2', driver: '535.104.05'}", None, None),
    ],
)
def test_a_driver_older_than_its_cudas_own_is_a_warning_naming_both(values, needed, source):
    found = stack(values)
    if needed is None:
        assert found == []
        return
    (line,) = found
    assert line.startswith("w.yml: warning: stack.driver: driver ")
    assert f"({needed}, NVIDIA's release notes; {source})" in line
    assert "minor version compatibility" in line and UNSUPPORTED_PTX in line


def test_each_cuda_the_driver_is_too_old_for_is_named_once():
    found = stack("{cuda: '12.4', torch: '2.7.1', torch_cuda: cu128, driver: '545.23.08'}")
    assert [("12.4" in w, "12.8" in w) for w in found] == [(True, False), (False, True)]
    same = stack("{cuda: '12.8', torch: '2.7.1', torch_cuda: cu128, driver: '550'}")
    assert len(same) == 1 and "stack.cuda: 12.8" in same[0]


def test_a_driver_pin_on_nodes_without_gpus_is_not_judged():
    cpu = "nodes: [{name: a, address: 192.0.2.1}]\n"
    assert stack("{cuda: '12.4', driver: '535'}", cpu) == []


# --- the torch build


def test_a_torch_label_other_than_its_variant_and_the_cpu_build_on_gpus_are_warnings():
    (label,) = stack("{torch: '2.4.1+cu121', torch_cuda: cu124}")
    assert label == (
        "w.yml: warning: stack.torch: 2.4.1+cu121 is the cu121 build, but stack.torch_cuda is "
        "cu124: its index has no 2.4.1+cu121; pin 2.4.1 (the cu124 build) or torch_cuda: cu121"
    )
    (cpu,) = stack("{torch: '2.4.1', torch_cuda: cpu}")
    assert cpu.startswith("w.yml: warning: stack.torch_cuda: torch's CPU build on nodes with 16")
    (labelled,) = stack("{torch: '2.4.1+cpu'}")
    assert labelled.startswith("w.yml: warning: stack.torch: torch's CPU build")
    assert (
        stack("{torch: '2.4.1', torch_cuda: cpu}", "nodes: [{name: a, address: 192.0.2.1}]") == []
    )
    assert stack("{torch: '2.4.1+cu124', torch_cuda: cu124}") == []
    assert stack("{torch: '2.4.1', torch_cuda: cu124}") == []


# --- addresses


@pytest.mark.parametrize(
    ("addresses", "node", "why"),
    [
        (["192.0.2.1", "2001:db8::2"], "b", "is IPv6: the preflight speaks IPv4"),
        (["fe80::1", "fe80::2"], "a", "is IPv6 link-local: it needs a scope id"),
        (["127.0.0.1", "192.0.2.2"], "a", "is no address another node can reach"),
        (["192.0.2.1", "0.0.0.0"], "b", "is no address another node can reach"),
        (["224.0.0.9", "192.0.2.2"], "a", "is a multicast address"),
        (["192.0.2.1", "169.254.7.1"], "b", "is IPv4 link-local (169.254.0.0/16"),
    ],
)
def test_an_address_the_preflight_cannot_test_or_peers_cannot_reach_is_a_warning(
    addresses, node, why
):
    nodes = ", ".join(
        f"{{name: {n}, address: '{a}'}}" for n, a in zip("ab", addresses, strict=True)
    )
    found = warned(f"nodes: [{nodes}]\n")
    assert found[0].startswith(f"w.yml: warning: nodes[{node}].address: ")
    assert why in found[0]


def test_one_node_on_its_loopback_is_no_warning():
    assert warned("nodes: [{name: a, address: 127.0.0.1}]\n") == []


# --- the master port


def test_a_master_port_on_the_masters_sshd_port_is_a_warning():
    (line,) = warned(f"cluster: {{master_port: 2222}}\nssh: {{port: 2222}}\n{TWO}")
    assert line == (
        "w.yml: warning: cluster.master_port: 2222 is a's sshd port (ssh.port): the rendezvous "
        "cannot listen there"
    )
    other = (
        "nodes: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2, ssh: {port: 2222}}]"
    )
    assert warned(f"cluster: {{master_port: 2222}}\n{other}\n") == []


def test_a_master_port_whose_pair_ports_pass_65535_is_a_warning():
    nodes = "nodes: [{name: 'g[01-16]', address: 192.0.2.1, gpus: 8}]\n"
    (line,) = warned(f"cluster: {{master_port: 65500}}\n{nodes}")
    assert line == (
        "w.yml: warning: cluster.master_port: the preflight's pair jobs take the 128 ports "
        "after 65500, up to 65628, past 65535: pick a lower master_port"
    )
    assert warned(f"cluster: {{master_port: 65407}}\n{nodes}") == []


@pytest.mark.parametrize(
    "nodes",
    [
        "nodes: [{name: a, address: 192.0.2.1, gpus: 8}]",
        "nodes: [{name: a, address: 192.0.2.1}]",
        TWO,
        "nodes: [{name: 'g[1-3]', address: 192.0.2.1, gpus: 4}]",
        "nodes: [{name: 'g[1-5]', address: 192.0.2.1}]\npreflight: {rails: [eth1, eth2]}",
        "nodes: [{name: 'g[1-4]', address: 192.0.2.1, gpus: 1}]",
        "nodes: [{name: 'g[1-9]', address: 192.0.2.1, gpus: 8}]",
    ],
)
def test_the_ports_counted_are_the_preflights_own(nodes):
    cluster = parse_cluster(nodes + "\n")
    ports = [port for hosted in hosted_ports(cluster).values() for port in hosted]
    assert preflight_ports(cluster) == max(ports, default=cluster.master_port) - cluster.master_port


# --- the preflight


def test_a_healthy_multiple_larger_than_the_cluster_is_a_warning():
    (line,) = warned(f"preflight: {{healthy_multiple_of: 4}}\n{TWO}")
    assert line == (
        "w.yml: warning: preflight.healthy_multiple_of: 4 is more than the cluster's 2 nodes: "
        "every healthy subset is cut to none"
    )
    assert warned(f"preflight: {{healthy_multiple_of: 2}}\n{TWO}") == []


# --- the controller's files


@pytest.fixture
def keys(tmp_path: Path) -> Path:
    """A real key pair (ssh-keygen's) and a known_hosts listing 192.0.2.1 by address and b by
    name, hashed as `ssh-keygen -H` writes it."""
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "id"), "-C", "t"],
        check=True,
    )
    public = " ".join((tmp_path / "id.pub").read_text().split()[:2])
    (tmp_path / "known_hosts").write_text(f"192.0.2.1 {public}\nb {public}\n")
    subprocess.run(
        ["ssh-keygen", "-H", "-f", str(tmp_path / "known_hosts")], check=True, capture_output=True
    )
    return tmp_path


def ssh(key: object, known_hosts: object, nodes: str = TWO) -> list[str]:
    return warned(f"ssh: {{key: '{key}', known_hosts: '{known_hosts}'}}\n{nodes}")


def test_a_known_hosts_that_lacks_a_node_names_it_and_says_the_name_is_not_looked_up(keys):
    (line,) = ssh(keys / "id", keys / "known_hosts")
    assert line.startswith(
        f"w.yml: warning: ssh.known_hosts: {keys / 'known_hosts'} lists no host key for "
        "b (192.0.2.2): pyinfra refuses a host it has no key for (Host key verification failed)"
    )
    assert line.endswith("; b listed by name only: pyinfra looks up the address")
    assert "PRIVATE" not in line and (keys / "id").read_text().split("\n")[1] not in line


def test_a_known_hosts_listing_every_node_by_address_and_port_is_no_warning(keys):
    public = " ".join((keys / "id.pub").read_text().split()[:2])
    both = keys / "both"
    both.write_text(f"192.0.2.1 {public}\n[192.0.2.2]:2222 {public}\n")
    nodes = (
        "nodes: [{name: a, address: 192.0.2.1}, {name: b, address: 192.0.2.2, ssh: {port: 2222}}]"
    )
    assert ssh(keys / "id", both, nodes + "\n") == []
    (lacking,) = ssh(keys / "id", both)  # b on port 22: the [addr]:2222 line is not its
    assert "lists no host key for b (192.0.2.2)" in lacking


@pytest.mark.parametrize(
    ("key", "why"),
    [
        ("missing", "does not exist on the controller"),
        (".", "is not a file"),
        ("id.pub", "is a public key: ssh.key names the private key (the file without .pub)"),
        ("known_hosts", "is not a private key (no -----BEGIN ... PRIVATE KEY----- line)"),
    ],
)
def test_an_ssh_key_that_is_missing_or_no_private_key_is_a_warning(keys, key, why):
    (line,) = ssh(keys / key, keys / "known_hosts", "nodes: [{name: a, address: 192.0.2.1}]\n")
    assert line.startswith("w.yml: warning: ssh.key: ") and line.endswith(why)


def test_a_relative_path_a_missing_and_an_unreadable_known_hosts_are_warnings(keys):
    one = "nodes: [{name: a, address: 192.0.2.1}]\n"
    (relative,) = ssh("id", keys / "known_hosts", one)
    assert "ssh.key: id is relative: pyinfra reads it from the folder it runs in" in relative
    (missing,) = ssh(keys / "id", keys / "nowhere", one)
    assert missing.endswith(
        "ssh.known_hosts: " + str(keys / "nowhere") + " does not exist on the controller"
    )
    broken = keys / "broken"
    broken.write_text(
        (keys / "known_hosts").read_text() + "192.0.2.9 ssh-ed25519 AAAA!!notbase64\n"
    )
    (unreadable,) = ssh(keys / "id", broken, one)
    assert (
        f"ssh.known_hosts: {broken} cannot be read: {broken}:3: not a host key line" in unreadable
    )


def test_a_nodes_own_file_is_named_at_its_nodes(keys):
    own = f"{{name: b, address: 192.0.2.2, ssh: {{key: '{keys}/gone'}}}}"
    nodes = f"nodes: [{{name: a, address: 192.0.2.1}}, {own}]\n"
    found = warned(f"ssh: {{key: '{keys / 'id'}'}}\n{nodes}")
    assert found == [
        f"w.yml: warning: nodes[b].ssh.key: {keys}/gone does not exist on the controller"
    ]


def test_the_example_spec_is_warning_free_where_its_files_are_in_place(keys, monkeypatch):
    """inventories/prod.yml names ~/.ssh/id_ed25519 and ~/.ssh/known_hosts: on a controller that
    has them, listing its two nodes, it has no warning; on one without them, it says so."""
    monkeypatch.setenv("HOME", str(keys))
    assert [w.key for w in spec_warnings(load_cluster(REPO / "inventories/prod.yml"))] == [
        "ssh.key",
        "ssh.known_hosts",
    ]
    (keys / ".ssh").mkdir()
    (keys / "id").rename(keys / ".ssh/id_ed25519")
    public = " ".join((keys / "id.pub").read_text().split()[:2])
    (keys / ".ssh/known_hosts").write_text(f"192.0.2.11 {public}\n192.0.2.12 {public}\n")
    assert spec_warnings(load_cluster(REPO / "inventories/prod.yml")) == []


# --- the command line


def run(*argv: str, home: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(sys.executable, "-m", "trainfleet", *argv, env={"HOME": str(home)})


@pytest.fixture
def specs(tmp_path: Path) -> tuple[Path, Path]:
    good = tmp_path / "good.yml"
    good.write_text(TWO)
    warn = tmp_path / "warn.yml"
    warn.write_text(
        f"stack: {{cuda: '12.4', driver: '535'}}\npreflight: {{healthy_multiple_of: 3}}\n{TWO}"
    )
    return good, warn


def test_check_warns_on_stderr_and_passes_and_strict_fails_as_a_bad_spec(specs, tmp_path):
    good, warn = specs
    plain = run("check", str(warn), home=tmp_path)
    assert plain.returncode == 0 and plain.stdout.startswith(f"{warn}: ok: 2 nodes")
    assert [line.split(": ")[:3] for line in plain.stderr.splitlines()] == [
        [str(warn), "warning", "stack.driver"],
        [str(warn), "warning", "preflight.healthy_multiple_of"],
    ]
    strict = run("check", "--strict", str(good), str(warn), home=tmp_path)
    assert (
        strict.returncode == 2
        and strict.stdout == f"{good}: ok: 2 nodes (a,b), 16 GPUs, master a\n"
    )
    assert strict.stderr.endswith(f"{warn}: 2 warning(s), refused under --strict\n")
    assert run("check", "--strict", str(good), home=tmp_path).returncode == 0


def test_check_json_carries_the_warnings_and_strict_turns_ok_false(specs, tmp_path):
    good, warn = specs
    plain = run("check", "--json", str(good), str(warn), home=tmp_path)
    assert plain.returncode == 0 and plain.stderr == ""
    clean, warned_ = map(json.loads, plain.stdout.splitlines())
    assert clean["ok"] is True and clean["warnings"] == []
    assert warned_["ok"] is True and len(warned_["warnings"]) == 2
    assert warned_["warnings"][0].startswith(f"{warn}: warning: stack.driver: driver 535 ")
    strict = run("check", "--json", "--strict", str(warn), home=tmp_path)
    assert strict.returncode == 2 and strict.stderr == ""
    assert json.loads(strict.stdout)["ok"] is False


def test_the_front_door_prints_the_warnings_before_pyinfra_runs(specs, tmp_path):
    _, warn = specs
    # a limit that matches no node: the warnings, then the refusal, and no host is reached
    door = run("drift", str(warn), "--limit", "no-such-node", home=tmp_path)
    lines = door.stderr.splitlines()
    assert lines[:2] == [w.line(str(warn)) for w in spec_warnings(load_cluster(warn))], door.stderr
    assert door.returncode == 64 and "--> Loading inventory..." not in door.stderr
    assert lines[2].endswith("--limit: 'no-such-node' matches no node of the spec (a,b)"), lines


def test_the_page_lists_every_warning_by_its_key():
    """docs/spec-checks.md's table of warnings has a row for each key a warning names."""
    text = """
        cluster: {master_port: 2222}
        ssh: {port: 2222, key: /nonexistent/id, known_hosts: /nonexistent/known_hosts}
        stack: {cuda: '12.4', driver: '535', torch: '2.4.1', torch_cuda: cpu}
        preflight: {healthy_multiple_of: 4}
        nodes: [{name: a, address: 192.0.2.1, gpus: 8}, {name: b, address: '2001:db8::2'}]
    """
    label = stack("{torch: '2.4.1+cu121', torch_cuda: cu124}")
    keys = {w.split(": ")[2] for w in warned(text) + label}
    assert len(keys) == 8, keys
    page = (REPO / "docs/spec-checks.md").read_text().split("## Warned")[1]
    rows = {line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| `")}
    listed = {key.strip("` ") for row in rows for key in row.split("/")}
    assert {k.replace("nodes[b]", "nodes[NAME]") for k in keys} <= listed
