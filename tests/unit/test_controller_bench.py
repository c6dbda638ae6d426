"""The controller benchmark's fake fleet (bench/controller): its rewritten answers, read through
trainfleet's real facts, are exactly what the plan says a converged node holds."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import replace

import pytest

from bench.controller import fleet as fleet_mod
from bench.controller import wire
from bench.controller.controller_report import growth
from bench.controller.measure import pyinfra_args
from bench.controller.record import load
from bench.run import PYINFRA, REPO, parse_results
from checks import drift_check
from facts.hosts_facts import HOSTS_PURPOSE
from facts.managed_block_facts import with_block_line
from runtime import bundle
from runtime.bundle import DeployState, NodeFingerprint
from trainfleet import plan as plan_mod
from trainfleet.capabilities import CAPABILITIES
from trainfleet.mesh import probe_targets
from trainfleet.plan import cluster_blocks


@pytest.fixture(scope="module", params=[4, 16])
def fleet(request, tmp_path_factory) -> fleet_mod.Fleet:
    """A certificate mesh (the spec's default)."""
    return fleet_mod.build(request.param, tmp_path_factory.mktemp(f"fleet{request.param}"), load())


@pytest.fixture(scope="module")
def keys_fleet(tmp_path_factory) -> fleet_mod.Fleet:
    return fleet_mod.build(16, tmp_path_factory.mktemp("keys16"), load(), mesh="keys")


def _first_match(responses: dict, command: str):
    """pyinfra's fake connector: the first matcher (substring or pattern) in insertion order."""
    for matcher, response in responses.items():
        if matcher.search(command) if hasattr(matcher, "search") else matcher in command:
            return response
    return None


def test_converged_answers_have_no_drift(fleet):
    report = fleet_mod.offline_drift(fleet)
    assert report.findings == []
    assert set(report.observed) == {n.name for n in fleet.cluster.nodes}
    assert all(props["ssh mesh (root)"] == "ok" for props in report.observed.values())


def test_converged_answers_are_the_plan(fleet):
    """What the deploy's operations compare against the plan, node by node."""
    for node in fleet.cluster.nodes:
        plan = fleet.plan.nodes[node.name]
        state = fleet_mod.parse_bundle(
            "deploy_state",
            fleet.converged[node.name].deploy_state,
            ["root"],
            blocks=cluster_blocks(fleet.cluster),
        )
        assert state["hostname"] == {"running": node.name, "static": node.name}
        assert state["hosts"]["block"] == plan.hosts.lines
        assert state["known_hosts"]["block"] == plan.ssh_mesh.known_hosts
        assert state["pdsh"]["genders"]["block"] == [f"{n} trainfleet" for n in plan.pdsh.nodes]
        assert state["nccl_files"]["profile"] == plan.nccl_env.profile
        assert state["openmpi"]["users"]["root"]["params"]["block"] == plan.openmpi.lines
        user, mine = state["mesh_user:root"], plan.ssh_mesh.users[0]
        assert (
            user["authorized"]["block"] == mine.authorized
            and user["config"]["block"] == mine.config
        )
        assert user["identity"]["sha256"] == fleet_mod.sha256(mine.identity.private)
        # the certificate mesh: exactly the plan's certificates (signed by the key store's CA)
        assert mine.certificate and user["certificate"] == mine.certificate.strip()
        sshd = state["sshd_mesh"]
        assert sshd["includes_drop_ins"] and sshd["other_revoked_keys"] == []
        assert {p: c for p, c in sshd["certificates"].items() if c} == {
            p: c.strip() for p, c in plan.ssh_mesh.sshd.certificates.items()
        }
        # the recorded node has ecdsa and ed25519 host keys: the ed25519 one is certified
        assert list(plan.ssh_mesh.sshd.certificates) == ["/etc/ssh/ssh_host_ed25519_key-cert.pub"]
        assert (
            sshd["drop_in"] == plan.ssh_mesh.sshd.drop_in.encode()
            and sshd["revoked_keys"] == plan.ssh_mesh.sshd.revoked_keys
        )
        assert sshd["client_drop_in"] == plan.ssh_mesh.sshd.client_drop_in.encode()
        assert (
            plan.ssh_mesh.known_hosts[0].startswith("@cert-authority ")
            and len(plan.ssh_mesh.known_hosts) == 1
        )
        assert {
            n: f["sha256"] for n, f in state["launchers"].items() if n in plan.launchers.files
        } == {n: fleet_mod.sha256(c) for n, (c, _) in plan.launchers.files.items()}
        assert (
            node.address
            in next(i for i in state["network"]["interfaces"] if i["name"] == "eth0")["addresses"]
        )
    identities = [
        fleet_mod.parse_bundle(
            "fingerprint", a.fingerprint, ["root"], a.targets, cluster_blocks(fleet.cluster)
        )["identity"]
        for a in fleet.converged.values()
    ]
    assert (
        len({i["boot_id"] for i in identities})
        == len({i["machine_id"] for i in identities})
        == fleet.nodes
    )


def test_fresh_answers_need_the_deploy(fleet):
    for node in fleet.cluster.nodes:
        state = fleet_mod.parse_bundle(
            "deploy_state", fleet.fresh[node.name].deploy_state, ["root"]
        )
        assert state["hostname"]["running"] == "ip-" + node.address.replace(".", "-")
        assert state["hosts"]["block"] is None and state["mesh_user:root"]["identity"] is None
        assert state["mesh_user:root"]["certificate"] is None
        assert state["sshd_mesh"] == {
            "includes_drop_ins": True,
            "other_revoked_keys": [],
            "certificates": dict.fromkeys(state["sshd_mesh"]["certificates"]),
            "drop_in": None,
            "revoked_keys": None,
            "client_includes_drop_ins": True,
            "other_revoked_host_keys": [],
            "client_drop_in": None,
        }


def test_one_nodes_hosts_block_is_named_by_drift(fleet):
    """A node whose /etc/hosts block lost a line: drift names that node, and only it (the
    node's block is not the one asked for: it answers the whole file, no digest)."""
    victim = fleet.cluster.nodes[1].name
    answers = hosts_block_cut(fleet, [victim])
    report = fleet_mod.offline_drift(fleet, answers)
    assert {f.node for f in report.findings} == {victim}
    assert {f.property for f in report.findings} == {"hosts block"}
    (finding,) = report.findings  # the whole file came back: its diff names the lost line
    assert f"-{fleet.plan.nodes[victim].hosts.lines[-1]}" in finding.diff


def hosts_block_cut(fleet: fleet_mod.Fleet, victims: list[str]) -> dict:
    """The fleet's converged answers with each victim's /etc/hosts block losing its last line
    (as a hand edit would), the rest of each answer as it was."""
    answers = dict(fleet.converged)
    for victim in victims:
        lines = list(answers[victim].fingerprint)
        at = lines.index(f"{fleet_mod.MARK} hosts") + 1
        section = base64.b64decode(lines[at]).decode()
        block = fleet.plan.nodes[victim].hosts.lines[:-1]
        lines[at] = fleet_mod.b64(
            fleet_mod.joined(
                [
                    with_block_line(line, HOSTS_PURPOSE, block)
                    for line in fleet_mod.text_lines(section)
                    if not line.startswith("block ")
                ]
            )
        )
        answers[victim] = replace(answers[victim], fingerprint=lines)
    return answers


def test_a_converged_nodes_cluster_wide_blocks_do_not_grow_with_the_cluster(tmp_path):
    """Issue #27: a converged node answers /etc/hosts and the pdsh lists by digest, so the
    bytes of those sections are the same at 4 and 32 nodes (they were a line per node)."""
    sizes = {}
    for n in (4, 32):
        built = fleet_mod.build(n, tmp_path / f"n{n}", load())
        per_section = fleet_mod.section_bytes(built.converged["node0001"].deploy_state)
        sizes[n] = (per_section["hosts"], per_section["pdsh"])
        state = fleet_mod.parse_bundle(
            "deploy_state",
            built.converged["node0001"].deploy_state,
            ["root"],
            blocks=cluster_blocks(built.cluster),
        )
        assert state["hosts"]["block"] == built.plan.nodes["node0001"].hosts.lines
        assert state["pdsh"]["machines"]["block"] == [node.name for node in built.cluster.nodes]
    assert sizes[4] == sizes[32]


def test_each_command_gets_its_answer(fleet):
    """The commands drift and the deploy send, matched as pyinfra's fake connector matches them."""
    names = [n.name for n in fleet.cluster.nodes]
    for node in fleet.cluster.nodes:
        answers = fleet.converged[node.name]
        responses = answers.responses()
        targets = probe_targets(names, node.name, fleet.stride)
        sampled = NodeFingerprint().command(users=["root"], peers=targets).get_masked_value()
        full = NodeFingerprint().command(users=["root"], peers=names).get_masked_value()
        assert _first_match(responses, sampled) is answers.fingerprint
        assert _first_match(responses, full) is answers.fingerprint_full
        assert (
            _first_match(responses, DeployState().command(users=["root"]).get_masked_value())
            is answers.deploy_state
        )
        assert _first_match(responses, "uname -n") == [node.name]
        proof = NodeFingerprint()
        proof.command(users=["root"], peers=names, blocks=cluster_blocks(fleet.cluster))
        assert set(proof.process(answers.fingerprint_full)["mesh_proof:root"].values()) == {"ok"}


def test_growth_exponent_and_per_doubling_ratios():
    k, steps = growth({64: 1.0, 128: 2.0, 512: 32.0})
    assert k == pytest.approx(12 / 7)  # the least-squares slope of (6, 0), (7, 1), (9, 5)
    assert [(a, b, round(r, 2)) for a, b, r in steps] == [(64, 128, 2.0), (128, 512, 4.0)]


def test_pyinfra_rerun_and_drift_on_four_fake_nodes(tmp_path):
    """The real thing: pyinfra drives 4 fake nodes of a certificate mesh; the re-run changes
    nothing, drift finds nothing, and the wire counts are what the answers hold."""
    fleet = fleet_mod.build(4, tmp_path / "fleet", load())
    inventory = fleet.write_inventory("converged", tmp_path / "converged.pkl")
    tally = tmp_path / "wire.json"
    env = {
        **os.environ,
        **fleet.env(),
        "TRAINFLEET_FLEET": str(inventory),
        "PYINFRA_PROGRESS": "off",
        wire.ENV: str(tally),
    }
    for task, answered in (
        ("re-run", lambda a: a.deploy_state),
        ("drift", lambda a: a.fingerprint),
    ):
        tally.unlink(missing_ok=True)
        proc = subprocess.run(
            [PYINFRA, *pyinfra_args(task)],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert parse_results(proc.stdout) == (0, 0)
        counts = wire.read(str(tally))
        assert (
            counts["commands"] == 4 and counts["uploads"] == 0
        )  # one bundle per node, nothing written
        assert counts["stdout_bytes"] == sum(
            fleet_mod.stdout_bytes(answered(a)) for a in fleet.converged.values()
        )
        assert counts["command_bytes"] > 4 * 1000
    report = json.loads((fleet.home / "reports" / f"drift-{fleet.cluster.name}.json").read_text())
    assert report["drift"] is False and report["findings"] == []


def test_a_missing_host_certificate_is_named_by_drift(fleet):
    """A node whose sshd lost its ed25519 host certificate: drift names that node's host
    certificates."""
    victim = fleet.cluster.nodes[-1].name
    plan = fleet.plan.nodes[victim].ssh_mesh.sshd
    kept = {p: c for p, c in plan.certificates.items() if "ed25519" not in p}
    lines = list(fleet.converged[victim].fingerprint)
    at = lines.index(f"{fleet_mod.MARK} sshd_mesh") + 1
    lines[at] = fleet_mod.b64(
        fleet_mod.sshd_mesh_text(
            plan.drop_in, plan.revoked_keys, kept, client_drop_in=plan.client_drop_in
        )
    )
    answers = {**fleet.converged, victim: replace(fleet.converged[victim], fingerprint=lines)}
    report = fleet_mod.offline_drift(fleet, answers)
    assert {(f.node, f.property) for f in report.findings} == {(victim, "host certificates")}


def test_keys_mesh_fleet(keys_fleet):
    """``--mesh keys``: the old mesh, no certificates anywhere, and still no drift."""
    assert fleet_mod.offline_drift(keys_fleet).findings == []
    for node in keys_fleet.cluster.nodes:
        plan = keys_fleet.plan.nodes[node.name]
        assert plan.ssh_mesh.sshd.drop_in is None and plan.ssh_mesh.users[0].certificate is None
        assert (
            len(plan.ssh_mesh.known_hosts) == 2 * keys_fleet.nodes
        )  # a line per node and host key
        state = fleet_mod.parse_bundle(
            "deploy_state",
            keys_fleet.converged[node.name].deploy_state,
            ["root"],
            blocks=cluster_blocks(keys_fleet.cluster),
        )
        assert (
            state["sshd_mesh"]["drop_in"] is None and state["mesh_user:root"]["certificate"] is None
        )
        assert state["known_hosts"]["block"] == plan.ssh_mesh.known_hosts


def test_mesh_files_constant_in_a_certificate_mesh_and_growing_with_keys(tmp_path, keys_fleet):
    """Issue #18: one node's mesh files are the same size at 16 and 64 nodes with certificates
    (16 to 64 adds no host pattern: 198.18.0.? and 198.18.0.??), and grow with N with keys."""
    sizes = {}
    for mesh, n in (("certificates", 16), ("certificates", 64), ("keys", 64)):
        built = fleet_mod.build(n, tmp_path / f"{mesh}{n}", load(), mesh=mesh)
        sizes[mesh, n] = fleet_mod.mesh_files(built.plan.nodes["node0001"])
    sizes["keys", 16] = fleet_mod.mesh_files(keys_fleet.plan.nodes["node0001"])
    assert sizes["certificates", 16] == sizes["certificates", 64]
    assert all(sizes["certificates", 64][f] > 0 for f in fleet_mod.MESH_FILE_PATHS)
    assert sizes["keys", 64]["total"] > 3.5 * sizes["keys", 16]["total"]
    assert sizes["keys", 16]["host_certificates"] == sizes["keys", 16]["user_certificate"] == 0
    assert sizes["certificates", 64]["total"] < sizes["keys", 16]["total"]
    assert (
        sum(v for k, v in sizes["keys", 16].items() if k != "total") == sizes["keys", 16]["total"]
    )


def test_fact_bytes_by_section(fleet):
    answers = fleet.converged["node0001"].deploy_state
    by = fleet_mod.section_bytes(answers)
    assert sum(by.values()) == fleet_mod.stdout_bytes(answers)
    assert {fleet_mod.section_group(n) for n in by} == {"ssh mesh", "hosts + pdsh", "other"}
    assert (
        fleet_mod.section_group("mesh_user:root")
        == fleet_mod.section_group("sshd_mesh")
        == "ssh mesh"
    )


def test_mesh_targets_from_results():
    """The report's issue #18 targets: constant per-node files met, N² read bytes missed."""
    from bench.controller.controller_report import mesh_series, render_mesh_targets

    def setup(n, mesh, files):
        return {
            "nodes": n,
            "mesh": mesh,
            "mesh_files": {"total": files},
            "mesh_files_total": {"min": files, "max": files},
            "fact_bytes_by_group": {"ssh mesh": 100 * n, "hosts + pdsh": n * n, "other": 10 * n},
        }

    def sample(n, mesh, task, read):
        return {
            "nodes": n,
            "mesh": mesh,
            "task": task,
            "ok": True,
            "wire": {
                "commands": n,
                "command_bytes": 1000 * n,
                "stdout_lines": n,
                "stdout_bytes": read,
            },
        }

    results = {
        "plan": {"mesh": "certificates"},
        "setups": [setup(n, "certificates", 3200) for n in (16, 64)]
        + [setup(n, "keys", 160 * n) for n in (16, 64)],
        "samples": [
            sample(n, "certificates", t, 500 * n) for n in (16, 64) for t in ("re-run", "drift")
        ]
        + [sample(n, "certificates", "first-provision plan", 9 * n * n) for n in (16, 64)],
    }
    series = mesh_series(results)
    assert series[("keys", "one node's mesh files")] == {16: 2560, 64: 10240}
    lines = render_mesh_targets(results)
    assert any(
        line.startswith("- one node's SSH mesh files of constant size")
        and ": met; k = 0.00" in line
        for line in lines
    )
    assert any(
        "all fact bytes read per run grow linearly with N (first-provision plan)" in line
        and "**missed**; k = 2.00" in line
        for line in lines
    )
    assert any(
        "(re-run)" in line and "bytes sent per run" in line and ": met; k = 1.00" in line
        for line in lines
    )


@pytest.mark.parametrize("mesh_mode", ["certificates", "keys"])
def test_the_baseline_runs_as_many_operations_as_the_deploy_with_the_same_names(
    tmp_path, monkeypatch, mesh_mode
):
    """The no-op baseline stands for deploy/cluster.py's operations (one mesh user): the same
    names, in the same order."""
    import ast

    from tests.unit.test_plan import ROOT, deploy_order, three_node_plan

    cluster, plan = three_node_plan(tmp_path, mesh_mode=mesh_mode)  # mesh users root and alice
    names = [
        kwargs["name"]
        for _, kwargs in deploy_order(monkeypatch, cluster, cluster.nodes[0].name, plan)
    ]

    root_only = [n for n in names if "alice" not in n]
    source = (
        ROOT / "bench/controller/noop_deploy.py"
    ).read_text()  # a deploy file: importing it runs it
    (listed,) = [
        node.value
        for node in ast.parse(source).body
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "OPERATIONS"
    ]
    expected = ast.literal_eval(listed)
    if (
        mesh_mode == "keys"
    ):  # sshd's certificates are taken away after the trust instead of set before the users
        expected.remove("sshd presents its host certificates, refuses revoked keys")
        expected.remove("Revoked mesh keys (/etc/ssh/trainfleet_revoked_keys)")
        expected.insert(
            expected.index("root trusts exactly the mesh") + 1,
            "sshd without trainfleet's certificates",
        )
    assert root_only == expected


def test_a_new_section_is_answered_from_the_registry_with_no_benchmark_edit(tmp_path, monkeypatch):
    """A capability that reads one more section (an existing fact, its converged value said in
    ``converged``): the fleet answers it on every node, in the deploy's bundle and drift's,
    though recorded.json has no recording of it and bench/ names no section."""
    path = "/etc/trainfleet-names"  # a new managed file: no lab node ever recorded it
    hosts = next(c for c in CAPABILITIES if c.name == "hosts")

    def deploy_sections(users, blocks):
        return {**hosts.deploy_sections(users, blocks), "names": ("HostsBlock", {"path": path})}

    def converged(plan):
        return {**hosts.converged(plan), "names": {"block": list(plan.hosts.lines), "outside": []}}

    grown = tuple(
        replace(c, deploy_sections=deploy_sections, converged=converged) if c is hosts else c
        for c in CAPABILITIES
    )
    for module in (bundle, drift_check, plan_mod, fleet_mod):  # each holds the registry's tuple
        monkeypatch.setattr(module, "CAPABILITIES", grown)
    document = load()
    assert all("names" not in recording for recording in document["converged"].values())

    fleet = fleet_mod.build(3, tmp_path, document)
    blocks = cluster_blocks(fleet.cluster)
    for node in fleet.cluster.nodes:
        lines = fleet.plan.nodes[node.name].hosts.lines
        answers = fleet.converged[node.name]
        deploy = fleet_mod.parse_bundle(
            "deploy_state", answers.deploy_state, ["root"], blocks=blocks
        )
        drift = fleet_mod.parse_bundle(
            "fingerprint", answers.fingerprint, ["root"], answers.targets, blocks
        )
        for state in (deploy, drift):
            assert state["names"]["exists"] and state["names"]["block"] == lines
            assert state["names"]["outside"] == []
    assert fleet_mod.offline_drift(fleet).findings == []
