"""Lab tests run against real sshd nodes in network namespaces; they need root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.lab.harness import LabController

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)
            if os.geteuid() != 0:
                item.add_marker(pytest.mark.skip(reason="lab tests need root (namespaces, mounts)"))


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> LabController:
    # The session's own key store, so tests never touch the developer's .trainfleet/.
    os.environ["TRAINFLEET_HOME"] = str(tmp_path_factory.mktemp("trainfleet-home"))
    controller = LabController()
    if controller.lab.is_up():
        pytest.fail("a lab is already up: the tests bring up their own (`python -m lab down` first)")
    yield controller
    left = controller.down()
    assert not left, f"the test lab left this behind: {left}"


@pytest.fixture()
def lab3(lab: LabController) -> LabController:
    """A freshly booted 3-node lab, as new servers would come: no trainfleet state at all."""
    lab.fresh(3)
    return lab
