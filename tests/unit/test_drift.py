"""Drift comparison over plain data: spec, majority, uniqueness, unreachable; table and JSON."""

from __future__ import annotations

import json

from trainfleet.drift import compare, digest

NODES = ["n1", "n2", "n3"]


def observed(**overrides) -> dict[str, dict[str, str]]:
    base = {n: {"hostname": n, "machine-id": f"id-{n}", "torch": "2.13.0+cpu", "kernel": "6.1"} for n in NODES}
    for key, value in overrides.items():
        node, prop = key.split("__")
        base[node][prop.replace("_", "-") if prop == "machine_id" else prop] = value
    return base


def expected() -> dict[str, dict[str, str]]:
    return {n: {"hostname": n, "torch": "2.13.0+cpu"} for n in NODES}


def test_a_converged_cluster_has_no_findings():
    report = compare("c", NODES, observed(), expected())
    assert not report.drift
    assert report.table() == "no drift: 3 nodes match the spec and each other"


def test_a_node_off_spec_is_named_with_the_property_and_both_values():
    report = compare("c", NODES, observed(n2__torch="2.12.0+cpu"), expected())
    assert [str(f) for f in report.findings] == ["torch is '2.12.0+cpu', the spec wants '2.13.0+cpu'"]
    assert report.findings[0].node == "n2"


def test_the_odd_node_out_is_found_by_majority_and_a_tie_is_a_tie():
    report = compare("c", NODES, observed(n3__kernel="6.5"), {})
    assert [(f.node, f.kind, f.expected) for f in report.findings] == [("n3", "majority", "6.1")]
    tie = compare("c", ["n1", "n2"], {"n1": {"kernel": "6.1"}, "n2": {"kernel": "6.5"}}, {})
    assert [f.kind for f in tie.findings] == ["tie", "tie"]


def test_duplicate_hostnames_and_machine_ids_are_named_on_both_nodes():
    report = compare("c", NODES, observed(n3__hostname="n1", n2__machine_id="id-n1"), {})
    found = {(f.node, f.property, f.expected) for f in report.findings if f.kind == "unique"}
    assert found == {("n1", "hostname", "also on n3"), ("n3", "hostname", "also on n1"),
                     ("n1", "machine-id", "also on n2"), ("n2", "machine-id", "also on n1")}


def test_an_unreachable_node_is_a_finding_and_a_marked_column():
    data = observed()
    del data["n3"]
    report = compare("c", NODES, data, {}, unreachable={"n3": "could not connect"})
    assert report.drift and [str(f) for f in report.findings] == ["n3: cannot be read (could not connect)"]
    assert report.table().splitlines()[2].split() == ["reachable", "yes", "yes", "NO", "*"]


def test_the_table_shows_only_differing_rows_with_odd_values_marked_and_json_has_everything():
    report = compare("c", NODES, observed(n2__torch="2.12.0+cpu"), expected())
    lines = report.table().splitlines()
    assert lines[0].split() == ["property", "n1", "n2", "n3"]
    assert lines[2].split() == ["torch", "2.13.0+cpu", "2.12.0+cpu", "*", "2.13.0+cpu"]
    assert len(lines) == 3
    assert len(report.table(all_rows=True).splitlines()) == 2 + 4
    data = json.loads(report.dumps())
    assert data["drift"] is True and data["nodes"]["n2"]["properties"]["torch"] == "2.12.0+cpu"
    assert data["findings"][0] == {"node": "n2", "property": "torch", "kind": "spec",
                                   "observed": "2.12.0+cpu", "expected": "2.13.0+cpu"}


def test_digests_are_stable_and_absent_is_absent():
    assert digest(["a", "b"]) == digest("a\nb") != digest(["a", "c"])
    assert digest(None) == "absent"


def test_a_venv_package_one_node_lacks_or_has_alone_or_at_another_version_is_named_per_package():
    from trainfleet.drift import absent_everywhere_else

    seen = observed()
    venv = {"python torch": "2.13.0+cpu", "python deepspeed": "0.19.8", "python accelerate": "1.15.0"}
    for node in NODES:
        seen[node].update(venv)
    del seen["n1"]["python accelerate"]  # not installed there
    seen["n2"]["python deepspeed"] = "0.19.7"  # another version
    seen["n3"]["python einops"] = "0.8.1"  # on this node only
    absent_everywhere_else(seen, "python ")
    report = compare("c", NODES, seen, {n: {**want, "python deepspeed": "0.19.8"} for n, want in expected().items()})
    assert [(f.node, f.property, f.kind, f.observed) for f in report.findings] == [
        ("n1", "python accelerate", "majority", "absent"),
        ("n2", "python deepspeed", "spec", "0.19.7"),
        ("n3", "python einops", "majority", "0.8.1"),
    ]
