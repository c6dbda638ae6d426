"""The controller benchmark's fake fleet (bench/controller): its rewritten answers, read through
trainfleet's real facts, are exactly what the plan says a converged node holds."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from bench.controller import fleet as fleet_mod
from bench.controller.measure import pyinfra_args
from bench.controller.record import load
from bench.controller.report import growth
from bench.run import PYINFRA, REPO, parse_results
from facts.fingerprint import DeployState, NodeFingerprint
from facts.hosts import HOSTS_PURPOSE
from trainfleet.mesh import probe_targets


@pytest.fixture(scope="module", params=[4, 16])
def fleet(request, tmp_path_factory) -> fleet_mod.Fleet:
    return fleet_mod.build(request.param, tmp_path_factory.mktemp(f"fleet{request.param}"), load())


def _first_match(responses: dict, command: str):
    """pyinfra's fake connector: the first matcher (substring or pattern) in insertion order."""
    for matcher, response in responses.items():
        if (matcher.search(command) if hasattr(matcher, "search") else matcher in command):
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
        state = fleet_mod.parse_bundle("deploy_state", fleet.converged[node.name].deploy_state, ["root"])
        assert state["hostname"] == {"running": node.name, "static": node.name}
        assert state["hosts"]["block"] == plan.hosts.lines
        assert state["known_hosts"]["block"] == plan.known_hosts
        assert state["pdsh"]["genders"]["block"] == [f"{n} trainfleet" for n in plan.pdsh_nodes]
        assert state["nccl_files"]["profile"] == plan.nccl.profile
        assert state["openmpi"]["users"]["root"]["params"]["block"] == plan.mpi.lines
        user, mine = state["mesh_user:root"], plan.mesh[0]
        assert user["authorized"]["block"] == mine.authorized and user["config"]["block"] == mine.config
        assert user["identity"]["sha256"] == fleet_mod.sha256(mine.identity.private)
        assert {n: f["sha256"] for n, f in state["launchers"].items() if n in plan.launchers.files} == \
            {n: fleet_mod.sha256(c) for n, (c, _) in plan.launchers.files.items()}
        assert node.address in next(i for i in state["network"]["interfaces"] if i["name"] == "eth0")["addresses"]
    identities = [fleet_mod.parse_bundle("fingerprint", a.fingerprint, ["root"], a.targets)["identity"]
                  for a in fleet.converged.values()]
    assert len({i["boot_id"] for i in identities}) == len({i["machine_id"] for i in identities}) == fleet.nodes


def test_fresh_answers_need_the_deploy(fleet):
    for node in fleet.cluster.nodes:
        state = fleet_mod.parse_bundle("deploy_state", fleet.fresh[node.name].deploy_state, ["root"])
        assert state["hostname"]["running"] == "ip-" + node.address.replace(".", "-")
        assert state["hosts"]["block"] is None and state["mesh_user:root"]["identity"] is None


def test_one_nodes_hosts_block_is_named_by_drift(fleet):
    """A node whose /etc/hosts block lost a line: drift names that node, and only it."""
    victim = fleet.cluster.nodes[1].name
    answers = dict(fleet.converged)
    lines = list(answers[victim].fingerprint)
    at = lines.index(f"{fleet_mod.MARK} hosts") + 1
    section = base64.b64decode(lines[at]).decode()
    block = fleet.plan.nodes[victim].hosts.lines[:-1]
    lines[at] = fleet_mod.b64(fleet_mod.joined([fleet_mod.with_plan_block(line, HOSTS_PURPOSE, block)
                                                for line in fleet_mod.text_lines(section)]))
    answers[victim] = replace(answers[victim], fingerprint=lines)
    report = fleet_mod.offline_drift(fleet, answers)
    assert {f.node for f in report.findings} == {victim}
    assert {f.property for f in report.findings} == {"hosts block"}


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
        assert _first_match(responses, DeployState().command(users=["root"]).get_masked_value()) is answers.deploy_state
        assert _first_match(responses, "uname -n") == [node.name]
        proof = NodeFingerprint()
        proof.command(users=["root"], peers=names)
        assert set(proof.process(answers.fingerprint_full)["mesh_proof:root"].values()) == {"ok"}


def test_growth_exponent_and_per_doubling_ratios():
    k, steps = growth({64: 1.0, 128: 2.0, 512: 32.0})
    assert k == pytest.approx(12 / 7)  # the least-squares slope of (6, 0), (7, 1), (9, 5)
    assert [(a, b, round(r, 2)) for a, b, r in steps] == [(64, 128, 2.0), (128, 512, 4.0)]


def test_pyinfra_rerun_and_drift_on_four_fake_nodes(tmp_path):
    """The real thing: pyinfra drives 4 fake nodes; the re-run changes nothing, drift finds nothing."""
    fleet = fleet_mod.build(4, tmp_path / "fleet", load())
    inventory = fleet.write_inventory("converged", tmp_path / "converged.pkl")
    env = {**os.environ, **fleet.env(), "TRAINFLEET_FLEET": str(inventory), "PYINFRA_PROGRESS": "off"}
    for task in ("re-run", "drift"):
        proc = subprocess.run([PYINFRA, *pyinfra_args(task)], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert parse_results(proc.stdout) == (0, 0)
    report = json.loads((fleet.home / "reports" / f"drift-{fleet.cluster.name}.json").read_text())
    assert report["drift"] is False and report["findings"] == []
