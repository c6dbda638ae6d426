"""The benchmark's pure parts: statistics, targets, tally parsing, pyinfra's JSON, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.lab_report import build_rows, render_markdown, render_table
from bench.run import parse_results, pyinfra_args
from bench.stats import Summary, ratio, summarize, verdict
from bench.tally import exec_count, phases, short_label, top_commands

# A tally as bench/lab_driver.py writes it for `deploy/drift.py` on a 2-node lab (shape and values
# from an accounted run; node2 got a second command, as a drift run that misses its target would).
DRIFT_TALLY = {
    "exit_code": 0,
    "execs": {"198.18.0.11": 1, "198.18.0.12": 2},
    "sftp": {"sessions": {}, "uploads": {}},
    "commands": {
        "fact facts.fingerprint.NodeFingerprint": {"count": 2, "seconds": 1.8214},
        "op Node matches the spec and its peers": {"count": 1, "seconds": 0.0123},
    },
    "stages": [
        {"stage": "connect", "at": 0.9112},
        {"stage": "prepare", "at": 1.2345},
        {"stage": "execute", "at": 2.5001},
        {"stage": "disconnect", "at": 2.5402},
    ],
    "end": 2.6003,
    "connect": {"node1": 0.2981, "node2": 0.3011},
    "names": {"198.18.0.11": "node1", "198.18.0.12": "node2"},
    "cprofile": [],
}
FLOOR_TALLY = {
    "exit_code": 0,
    "execs": {"198.18.0.11": 1, "198.18.0.12": 1},
    "commands": {"fact server.Hostname": {"count": 2, "seconds": 0.0441}},
    "stages": [{"stage": "connect", "at": 0.8421}, {"stage": "prepare", "at": 1.1503}],
    "end": 1.2204,
    "names": {"198.18.0.11": "node1", "198.18.0.12": "node2"},
}


def test_summary_is_median_and_min_max():
    s = summarize([3.4, 2.1, 2.9])
    assert (s.median, s.low, s.high, s.runs) == (2.9, 2.1, 3.4, 3)
    assert s.spread() == "2.10–3.40"
    assert summarize([2.0, 4.0]).median == 3.0
    assert summarize([1.5]).spread() == "1 run"
    with pytest.raises(ValueError):
        summarize([])


def test_ratio_is_median_over_the_floors_median():
    assert ratio(Summary(3.0, 2.5, 3.5, 3), Summary(2.0, 1.9, 2.2, 3)) == pytest.approx(1.5)
    with pytest.raises(ValueError):
        ratio(Summary(3.0, 3.0, 3.0, 1), Summary(0.0, 0.0, 0.0, 1))


def test_targets_apply_to_rerun_and_drift_only():
    assert verdict("floor", 1.0, 1) is None
    assert verdict("first provision", 9.0, 40) is None
    assert verdict("re-run", 1.5, 12).met  # 1.5x is within the target; re-run execs have none
    missed = verdict("re-run", 2.104, 12)
    assert not missed.met and missed.missed == ["ratio 2.10 > 1.5"]


def test_drift_must_also_send_one_command_per_node():
    assert verdict("drift", 1.2, 1).met
    both = verdict("drift", 1.7, 2)
    assert both.missed == ["ratio 1.70 > 1.5", "2 execs/node > 1"]
    assert verdict("drift", None, None).missed == ["ratio not measured", "execs not counted"]


def test_exec_count_maps_addresses_to_nodes_and_keeps_silent_nodes():
    count = exec_count(DRIFT_TALLY, ["node1", "node2", "node3"])
    assert count.per_node == {"node1": 1, "node2": 2, "node3": 0}
    assert (count.low, count.high) == (0, 2)
    assert count.describe() == "1.0 (0–2)"
    assert exec_count(FLOOR_TALLY, ["node1", "node2"]).describe() == "1"


def test_exec_count_keeps_an_address_it_cannot_name():
    tally = {"execs": {"198.18.0.11": 1, "unknown": 1}, "names": {"198.18.0.11": "node1"}}
    assert exec_count(tally, ["node1"]).per_node == {"node1": 1, "unknown": 1}


def test_phases_split_the_run_at_pyinfras_stages():
    assert phases(DRIFT_TALLY) == {
        "startup": 0.911,
        "connect": 0.323,
        "prepare": 1.266,
        "execute": 0.04,
        "output": 0.06,
    }
    # A fact run has no execute stage: everything after connecting is prepare.
    assert phases(FLOOR_TALLY) == {
        "startup": 0.842,
        "connect": 0.308,
        "prepare": 0.07,
        "execute": 0.0,
        "output": 0.0,
    }
    assert sum(phases(DRIFT_TALLY).values()) == pytest.approx(DRIFT_TALLY["end"], abs=0.01)


def test_top_commands_by_summed_time():
    top = top_commands(DRIFT_TALLY, 1)
    assert [(c.label, c.count) for c in top] == [("fact facts.fingerprint.NodeFingerprint", 2)]
    assert short_label(top[0].label) == "fact NodeFingerprint"
    assert (
        short_label("op Cluster hosts block in /etc/hosts")
        == "op Cluster hosts block in /etc/hosts"
    )


# pyinfra 3.10's --json results (pyinfra_cli/prints.py: build_results_json), trimmed to 2 ops.
PYINFRA_JSON = {
    "plan": [],
    "results": {
        "operations": [
            {
                "op_hash": "a1",
                "name": "Hostname is the node's spec name",
                "names": ["Hostname is the node's spec name"],
                "args": [],
                "hosts": 2,
                "success": ["node2"],
                "error": [],
                "no_change": ["node1"],
            },
            {
                "op_hash": "b2",
                "name": "pdsh over ssh to every node",
                "names": ["pdsh over ssh to every node"],
                "args": [],
                "hosts": 2,
                "success": [],
                "error": ["node1"],
                "no_change": ["node2"],
            },
        ],
        "totals": {"hosts": 4, "success": 1, "error": 1, "no_change": 2},
    },
}


def test_parse_results_counts_changed_and_failed_host_operations():
    stdout = "--> Loading config...\n" + json.dumps(PYINFRA_JSON)
    assert parse_results(stdout) == (1, 1)
    # `fact` prints {fact: {host: value}}: no results to count.
    assert parse_results(json.dumps({"server.Hostname": {"node1": "node1"}})) == (None, None)
    assert parse_results("no json here") == (None, None)


def test_every_task_runs_pyinfra_with_yes_and_json():
    assert pyinfra_args("floor", "inventories/lab.py") == [
        "-y",
        "--json",
        "inventories/lab.py",
        "fact",
        "server.Hostname",
    ]
    assert pyinfra_args("drift", "inv.py") == ["-y", "--json", "inv.py", "deploy/drift.py"]


def _sample(
    task: str, nodes: int, round_: int, seconds: float, code: int = 0, changed: int | None = 0
) -> dict:
    return {
        "task": task,
        "nodes": nodes,
        "round": round_,
        "seconds": seconds,
        "cpu_seconds": seconds * 0.9,
        "maxrss_kb": 90_000 + nodes * 1024,
        "returncode": code,
        "changed": changed,
        "errors": 0,
    }


def results_document() -> dict:
    samples = []
    for r, (floor, rerun, drift) in enumerate(
        [(1.2, 1.6, 2.5), (1.3, 1.7, 2.6), (1.25, 1.75, 2.7)]
    ):
        samples += [
            _sample("floor", 2, r, floor, changed=None),
            _sample("re-run", 2, r, rerun),
            _sample("drift", 2, r, drift),
        ]
    samples.append(_sample("first provision", 2, 0, 14.0, changed=20))
    samples.append(_sample("first provision", 2, 1, 15.0, code=1, changed=3))
    return {
        "command": "python -m bench --nodes 2",
        "total_minutes": 3.2,
        "machine": {
            "cpu": "Intel(R) Xeon(R) Processor @ 2.00GHz",
            "cores": 2,
            "memory_gib": 23.5,
            "os": "Debian GNU/Linux 12 (bookworm)",
            "kernel": "6.1.0",
            "python": "3.11.2",
            "pyinfra": "3.10.0",
            "date": "2026-11-22 18:00 UTC",
        },
        "plan": {
            "nodes": [2],
            "runs": 3,
            "preflight_max_nodes": 0,
            "budget_seconds": 2400,
            "cprofile_at": 2,
        },
        "samples": samples,
        "accounted": [
            {"task": "floor", "nodes": 2, "seconds": 1.3, "cprofile": False, "tally": FLOOR_TALLY},
            {"task": "drift", "nodes": 2, "seconds": 2.6, "cprofile": False, "tally": DRIFT_TALLY},
        ],
        "not_measured": [{"task": "preflight", "nodes": 2, "why": "not run above 0 nodes"}],
    }


def test_rows_take_medians_of_successful_runs_and_flag_failures():
    rows = {r.task: r for r in build_rows(results_document())}
    assert rows["floor"].summary.median == 1.25
    assert rows["re-run"].ratio == pytest.approx(1.7 / 1.25)
    assert rows["re-run"].verdict.met
    assert rows["drift"].ratio == pytest.approx(2.6 / 1.25)
    assert rows["drift"].verdict.missed == ["ratio 2.08 > 1.5", "2 execs/node > 1"]
    # The failed first provision is not in the median, and the row says it failed.
    assert rows["first provision"].summary.runs == 1
    assert rows["first provision"].problems == ["run 2 exited 1"]


def test_table_shows_targets_met_and_missed_with_a_note():
    rows = build_rows(results_document())
    table = render_table(rows, {(2, "drift"): 1})
    lines = {line.split(" | ")[1]: line for line in table.splitlines()[2:]}
    assert lines["re-run"] == "| 2 | re-run | 3 | 1.70 | 1.60–1.75 | 1.36 | — | 1.53 | 90 | met |"
    assert "| 2.08 | 1.5 (1–2) |" in lines["drift"]
    assert lines["drift"].endswith("**missed**: ratio 2.08 > 1.5, 2 execs/node > 1 (note 1) |")
    assert "**check**: run 2 exited 1" in lines["first provision"]


def test_markdown_explains_a_miss_from_the_profile_and_lists_what_was_not_measured():
    text = render_markdown(results_document())
    assert "Intel(R) Xeon(R) Processor @ 2.00GHz, 2 cores" in text
    why = text.split("## Why targets were missed", 1)[1].split("##", 1)[0]
    assert "drift at 2 nodes takes 1.35 s more than the floor" in why
    assert "prepare (+1.20 s)" in why  # 1.266 s against the floor's 0.07 s
    assert "fact NodeFingerprint 2" in why  # which commands make 2 execs on a node
    assert "- preflight at N=2: not run above 0 nodes" in text


def test_plot_is_written(tmp_path: Path):
    pytest.importorskip("matplotlib")
    from bench.lab_report import plot

    plot(results_document(), tmp_path / "b.png")
    assert (tmp_path / "b.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "bench_main, document",
    [("bench.__main__", None), ("bench.controller.__main__", "docs/controller-benchmark.json")],
)
def test_without_matplotlib_the_outputs_are_written_and_the_plot_is_skipped_with_a_note(
    bench_main, document, tmp_path: Path, monkeypatch, capsys
):
    """#39: without the bench extra a run crashed writing its first N's outputs (the lab's
    benchmark and the controller's, the latter with its last real results)."""
    import importlib
    import sys

    module = importlib.import_module(bench_main)
    repo = Path(__file__).resolve().parents[2]
    results = json.loads((repo / document).read_text()) if document else results_document()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib: ImportError
    module.write_outputs(tmp_path, results)
    written = sorted(p.suffix for p in tmp_path.iterdir())
    assert written == [".json", ".md"]
    assert "not drawn: matplotlib is missing" in capsys.readouterr().err


def test_section_times_are_read_from_the_nodes_own_clock():
    from bench.run import parse_section_times

    stdout = (
        "section identity 10512\nsection mesh_proof:root 912044\nWarning: something\nsection stack "
        "x\n"
    )
    assert parse_section_times(stdout) == {"identity": 0.0105, "mesh_proof:root": 0.912}


def test_a_missed_drift_names_the_slowest_fingerprint_parts():
    doc = results_document()
    doc["sections"] = [
        {
            "nodes": 2,
            "node": "node1",
            "seconds": {"identity": 0.01, "mesh_proof:root": 0.91, "stack": 0.32, "hosts": 0.0},
        }
    ]
    text = render_markdown(doc)
    why = text.split("## Why targets were missed", 1)[1].split("##", 1)[0]
    assert (
        "alone on one node of an idle lab, its parts take 1.24 s, slowest mesh_proof:root 0.91 s, "
        "stack 0.32 s" in why
    )
    assert "fact NodeFingerprint took 0.91 s on average with 2 nodes at once" in why
    assert "| mesh_proof:root | 0.91 |" in text


def test_machine_busy_share_from_proc_stat():
    from bench.run import busy_share, cpu_times

    before = cpu_times(
        "cpu  1136618 0 522550 1082208 24315 0 4067 13583 0 0\ncpu0 568309 0 261275 541104 0 0 0 0 "
        "0 0\n"
    )
    after = cpu_times("cpu  1136918 0 522650 1082288 24335 0 4067 13583 0 0\n")
    assert before == (
        1136618 + 522550 + 4067 + 13583,
        1136618 + 522550 + 4067 + 13583 + 1082208 + 24315,
    )
    assert busy_share(before, after) == 0.8  # 400 busy ticks of 500
    assert busy_share(after, after) == 0.0


def test_a_saturated_machine_is_named_in_the_explanation():
    doc = results_document()
    for sample in doc["samples"]:
        sample["machine_busy"] = 0.97 if sample["task"] == "drift" else 0.5
    why = render_markdown(doc).split("## Why targets were missed", 1)[1]
    assert "the machine's 2 cores were 97% busy during the run" in why
    assert "the lab is CPU-bound" in why


# The verdict lines of a drift run on a converged 8-node lab whose mesh probes timed out.
DRIFT_STDERR = (
    "    [node1] No changes\n"
    "    [node7] trainfleet: drift: ssh mesh (root) is 'fails: node3 (rc=124)', the spec wants "
    "'ok'\n"
    "    [node7] Error: executed 0 commands\n"
    "    [node6] trainfleet: drift: ssh mesh (root) is 'fails: node1 (rc=124); node2 (rc=124)', "
    "the spec wants 'ok'\n"
    "    [node2] trainfleet: drift: hostname is 'ip-198-18-0-12', the spec wants 'node2'\n"
)


def test_check_findings_are_read_per_node():
    from bench.run import check_findings

    found = check_findings(DRIFT_STDERR)
    assert sorted(found) == ["node2", "node6", "node7"]
    assert found["node7"] == "ssh mesh (root) is 'fails: node3 (rc=124)', the spec wants 'ok'"
    assert check_findings("    [node1] No changes\n") == {}


def test_a_check_that_failed_nodes_is_timed_and_its_findings_are_shown():
    from bench.lab_report import summarize_findings

    assert (
        summarize_findings(
            {
                "node7": "ssh mesh (root) is 'fails: node3 (rc=124)', the spec wants 'ok'",
                "node6": "ssh mesh (root) is 'fails: node1 (rc=124)', the spec wants 'ok'",
                "node2": "hostname is 'ip-198-18-0-12', the spec wants 'node2'",
            }
        )
        == "ssh mesh (root) on 2 nodes (rc=124); hostname on 1 node"
    )
    doc = results_document()
    drift = [s for s in doc["samples"] if s["task"] == "drift"]
    drift[0].update(returncode=1, stderr_tail=DRIFT_STDERR)  # older results: findings from the tail
    drift[1].update(
        returncode=1,
        findings={"node7": "ssh mesh (root) is 'fails: node3 (rc=124)', the spec wants 'ok'"},
    )
    row = next(r for r in build_rows(doc) if r.task == "drift")
    assert row.summary.runs == 3  # the check ran to its verdict: its time counts
    assert row.problems == [
        "2 of 3 runs failed nodes (up to 3): ssh mesh (root) on 1 node (rc=124)"
    ]
    why = render_markdown(doc).split("## Why targets were missed", 1)[1]
    assert (
        "2 runs failed nodes of the converged cluster: ssh mesh (root) on 2 nodes (rc=124); "
        "hostname" in why
    )
    # A crash (exit 2, no verdict) is not timed.
    drift[2].update(returncode=2)
    row = next(r for r in build_rows(doc) if r.task == "drift")
    assert row.summary.runs == 2 and "run 3 exited 2" in row.problems


def test_summary_is_nodes_by_tasks_with_ratios():
    from bench.lab_report import render_summary

    lines = render_summary(build_rows(results_document())).splitlines()
    assert lines[0] == "| N | floor | first provision | re-run | drift |"
    assert lines[2] == "| 2 | 1.25 | 14.00 (11.20x) | 1.70 (1.36x) | 2.60 (2.08x) |"
