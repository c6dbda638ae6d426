"""The bandwidth stage per rail (issue #41): which rails a node has, the rail-aligned pairs and
their ports, the worst case with them, and the verdicts over plain figures: a slow rail is named
on its node with its rail, a rail slow on every node is the rail's fabric, not a node."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from checks import stage_runner
from checks.bandwidth_stage import bandwidth_plan
from checks.pair_ports import hosted_ports, rail_bound, rail_ports
from checks.preflight_scope import WAIT, worst_case
from checks.rail_stage import rail_jobs, rail_lines, rail_plan
from checks.rail_verdicts import (
    hca_entries,
    node_rails,
    rail_failures,
    rail_problems,
    rail_rounds,
)
from trainfleet.spec import SpecError, parse_cluster

NODES = ["node1", "node2", "node3", "node4"]


def cluster(count: int = 4, gpus: int = 0, rails: str | None = "[eth1, eth2]"):
    nodes = "".join(
        f"  - {{name: node{i}, address: 198.18.0.{10 + i}, gpus: {gpus}}}\n"
        for i in range(1, count + 1)
    )
    preflight = f"preflight: {{rails: {rails}}}\n" if rails is not None else ""
    return parse_cluster(preflight + "nodes:\n" + nodes)


RAILS = {node: ["if:eth1", "if:eth2"] for node in NODES}
# the ring's pairs of four nodes, as the bandwidth stage runs them
PAIRS = [("node1", "node2"), ("node3", "node4"), ("node2", "node3"), ("node1", "node4")]


def figures(rail1: dict, rail2: dict) -> dict:
    """Rail pair -> busbw: rail 1 (index 0) and rail 2 (index 1) of each node pair."""
    return {(pair, 0): rail1[pair] for pair in PAIRS} | {(pair, 1): rail2[pair] for pair in PAIRS}


# lab-like noise: 0.32-0.46 GB/s (the measure)
NOISY = dict(zip(PAIRS, [0.41, 0.33, 0.46, 0.38], strict=True))


# -- which rails ----------------------------------------------------------------------------------


def test_cpu_nodes_take_the_specs_interfaces_as_rails_and_the_default_has_none():
    assert node_rails(cluster(), {}) == {node: ["if:eth1", "if:eth2"] for node in NODES}
    assert node_rails(cluster(rails=None), {}) == {node: [] for node in NODES}
    # one rail is nothing to tell apart
    assert node_rails(cluster(rails="[eth1]"), {}) == {node: [] for node in NODES}


def test_gpu_nodes_take_the_hcas_nccl_ib_hca_lists_one_per_gpu():
    envs = {
        "node1": {"NCCL_IB_HCA": "=mlx5_0,mlx5_3,mlx5_4"},
        "node2": {"NCCL_IB_HCA": "mlx5_0,mlx5_3"},
        "node3": {"NCCL_IB_HCA": "^mlx5_2"},  # an exclusion names what is not used: no rails
        "node4": {"NCCL_IB_HCA": "=mlx5_0,mlx5 3"},  # no name: nothing guessed
    }
    rails = node_rails(cluster(gpus=2, rails=None), envs)
    assert rails == {
        "node1": ["hca:mlx5_0", "hca:mlx5_3"],  # two GPUs: two rails
        "node2": ["hca:mlx5_0", "hca:mlx5_3"],
        "node3": [],
        "node4": [],
    }
    assert hca_entries("=mlx5_4:1,mlx5_5:1") == ["mlx5_4:1", "mlx5_5:1"]


def test_the_spec_refuses_a_rail_that_is_no_interface_name_or_one_named_twice():
    with pytest.raises(SpecError, match="not an interface name"):
        cluster(rails="['eth1,eth2', eth3]")
    with pytest.raises(SpecError, match="twice"):
        cluster(rails="[eth1, eth1]")


# -- the rail pairs: the node pairs' rounds, rail by rail, one rank each --------------------------


def test_each_node_pair_runs_on_every_rail_both_nodes_have_in_the_same_rounds():
    lab = cluster(3)
    rounds, _ = bandwidth_plan(lab)
    rails, plan = rail_plan(lab, rounds, {})
    assert [[(pair, r) for pair, r in items] for items in plan] == [
        [(pair, r) for pair in pairs for r in (0, 1)] for pairs in rounds
    ]
    # a node with no rails takes no rail pair
    fewer = {**rails, "node2": []}
    assert [pair for items in rail_rounds(rounds, fewer) for pair, _ in items] == [
        ("node1", "node3"),
        ("node1", "node3"),
    ]


def test_a_rail_pair_is_rank_i_of_each_node_on_rail_i_on_a_port_hygiene_checks():
    lab = cluster(3)
    rounds, _ = bandwidth_plan(lab)
    rails, plan = rail_plan(lab, rounds, {})
    ports = rail_ports(lab, rounds)
    jobs = rail_jobs(lab, rails, plan, ports, 30)
    used = [job[4] for mine in jobs.values() for job in mine if job[1] == 0]
    assert len(used) == len(set(used)) == 6  # 3 pairs x 2 rails, each a port of its own
    hosted = hosted_ports(lab)
    for node, mine in jobs.items():
        for end, first, world, host, port, size, rail, local in mine:
            assert world == 2 and size == 4 << 20 and rail == rails[node][local]
            assert end in (30, 60, 90)  # its round's end, as the node pairs'
            if first == 0:  # the pair's first node hosts its rendezvous, on a port checked
                assert host == lab.node(node).address and port in hosted[node]
        # one rank per rail: local rank r runs rail r's pairs alone
        assert {(job[6], job[7]) for job in mine} == {("if:eth1", 0), ("if:eth2", 1)}
    # the other end of each pair meets on the same port with the same end
    by_port: dict[int, list[tuple]] = {}
    for mine in jobs.values():
        for job in mine:
            by_port.setdefault(job[4], []).append(job)
    assert all(sorted(j[1] for j in both) == [0, 1] for both in by_port.values())
    assert all(len({(j[0], j[7]) for j in both}) == 1 for both in by_port.values())


@pytest.mark.parametrize("count", [2, 3, 7])
def test_the_worst_case_covers_the_rail_command(count):
    lab = cluster(count)
    rounds, _ = bandwidth_plan(lab)
    rails, plan = rail_plan(lab, rounds, {})
    jobs = rail_jobs(lab, rails, plan, rail_ports(lab, rounds), 30)
    last = max(job[0] for mine in jobs.values() for job in mine)
    assert worst_case(lab)["rails"] >= last + WAIT
    assert "rails" not in worst_case(cluster(count, rails=None))
    assert rail_bound(cluster(count, gpus=8, rails=None)) == 8  # HCAs: one per GPU at most


# -- collective.py's side: one interface or HCA for the rail's process group ----------------------


def test_a_rank_takes_its_rails_interface_or_hca_and_refuses_anything_else(monkeypatch):
    path = Path(stage_runner.STAGES) / "collective.py"
    spec = importlib.util.spec_from_file_location("collective_rails", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "NCCL_IB_HCA"):
        monkeypatch.setenv(name, "before")
    module.use_rail("if:eth2")
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("eth2", "=eth2")
    module.use_rail("hca:mlx5_4")
    assert os.environ["NCCL_IB_HCA"] == "=mlx5_4"
    for bad in ("eth2", "if:eth1,eth2", "hca:mlx5 4", "ib:mlx5_4", "if:"):
        with pytest.raises(module.Failed, match="not a rail"):
            module.use_rail(bad)


def test_a_rank_with_only_other_ranks_rails_exits_at_once_without_torch():
    """A re-measure of rail 2 alone still starts local rank 0 on each node (ranks are counted up
    to the highest rail): it says its start and ends, importing nothing (torch, a GPU's
    context); a rank with a job of its own goes on to import torch."""
    import subprocess
    import sys

    path = Path(stage_runner.STAGES) / "collective.py"
    job = "30,0,2,127.0.0.1,29502,4194304,if:eth2,1"
    env = {"PATH": os.environ["PATH"], "PYTHONNOUSERSITE": "1"}
    idle = subprocess.run(
        [sys.executable, "-S", str(path), "0", "gloo", job],
        capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert idle.returncode == 0 and '"step": "start"' in idle.stdout
    assert "import" not in idle.stdout and idle.stdout.count("\n") == 1
    busy = subprocess.run(
        [sys.executable, "-S", str(path), "1", "gloo", job],
        capture_output=True, text=True, timeout=30, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert busy.returncode == 2 and '"stage": "import"' in busy.stdout  # -S: no torch to import


# -- the verdicts ---------------------------------------------------------------------------------


def test_healthy_noisy_rails_pass():
    assert rail_problems(figures(NOISY, NOISY), RAILS, 0.5, NODES) == []


def test_one_slow_rail_on_one_node_is_named_with_its_rail_not_its_other_rail():
    slow = {pair: (0.05 if "node3" in pair else bw) for pair, bw in NOISY.items()}
    found = rail_problems(figures(NOISY, slow), RAILS, 0.5, NODES)
    assert [(p.node, p.cause.split(":")[0]) for p in found] == [("node3", "rail eth2 slow")]
    cause = found[0].cause
    # the rail's median: each node's best pair on it (node1 0.41, node2 0.41, node4 0.38)
    assert "0.05 GB/s, median 0.40 of rail 2 (eth2)" in cause
    assert "(with node4: 0.05, with node2: 0.05 GB/s)" in cause
    assert cause.endswith("the node's rail is slow with every partner on it")


def test_a_rail_slow_on_every_node_is_the_rails_fabric_not_a_node():
    slow = {pair: bw / 8 for pair, bw in NOISY.items()}
    found = rail_problems(figures(NOISY, slow), RAILS, 0.5, NODES)
    assert [p.node for p in found] == NODES  # every node alike: no one node is at fault
    assert {p.cause for p in found} == {
        "rail 2 (eth2) is slow on every node: its median 0.05 GB/s is under 0.5 of the best "
        "rail's 0.43 GB/s: the rail's fabric (its switch or cables), not one node"
    }


def test_a_rail_pair_slow_only_together_is_a_link_on_that_rail():
    slow = {**NOISY, ("node2", "node3"): 0.04}
    found = rail_problems(figures(slow, NOISY), RAILS, 0.5, NODES)
    assert [p.node for p in found] == ["node2", "node3"]
    assert found[0].cause.startswith("the rail 1 (eth1) link node2 eth1-node3 eth1 is slow: 0.04")


def test_figures_for_people_give_each_rail_pair_against_its_rails_median():
    details = {
        "rails": {
            "medians_gbps": {"1": 0.41, "2": 0.4},
            "pairs": {"node1-node2 rail 2 (eth2-eth2)": {"busbw_gbps": 0.05, "of_median": 0.125}},
        }
    }
    assert rail_lines(details)[0] == (
        "busbw node1-node2 rail 2 (eth2-eth2): 0.05 GB/s (0.12 of the rail's median)"
    )
    assert rail_lines(details)[1].startswith("busbw rail medians: rail 1 0.41 GB/s, rail 2 0.40")
    assert rail_lines({}) == []


def test_a_rail_pair_without_a_figure_fails_its_failing_end_in_its_words_or_both_ends():
    pair = ("node1", "node2")
    finished = [{"step": step, "job": 1} for step in ("start", "reached", "joined", "done")]
    reset = finished[:2] + [
        {"step": "error", "job": 1, "stage": "collective", "error": "RuntimeError: reset"}
    ]
    found = rail_failures(pair, 1, RAILS, {"node1": finished, "node2": reset})
    assert [(p.node, p.cause) for p in found] == [
        (
            "node2",
            "rail eth2: the timed all_reduce with node1's rail eth2 did not finish: "
            "collective failed: RuntimeError: reset",
        )
    ]
    # both finished yet no figure: no pass, both ends named
    found = rail_failures(pair, 0, RAILS, {"node1": finished, "node2": finished})
    assert [p.node for p in found] == ["node1", "node2"]
    assert found[0].cause == (
        "rail eth1: the timed all_reduce of node1-node2 rail 1 (eth1-eth1) reported no usable "
        "figure"
    )


# -- a slow rail pair is measured twice -----------------------------------------------------------


def rail_ranks_run(commands: dict, seconds_of) -> dict[str, list[str]]:
    """What each node's ranks print for their rail jobs ("END,FIRST,WORLD,MASTER,PORT,BYTES,
    RAIL,LOCAL": local rank LOCAL runs it), ``seconds_of(port)`` per all_reduce."""
    import json
    import re

    out = {}
    for node, command in commands.items():
        jobs = re.split(r" (?:gloo|nccl) ", command.get_raw_value())[-1].split()
        out[node] = [
            f"{local} {json.dumps({**step, 'job': index})}"
            for index, job in enumerate(jobs)
            for _, first, world, _, port, nbytes, _, local in [job.split(",")]
            for step in (
                {"step": "start", "rank": int(first)},
                {"step": "joined"},
                {"step": "bandwidth", "bytes": int(nbytes), "seconds": seconds_of(int(port))},
                {"step": "done"},
            )
        ]
    return out


@pytest.mark.parametrize("slow_twice", [False, True])
def test_a_rail_pair_slow_once_is_measured_again_and_judged_by_its_better_figure(
    monkeypatch, slow_twice
):
    """node1-node2's rail 2 (port 29502) is slow in the first command: it alone is measured
    again, on its own port; fast the second time it names nothing, slow again it is a link on
    rail 2. Both figures are kept for people and the JSON."""
    from checks import rail_stage
    from checks.preflight_report import PreflightReport

    lab = cluster(3)
    sent: list[dict[str, str]] = []

    def run_everywhere(state, commands, seconds, stdin=None):
        sent.append({node: c.get_raw_value() for node, c in commands.items()})
        slow = len(sent) == 1 or slow_twice
        return rail_ranks_run(commands, lambda port: 0.2 if slow and port == 29502 else 0.02)

    monkeypatch.setattr(rail_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="lab", nodes=["node1", "node2", "node3"])
    report.details["bandwidth"] = {}
    rail_stage.run_rails(None, lab, report, bandwidth_plan(lab)[0], 0.33)

    assert len(sent) == 2 and sorted(sent[1]) == ["node1", "node2"]
    assert sent[1]["node1"].endswith(" 2 gloo 30,0,2,198.18.0.11,29502,4194304,if:eth2,1")
    assert sent[1]["node2"].endswith(" 2 gloo 30,1,2,198.18.0.11,29502,4194304,if:eth2,1")
    pair = report.details["bandwidth"]["rails"]["pairs"]["node1-node2 rail 2 (eth2-eth2)"]
    fast, slow = round((4 << 20) / 0.02 / 1e9, 4), round((4 << 20) / 0.2 / 1e9, 4)
    assert pair["measured_gbps"] == [slow, slow if slow_twice else fast]
    assert pair["busbw_gbps"] == (slow if slow_twice else fast)
    (line,) = [line for line in rail_lines(report.details["bandwidth"]) if "twice" in line]
    assert line.startswith("busbw node1-node2 rail 2 (eth2-eth2): ")
    assert line.endswith(" GB/s, the better judged)")
    if slow_twice:
        assert [p.node for p in report.problems] == ["node1", "node2"]
        assert report.problems[0].cause.startswith(
            "the rail 2 (eth2) link node1 eth2-node2 eth2 is"
        )
    else:
        assert report.problems == []


@pytest.mark.parametrize("healthy_again", [True, False])
def test_a_rail_slow_everywhere_once_is_measured_again_and_judged_by_its_better_median(
    monkeypatch, healthy_again
):
    """The lab's throttled run, measured on a loaded CI machine: node2's rail 2 is slow with
    both partners, and node1-node3 on rail 2, healthy, was slowed by the load the first time.
    That pair made rail 2's median (each node's best pair), under the fraction of rail 1's: the
    rail looked slow on every node, so all its pairs were measured again. Its median is then
    taken from the better figures: node1-node3 fast again clears the rail's fabric, and node2's
    rail eth2 alone is named; slow again, the rail's fabric stands, on every node."""
    from checks import rail_stage
    from checks.preflight_report import PreflightReport

    lab = cluster(3)
    rounds = bandwidth_plan(lab)[0]
    by_port = {port: item for item, port in rail_ports(lab, rounds).items()}
    sent: list[dict[str, str]] = []

    def seconds_of(port: int) -> float:
        pair, r = by_port[port]
        if r == 1 and "node2" in pair:
            return 0.2  # node2's eth2: slow every time
        if r == 1 and (len(sent) == 1 or not healthy_again):
            return 0.08  # node1-node3 on rail 2: slowed by the load
        return 0.02

    def run_everywhere(state, commands, seconds, stdin=None):
        sent.append({node: c.get_raw_value() for node, c in commands.items()})
        return rail_ranks_run(commands, seconds_of)

    monkeypatch.setattr(rail_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="lab", nodes=["node1", "node2", "node3"])
    report.details["bandwidth"] = {}
    rail_stage.run_rails(None, lab, report, rounds, 0.33)

    assert len(sent) == 2  # every pair of rail 2 measured again, in one more command
    rails = report.details["bandwidth"]["rails"]
    again = {name for name, p in rails["pairs"].items() if "measured_gbps" in p}
    assert again == {
        f"{p} rail 2 (eth2-eth2)" for p in ("node1-node2", "node2-node3", "node1-node3")
    }
    fast, noisy = round((4 << 20) / 0.02 / 1e9, 4), round((4 << 20) / 0.08 / 1e9, 4)
    assert rails["medians_gbps"] == {"1": fast, "2": fast if healthy_again else noisy}
    if healthy_again:
        assert [p.node for p in report.problems] == ["node2"]
        assert report.problems[0].cause.startswith("rail eth2 slow: ")
        assert rails["pairs"]["node1-node3 rail 2 (eth2-eth2)"]["of_median"] == 1.0
    else:
        assert [p.node for p in report.problems] == ["node1", "node2", "node3"]
        assert "rail 2 (eth2) is slow on every node" in report.problems[0].cause
