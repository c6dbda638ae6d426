"""The healthy subset a preflight's report carries: who can train together, who was left out
and why, cut to a multiple of K when the spec asks."""

from __future__ import annotations

from checks.healthy_subset import healthy_lines, healthy_subset
from checks.preflight_report import PreflightReport, Problem

NODES = ["node1", "node2", "node3", "node4", "node5"]
DROPPED = Problem("reachability", "node3", "cannot reach node1:29500 (timed out)")


def test_a_node_a_problem_names_is_left_out_with_its_causes_and_the_rest_keep_rank_order():
    subset = healthy_subset(NODES, [DROPPED, DROPPED, Problem("collective", "node3", "x")])
    assert subset == {
        "nodes": ["node1", "node2", "node4", "node5"],
        "excluded": {
            "node3": ["reachability: cannot reach node1:29500 (timed out)", "collective: x"]
        },
        "multiple_of": None,
        "note": None,
    }
    assert healthy_lines(subset, 5) == [
        "healthy subset: 4 of 5 nodes, named by no problem: node1, node2, node4, node5 (the next "
        "deploy writes their launch files in /etc/trainfleet/launch/healthy/)",
        "left out: node3: reachability: cannot reach node1:29500 (timed out); collective: x",
    ]


def test_a_multiple_of_k_leaves_out_the_last_healthy_nodes_and_says_why():
    subset = healthy_subset(NODES, [DROPPED, Problem("smoke", "node5", "y")], multiple_of=2)
    assert subset["nodes"] == ["node1", "node2"]
    assert subset["excluded"] == {
        "node3": ["reachability: cannot reach node1:29500 (timed out)"],
        "node4": ["left out to keep the subset a multiple of 2"],
        "node5": ["smoke: y"],
    }
    assert healthy_subset(NODES, [], multiple_of=4)["nodes"] == NODES[:4]
    assert healthy_subset(NODES[:1], [], multiple_of=2)["nodes"] == []  # fewer than K pass


def test_a_passing_preflight_readmits_every_node_and_its_report_says_so():
    before = healthy_subset(NODES, [DROPPED])
    assert "node3" in before["excluded"]
    subset = healthy_subset(NODES, [])  # the next preflight, node3 fixed
    assert subset["nodes"] == NODES and subset["excluded"] == {} and subset["note"] is None
    assert healthy_lines(subset, 5) == []
    report = PreflightReport(cluster="lab", nodes=NODES, healthy=subset)
    assert report.to_json()["healthy"] == subset


def test_isolations_culprit_is_left_out_not_every_rank_the_hung_collective_named():
    hung = [Problem("collective", n, "stopped after 'joined' (timed out)") for n in NODES]
    culprit = Problem("isolation", "node4", "its 2-rank collective with node1 failed")
    subset = healthy_subset(NODES, [*hung, culprit])
    assert subset["nodes"] == ["node1", "node2", "node3", "node5"]
    assert subset["excluded"] == {
        "node4": [
            "collective: stopped after 'joined' (timed out)",
            "isolation: its 2-rank collective with node1 failed",
        ]
    }


def test_no_subset_when_every_node_failed_alike_or_a_problem_names_no_node():
    venv = [Problem("collective", n, "import failed: No module named 'torch'") for n in NODES]
    alike = healthy_subset(NODES, venv)
    assert alike["nodes"] == [] and alike["note"] == (
        "every node failed alike: the cause is not one node's"
    )
    assert healthy_lines(alike, 5)[0] == (
        "no healthy subset: every node failed alike: the cause is not one node's"
    )
    stranger = healthy_subset(NODES, [Problem("collective", "?", "torch 2.4 differs")])
    assert stranger["nodes"] == [] and stranger["note"] == (
        "a problem names no node of the cluster (?)"
    )


def test_a_slow_node_is_left_out_with_its_figures_and_its_stamp_keeps_them():
    from datetime import UTC, datetime

    from checks.bandwidth_verdicts import bandwidth_problems, node_figures
    from trainfleet import stamps

    measured = {("node1", "node2"): 0.40, ("node2", "node3"): 0.05, ("node3", "node4"): 0.05}
    measured[("node1", "node4")] = 0.40
    problems = bandwidth_problems(measured, None)
    subset = healthy_subset(NODES[:4], problems)
    assert subset["nodes"] == ["node1", "node2", "node4"]
    (cause,) = subset["excluded"]["node3"]
    assert cause.startswith("bandwidth: slow: 0.05 GB/s, median 0.40 (")
    details = {
        "median_gbps": 0.4,
        "pairs": {"-".join(p): {"nodes": list(p), "busbw_gbps": bw} for p, bw in measured.items()},
    }
    figures = node_figures(details)
    assert figures["node3"] == {"busbw_gbps": 0.05, "median_gbps": 0.4}
    now = datetime(2026, 11, 28, tzinfo=UTC)
    tested = {n: subset["excluded"].get(n, []) for n in NODES[:4]}
    after = stamps.recorded({}, tested, {}, NODES[:4], now, figures=figures)
    assert after["node3"]["passed"] is False and after["node3"]["causes"] == [cause]
    assert after["node3"]["figures"] == {"busbw_gbps": 0.05, "median_gbps": 0.4}
    assert after["node1"]["passed"] is True and after["node1"]["figures"]["busbw_gbps"] == 0.4
    # a staleness-bounded run tests the slow node again
    assert stamps.to_retest(after, {}, ["node3"], stamps.parse_stale("1h"), now) == {
        "node3": "did not pass its last preflight"
    }
