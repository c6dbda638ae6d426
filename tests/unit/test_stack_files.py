"""The stack's files, the CUDA repository's (apt list, yum .repo) and gcc's login profile, are
rendered by the plan (templates/stack/) for the node's OS as its StackVersions fact read it,
and drift diffs each against what the node holds. Nodes are real captured fact outputs
(tests/fixtures/stack/facts); a changed node is one of them with ONE line changed here."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from facts.stack_facts import StackVersions
from tests.unit.test_plan import SPEC, fresh_sshd, plain_network, planned, public_key
from trainfleet.capabilities import RULES, stack
from trainfleet.capabilities.stack import STACK_FILES
from trainfleet.compare import compare, explain
from trainfleet.defaults import CUDA_REPOS, GCC_PROFILE
from trainfleet.keystore import KeyStore
from trainfleet.model import Cluster
from trainfleet.plan_types import Gathered, NodePlan
from trainfleet.spec import parse_cluster

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stack"
APT_LIST = "/etc/apt/sources.list.d/cuda-ubuntu2204-x86_64.list"
YUM_REPO = "/etc/yum.repos.d/cuda-rhel9.repo"
NODE = "gpu-a01"
PINS = 'stack: {cuda: "12.4", nccl: 2.21.5-1, torch: 2.4.1, torch_cuda: cpu}'


def captured(name: str, change: Callable[[str], str] = lambda line: line) -> dict:
    """The StackVersions fact of a captured output, each line through ``change``."""
    output = json.loads((FIXTURES / "facts" / name).read_text())["output"]
    return StackVersions().process([change(line) for line in output])


def node_plan(tmp_path: Path, found: dict, pins: str = PINS) -> tuple[Cluster, NodePlan]:
    """The plan of a node whose StackVersions fact is ``found`` (every node alike)."""
    cluster = parse_cluster(SPEC.replace(PINS, pins))
    names = [n.name for n in cluster.nodes]
    gathered = Gathered(
        networks={n.name: plain_network(n.address) for n in cluster.nodes},
        host_keys={name: [public_key()] for name in names},
        os_families={name: found["os"]["family"] for name in names},
        sshd={name: fresh_sshd() for name in names},
        stacks={name: found for name in names},
    )
    plan = planned(cluster, gathered, KeyStore(cluster.name, root=tmp_path / "keys"))
    return cluster, plan.nodes[NODE]


def stack_files_drift(cluster: Cluster, plan: NodePlan, found: dict) -> list:
    """Drift's findings on the stack's files for a node that answers ``found``, each with the
    files that differ and their diff, as drift explains them."""
    fingerprint = {"stack": found}
    observed = {NODE: {STACK_FILES: stack.observe(fingerprint, plan, cluster)[STACK_FILES]}}
    expected = {NODE: {STACK_FILES: stack.expect(plan)[STACK_FILES]}}
    report = compare(cluster.name, [NODE], observed, expected, rules=RULES)
    wanted = {NODE: stack.wanted_contents(plan)}
    explain(report, wanted, {NODE: stack.found_contents(fingerprint, cluster.mesh_users)})
    return report.findings


def test_the_plan_renders_the_list_a_converged_ubuntu_node_holds(tmp_path):
    found = captured("ubuntu2204_cuda124_converged.json")
    cluster, plan = node_plan(tmp_path, found)
    assert plan.stack.repo_files == {APT_LIST: found["repos"][APT_LIST]}
    assert plan.stack.cuda_repo_url.endswith("/ubuntu2204/x86_64")
    assert stack_files_drift(cluster, plan, found) == []


def test_a_list_pointed_elsewhere_on_the_node_is_drift_with_its_diff(tmp_path):
    official = "https://developer.download.nvidia.com/compute/cuda/repos"
    found = captured(
        "ubuntu2204_cuda124_converged.json",
        lambda line: line.replace(official, "https://mirror.example.com/cuda"),
    )
    cluster, plan = node_plan(tmp_path, found)
    (finding,) = stack_files_drift(cluster, plan, found)
    assert (finding.property, finding.kind, finding.files) == (STACK_FILES, "spec", (APT_LIST,))
    assert f"-deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] {official}" in "\n".join(
        finding.diff
    )
    assert (
        "+deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] https://mirror.example"
        in ("\n".join(finding.diff))
    )


def test_a_mirror_in_the_spec_is_the_list_the_plan_wants(tmp_path):
    """The spec's stack.cuda_repo changes the planned list: the node still on NVIDIA's is drift
    until the deploy rewrites it."""
    found = captured("ubuntu2204_cuda124_converged.json")
    mirror = PINS.replace("{cuda:", '{cuda_repo: "https://mirror.example.com/cuda", cuda:')
    cluster, plan = node_plan(tmp_path, found, mirror)
    assert plan.stack.repo_files[APT_LIST] == (
        "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
        "https://mirror.example.com/cuda/ubuntu2204/x86_64/ /\n"
    )
    assert [f.files for f in stack_files_drift(cluster, plan, found)] == [(APT_LIST,)]


def test_the_rhel_repo_file_and_the_toolset_profile_are_planned_and_diffed(tmp_path):
    """Rocky 9 with the system gcc 11 and gcc 12 pinned: the .repo file as the node holds it,
    and gcc-toolset-12's profile, which the node lacks: drift names the profile alone."""
    found = captured("rocky9_cuda124_versionlocked.json")
    cluster, plan = node_plan(tmp_path, found, PINS.replace("{cuda:", '{gcc: "12", cuda:'))
    assert plan.stack.files.keys() == {YUM_REPO, GCC_PROFILE}
    assert plan.stack.repo_files[YUM_REPO] == found["repos"][YUM_REPO]
    assert plan.stack.gcc_toolset == "gcc-toolset-12"
    (finding,) = stack_files_drift(cluster, plan, found)
    assert finding.files == (GCC_PROFILE,)
    assert "-if [ -r /opt/rh/gcc-toolset-12/enable ]; then . /opt/rh/gcc-toolset-12/enable; fi" in (
        finding.diff
    )
    converged = {**found, "gcc_profile": plan.stack.gcc_files[GCC_PROFILE]}
    assert stack_files_drift(cluster, plan, converged) == []


def test_a_profile_left_where_the_system_gcc_is_the_pin_is_drift(tmp_path):
    """gcc 11 pinned on a Rocky 9 node whose system gcc is 11: no profile may be there; the one
    an earlier gcc 12 pin left (the gcc operation fixture's node) is named, and goes."""
    fixture = json.loads((FIXTURES / "gcc" / "rhel9_system_gcc_drops_profile.json").read_text())
    (found,) = fixture["facts"]["stack_facts.StackVersions"].values()
    cluster, plan = node_plan(tmp_path, found, PINS.replace("{cuda:", '{gcc: "11", cuda:'))
    assert plan.stack.gcc_files == {GCC_PROFILE: None} and plan.stack.gcc_toolset is None
    (finding,) = stack_files_drift(cluster, plan, found)
    assert finding.files == (GCC_PROFILE,)
    assert "+# Written by trainfleet: login shells use gcc-toolset-12's gcc." in finding.diff


@pytest.mark.parametrize(
    "pins",
    [PINS.replace('cuda: "12.4", nccl: 2.21.5-1, ', ""), PINS],
    ids=["torch alone", "cuda pinned"],
)
def test_nothing_is_planned_where_nothing_is_pinned_or_the_node_was_not_read(tmp_path, pins):
    found = captured("ubuntu2204_cuda124_converged.json")
    _, plan = node_plan(tmp_path, found, pins)
    if "cuda" not in pins:  # torch alone: no CUDA repository
        assert plan.stack.files == {} and STACK_FILES not in stack.expect(plan)
    assert stack.with_files(plan.stack, None) == plan.stack
    assert stack.stack_part({"cuda": "12.4"}, "debian", 0, None).files == {}


def test_an_os_release_value_that_is_no_repository_name_plans_no_file():
    """The repository's path is made of the node's os-release id and version: only a name and
    digits make one (a forged version cannot reach a path or a URL)."""
    os_ = captured("ubuntu2204_cuda124_converged.json")["os"]
    assert stack.cuda_distro(os_) == "ubuntu2204"
    for version in ("22.04/../../x", "22.04 x", ""):
        assert stack.cuda_repo_files(CUDA_REPOS, {**os_, "version": version}) == (None, {})
