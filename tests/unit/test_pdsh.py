"""pdsh on the branches the Debian lab cannot reach (RHEL-family), from real os-release output."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pyinfra_testing.facts import make_fact_tests
from pyinfra_testing.operations import make_operation_tests

from trainfleet.capabilities.pdsh import genders_lines
from trainfleet.osfamily import os_family
from trainfleet.render import UnsafeValue, render, variables

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pdsh"

TestPdshStateFact = make_fact_tests("facts", "pdsh_facts.PdshState", FIXTURES / "facts")
TestPdshOperation = make_operation_tests("operations", "pdsh_ops.pdsh", FIXTURES / "pdsh")


def test_os_release_maps_to_the_package_manager():
    assert os_family("rocky", "rhel centos fedora", "9.4")["package_manager"] == "dnf"
    assert os_family("centos", "rhel fedora", "7")["package_manager"] == "yum"
    assert os_family("ubuntu", "debian", "22.04")["package_manager"] == "apt"
    assert os_family("arch", "", "")["package_manager"] is None


def test_the_genders_block_is_the_template_the_plan_renders():
    """/etc/genders's block comes from templates/pdsh/genders.j2 (the plan's, diffed by drift),
    line for line what the fixtures' commands write; a name that would start a line of its
    own is refused, nothing rendered."""
    assert variables("pdsh/genders.j2") == {"nodes"}
    assert genders_lines(["gpu-a01", "gpu-a02"]) == ["gpu-a01 trainfleet", "gpu-a02 trainfleet"]
    assert genders_lines([]) == []
    for path in sorted((FIXTURES / "pdsh").glob("*.json")):  # what the operation is given
        part = json.loads(path.read_text())["kwargs"]["pdsh"]
        assert part["genders"] == genders_lines(part["nodes"]), path.name
        assert part["rcmd_default"] == render("pdsh/rcmd_default.j2") == "ssh\n", path.name
        assert "export PDSH_RCMD_TYPE=ssh\n" in part["profile"] == render("pdsh/profile.sh.j2")
    with pytest.raises(UnsafeValue):
        genders_lines(["gpu-a01\nall trainfleet"])
