"""Drift comparison over plain data: spec, majority, uniqueness, unreachable; table and JSON."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from bench.controller import fleet as fleet_mod
from bench.controller.record import load
from checks.drift_check import compare_fingerprints
from facts.launchers_facts import LauncherContents, LauncherFiles
from trainfleet.capabilities import RULES
from trainfleet.compare import (
    DIFF_LINES,
    DIFF_WIDTH,
    Report,
    compare,
    content,
    content_diff,
    digest,
    explain,
)
from trainfleet.keystore import KeyStore
from trainfleet.plan import cluster_blocks

NODES = ["n1", "n2", "n3"]


def observed(**overrides) -> dict[str, dict[str, str]]:
    base = {
        n: {"hostname": n, "machine-id": f"id-{n}", "torch": "2.13.0+cpu", "kernel": "6.1"}
        for n in NODES
    }
    for key, value in overrides.items():
        node, prop = key.split("__")
        base[node][prop.replace("_", "-") if prop == "machine_id" else prop] = value
    return base


def expected() -> dict[str, dict[str, str]]:
    return {n: {"hostname": n, "torch": "2.13.0+cpu"} for n in NODES}


def test_a_converged_cluster_has_no_findings():
    report = compare("c", NODES, observed(), expected(), rules=RULES)
    assert not report.drift
    assert report.table() == "no drift: 3 nodes match the spec and each other"


def test_a_node_off_spec_is_named_with_the_property_and_both_values():
    report = compare("c", NODES, observed(n2__torch="2.12.0+cpu"), expected(), rules=RULES)
    assert [str(f) for f in report.findings] == [
        "torch is '2.12.0+cpu', the spec wants '2.13.0+cpu'"
    ]
    assert report.findings[0].node == "n2"


def test_the_odd_node_out_is_found_by_majority_and_a_tie_is_a_tie():
    report = compare("c", NODES, observed(n3__kernel="6.5"), {}, rules=RULES)
    assert [(f.node, f.kind, f.expected) for f in report.findings] == [("n3", "majority", "6.1")]
    tie = compare(
        "c", ["n1", "n2"], {"n1": {"kernel": "6.1"}, "n2": {"kernel": "6.5"}}, {}, rules=RULES
    )
    assert [f.kind for f in tie.findings] == ["tie", "tie"]


def test_duplicate_hostnames_and_machine_ids_are_named_on_both_nodes():
    report = compare(
        "c", NODES, observed(n3__hostname="n1", n2__machine_id="id-n1"), {}, rules=RULES
    )
    found = {(f.node, f.property, f.expected) for f in report.findings if f.kind == "unique"}
    assert found == {
        ("n1", "hostname", "also on n3"),
        ("n3", "hostname", "also on n1"),
        ("n1", "machine-id", "also on n2"),
        ("n2", "machine-id", "also on n1"),
    }


def test_an_unreachable_node_is_a_finding_and_a_marked_column():
    data = observed()
    del data["n3"]
    report = compare("c", NODES, data, {}, unreachable={"n3": "could not connect"}, rules=RULES)
    assert report.drift and [str(f) for f in report.findings] == [
        "n3: cannot be read (could not connect)"
    ]
    assert report.table().splitlines()[0] == "3 nodes, 1 odd: n3"
    assert report.table().splitlines()[3].split() == ["reachable", "yes", "yes", "NO", "*"]


def test_the_table_shows_only_differing_rows_with_odd_values_marked_and_json_has_everything():
    report = compare("c", NODES, observed(n2__torch="2.12.0+cpu"), expected(), rules=RULES)
    summary, *lines = report.table().splitlines()
    assert summary == "3 nodes, 1 odd: n2"
    assert lines[0].split() == ["property", "n1", "n2", "n3"]
    assert lines[2].split() == ["torch", "2.13.0+cpu", "2.12.0+cpu", "*", "2.13.0+cpu"]
    assert len(lines) == 3
    assert len(report.table(all_rows=True).splitlines()) == 1 + 2 + 4
    data = json.loads(report.dumps())
    assert data["drift"] is True and data["nodes"]["n2"]["properties"]["torch"] == "2.12.0+cpu"
    assert data["findings"][0] == {
        "node": "n2",
        "property": "torch",
        "kind": "spec",
        "observed": "2.12.0+cpu",
        "expected": "2.13.0+cpu",
    }


def test_digests_are_stable_and_absent_is_absent():
    assert digest(["a", "b"]) == digest("a\nb") != digest(["a", "c"])
    assert digest(None) == "absent"


def test_a_venv_package_one_node_lacks_or_has_alone_or_at_another_version_is_named_per_package():
    from trainfleet.compare import absent_everywhere_else

    seen = observed()
    venv = {
        "python torch": "2.13.0+cpu",
        "python deepspeed": "0.19.8",
        "python accelerate": "1.15.0",
    }
    for node in NODES:
        seen[node].update(venv)
    del seen["n1"]["python accelerate"]  # not installed there
    seen["n2"]["python deepspeed"] = "0.19.7"  # another version
    seen["n3"]["python einops"] = "0.8.1"  # on this node only
    absent_everywhere_else(seen, "python ")
    report = compare(
        "c",
        NODES,
        seen,
        {n: {**want, "python deepspeed": "0.19.8"} for n, want in expected().items()},
        rules=RULES,
    )
    assert [(f.node, f.property, f.kind, f.observed) for f in report.findings] == [
        ("n1", "python accelerate", "majority", "absent"),
        ("n2", "python deepspeed", "spec", "0.19.7"),
        ("n3", "python einops", "majority", "0.8.1"),
    ]


# A managed file's diff: real content, trainfleet's own smoke job (a launcher file, copied verbatim)
SMOKE = (Path(__file__).resolve().parents[2] / "trainfleet/smoke/train.py").read_text()


def _launcher_finding(found_text: str, wanted_text: str = SMOKE) -> Report:
    seen = observed()
    for node in NODES:
        seen[node]["launcher files"] = digest(found_text if node == "n2" else wanted_text)
    report = compare(
        "c", NODES, seen, {n: {"launcher files": digest(wanted_text)} for n in NODES}, rules=RULES
    )
    path = "/etc/trainfleet/launch/smoke_train.py"
    explain(
        report,
        {"n2": {"launcher files": {path: content(wanted_text)}}},
        {"n2": {"launcher files": {path: content(found_text)}}},
    )
    return report


def test_a_changed_managed_file_is_named_with_a_short_diff_in_the_table_and_the_json():
    lines = SMOKE.split("\n")
    changed = lines[10]
    found = "\n".join([*lines[:10], changed + "  # edited", *lines[11:]])
    report = _launcher_finding(found)
    (finding,) = report.findings
    assert finding.files == ("/etc/trainfleet/launch/smoke_train.py",)
    assert str(finding).startswith(
        "launcher files: /etc/trainfleet/launch/smoke_train.py differs from the spec"
    )
    assert f"-{changed}" in finding.diff and f"+{changed}  # edited" in finding.diff
    assert finding.diff[:2] == (
        "--- /etc/trainfleet/launch/smoke_train.py (expected)",
        "+++ /etc/trainfleet/launch/smoke_train.py (found)",
    )
    table = report.table()
    assert "n2: launcher files: /etc/trainfleet/launch/smoke_train.py" in table
    assert f"    +{changed}  # edited" in table.splitlines()
    assert json.loads(report.dumps())["findings"][0]["diff"] == list(finding.diff)


def test_a_rewritten_file_is_bounded_and_long_lines_are_cut():
    (finding,) = _launcher_finding("\n".join(f"line {i}" for i in range(200))).findings
    assert len(finding.diff) == DIFF_LINES and finding.diff[-1].startswith("... ")
    (finding,) = _launcher_finding(SMOKE.replace("import", "x" * 500, 1)).findings
    assert max(map(len, finding.diff)) == DIFF_WIDTH
    assert any(line.startswith("+") and line.endswith("x...") for line in finding.diff)


def test_key_material_is_named_and_never_shown():
    marker = "OPENSSH " + "PRIVATE KEY"  # a key's framing around a truncated body, no key at all
    private = f"-----BEGIN {marker}-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END {marker}-----\n"
    files, diff = content_diff(
        {"~root/.ssh/id_trainfleet": content(private, shown=False), "/etc/x": content("a")},
        {"~root/.ssh/id_trainfleet": content(private + "x", shown=False), "/etc/x": content("a")},
    )
    assert files == ("~root/.ssh/id_trainfleet",) and diff == ()


def test_file_content_cannot_forge_the_tables_framing():
    hostile = (
        SMOKE.replace("import", "import\x1b[2J\rn1  hostname  forged\u202e", 1) + "\nn3 torch *\n"
    )
    report = _launcher_finding(hostile)
    table = report.table()
    assert all(c.isprintable() for line in table.splitlines() for c in line)
    assert "\\x1b[2J\\rn1" in table and "\\u202e" in table
    assert not any(
        line.startswith(("n1", "n3")) for line in table.splitlines()
    )  # every diff line indented
    assert any("\x1b[2J\r" in line for line in json.loads(report.dumps())["findings"][0]["diff"])


def _run(command) -> list[str]:
    """A fact's real command, run here with sh (its node is a directory of this machine)."""
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()], capture_output=True, text=True, check=True
    )
    return out.stdout.splitlines()


def test_drift_names_a_changed_launcher_and_hosts_line_and_shows_what_changed(tmp_path):
    """The bench's fleet (a real lab node's answers, rewritten per node by the plan); on one
    node a launcher file edited in a real directory, read by the real launcher facts, and a
    line gone from its hosts block."""
    fleet = fleet_mod.build(4, tmp_path / "fleet", load())
    victim = fleet.cluster.nodes[1].name
    plan = fleet.plan.nodes[victim]
    launch = tmp_path / "launch"
    (launch / "healthy").mkdir(parents=True)
    for name, (text, _) in plan.launchers.files.items():
        (launch / name).write_text(text)
    script = plan.launchers.files["torchrun.sh"][0]
    changed = next(
        line for line in script.splitlines() if "torchrun" in line and not line.startswith("#")
    )
    (launch / "torchrun.sh").write_text(script.replace(changed, changed + " --max-restarts 9", 1))
    users = fleet.cluster.mesh_users
    fingerprints = {
        name: fleet_mod.parse_bundle(
            "fingerprint", a.fingerprint, users, a.targets, cluster_blocks(fleet.cluster)
        )
        for name, a in fleet.converged.items()
    }
    files = LauncherFiles()
    fingerprints[victim]["launchers"] = files.process(_run(files.command(str(launch))))
    fingerprints[victim]["hosts"]["block"] = plan.hosts.lines[:-1]
    asked = {}

    def read(changed_files):
        asked.update(changed_files)
        fact = LauncherContents()
        return {
            node: fact.process(_run(fact.command(str(launch), names)))
            for node, names in changed_files.items()
        }

    report = compare_fingerprints(
        fleet.cluster,
        fingerprints,
        KeyStore(fleet.cluster.name, root=fleet.home / "keys").snapshot(
            users, [n.name for n in fleet.cluster.nodes]
        ),
        read_launchers=read,
    )
    assert asked == {victim: ["torchrun.sh"]}  # only the file that differs, only from its node
    by_property = {f.property: f for f in report.findings if f.node == victim}
    launchers, hosts = by_property["launcher files"], by_property["hosts block"]
    assert launchers.files == ("/etc/trainfleet/launch/torchrun.sh",)
    assert f"-{changed}" in launchers.diff and f"+{changed} --max-restarts 9" in launchers.diff
    assert hosts.files == ("/etc/hosts",) and f"-{plan.hosts.lines[-1]}" in hosts.diff
    table = report.table()
    assert f"{victim}: launcher files: /etc/trainfleet/launch/torchrun.sh" in table
    assert f"    +{changed} --max-restarts 9" in table.splitlines()
    found = {f["property"]: f for f in json.loads(report.dumps())["findings"]}
    assert found["launcher files"]["diff"] == list(launchers.diff)
    assert found["hosts block"]["files"] == ["/etc/hosts"]
