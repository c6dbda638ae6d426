"""Adopting a running cluster (#43): the spec's ``manage`` and ``preflight.python`` grammars, a
step turned off running no operation, drift not expecting it (its job checks kept), and what
drift says a first deploy would change. Nodes: the controller benchmark's fake fleet, its
answers parsed by the real facts; pyinfra runs the real deploy on them."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
from dataclasses import replace
from typing import Any

import pytest
import yaml

from bench.controller import fleet as fleet_mod
from bench.controller.measure import pyinfra_args
from bench.controller.record import load
from bench.run import PYINFRA, REPO, parse_results
from checks.drift_check import compare_fingerprints
from trainfleet.capabilities import (
    MANAGE_STEPS,
    expected_steps,
    managed_expectations,
    ssh_mesh,
)
from trainfleet.compare import ABSENT, Finding, change_text, deploy_changes
from trainfleet.keystore import KeyStore
from trainfleet.plan import cluster_blocks
from trainfleet.schema import MANAGE, reference_markdown
from trainfleet.spec import SpecError, parse_cluster, parse_spec

ONE_NODE = "nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n"
CONDA = "/opt/conda/envs/train/bin/python"


def problems(text: str) -> list[str]:
    with pytest.raises(SpecError) as caught:
        parse_spec(text, "bad.yml")
    return caught.value.problems


# -- the grammar: refused by `trainfleet check`, before any host ------------------------------


def test_every_step_is_managed_unless_the_spec_says_otherwise():
    cluster = parse_cluster(ONE_NODE)
    assert all(cluster.manages(step) for step in MANAGE_STEPS) and cluster.unmanaged == ()
    adopted = parse_cluster("manage: {hostname: false, stack: false, pdsh: false}\n" + ONE_NODE)
    assert adopted.unmanaged == ("hostname", "pdsh", "stack")
    assert not adopted.manages("hostname") and adopted.manages("hosts")


def test_the_schema_has_one_key_per_step_of_the_deploy_and_documents_each():
    assert sorted(MANAGE.keys) == sorted(MANAGE_STEPS)
    reference = reference_markdown()
    assert "`manage`: What the deploy manages" in reference
    assert all(f"| `{step}` | boolean | `true` |" in reference for step in MANAGE_STEPS)


def test_an_unknown_step_is_refused_naming_the_known_ones():
    assert problems("manage: {hostnames: false}\n" + ONE_NODE) == [
        "bad.yml:1: manage.hostnames: unknown key; did you mean 'hostname'? manage accepts: a "
        "mapping of hostname, hosts, ssh_mesh, pdsh, stack, nccl_env, openmpi, launchers, gpu_node"
    ]


@pytest.mark.parametrize(
    "value, shown", [('"false"', "string 'false'"), ("0", "integer 0"), ("[]", "list []")]
)
def test_a_step_that_is_not_a_yaml_boolean_is_refused(value, shown):
    assert problems(f"manage:\n  stack: {value}\n" + ONE_NODE) == [
        f"bad.yml:2: manage.stack: must be a boolean, got {shown}; accepts: true or false "
        "(a YAML boolean)"
    ]


def test_manage_that_is_no_mapping_is_refused():
    assert problems("manage: false\n" + ONE_NODE) == [
        "bad.yml:1: manage: must be a mapping, got boolean False; accepts: a mapping of "
        "hostname, hosts, ssh_mesh, pdsh, stack, nccl_env, openmpi, launchers, gpu_node"
    ]


def test_an_existing_envs_python_is_taken_where_the_stack_is_not_managed():
    cluster = parse_cluster(f"manage: {{stack: false}}\npreflight: {{python: {CONDA}}}\n{ONE_NODE}")
    assert cluster.job_python == CONDA and cluster.job_env == "/opt/conda/envs/train"
    default = parse_cluster(ONE_NODE)
    assert default.job_python == "/opt/trainfleet/venv/bin/python"
    assert default.job_env == "/opt/trainfleet/venv"


def test_an_existing_envs_python_is_refused_where_the_stack_is_managed():
    assert problems(f"preflight: {{python: {CONDA}}}\n{ONE_NODE}") == [
        "bad.yml:1: preflight.python: an existing env's python needs manage.stack: false (a "
        "managed stack's preflight tests trainfleet's venv, the one the deploy pins)"
    ]


@pytest.mark.parametrize(
    "path, why",
    [
        ("conda/bin/python", "must be an absolute path on the nodes"),
        ("/opt/../bin/python", "must not contain '..'"),
        ("/opt/env/bin/python;id", "may contain only letters"),
        ("/opt/env name/bin/python", "may contain only letters"),
        ("/opt/env/bin/ipython", "is not an env's python"),
        ("/opt/env/python", "is not an env's python"),
        ("/bin/python", "is not an env's python"),
    ],
)
def test_a_python_that_is_no_safe_env_path_is_refused_before_any_host(path, why):
    found = problems(f"manage: {{stack: false}}\npreflight: {{python: '{path}'}}\n{ONE_NODE}")
    assert len(found) == 1 and why in found[0], found
    assert found[0].startswith("bad.yml:2: preflight.python: ")


@pytest.mark.parametrize("path", ["/usr/bin/python3", "/opt/env/bin/python3.11", CONDA])
def test_an_env_python_of_safe_characters_is_accepted(path):
    assert parse_cluster(f"manage: {{stack: false}}\npreflight: {{python: {path}}}\n{ONE_NODE}")


# -- the deploy: an unmanaged step runs no operation ------------------------------------------


def test_the_deploy_asks_for_every_step_by_its_manage_key_and_for_no_other():
    asked = re.findall(r'cluster\.manages\("([a-z_]+)"\)', (REPO / "deploy/cluster.py").read_text())
    assert sorted(asked) == sorted(MANAGE_STEPS)  # each once, none misspelt (a typo is managed)


@pytest.fixture(scope="module")
def fleet(tmp_path_factory) -> fleet_mod.Fleet:
    return fleet_mod.build(3, tmp_path_factory.mktemp("adopt"), load())


def _deploy(
    fleet: fleet_mod.Fleet, manage: dict[str, bool], tmp: Any, home: Any = None
) -> dict[str, Any]:
    """The real deploy by pyinfra on the converged fake nodes, the spec's ``manage`` set
    (``home``: another TRAINFLEET_HOME than the fleet's)."""
    spec = yaml.safe_load(fleet.spec.read_text())
    spec["manage"] = manage
    fleet.spec.write_text(yaml.safe_dump(spec, sort_keys=False))
    inventory = fleet.write_inventory("converged", tmp / "converged.pkl")
    env = {**os.environ, **fleet.env(), "TRAINFLEET_FLEET": str(inventory)}
    if home is not None:
        env["TRAINFLEET_HOME"] = str(home)
    proc = subprocess.run(
        [PYINFRA, *pyinfra_args("re-run")],
        cwd=REPO,
        env={**env, "PYINFRA_PROGRESS": "off"},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert parse_results(proc.stdout) == (0, 0)
    return json.loads(proc.stdout[proc.stdout.index("{") :])


def test_an_unmanaged_step_runs_no_operation_and_the_others_run_as_before(fleet, tmp_path):
    home = tmp_path / "home"  # a controller with no key store yet
    report = _deploy(fleet, {"hostname": False, "ssh_mesh": False, "stack": False}, tmp_path, home)
    ran = {op["name"] for op in report["results"]["operations"]}
    assert "Hostname is the node's spec name" not in ran
    assert not any("mesh" in name or "known_hosts" in name for name in ran), ran
    assert not any(name.startswith("Pinned software stack") for name in ran)
    assert {
        "Cluster hosts block in /etc/hosts",
        "pdsh over ssh to every node",
        "NCCL environment (profile.d, /etc/environment, /etc/nccl.conf)",
        "OpenMPI network (~/.openmpi/mca-params.conf)",
        "Launcher configs",
        "GPU node settings (memlock, persistence, fabric manager, nvidia_peermem)",
    } <= ran
    # the mesh not managed: no key and no CA made for it (the key store read only)
    made = [p for p in home.rglob("*") if p.is_file()] if home.exists() else []
    assert not [p for p in made if "keys" in p.relative_to(home).parts], made


# -- drift: an unmanaged step's properties observed, never expected ---------------------------


def _fingerprints(fleet: fleet_mod.Fleet, answers: dict[str, Any]) -> dict[str, Any]:
    users, blocks = fleet.cluster.mesh_users, cluster_blocks(fleet.cluster)
    return {
        name: fleet_mod.parse_bundle("fingerprint", a.fingerprint, users, a.targets, blocks)
        for name, a in answers.items()
    }


def _drift(fleet: fleet_mod.Fleet, fingerprints: dict[str, Any], **manage: bool):
    cluster = replace(fleet.cluster, manage=manage)
    names = [n.name for n in cluster.nodes]
    keys = KeyStore(cluster.name, root=fleet.home / "keys").snapshot(cluster.mesh_users, names)
    return compare_fingerprints(cluster, fingerprints, keys)


def _own_hostnames(fps: dict[str, Any], names: dict[str, str]) -> dict[str, Any]:
    """The nodes' fingerprints with each named node's own hostname (running and static)."""
    changed = copy.deepcopy(fps)
    for node, name in names.items():
        changed[node]["hostname"] = {"running": name, "static": name}
    return changed


def test_drift_does_not_expect_an_unmanaged_hostname_and_still_wants_it_unique(fleet):
    fps = _fingerprints(fleet, fleet.converged)
    first, second, third = (n.name for n in fleet.cluster.nodes)
    own = _own_hostnames(fps, {first: "gpu-a", second: "gpu-b", third: "gpu-c"})
    managed = _drift(fleet, own)
    assert {(f.node, f.property) for f in managed.findings} == {
        (n, p) for n in (first, second, third) for p in ("hostname", "hostname (persistent)")
    }
    adopted = _drift(fleet, own, hostname=False)
    assert adopted.findings == [] and adopted.not_managed == ("hostname",)
    assert adopted.observed[first]["hostname"] == "gpu-a"  # still observed
    clash = _own_hostnames(fps, {first: "localhost", second: "localhost", third: "gpu-c"})
    found = _drift(fleet, clash, hostname=False).findings
    assert {(f.node, f.property, f.kind) for f in found} == {
        (first, "hostname", "unique"),
        (second, "hostname", "unique"),
    }


def test_drift_does_not_expect_an_unmanaged_stack_but_still_votes_on_its_versions(fleet):
    fps = _fingerprints(fleet, fleet.converged)
    odd = fleet.cluster.nodes[-1].name
    report = _drift(fleet, fps, stack=False)
    assert report.findings == []
    voted = copy.deepcopy(fps)
    voted[odd]["stack"]["torch"] = {"version": "2.3.1"}  # one node's own torch
    found = _drift(fleet, voted, stack=False).findings
    assert [(f.node, f.property, f.kind) for f in found] == [(odd, "torch", "majority")]


def _bare(fps: dict[str, Any]) -> dict[str, Any]:
    """Nodes trainfleet never deployed to: no hosts block, no genders block (the team's own
    pdsh), each its own hostname."""
    bare = _own_hostnames(fps, {node: f"own-{node}" for node in fps})
    for fp in bare.values():
        fp["hosts"]["block"] = None
        fp["pdsh"]["genders"]["block"] = None
    return bare


def test_an_unmanaged_steps_files_are_not_compared(fleet):
    bare = _bare(_fingerprints(fleet, fleet.converged))
    nodes = {n.name for n in fleet.cluster.nodes}
    assert {(f.node, f.property) for f in _drift(fleet, bare).findings} >= {
        (n, "pdsh nodes") for n in nodes
    }
    found = _drift(fleet, bare, pdsh=False, hosts=False, hostname=False).findings
    assert found == []


def test_managed_expectations_leave_out_each_unmanaged_steps_properties_only(fleet):
    plan = fleet.plan.nodes[fleet.cluster.nodes[0].name]
    steps = expected_steps(plan)
    every = managed_expectations(steps, {})
    adopted = managed_expectations(steps, {"hostname": False, "hosts": False})
    assert set(every) - set(adopted) == {"hostname", "hostname (persistent)", "hosts block"}
    assert "stale /etc/hosts lines" in adopted  # the job's: a name resolving elsewhere
    no_mesh = managed_expectations(steps, {"ssh_mesh": False})
    mesh = set(ssh_mesh.expect(plan))
    assert mesh and not mesh & set(no_mesh) and set(every) - set(no_mesh) == mesh


# -- drift before a first deploy: per step and node, what the deploy would change -------------


def test_drift_on_fresh_nodes_says_per_step_and_node_what_a_deploy_would_change(fleet):
    report = _drift(fleet, _bare(_fingerprints(fleet, fleet.converged)), hostname=False)
    nodes = {n.name for n in fleet.cluster.nodes}
    assert "hostname" not in report.would_change
    assert set(report.would_change) == {"hosts", "pdsh"}
    assert all(set(on) == nodes for on in report.would_change.values())
    data = report.to_json()
    assert data["would_change"] == report.would_change and data["not_managed"] == ["hostname"]
    lines = report.change_lines()
    assert lines[0].startswith("not managed (the spec's manage:): hostname")
    assert lines[1] == "a deploy would change:"
    assert "  hosts: node[0001-0003]: hosts block (/etc/hosts) would be added" in lines
    assert "  pdsh: node[0001-0003]: pdsh nodes (/etc/genders) would be added" in lines
    managed = _drift(fleet, _bare(_fingerprints(fleet, fleet.converged)))
    assert managed.would_change["hostname"]["node0002"] == [
        "hostname would change from 'own-node0002' to 'node0002'",
        "hostname (persistent) would change from 'own-node0002' to 'node0002'",
    ]


def test_a_node_trainfleet_never_touched_is_not_managed_and_drift_still_says_what_would_change(
    fleet,
):
    untouched = _bare(_fingerprints(fleet, fleet.converged))
    for fp in untouched.values():  # no trace of trainfleet at all (checks.unmanaged)
        fp["known_hosts"]["block"] = None
        for user in fleet.cluster.mesh_users:
            fp[f"mesh_user:{user}"]["authorized"]["block"] = None
            fp[f"mesh_user:{user}"]["config"]["block"] = None
        fp["launchers"] = {}
    report = _drift(fleet, untouched, hostname=False)
    nodes = {n.name for n in fleet.cluster.nodes}
    # one "not managed" per node instead of each missing block, and what a deploy would do
    assert {(f.node, f.property) for f in report.findings if f.kind == "spec"} == {
        (node, "trainfleet") for node in nodes
    }
    assert {"hosts", "pdsh", "ssh_mesh", "launchers"} <= set(report.would_change)
    assert all(set(on) == nodes for on in report.would_change.values())


def test_a_converged_report_says_nothing_would_change():
    report = _report([])
    assert report.would_change == {} and "would_change" not in report.to_json()
    assert report.change_lines() == []


def _report(findings: list[Finding]):
    from trainfleet.compare import Report

    report = Report(cluster="c", nodes=["n1"], observed={"n1": {}}, findings=findings)
    report.would_change = deploy_changes(findings, {"n1": {"hostname": "hostname"}})
    return report


@pytest.mark.parametrize(
    "finding, text",
    [
        (
            Finding("n1", "hostname", "spec", "localhost", "n1"),
            "hostname would change from 'localhost' to 'n1'",
        ),
        (
            Finding("n1", "hosts block", "spec", ABSENT, "abc", files=("/etc/hosts",)),
            "hosts block (/etc/hosts) would be added",
        ),
        (
            Finding("n1", "memlock file", "spec", "abc", ABSENT),
            "memlock file would be removed",
        ),
        (
            Finding("n1", "launcher files", "spec", "a", "b", files=tuple("abcde")),
            "launcher files (a, b, c, 2 more) would be rewritten",
        ),
        (
            Finding("n1", "ssh mesh (root)", "spec", "fails: " + "x" * 200, "ok"),
            f"ssh mesh (root) would change from 'fails: {'x' * 70}...' to 'ok'",
        ),
    ],
)
def test_each_change_is_said_in_words_on_one_short_line(finding, text):
    assert change_text(finding) == text


def test_only_spec_findings_of_a_step_are_changes_a_deploy_would_make():
    findings = [
        Finding("n1", "hostname", "unique", "localhost", "also on n2"),  # the job's: no step's
        Finding("n1", "gpus", "spec", "1x A100", "none"),  # no step sets it
        Finding("n1", "hostname", "spec", "localhost", "n1"),
    ]
    steps = {"n1": {"hostname": "hostname", "gpus": None}}
    assert deploy_changes(findings, steps) == {
        "hostname": {"n1": ["hostname would change from 'localhost' to 'n1'"]}
    }
