"""pdsh on the branches the Debian lab cannot reach (RHEL-family), from real os-release output."""

from __future__ import annotations

from pathlib import Path

from pyinfra_testing.facts import make_fact_tests
from pyinfra_testing.operations import make_operation_tests

from trainfleet.osfamily import os_family

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "pdsh"

TestPdshStateFact = make_fact_tests("facts", "pdsh_facts.PdshState", FIXTURES / "facts")
TestPdshOperation = make_operation_tests("operations", "pdsh_ops.pdsh", FIXTURES / "pdsh")


def test_os_release_maps_to_the_package_manager():
    assert os_family("rocky", "rhel centos fedora", "9.4")["package_manager"] == "dnf"
    assert os_family("centos", "rhel fedora", "7")["package_manager"] == "yum"
    assert os_family("ubuntu", "debian", "22.04")["package_manager"] == "apt"
    assert os_family("arch", "", "")["package_manager"] is None
