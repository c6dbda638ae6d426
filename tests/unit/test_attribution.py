"""Attribution by the N x N pattern (checks/attribution.py): every pattern the preflight's pair
stages can see, at several cluster sizes."""

from __future__ import annotations

import itertools

import pytest

from checks.attribution import Attribution, attribute


def names(n: int) -> list[str]:
    return [f"node{i}" for i in range(1, n + 1)]


def every_pair(nodes: list[str]) -> set[tuple[str, str]]:
    """N x N, both ways, as reachability and the SSH mesh test."""
    return {(a, b) for a, b in itertools.permutations(nodes, 2)}


def both_ways(*pairs: tuple[str, str]) -> set[tuple[str, str]]:
    return {p for a, b in pairs for p in ((a, b), (b, a))}


@pytest.mark.parametrize("n", [3, 4, 8, 64])
def test_a_node_no_peer_reaches_is_the_only_one_named(n):
    nodes = names(n)
    cut = nodes[2]  # node3
    failed = {(src, cut) for src in nodes if src != cut}
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == {cut: "no peer reaches it"}
    assert verdict.links == [] and not verdict.unexplained
    assert verdict.left_out(nodes) == [cut]


@pytest.mark.parametrize("n", [4, 8, 64])
def test_a_node_that_reaches_none_is_the_only_one_named(n):
    nodes = names(n)
    failed = {("node2", dst) for dst in nodes if dst != "node2"}
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == {"node2": "it reaches no peer"}
    assert verdict.left_out(nodes) == ["node2"]


def test_a_node_cut_off_both_ways_is_named_so():
    nodes = names(8)
    failed = both_ways(*[("node5", other) for other in nodes if other != "node5"])
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == {"node5": "fails with every peer"}


@pytest.mark.parametrize("n", [2, 3, 4, 8, 64])
def test_a_single_failing_pair_is_a_link_with_both_ends_named(n):
    nodes = names(n)
    verdict = attribute(nodes, every_pair(nodes), {(nodes[-1], nodes[0])})  # one way only
    assert verdict.links == [(nodes[0], nodes[-1])]  # lower-ranked end first
    assert verdict.nodes == {} and not verdict.unexplained
    assert verdict.left_out(nodes) == [nodes[0], nodes[-1]]


def test_two_links_sharing_a_node_name_the_shared_node_alone():
    nodes = names(8)
    failed = both_ways(("node1", "node3"), ("node1", "node5"))
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == {"node1": "fails with node3, node5"}
    assert verdict.links == [] and verdict.left_out(nodes) == ["node1"]


def test_a_star_of_failing_pairs_names_its_peers_in_rank_order():
    nodes = names(12)
    failed = both_ways(("node1", "node10"), ("node1", "node2"))
    assert attribute(nodes, every_pair(nodes), failed).nodes == {
        "node1": "fails with node2, node10"
    }


def test_two_links_that_share_no_node_are_two_links():
    nodes = names(8)
    failed = both_ways(("node1", "node3"), ("node6", "node8"))
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.links == [("node1", "node3"), ("node6", "node8")] and verdict.nodes == {}


@pytest.mark.parametrize("n", [8, 64])
def test_two_bad_nodes_are_both_named_and_nobody_else(n):
    nodes = names(n)
    bad = {"node2", "node5"}
    failed = {(a, b) for a, b in every_pair(nodes) if b in bad}
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == dict.fromkeys(sorted(bad), "no peer reaches it")
    assert verdict.left_out(nodes) == ["node2", "node5"]


@pytest.mark.parametrize("n", [4, 8, 64])
def test_a_split_into_halves_is_no_node_or_link_and_leaves_everyone_out(n):
    nodes = names(n)
    half = set(nodes[: n // 2])
    failed = {(a, b) for a, b in every_pair(nodes) if (a in half) != (b in half)}
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.unexplained and verdict.nodes == {} and verdict.links == []
    assert verdict.left_out(nodes) == nodes
    assert len(verdict.failed) == len(failed)


@pytest.mark.parametrize("n", [3, 4, 8, 64])
def test_every_pair_failing_is_no_node_or_link(n):
    nodes = names(n)
    verdict = attribute(nodes, every_pair(nodes), every_pair(nodes))
    assert verdict.unexplained and verdict.left_out(nodes) == nodes


def test_an_asymmetric_one_way_cut_names_the_node_and_its_direction():
    nodes = names(4)
    # node4 sends nowhere it is tested to (its egress to the cluster is cut), and receives fine
    failed = {("node4", "node1"), ("node4", "node2"), ("node4", "node3")}
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.nodes == {"node4": "it reaches no peer"}
    assert verdict.left_out(nodes) == ["node4"]


def test_nothing_failing_is_no_verdict():
    nodes = names(4)
    assert attribute(nodes, every_pair(nodes), set()) == Attribution()


def test_a_node_tested_with_one_peer_only_is_never_told_from_its_link():
    # a ring of bandwidth pairs where a node has one partner: the pair is a link
    nodes = names(2)
    verdict = attribute(nodes, {("node1", "node2")}, {("node1", "node2")})
    assert verdict.links == [("node1", "node2")] and verdict.nodes == {}


def test_a_ring_of_pairs_tells_a_slow_node_from_a_slow_link():
    nodes = names(6)
    ring = {(nodes[i], nodes[(i + 1) % 6]) for i in range(6)}
    slow_node = attribute(nodes, ring, {("node3", "node4"), ("node4", "node5")})
    assert slow_node.nodes == {"node4": "fails with every peer"} and slow_node.links == []
    slow_link = attribute(nodes, ring, {("node3", "node4")})
    assert slow_link.links == [("node3", "node4")] and slow_link.nodes == {}


def test_pairs_nobody_tested_and_a_nodes_pair_with_itself_are_not_judged():
    nodes = names(4)
    tested = every_pair(nodes) - {("node1", "node2")}
    verdict = attribute(nodes, tested, {("node1", "node2"), ("node3", "node3")})
    assert verdict == Attribution()


def test_more_faults_than_a_minority_explains_leave_everyone_out():
    nodes = names(4)
    failed = both_ways(("node1", "node2"), ("node3", "node4"))  # two links in four nodes
    verdict = attribute(nodes, every_pair(nodes), failed)
    assert verdict.unexplained and verdict.left_out(nodes) == nodes


def lab_cluster(n: int):
    from trainfleet.spec import parse_cluster

    return parse_cluster(
        "nodes:\n"
        + "".join(f"  - {{name: node{i}, address: 198.18.0.{10 + i}}}\n" for i in range(1, n + 1))
    )


def matrix(n: int, fail) -> dict[str, dict[str, str]]:
    """Every node's probe of every node and of node1:29500; ``fail(src, target)``: its reason."""
    nodes = names(n)
    return {src: {t: fail(src, t) or "ok" for t in [*nodes, "node1:29500"]} for src in nodes}


def test_the_issues_cut_off_node_is_the_only_one_reachability_names():
    """The issue's measure: node3 drops inbound TCP 1024-65535 from the cluster; it still
    reaches everyone (and the rendezvous port). Before, every node was named."""
    from checks.healthy_subset import healthy_subset
    from checks.reachability_verdicts import reachability_problems

    seen = matrix(4, lambda src, t: "timeout timed out" if t == "node3" and src != t else None)
    problems = reachability_problems(lab_cluster(4), seen)
    assert [(p.node, p.cause) for p in problems] == [
        (
            "node3",
            "no peer reaches it: node1 cannot reach node3: timeout timed out; node2 cannot reach "
            "node3: timeout timed out; node4 cannot reach node3: timeout timed out",
        )
    ]
    subset = healthy_subset(names(4), problems)
    assert subset["nodes"] == ["node1", "node2", "node4"] and list(subset["excluded"]) == ["node3"]


def test_reachability_names_a_link_on_both_ends_and_an_unexplained_pattern_on_everyone():
    from checks.healthy_subset import healthy_subset
    from checks.reachability_verdicts import reachability_problems

    link = matrix(4, lambda src, t: "refused" if (src, t) == ("node2", "node4") else None)
    problems = reachability_problems(lab_cluster(4), link)
    cause = "the link node2-node4 fails (node2 cannot reach node4: refused): both ends named"
    assert [(p.node, p.cause) for p in problems] == [
        ("node2", f"{cause}, neither told at fault"),
        ("node4", f"{cause}, neither told at fault"),
    ]
    halves = {"node1": 0, "node2": 0, "node3": 1, "node4": 1}
    split = matrix(
        4, lambda src, t: "timeout" if halves[src] != halves.get(t, halves[src]) else None
    )
    problems = reachability_problems(lab_cluster(4), split)
    assert {p.node for p in problems} == set(names(4))
    assert all("no single node or link explains" in p.cause for p in problems)
    assert healthy_subset(names(4), problems)["note"] == (
        "every node failed alike: the cause is not one node's"
    )


def test_no_node_reaching_the_rendezvous_port_names_the_master_and_one_that_cannot_names_itself():
    from checks.reachability_verdicts import reachability_problems

    closed = matrix(4, lambda src, t: "refused" if t == "node1:29500" and src != "node1" else None)
    assert [(p.node, p.cause) for p in reachability_problems(lab_cluster(4), closed)] == [
        ("node1", "no node reaches node1:29500: node2: refused; node3: refused; node4: refused")
    ]
    one = matrix(4, lambda src, t: "timeout" if (src, t) == ("node3", "node1:29500") else None)
    assert [(p.node, p.cause) for p in reachability_problems(lab_cluster(4), one)] == [
        ("node3", "cannot reach node1:29500: timeout")
    ]
