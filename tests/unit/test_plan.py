"""One plan per node (issue #14): the deploy gives its operations the plan's values and drift
expects exactly those, so drift can never expect what the deploy would not write."""

from __future__ import annotations

import copy
import hashlib
import importlib
import runpy
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

import runtime.gather
from checks.drift_check import expect
from operations import (
    gpu_node_ops,
    hosts_ops,
    launchers_ops,
    nccl_env_ops,
    openmpi_ops,
    pdsh_ops,
    ssh_mesh_ops,
    stack_ops,
)
from operations.launchers_ops import launcher_files as apply_launcher_files
from operations.nccl_env_ops import nccl_env as apply_nccl_env
from operations.remote import FailCommand
from tests.unit.test_nccl_env import ib_ports
from trainfleet import mesh
from trainfleet.capabilities import ssh_mesh
from trainfleet.compare import digest
from trainfleet.key_material import KeyMaterial
from trainfleet.key_preparation import prepare_keys
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster
from trainfleet.plan import plan_cluster
from trainfleet.plan_types import ClusterPlan, Gathered
from trainfleet.spec import parse_cluster

ROOT = Path(__file__).resolve().parents[2]
SPEC = """\
cluster: {name: plan, mesh_users: [root, alice]}
nodes:
  - {name: gpu-a01, address: 198.18.0.11}
  - {name: gpu-a02, address: 198.18.0.12}
  - {name: gpu-a03, address: 198.18.0.13}
stack: {cuda: "12.4", nccl: 2.21.5-1, torch: 2.4.1, torch_cuda: cpu}
"""


def plain_network(address: str) -> dict:
    """A lab node: a decoy NIC first, the cluster interface second, no InfiniBand."""
    return {
        "interfaces": [
            {"name": "lo", "addresses": ["127.0.0.1"], "bridge": False},
            {"name": "eno1", "addresses": ["203.0.113.9"], "bridge": False},
            {"name": "eth0", "addresses": [address], "bridge": False, "cidrs": [f"{address}/24"]},
        ],
        "ib_ports": [],
    }


def roce_network(address: str, gid_index: int) -> dict:
    """A RoCE v2 node (the ConnectX-6 sysfs tree) whose IPv4 GID sits at ``gid_index``."""
    ports = copy.deepcopy(ib_ports("roce_v2_cx6"))
    for gid in ports[0]["gids"]:
        if gid["index"] == 5:
            gid["index"] = gid_index
    network = plain_network(address)
    network["ib_ports"] = ports
    return network


def public_key() -> str:
    return (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        .decode()
    )


def fresh_sshd() -> dict:
    """The SshdMesh fact of a node no certificate mesh reached yet (Debian 12's sshd_config)."""
    return {
        "includes_drop_ins": True,
        "other_revoked_keys": [],
        "certificates": {},
        "drop_in": None,
        "revoked_keys": None,
        "client_includes_drop_ins": True,
        "other_revoked_host_keys": [],
        "client_drop_in": None,
    }


def three_node_plan(
    tmp_path: Path,
    networks: dict[str, dict] | None = None,
    mesh_mode: str = "certificates",
    family: str = "debian",
    nccl: str = "2.21.5-1",
) -> tuple[Cluster, ClusterPlan]:
    spec = SPEC.replace("nccl: 2.21.5-1,", f"nccl: {nccl},")
    cluster = parse_cluster(spec + f"ssh: {{mesh: {mesh_mode}}}\n")
    networks = networks or {n.name: plain_network(n.address) for n in cluster.nodes}
    gathered = Gathered(
        networks=networks,
        host_keys={n.name: [public_key()] for n in cluster.nodes},
        os_families={n.name: family for n in cluster.nodes},
        sshd={n.name: fresh_sshd() for n in cluster.nodes},
    )
    return cluster, planned(cluster, gathered, KeyStore(cluster.name, root=tmp_path / "keys"))


def planned(cluster: Cluster, gathered: Gathered, store: KeyStore) -> ClusterPlan:
    """The deploy's two steps: the key store prepared (its one writer), then the plan of it."""
    return plan_cluster(cluster, gathered, prepare_keys(store, cluster, gathered))


def prepared(store: KeyStore, cluster: Cluster) -> KeyMaterial:
    """The key store with every key and the CA the cluster needs, as the deploy leaves it."""
    return prepare_keys(store, cluster, Gathered())


def deploy_order(
    monkeypatch, cluster: Cluster, node_name: str, plan: ClusterPlan
) -> list[tuple[str, dict]]:
    """Run deploy/cluster.py for one node with its operations recording, in order, what they
    are given: ``[("module.operation", kwargs)]``."""
    order: list[tuple[str, dict]] = []
    monkeypatch.setattr(runtime.gather, "this_node", lambda: (cluster, cluster.node(node_name)))
    monkeypatch.setattr(runtime.gather, "deploy_plan", lambda _cluster: plan)
    for module, names in (
        (hosts_ops, ["hostname", "hosts_block"]),
        (
            ssh_mesh_ops,
            [
                "known_hosts",
                "mesh_user",
                "mesh_trust",
                "sshd_certificates",
                "revoked_keys",
                "mesh_users_failed",
                "logins_under_way_finish",
            ],
        ),
        (pdsh_ops, ["pdsh"]),
        (stack_ops, ["software"]),
        (nccl_env_ops, ["nccl_env"]),
        (openmpi_ops, ["mca_params"]),
        (launchers_ops, ["launcher_files"]),
        (gpu_node_ops, ["settings"]),
    ):
        for name in names:
            op = f"{module.__name__.split('.')[-1].removesuffix('_ops')}.{name}"
            monkeypatch.setattr(module, name, lambda _op=op, **kwargs: order.append((_op, kwargs)))
    runpy.run_path(str(ROOT / "deploy/cluster.py"))
    return order


def deploy_calls(
    monkeypatch, cluster: Cluster, node_name: str, plan: ClusterPlan
) -> dict[str, list[dict]]:
    """What deploy/cluster.py gives each of its operations for one node: ``{"module.operation":
    [kwargs]}``."""
    calls: dict[str, list[dict]] = {}
    for op, kwargs in deploy_order(monkeypatch, cluster, node_name, plan):
        calls.setdefault(op, []).append(kwargs)
    return calls


# The operations deploy/cluster.py gives their capability's plan part whole, by keyword.
WHOLE = {
    "pdsh.pdsh": ("pdsh", "pdsh"),
    "hosts.hostname": ("hosts", "hosts"),
    "hosts.hosts_block": ("hosts", "hosts"),
    "stack.software": ("stack", "stack"),
    "nccl_env.nccl_env": ("nccl_env", "nccl"),
    "openmpi.mca_params": ("openmpi", "mpi"),
    "launchers.launcher_files": ("launchers", "launchers"),
    "gpu_node.settings": ("gpu_node", "gpu"),
}


def mesh_given_to_operations(calls: dict[str, list[dict]]) -> dict[str, str]:
    """What the node's SSH mesh will be once the mesh's operations ran (they are given fields,
    in the mesh's choreography), digested as drift digests it, worked out from nothing but the
    operations' arguments."""
    adding, known = calls["ssh_mesh.known_hosts"]  # trust the new lines too; then exactly them
    assert adding["entries"] == known["entries"] and (
        adding["exactly"],
        known.get("exactly", True),
    ) == (False, True)
    given = {"known_hosts block": digest(known["entries"])}
    (sshd,) = calls["ssh_mesh.sshd_certificates"]
    for krl in calls.get(
        "ssh_mesh.revoked_keys", []
    ):  # a certificate mesh: the KRL once more, after the users
        assert krl["content"] == sshd["revoked_keys"]
    if not sshd.get("problems"):
        given["host certificates"] = mesh.host_certificates_summary(sshd["certificates"])
        given["sshd mesh files"] = mesh.sshd_files_digest(sshd["drop_in"], sshd["revoked_keys"])
        given["ssh client drop-in"] = mesh.file_digest(sshd.get("client_drop_in"))
    trust = {
        call["user"]: call for call in calls["ssh_mesh.mesh_trust"] if call.get("exactly", True)
    }
    adding = {
        call["user"]: call for call in calls["ssh_mesh.mesh_trust"] if not call.get("exactly", True)
    }
    for user in calls["ssh_mesh.mesh_user"]:
        name = user["user"]
        assert trust[name]["certificate"] == user["certificate"]
        assert adding[name]["authorized"] == trust[name]["authorized"]
        given[f"user certificate ({name})"] = mesh.certificate_summary(user["certificate"])
        given[f"authorized_keys ({name})"] = digest(trust[name]["authorized"])
        given[f"ssh config ({name})"] = digest(user["config"])
        given[f"cluster key ({name})"] = (
            f"{hashlib.sha256(user['identity'].private.encode()).hexdigest()[:12]} 600"
        )
    return given


# The mesh's properties drift checks that no operation writes: the node's own answers.
MESH_OBSERVED_ONLY = {
    "ssh mesh (root)",  # the live login probe of every peer
    "ssh mesh (alice)",
    "sshd mesh plan",  # "ok": the plan's problems, where it has any, are the finding
    "ssh mesh plan (root)",  # "ok": key material the store lacks, where it lacks any
    "ssh mesh plan (alice)",
}


@pytest.mark.parametrize("mesh_mode", ["certificates", "keys"])
def test_drift_expects_of_every_node_exactly_what_the_deploy_gives_its_operations(
    tmp_path, monkeypatch, mesh_mode
):
    """Each operation outside the mesh gets its capability's part itself, the very object
    drift's ``expect`` reads; the mesh's operations get fields of it, and drift expects exactly
    what they were given."""
    cluster, plan = three_node_plan(tmp_path, mesh_mode=mesh_mode)
    for node in cluster.nodes:
        node_plan = plan.nodes[node.name]
        calls = deploy_calls(monkeypatch, cluster, node.name, plan)
        for op, (part, keyword) in WHOLE.items():  # the part itself, and nothing else
            assert all(call[keyword] is getattr(node_plan, part) for call in calls[op]), op
            assert all(set(call) == {"name", keyword} for call in calls[op]), op
        assert {op for op in calls if not op.startswith("ssh_mesh.")} == set(WHOLE)
        given = mesh_given_to_operations(calls)
        expected = ssh_mesh.expect(node_plan)
        assert set(expected) - set(given) == MESH_OBSERVED_ONLY, node.name
        assert {prop: expected[prop] for prop in given} == given, node.name
    # Nothing was left out: every capability of the deploy is expected of the node.
    assert {
        "NCCL env files",
        "launcher files",
        "openmpi params (alice)",
        "package libnccl2",
    } <= set(expect(node_plan))


# The packages SPEC's stack pins, spelled out as NVIDIA's repositories name them (not worked out by
# trainfleet.pins): cuda 12.4 is the toolkit meta-package at whatever 12.4 release the repository
# has; NCCL's runtime and headers at exactly 2.21.5-1, the build for CUDA 12.4.
SPEC_PACKAGES = {
    "debian": {
        "cuda-toolkit-12-4": None,
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
    },
    "rhel": {
        "cuda-toolkit-12-4": None,
        "libnccl": "2.21.5-1+cuda12.4",
        "libnccl-devel": "2.21.5-1+cuda12.4",
    },
}


@pytest.mark.parametrize("family", SPEC_PACKAGES)
def test_the_deploy_installs_and_drift_expects_exactly_the_packages_the_spec_pins(
    tmp_path, monkeypatch, family
):
    cluster, plan = three_node_plan(tmp_path, family=family)
    pins = SPEC_PACKAGES[family]
    for node in cluster.nodes:
        (software,) = deploy_calls(monkeypatch, cluster, node.name, plan)["stack.software"]
        assert software["stack"].packages == pins, node.name
        expected = expect(plan.nodes[node.name])
        assert {prop: value for prop, value in expected.items() if prop.startswith("package ")} == {
            **{f"package {name}": version for name, version in pins.items() if version},
            **{f"package {name} hold": "held" for name in pins},
        }, node.name


def test_the_cross_node_parts_are_built_once_and_shared_by_every_node(tmp_path):
    _, plan = three_node_plan(tmp_path)
    first, *others = plan.nodes.values()
    assert all(
        p.hosts.lines is first.hosts.lines
        and p.ssh_mesh.known_hosts is first.ssh_mesh.known_hosts
        and p.openmpi is first.openmpi
        for p in others
    )
    assert (
        len({id(user.config) for p in plan.nodes.values() for user in p.ssh_mesh.users}) == 2
    )  # one per mesh user
    assert (
        first.nccl_env.env["NCCL_SOCKET_IFNAME"] == "=eth0"
    )  # the cluster address's NIC, not the decoy


GID_AT_5_AND_3 = {
    "gpu-a01": ("198.18.0.11", 5),
    "gpu-a02": ("198.18.0.12", 3),
}


def test_nodes_that_disagree_on_the_gid_index_are_refused_by_the_deploy_and_not_expected_by_drift(
    tmp_path, monkeypatch
):
    """NCCL 2.18 uses the index it is given, and the launchers forward one node's value."""
    networks = {name: roce_network(*at) for name, at in GID_AT_5_AND_3.items()}
    networks["gpu-a03"] = plain_network("198.18.0.13")
    cluster, plan = three_node_plan(tmp_path, networks, nccl="2.18.3-1")
    for name in ("gpu-a01", "gpu-a02"):
        calls = deploy_calls(monkeypatch, cluster, name, plan)
        (nccl,), (files,) = calls["nccl_env.nccl_env"], calls["launchers.launcher_files"]
        problems = ["NCCL_IB_GID_INDEX differs between nodes: gpu-a01=5, gpu-a02=3"]
        assert nccl["nccl"].problems == problems
        # The deploy: both steps fail the node and write nothing.
        for op, kwargs in ((apply_nccl_env, nccl), (apply_launcher_files, files)):
            commands = list(op._inner(**{k: v for k, v in kwargs.items() if k != "name"}))
            assert len(commands) == 1 and isinstance(commands[0], FailCommand)
        # Drift, from the same plan: no NCCL files, variables or launcher files expected of it,
        # only a plan without problems (what it observes is these problems: a finding).
        expected = expect(plan.nodes[name])
        assert {p for p in expected if p.startswith("NCCL") or p == "launcher files"} == {
            "NCCL env plan"
        }
        assert expected["NCCL env plan"] == "ok"
    # The node without RoCE is not dragged in.
    assert plan.nodes["gpu-a03"].nccl_env.problems == [] and "NCCL env files" in expect(
        plan.nodes["gpu-a03"]
    )


def test_on_nccl_2_21_nodes_whose_gid_sits_at_different_indices_are_each_left_to_nccl(tmp_path):
    """The same tables on NCCL 2.21 (SPEC's pin): NCCL picks each node's GID itself, so the
    nodes need not agree on an index and no index is written."""
    networks = {name: roce_network(*at) for name, at in GID_AT_5_AND_3.items()}
    networks["gpu-a03"] = plain_network("198.18.0.13")
    _, plan = three_node_plan(tmp_path, networks)
    for name in GID_AT_5_AND_3:
        nccl = plan.nodes[name].nccl_env
        assert nccl.problems == [] and "NCCL_IB_GID_INDEX" not in nccl.env
        assert (nccl.env["NCCL_IB_ROCE_VERSION_NUM"], nccl.env["NCCL_IB_ADDR_FAMILY"]) == (
            "2",
            "AF_INET",
        )
        assert "NCCL env files" in expect(plan.nodes[name])


def test_a_node_whose_network_was_not_read_fails_its_nccl_step_and_is_expected_none_of_it(tmp_path):
    cluster = parse_cluster(SPEC)
    _, plan = three_node_plan(
        tmp_path, {n.name: plain_network(n.address) for n in cluster.nodes[:2]}
    )
    assert plan.nodes["gpu-a03"].nccl_env.problems == ["the node's network could not be read"]
    assert "NCCL env files" not in expect(plan.nodes["gpu-a03"])


def test_a_node_that_gave_no_host_keys_gets_them_from_the_controllers_known_hosts(tmp_path):
    public = (
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH)
        .decode()
    )
    known = tmp_path / "known_hosts"
    known.write_text(f"198.18.0.12 {public}\n")
    cluster = parse_cluster(
        SPEC.replace(
            "address: 198.18.0.12}", f"address: 198.18.0.12, ssh: {{known_hosts: {known}}}}}"
        )
    )
    gathered = Gathered(
        networks={},
        host_keys={
            "gpu-a01": ["ssh-ed25519 AAAA1"],
            "gpu-a02": [],
            "gpu-a03": ["ssh-ed25519 AAAA3"],
        },
    )
    plan = plan_cluster(cluster, gathered)
    assert plan.nodes["gpu-a01"].ssh_mesh.known_hosts == mesh.known_hosts_lines(
        cluster,
        {"gpu-a01": ["ssh-ed25519 AAAA1"], "gpu-a02": [public], "gpu-a03": ["ssh-ed25519 AAAA3"]},
    )
    assert plan.notes == [
        "[gpu-a02] not reachable: its host keys come from the controller's known_hosts (1 found)"
    ]


def test_a_plan_without_the_key_store_plans_no_mesh_and_creates_no_key(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path))
    cluster = parse_cluster(SPEC)
    plan = plan_cluster(
        cluster, Gathered(networks={n.name: plain_network(n.address) for n in cluster.nodes})
    )
    assert all(p.ssh_mesh.users == [] and p.ssh_mesh.known_hosts == [] for p in plan.nodes.values())
    assert not any(tmp_path.iterdir())


# Programs that run on nodes, each in a process of its own, never imported by the controller (which
# lacks what they import, or runs them only there): their module state lives and dies with one run.
NODE_PROGRAMS = {
    "trainfleet.smoke.train": "the smoke job, run by the node's venv python; imports torch",
    "facts.scripts": "fact scripts, run on nodes by the fact bundle",
    "checks.preflight_stages": "preflight stage scripts, run on nodes",
}


def _module_names(package: str) -> list[str]:
    """Every module in the package's folder and its subfolders, found as files (not through the
    imports, which would miss a folder without ``__init__.py`` or a module nothing imports)."""
    return sorted(
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for path in (ROOT / package).rglob("*.py")
    )


def _node_program(name: str) -> str | None:
    return next((p for p in NODE_PROGRAMS if name == p or name.startswith(f"{p}.")), None)


@pytest.mark.parametrize("package", ["trainfleet", "operations", "facts", "checks", "runtime"])
def test_no_module_holds_mutable_state(package):
    """Run-time state lives on pyinfra's State: a module-level dict, list or set is refused
    (constants are tuples or read-only mappings)."""
    names = _module_names(package)
    skipped = {_node_program(name) for name in names} - {None}
    assert skipped == {p for p in NODE_PROGRAMS if p.startswith(f"{package}.")}  # none stale
    found = [
        f"{name}.{attr}"
        for name in names
        if not _node_program(name)
        for attr, value in vars(importlib.import_module(name)).items()
        if isinstance(value, (dict, list, set, bytearray)) and not attr.startswith("__")
    ]
    assert found == []
