"""The capability registry: every capability declares every part, names only facts that
exist, and a node answering what ``converged`` says it answers is observed exactly as its
plan expects (so the benchmark's fake nodes and drift agree with the plan by construction)."""

from __future__ import annotations

from types import ModuleType

import pytest

from facts.fingerprint import FACTS, resolve
from tests.unit.test_plan import three_node_plan
from trainfleet.capabilities import CAPABILITIES, missing_parts
from trainfleet.compare import identical_prefixes, unique_properties
from trainfleet.model import Cluster
from trainfleet.plan import ClusterPlan

USERS, PEERS = ["root", "alice"], ["gpu-a01", "gpu-a02"]


def names(capability: ModuleType) -> str:
    return capability.__name__.rsplit(".", 1)[1]


@pytest.fixture(scope="module", params=["certificates", "keys"])
def planned(request, tmp_path_factory) -> tuple[Cluster, ClusterPlan]:
    return three_node_plan(tmp_path_factory.mktemp("keys"), mesh_mode=request.param)


@pytest.mark.parametrize("capability", CAPABILITIES, ids=names)
def test_declares_every_part(capability):
    assert missing_parts(capability) == []


def test_a_missing_part_is_named(monkeypatch):
    capability = CAPABILITIES[0]
    monkeypatch.delattr(capability, "converged")
    assert missing_parts(capability) == ["converged"]


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
    assert set(identical_prefixes()) == {p for c in CAPABILITIES for p in c.MAJORITY}
    assert {"os", "hosts block", "pdsh nodes", "memlock"} <= set(identical_prefixes())
    assert set(unique_properties()) == {"hostname", "boot_id", "machine-id"}


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
