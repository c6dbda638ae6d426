"""The one os-release reader: facts/os_release_facts.py's fragment, trainfleet.osfamily's parser."""

from __future__ import annotations

import os
import platform
import subprocess

import pytest

from facts.os_release_facts import OS_FAMILY_SH, OS_NAME_SH
from trainfleet.osfamily import os_release


def test_the_fragment_is_what_the_stack_and_pdsh_facts_have_always_run():
    assert OS_FAMILY_SH == (
        '( . /etc/os-release 2>/dev/null; echo "id ${ID:-unknown}"; '
        'echo "like ${ID_LIKE:-}"; echo "version ${VERSION_ID:-}" )'
    )


def test_the_parser_maps_what_the_fragment_prints_and_defaults_what_it_does_not():
    assert os_release({"id": "rocky", "like": "rhel centos fedora", "version": "9.4"}) == {
        "id": "rocky",
        "family": "rhel",
        "version": "9.4",
        "package_manager": "dnf",
    }
    assert os_release({})["family"] == "unknown"  # no /etc/os-release: nothing printed


def test_the_fragments_read_this_machines_os_release_as_python_does():
    try:
        expected = platform.freedesktop_os_release()
    except OSError:
        # CI runs on Debian: a controller without os-release there is a broken image, not a pass
        assert not os.environ.get("CI"), "this machine has no os-release"
        pytest.skip("no os-release here")
    out = subprocess.run(
        ["sh", "-c", f"{OS_FAMILY_SH}; {OS_NAME_SH}"], capture_output=True, text=True, check=True
    ).stdout
    head = dict(line.split(" ", 1) for line in out.splitlines())
    assert os_release(head)["id"] == expected["ID"]
    assert head["version"] == expected.get("VERSION_ID", "")
    assert head["os"] == expected.get("PRETTY_NAME", "unknown")
