"""The healthy subset's launch files (/etc/trainfleet/launch/healthy/): the deploy's plan
writes them for the nodes the last preflight of each did not fail, from the controller's
stamps; the node left out gets none and keeps none; nobody left out, they equal the full ones."""

from __future__ import annotations

import hashlib
import os
import subprocess
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import yaml

import operations.launchers_ops as ops
from checks.bandwidth_stage import bandwidth_jobs, bandwidth_plan
from checks.hygiene_output import parse_hygiene
from checks.preflight_scope import WAIT, bound_line, scope, worst_case
from checks.stage_runner import BOUNDS
from trainfleet import stamps
from trainfleet.capabilities.launchers import (
    HEALTHY,
    LAUNCH_FILE_NAMES,
    LAUNCHER_FILES,
    healthy_part,
)
from trainfleet.plan import plan_cluster
from trainfleet.plan_types import Gathered
from trainfleet.spec import parse_cluster

SPEC = """\
cluster: {name: lab, mesh_users: [root]}
preflight: {healthy_multiple_of: MULTIPLE}
nodes:
  - {name: node1, address: 192.0.2.11, gpus: 0}
  - {name: node2, address: 192.0.2.12, gpus: 0}
  - {name: node3, address: 192.0.2.13, gpus: 0}
  - {name: node4, address: 192.0.2.14, gpus: 0}
"""
DROPPED = ["reachability: cannot reach node1:29500 (timed out)"]


def plan(excluded=None, multiple="null"):
    cluster = parse_cluster(SPEC.replace("MULTIPLE", multiple))
    return plan_cluster(cluster, Gathered(), excluded=excluded)


def files(built, node: str) -> dict[str, str]:
    return {name: text for name, (text, _) in built.nodes[node].launchers.files.items()}


def healthy(built, node: str) -> dict[str, str]:
    prefix = f"{HEALTHY}/"
    return {n[len(prefix) :]: t for n, t in files(built, node).items() if n.startswith(prefix)}


def test_with_no_node_left_out_the_healthy_files_equal_the_full_ones_but_the_readme():
    built = plan()
    for node in ("node1", "node4"):
        mine, subset = files(built, node), healthy(built, node)
        assert subset.keys() == {n for n in LAUNCH_FILE_NAMES if n in mine}
        assert {n: t for n, t in subset.items() if n != "README"} == {
            n: t for n, t in mine.items() if n != "README" and "/" not in n
        }
        assert "No node is left out" in subset["README"]


def test_a_node_the_last_preflight_failed_is_left_out_of_the_healthy_files_everywhere():
    built = plan({"node3": DROPPED})
    assert healthy(built, "node3") == {}  # the node left out gets none
    subset = healthy(built, "node1")
    assert subset["hostfile"].split("\n")[:3] == ["node1 slots=1", "node2 slots=1", "node4 slots=1"]
    assert "node3" not in subset["hostfile"] and "node3" in files(built, "node1")["hostfile"]
    # they name each other in healthy/, and node4 is rank 2 of 3 there
    assert "--hostfile /etc/trainfleet/launch/healthy/hostfile" in subset["deepspeed.sh"]
    assert "DS_ENV_FILE=/etc/trainfleet/launch/healthy/.deepspeed_env" in subset["deepspeed.sh"]
    node4 = yaml.safe_load(healthy(built, "node4")["accelerate.yaml"])
    assert (node4["machine_rank"], node4["num_machines"]) == (2, 3)
    assert "--nnodes=3" in subset["torchrun.sh"] or "--nnodes 3" in subset["torchrun.sh"]
    readme = subset["README"]
    assert "Left out (1 of 4 nodes)" in readme
    assert "node3: reachability: cannot reach node1:29500 (timed out)" in readme


def test_the_master_left_out_makes_the_next_healthy_node_the_subsets_master():
    subset = healthy(plan({"node1": DROPPED}), "node2")
    assert "--master_addr 192.0.2.12" in subset["deepspeed.sh"]
    assert yaml.safe_load(subset["accelerate.yaml"])["machine_rank"] == 0


def test_a_multiple_of_k_leaves_out_the_last_healthy_node_and_its_readme_says_why():
    built = plan({"node3": DROPPED}, multiple="2")
    assert healthy(built, "node4") == {} and healthy(built, "node3") == {}
    readme = healthy(built, "node2")["README"]
    assert "node4: left out to keep the subset a multiple of 2" in readme
    assert healthy(built, "node1")["hostfile"].split("\n")[:2] == ["node1 slots=1", "node2 slots=1"]


def test_every_node_left_out_leaves_no_healthy_files_anywhere():
    built = plan({n: DROPPED for n in ("node1", "node2", "node3", "node4")})
    assert all(healthy(built, n) == {} for n in built.nodes)


def test_a_cause_with_control_characters_reaches_the_readme_printable():
    cluster = parse_cluster(SPEC.replace("MULTIPLE", "null"))
    _, out = healthy_part(cluster, {"node2": ["hygiene: held by \x1b[2J\nnode9: fine"]}, None)
    assert out == {"node2": ["hygiene: held by \\x1b[2J\\x0anode9: fine"]}


def test_the_launcher_operation_removes_trainfleets_healthy_files_a_node_no_longer_gets(
    monkeypatch, tmp_path
):
    """The op as the deploy runs it, its LauncherFiles fact answered, its command run here on a
    real folder: on node3, left out now, trainfleet's healthy files go, a file of the user's
    there stays (and so does the folder); a folder that is a link is refused untouched."""
    built = plan({"node3": DROPPED})
    mine = built.nodes["node3"].launchers.files
    have = {
        name: {"mode": mode, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        for name, (text, mode) in mine.items()
    }
    have |= {f"{HEALTHY}/hostfile": {"mode": "644", "sha256": "0" * 64}}
    have |= {f"{HEALTHY}/notes.txt": {"mode": "644", "sha256": "1" * 64}}  # the user's own
    monkeypatch.setattr(ops, "fact", lambda *a, **k: have)

    def run(directory: Path) -> subprocess.CompletedProcess:
        part = replace(built.nodes["node3"].launchers, problems=[])  # no network read here
        (command,) = ops.launcher_files._inner(launchers=part, directory=str(directory))
        assert "launch/healthy/hostfile" in command.get_raw_value()  # nothing else named
        return subprocess.run(["sh", "-c", command.get_raw_value()], capture_output=True, text=True)

    launch = tmp_path / "launch"
    (launch / HEALTHY).mkdir(parents=True)
    for name in ("hostfile", "notes.txt"):
        (launch / HEALTHY / name).write_text(name)
    assert run(launch).returncode == 0
    assert sorted(p.name for p in (launch / HEALTHY).iterdir()) == ["notes.txt"]
    # the folder a link (to a place root must not empty): refused, nothing removed
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "hostfile").write_text("theirs")
    linked = tmp_path / "linked" / "launch"
    linked.mkdir(parents=True)
    (linked / HEALTHY).symlink_to(elsewhere)
    refused = run(linked)
    assert refused.returncode != 0 and "is a link: nothing removed" in refused.stderr
    assert (elsewhere / "hostfile").read_text() == "theirs"


def test_a_first_deploys_launcher_files_go_in_a_few_commands_each_within_the_argument_limit():
    built = plan()
    assert ops.batched([]) == []
    writes = [
        ops.write_file_command(f"/etc/trainfleet/launch/{name}", text, mode)
        for name, (text, mode) in built.nodes["node1"].launchers.files.items()
    ]
    assert len(writes) == 2 * len(LAUNCHER_FILES)  # healthy/ included
    batches = ops.batched(writes)
    assert 1 < len(batches) < len(writes) // 4
    assert all(len(b.get_raw_value()) <= ops.BATCH_CHARACTERS for b in batches)
    joined = " && ".join(w.get_raw_value() for w in writes)
    assert " && ".join(b.get_raw_value() for b in batches) == joined  # all of them, in order


# -- the stamps: each node's last verdict on the controller ---------------------------------------

NOW = datetime(2026, 11, 27, 6, 0, tzinfo=UTC)
SEEN = {n: {"plan": "p", "ledger": None, "kernel": "boot 0"} for n in ("node1", "node2", "node3")}


def test_a_preflight_stamps_the_nodes_it_tested_and_keeps_the_others():
    before = {"node4": {"passed": True, "at": "2026-11-27T05:00:00Z"}, "gone": {"passed": True}}
    after = stamps.recorded(
        before,
        {"node1": [], "node3": DROPPED, "node2": ["left out to keep the subset a multiple of 2"]},
        SEEN,
        ["node1", "node2", "node3", "node4"],
        NOW,
    )
    assert after["node1"] == {
        "passed": True,
        "at": "2026-11-27T06:00:00Z",
        "causes": [],
        "plan": "p",
        "ledger": None,
        "kernel": "boot 0",
    }
    assert after["node2"]["passed"] is True  # cut for the spec's sake, not failed
    assert after["node3"]["passed"] is False and after["node3"]["causes"] == DROPPED
    assert after["node4"] == before["node4"] and "gone" not in after
    assert stamps.exclusions(after, ["node1", "node2", "node3", "node4"]) == {"node3": DROPPED}


def test_a_node_no_problem_named_in_a_run_whose_collective_never_passed_is_open_not_passed():
    """The firewall case: node3 failed, the collective never ran among the others, so node1's
    verdict is open: not left out of the healthy files, never carried over by a bound."""
    after = stamps.recorded(
        {}, {"node1": [], "node3": DROPPED}, SEEN, ["node1", "node3"], NOW, False
    )
    assert after["node1"]["passed"] is None and after["node3"]["passed"] is False
    assert stamps.exclusions(after, ["node1", "node3"]) == {"node3": DROPPED}
    assert stamps.to_retest(after, SEEN, ["node1"], timedelta(hours=6), NOW) == {
        "node1": "its last preflight ended before its collective passed"
    }


def test_a_stale_bound_retests_only_the_old_the_changed_and_the_never_passed():
    at = "2026-11-27T05:00:00Z"
    kept = {"passed": True, "at": at, "causes": [], "plan": "p", "ledger": None, "kernel": "boot 0"}
    recorded = {
        "node1": kept,
        "node2": {**kept, "at": "2026-11-26T05:00:00Z"},
        "node3": {**kept, "passed": False, "causes": DROPPED},
        "node5": kept,
        "node6": kept,
        "node7": kept,
    }
    seen = {
        **SEEN,
        "node5": {**SEEN["node1"], "plan": "q"},
        "node6": {**SEEN["node1"], "kernel": "boot 2"},
        "node7": {**SEEN["node1"], "kernel": None},
    }
    nodes = ["node1", "node2", "node3", "node4", "node5", "node6", "node7"]
    why = stamps.to_retest(recorded, seen, nodes, timedelta(hours=6), NOW)
    assert why == {
        "node2": "passed at 2026-11-26T05:00:00Z, longer ago than 6h",
        "node3": "did not pass its last preflight",
        "node4": "never tested",
        "node5": f"its plan changed since it passed at {at}",
        "node6": f"new GPU error lines in its kernel log (or a reboot) since {at}",
        "node7": "its kernel's error lines could not be read",
    }


@pytest.mark.parametrize("value", ["6h", "30m", "2d", "45s"])
def test_a_staleness_bound_is_a_whole_number_and_a_unit(value):
    assert stamps.parse_stale(value) > timedelta(0)


@pytest.mark.parametrize("value", ["", "6", "h", "0h", "1.5h", "6 h", "6H", "-1d", True, 6, "6h;x"])
def test_anything_else_is_refused(value):
    with pytest.raises(ValueError, match="not a duration"):
        stamps.parse_stale(value)


def test_a_damaged_stamps_file_is_an_error_not_every_node_readmitted(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path / "home"))
    assert stamps.load("lab") == {}
    stamps.save("lab", {"node1": {"passed": False, "causes": DROPPED}})
    assert stamps.exclusions(stamps.load("lab"), ["node1"]) == {"node1": DROPPED}
    stamps.stamps_path("lab").write_text("{not json")
    with pytest.raises(ValueError, match="not a preflight stamps file"):
        stamps.load("lab")


# -- the preflight's scope: its worst case, and what a staleness bound tests again -----------------


@pytest.mark.parametrize("count", [1, 2, 3, 4, 7, 32])
def test_the_stated_worst_case_covers_the_longest_command_the_collective_stage_sends(count):
    """The bound is the stages' own: the collective's command ends with its last round of
    pairs (bandwidth_jobs), and the controller waits WAIT s past it; from seven nodes a round of
    re-tests (suspects with partners known good, run_retest) may follow, waited for too."""
    nodes = "\n".join(
        f"  - {{name: n{i}, address: 192.0.2.{10 + i}, gpus: 0}}" for i in range(count)
    )
    cluster = parse_cluster(f"cluster: {{name: lab, mesh_users: [root]}}\nnodes:\n{nodes}\n")
    steps = worst_case(cluster)
    rounds, _ = bandwidth_plan(cluster)
    jobs = bandwidth_jobs(cluster, rounds, BOUNDS["collective"], BOUNDS["bandwidth"])
    last = max([BOUNDS["collective"], *(job[0] for mine in jobs.values() for job in mine)])
    retest = BOUNDS["bandwidth"] + WAIT if count >= 7 else 0
    assert steps["collective and bandwidth"] >= last + WAIT + retest
    assert (
        "smoke" not in steps and worst_case(cluster, "torchrun")["smoke"] == BOUNDS["smoke"] + WAIT
    )
    assert bound_line(cluster, steps).startswith(
        f"at most {sum(steps.values())} s for {count} nodes"
    )


def test_a_stale_run_tests_the_changed_node_with_one_partner_known_good_and_carries_the_rest():
    cluster = parse_cluster(SPEC.replace("MULTIPLE", "null"))
    kept = {"passed": True, "at": "2026-11-27T05:00:00Z", "plan": "p", "ledger": None}
    recorded = {n: {**kept, "kernel": "boot 0"} for n in ("node1", "node2", "node3", "node4")}
    seen = {n: {**kept, "kernel": "boot 0"} for n in recorded} | {
        "node3": {**kept, "kernel": "boot 1"}
    }
    names, why, carried = scope(cluster, recorded, seen, timedelta(hours=6), NOW, set())
    assert names == ["node1", "node3"]
    assert why["node1"] == "passed; tested again as a partner known good"
    assert carried == {"node2": kept["at"], "node4": kept["at"]}
    # nothing changed: nobody is tested; a hygiene failure now is tested with a partner
    assert scope(cluster, recorded, recorded, timedelta(hours=6), NOW, set())[0] == []
    names, why, _ = scope(cluster, recorded, recorded, timedelta(hours=6), NOW, {"node4"})
    assert names == ["node1", "node4"] and why["node4"] == "failed the hygiene stage now"


def test_the_hygiene_stage_reads_the_boot_the_error_count_and_the_last_errors_time():
    """The stage's real script on this machine (its own dmesg, a pattern that matches nothing
    and one that matches the kernel's first line), and the line read strictly."""
    script = Path("checks/preflight_stages/hygiene.sh").resolve().read_text()
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def kernel(pattern: str) -> str | None:
        args = ["29500", "0", "me", "/nonexistent", pattern, "", "", ""]  # no pair, address, env
        out = subprocess.run(["sh", "-c", script, "hygiene", *args], capture_output=True, text=True)
        return parse_hygiene(out.stdout.splitlines()).get("kernel")

    if subprocess.run(["dmesg"], capture_output=True).returncode != 0:
        # CI runs as root (the lab needs it): there an unreadable dmesg is a failure
        assert not os.environ.get("CI"), "dmesg cannot be read: the kernel line went untested"
        pytest.skip("dmesg cannot be read here (not root)")
    assert kernel("no line has this 7f3a9c") == f"{boot} 0"
    count, last = kernel(".")[len(boot) + 1 :].split(" ")  # every line: the newest's time
    assert int(count) > 0 and float(last) > 0
    # the same count with a later last line (the ring buffer rotated new errors in) differs
    rotated = {"node1": {**SEEN["node1"], "kernel": f"{boot} 3 120.5"}}
    stamp = {"passed": True, "at": "2026-11-27T05:00:00Z", "plan": "p", "ledger": None}
    before = {"node1": {**stamp, "kernel": f"{boot} 3 99.25"}}
    assert stamps.to_retest(before, rotated, ["node1"], timedelta(hours=6), NOW)
    for forged in ("kernel x 3", f"kernel {boot} 3 4 5", f"kernel {boot} -1"):
        assert "kernel" not in parse_hygiene([forged])
