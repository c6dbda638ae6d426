"""The capability registry: a part a capability leaves out takes its default (no stubs), names
only facts that exist, and a node answering what ``converged`` says it answers is observed
exactly as its plan expects (so the benchmark's fake nodes and drift agree with the plan by
construction)."""

from __future__ import annotations

import ast
import importlib
import inspect
from types import ModuleType

import pytest

from facts.fingerprint import FACTS, resolve
from tests.unit.test_plan import three_node_plan
from trainfleet.capabilities import CAPABILITIES, HOOKS, RULES, Capability
from trainfleet.model import Cluster
from trainfleet.plan_types import ClusterPlan

USERS, PEERS = ["root", "alice"], ["gpu-a01", "gpu-a02"]


def names(capability: Capability) -> str:
    return capability.name


@pytest.fixture(scope="module", params=["certificates", "keys"])
def planned(request, tmp_path_factory) -> tuple[Cluster, ClusterPlan]:
    return three_node_plan(tmp_path_factory.mktemp("keys"), mesh_mode=request.param)


def test_a_part_left_out_takes_its_default():
    module = ModuleType("trainfleet.capabilities.example")
    module.MAJORITY = ("example",)  # type: ignore[attr-defined]
    capability = Capability.of(module)
    assert capability.name == "example" and capability.MAJORITY == ("example",)
    assert capability.UNIQUE == () and capability.HEALTH == ()
    assert capability.deploy_sections(USERS, {}) == {} == capability.check_sections(USERS, PEERS)
    assert capability.shared(None) is None and capability.plan_part(None, None) is None
    assert capability.observe({}, None, None) == {} == capability.converged(None)


def _only_returns_a_constant(function) -> bool:
    body = ast.parse(inspect.getsource(function)).body[0].body
    body = [s for s in body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
    if len(body) != 1 or not isinstance(body[0], ast.Return):
        return False
    try:
        return body[0].value is None or ast.literal_eval(body[0].value) in ({}, (), [], None)
    except ValueError:  # not a constant
        return False


@pytest.mark.parametrize("capability", CAPABILITIES, ids=names)
def test_no_capability_declares_an_empty_stub(capability):
    """What a capability does not do it leaves out (``Capability``'s defaults), so a new part
    costs no edit of every module."""
    module = importlib.import_module(f"trainfleet.capabilities.{capability.name}")
    stubs = [
        part
        for part in HOOKS
        if callable(getattr(module, part, None)) and _only_returns_a_constant(getattr(module, part))
    ]
    assert stubs == []
    assert [
        part for part in ("MAJORITY", "UNIQUE", "HEALTH") if getattr(module, part, 0) == ()
    ] == []


def test_the_registry_names_each_capability_once_after_its_module():
    assert [c.name for c in CAPABILITIES] == list(dict.fromkeys(c.name for c in CAPABILITIES))
    for capability in CAPABILITIES:
        module = importlib.import_module(f"trainfleet.capabilities.{capability.name}")
        assert Capability.of(module) == capability


@pytest.mark.parametrize("capability", CAPABILITIES, ids=names)
def test_sections_name_facts_that_exist(capability):
    for sections in (
        capability.deploy_sections(USERS, {}),
        capability.check_sections(USERS, PEERS),
    ):
        assert {fact for fact, _ in sections.values()} <= FACTS.keys()
        assert resolve(sections).keys() == sections.keys()


def test_an_unknown_fact_name_fails_loudly():
    with pytest.raises(KeyError, match="no fact is named 'Nothing'"):
        resolve({"nothing": ("Nothing", {})})


def test_no_two_capabilities_share_a_section():
    seen: dict[str, str] = {}
    for capability in CAPABILITIES:
        for section in {
            **capability.deploy_sections(USERS, {}),
            **capability.check_sections(USERS, PEERS),
        }:
            assert section not in seen, f"{section}: {seen.get(section)} and {names(capability)}"
            seen[section] = names(capability)


def test_majority_is_the_union_of_the_capabilities():
    assert set(RULES.majority) == {p for c in CAPABILITIES for p in c.MAJORITY}
    assert {"os", "hosts block", "pdsh nodes", "memlock"} <= set(RULES.majority)
    assert set(RULES.unique) == {"hostname", "boot_id", "machine-id"}
    assert set(RULES.health) == {p for c in CAPABILITIES for p in c.HEALTH} != set()


def converged_answers(plan) -> dict:
    """What a converged node answers, every capability's sections."""
    answers: dict = {}
    for capability in CAPABILITIES:
        answers |= capability.converged(plan)
    return answers


@pytest.mark.parametrize("capability", CAPABILITIES, ids=names)
def test_a_converged_node_is_observed_as_planned(capability, planned):
    """observe(converged(plan)) holds exactly what expect(plan) wants, node by node; each
    capability's converged answers are sections it declares."""
    cluster, plan = planned
    for node_plan in plan.nodes.values():
        answers = converged_answers(node_plan)
        mine = capability.converged(node_plan)
        declared = {
            **capability.deploy_sections(cluster.mesh_users, {}),
            **capability.check_sections(cluster.mesh_users, PEERS),
        }
        assert mine.keys() <= declared.keys()
        seen = capability.observe(answers, node_plan, cluster)
        wanted = capability.expect(node_plan)
        assert {prop: seen.get(prop) for prop in wanted} == wanted
        assert wanted or names(capability) in ("identity", "hardware"), (
            "a capability that expects nothing"
        )


def test_the_converged_managed_files_are_the_planned_ones(planned):
    cluster, plan = planned
    for node_plan in plan.nodes.values():
        answers = converged_answers(node_plan)
        for capability in CAPABILITIES:
            found = capability.found_contents(answers, cluster.mesh_users)
            wanted = capability.wanted_contents(node_plan)
            assert found.keys() == wanted.keys()
            for prop, files in wanted.items():
                assert {f: c.sha for f, c in found[prop].items()} == {
                    f: c.sha for f, c in files.items()
                }, prop
