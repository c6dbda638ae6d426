"""One list of the environment variable families (trainfleet.nccl.ENV_PREFIXES): the spec's
grammar, the facts, drift and the preflight's hygiene stage all take it from there, and what the
spec sets is checked as processes see it."""

from __future__ import annotations

import re
from pathlib import Path

from facts.nccl_env_facts import NcclEnvSeen
from trainfleet.capabilities import RULES, nccl_env
from trainfleet.capabilities.nccl_env import NCCL
from trainfleet.compare import compare
from trainfleet.grammar import env_name_problem
from trainfleet.nccl import ENV_PREFIXES, OWNED_PREFIXES, SHARED_PREFIXES, checked_env
from trainfleet.plan import plan_cluster
from trainfleet.plan_types import Gathered
from trainfleet.spec import parse_cluster

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("trainfleet", "facts", "checks", "operations", "runtime", "deploy", "templates")
HOME = ROOT / "trainfleet" / "nccl.py"  # the one place the list is written
FAMILIES = ("NCCL", "GLOO", "UCX", "TORCH", "CUDA")
# Families written as strings side by side (("NCCL_", "GLOO_"), as a tuple of prefixes holds
# them), an alternation of families (NCCL|GLOO), or a slash-separated list of them (NCCL_/GLOO_).
# One family alone is no list (/etc/nccl.conf takes NCCL_ variables only).
_NAME = "|".join(FAMILIES)
QUOTED = re.compile(rf"""["'](?:{_NAME})_["'],\s*["'](?:{_NAME})_["']""")
ALTERNATION = re.compile(rf"\b((?:{_NAME})(?:\|(?:{_NAME}))+)\)?_")
SLASHED = re.compile(rf"\b((?:{_NAME})_(?:/(?:{_NAME})_)+)")


def _sources() -> list[Path]:
    return [
        path
        for folder in PRODUCT
        for path in sorted((ROOT / folder).rglob("*"))
        if path.suffix in (".py", ".sh", ".j2") and path != HOME
    ]


def _families(text: str, separator: str) -> set[str]:
    return {name.strip("_()") for name in text.split(separator)}


def test_no_second_list_of_environment_families_in_the_product():
    """No module, script or template spells the prefixes as code again (a tuple of them, a
    regex or shell alternation); a list in prose or in the spec reference's help (a `(A|B)_`
    in backticks) names exactly one of the list's sets."""
    sets = {
        frozenset(p.removesuffix("_") for p in group)
        for group in (ENV_PREFIXES, OWNED_PREFIXES, SHARED_PREFIXES)
    }
    copies, disagree = [], []
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        where = path.relative_to(ROOT)
        copies += [f"{where}: {m.group(0)}" for m in QUOTED.finditer(text)]
        for m in ALTERNATION.finditer(text):
            if text[max(m.start() - 2, 0) : m.start()] != "`(":  # code, not the grammar's help
                copies.append(f"{where}: {m.group(0)}")
            elif frozenset(_families(m.group(1), "|")) not in sets:
                disagree.append(f"{where}: {m.group(0)}")
        for m in SLASHED.finditer(text):
            if frozenset(_families(m.group(1), "/")) not in sets:
                disagree.append(f"{where}: {m.group(0)}")
    assert copies == [], "prefixes spelled again instead of imported from trainfleet.nccl"
    assert disagree == [], "a list of families that is none of trainfleet.nccl's"


def test_the_guard_finds_a_copied_list():
    """The scan above can fail: each way of copying the list is caught."""
    assert QUOTED.search('line.startswith(("NCCL_", "GLOO_"))')
    assert _families(ALTERNATION.search("grep -E '^(NCCL|GLOO)_'").group(1), "|") == {
        "NCCL",
        "GLOO",
    }
    assert _families(SLASHED.search("an NCCL_/GLOO_ name").group(1), "/") == {"NCCL", "GLOO"}
    assert not QUOTED.search('key.startswith("NCCL_")') and not SLASHED.search("NCCL_IB_HCA")


def test_the_schema_takes_exactly_the_families_of_the_list():
    for prefix in ENV_PREFIXES:
        assert env_name_problem(f"{prefix}X") is None
        assert env_name_problem(prefix) is not None  # a family needs a name after it
    for name in ("LD_LIBRARY_PATH", "NCCLX_A", "nccl_debug", "XNCCL_A", "NCCL_A\nB"):
        assert env_name_problem(name) is not None
    accepts = NCCL.keys["env"].accepts  # the spec reference says what the grammar takes
    assert {frozenset(_families(m.group(1), "|")) for m in ALTERNATION.finditer(accepts)} == {
        frozenset(p.removesuffix("_") for p in ENV_PREFIXES)
    }


def test_owned_and_shared_families_split_the_list():
    assert set(OWNED_PREFIXES) | set(SHARED_PREFIXES) == set(ENV_PREFIXES)
    assert not set(OWNED_PREFIXES) & set(SHARED_PREFIXES)
    seen = {"NCCL_X": "1", "UCX_Y": "2", "CUDA_HOME": "/usr/local/cuda", "TORCH_Z": "3"}
    assert checked_env(seen, ["TORCH_Z"]) == {"NCCL_X": "1", "UCX_Y": "2", "TORCH_Z": "3"}


# ---- drift: what the spec sets is checked as processes see it ---------------------------------

SPEC = """\
nodes:
  - {name: gpu-a01, address: 192.0.2.11}
  - {name: gpu-a02, address: 192.0.2.12}
nccl:
  env: {TORCH_NCCL_ASYNC_ERROR_HANDLING: 1, CUDA_DEVICE_MAX_CONNECTIONS: 1}
"""


def _network(address: str) -> dict:
    return {
        "interfaces": [
            {"name": "eth0", "addresses": [address], "bridge": False, "cidrs": [f"{address}/24"]}
        ],
        "ib_ports": [],
    }


def _drift(seen: dict[str, dict[str, dict[str, str]]]) -> list[tuple[str, str, str, str | None]]:
    """The nccl_env capability's findings where each node's files are the plan's and its
    shells see ``seen[node]`` (the plan's variables where not given)."""
    cluster = parse_cluster(SPEC)
    plan = plan_cluster(
        cluster, Gathered(networks={n.name: _network(n.address) for n in cluster.nodes})
    )
    observed, expected = {}, {}
    for name, node_plan in plan.nodes.items():
        fp = nccl_env.converged(node_plan)
        fp["nccl_seen"].update(seen.get(name, {}))
        observed[name] = nccl_env.observe(fp, node_plan, cluster)
        expected[name] = nccl_env.expect(node_plan)
    report = compare(cluster.name, list(plan.nodes), observed, expected, rules=RULES)
    return [(f.node, f.property, f.observed, f.expected) for f in report.findings]


def test_a_torch_variable_the_spec_sets_but_a_login_shell_lacks_is_drift():
    cluster = parse_cluster(SPEC)
    plan = plan_cluster(
        cluster, Gathered(networks={n.name: _network(n.address) for n in cluster.nodes})
    )
    env = plan.nodes["gpu-a02"].nccl_env.env
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1"
    assert _drift({}) == []  # converged: every shell sees the plan
    login = {k: v for k, v in env.items() if k != "TORCH_NCCL_ASYNC_ERROR_HANDLING"}
    ((node, prop, observed, expected),) = _drift({"gpu-a02": {"login": login}})
    assert (node, prop) == ("gpu-a02", "NCCL env (login shell)")
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in expected.split()
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" not in observed


def test_a_stray_nccl_variable_is_drift_a_cuda_home_the_plan_does_not_name_is_not():
    cluster = parse_cluster(SPEC)
    plan = plan_cluster(
        cluster, Gathered(networks={n.name: _network(n.address) for n in cluster.nodes})
    )
    env = plan.nodes["gpu-a01"].nccl_env.env
    cuda_home = {**env, "CUDA_HOME": "/usr/local/cuda", "TORCH_HOME": "/root/.torch"}
    assert _drift({"gpu-a01": {"non_login": cuda_home, "login": cuda_home}}) == []
    stray = {**env, "NCCL_IB_DISABLE": "0"}
    ((node, prop, observed, _),) = _drift({"gpu-a01": {"non_login": stray}})
    assert (node, prop) == ("gpu-a01", "NCCL env (non-login ssh)")
    assert "NCCL_IB_DISABLE=0" in observed.split()


def test_the_converged_answer_keeps_a_recorded_cuda_home_and_replaces_owned_variables():
    """The controller benchmark's converged node: its shells see the plan's variables; a
    recorded CUDA_HOME stays (no check reads it), a recorded stray NCCL_ one goes."""
    recorded = ["@non-login", "NCCL_OLD=1", "CUDA_HOME=/usr/local/cuda", "@login", "TORCH_A=0"]
    env = {"NCCL_SOCKET_IFNAME": "=eth0", "TORCH_A": "1"}
    seen = NcclEnvSeen().process(NcclEnvSeen().answer({"non_login": env, "login": env}, recorded))
    assert seen == {"non_login": {**env, "CUDA_HOME": "/usr/local/cuda"}, "login": env}
