"""Drift's live SSH probe: a constant number of logins per node (a ring and a rotating
stride), every node probed as source and as target, every pair covered over the runs."""

from __future__ import annotations

import json

import pytest

from checks.drift_check import FULL_PROBE_ENV, STRIDE_ENV, _previous, mesh_probe
from trainfleet.mesh import probe_stride, probe_targets


def names(n: int) -> list[str]:
    return [f"node{i:04d}" for i in range(1, n + 1)]


def pairs(nodes: list[str], stride: int) -> set[tuple[str, str]]:
    return {(source, target) for source in nodes for target in probe_targets(nodes, source, stride)}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 16, 97, 1024])
def test_every_node_is_probed_as_source_and_as_target_by_at_most_two_logins(n):
    nodes = names(n)
    for rotation in (0, 1, 7):
        probed = pairs(nodes, probe_stride(n, rotation))
        assert {s for s, _ in probed} == set(nodes) and {t for _, t in probed} == set(nodes)
        assert (
            max(len(probe_targets(nodes, node, probe_stride(n, rotation))) for node in nodes) <= 2
        )
        assert (
            all(s != t for s, t in probed) or n == 1
        )  # a peer, never itself, once there are peers


@pytest.mark.parametrize("n", [4, 5, 9, 16])
def test_over_n_minus_two_runs_every_ordered_pair_is_probed(n):
    nodes = names(n)
    covered = set().union(*(pairs(nodes, probe_stride(n, rotation)) for rotation in range(n - 2)))
    assert covered == {(s, t) for s in nodes for t in nodes if s != t}


def test_the_full_probe_is_every_node_to_every_node():
    nodes = names(5)
    assert pairs(nodes, 0) == {(s, t) for s in nodes for t in nodes}


def test_each_run_rotates_the_stride_from_the_last_report():
    nodes = names(10)
    first = mesh_probe(nodes, None, {})
    assert first == {"mode": "sampled", "stride": 2, "rotation": 0, "logins_per_node": 2}
    second = mesh_probe(nodes, {"mesh_probe": first}, {})
    assert (second["rotation"], second["stride"]) == (1, 3)
    after_last = mesh_probe(nodes, {"mesh_probe": {"rotation": 7}}, {})
    assert after_last["stride"] == 2  # 8 strides (2..9), then round again
    assert (
        mesh_probe(nodes, {"mesh_probe": {"rotation": "x"}}, {})["rotation"] == 0
    )  # an unreadable report restarts


def test_the_full_probe_and_a_pinned_stride_are_there_on_request():
    nodes = names(10)
    assert mesh_probe(nodes, None, {FULL_PROBE_ENV: "full"}) == {
        "mode": "full",
        "stride": 0,
        "rotation": None,
        "logins_per_node": 10,
    }
    assert mesh_probe(nodes, None, {STRIDE_ENV: "9"})["stride"] == 9


def test_a_pinned_stride_leaves_the_rotation_where_it_was():
    nodes = names(5)
    runs, previous = [], None
    for env in ({}, {STRIDE_ENV: "4"}, {}, {}):
        previous = {"mesh_probe": mesh_probe(nodes, previous, env)}
        runs.append(previous["mesh_probe"]["stride"])
    assert runs == [2, 4, 3, 4]  # the pinned run does not use up stride 3


@pytest.mark.parametrize(
    "previous",
    [
        [1],
        5,
        "x",
        {"mesh_probe": "x"},
        {"mesh_probe": {"rotation": True}},
        {"mesh_probe": {"rotation": -2}},
    ],
)
def test_a_last_report_that_is_not_one_restarts_the_rotation(previous):
    warnings = []
    assert mesh_probe(names(10), previous, {}, warnings.append)["rotation"] == 0
    assert len(warnings) == 1


@pytest.mark.parametrize(
    "env",
    [
        {STRIDE_ENV: "²"},
        {STRIDE_ENV: "1"},
        {STRIDE_ENV: "10"},
        {STRIDE_ENV: "-3"},
        {STRIDE_ENV: "two"},
        {FULL_PROBE_ENV: "everything"},
    ],
)
def test_a_bad_probe_setting_is_refused_with_its_name(env):
    with pytest.raises(ValueError, match=next(iter(env))):
        mesh_probe(names(10), None, env)


def test_an_absurd_last_rotation_is_ignored_with_a_warning_and_the_next_report_is_written(tmp_path):
    # A report that once made every later drift run fail to write its own: 4,300 nines parse,
    # one more is a 4,301-digit number json cannot write.
    path = tmp_path / "drift-lab.json"
    rotation = "9" * 4300
    path.write_text('{"cluster": "lab", "mesh_probe": {"rotation": ' + rotation + "}}")
    warnings = []
    probe = mesh_probe(names(10), _previous(path, warnings.append), {}, warnings.append)
    assert probe["rotation"] == 0 and probe["stride"] == 2
    json.dumps(probe)
    assert warnings == [
        "drift: the last report's mesh probe is ignored "
        "(its rotation is above 1000000000); the stride rotation restarts"
    ]


TOO_DEEP, TOO_LARGE = "[" * 100_000 + "]" * 100_000, '{"a": "' + "x" * 2000 + '"}'


@pytest.mark.parametrize("text", [TOO_DEEP, "{nope", TOO_LARGE])
def test_a_last_report_that_cannot_be_read_is_ignored_with_a_warning(tmp_path, monkeypatch, text):
    monkeypatch.setattr(
        "checks.drift_check.REPORT_BYTES", 1000
    )  # the last case: too large to read back
    path = tmp_path / "drift-lab.json"
    path.write_text(text)
    warnings = []
    previous = _previous(path, warnings.append)
    assert mesh_probe(names(10), previous, {}, warnings.append)["rotation"] == 0
    assert len(warnings) == 1 and "is not a drift report" in warnings[0]
    assert _previous(tmp_path / "none.json", warnings.append) is None  # none yet: quietly
    assert len(warnings) == 1
