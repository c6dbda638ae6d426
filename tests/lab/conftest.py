"""Lab tests run against real sshd nodes in network namespaces; they need root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.lab.harness import LabController

HERE = Path(__file__).resolve().parent
# Set by tests/run_suite.py: an open descriptor of the cpuacct.usage file of this shard's CPU
# group, which holds every process the shard starts, the lab nodes' included (a descriptor: `ip
# netns exec` mounts a /sys without the cgroup file systems). Each lab test's CPU is read from it.
CPU_FD = int(os.environ.get("TRAINFLEET_SUITE_CPU_FD", "-1"))
_cpu_by_test: dict[str, float] = {}


def _cpu_seconds() -> float:
    return int(os.pread(CPU_FD, 64, 0)) / 1e9


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if CPU_FD < 0:
        yield
        return
    before = _cpu_seconds()
    yield  # setup (a module's lab, the first time) + call + teardown
    _cpu_by_test[item.nodeid] = _cpu_seconds() - before


def pytest_terminal_summary(terminalreporter):
    if _cpu_by_test:
        terminalreporter.write_sep("=", "most CPU (the test's lab nodes and pyinfra included)")
        ranked = sorted(_cpu_by_test.items(), key=lambda kv: kv[1], reverse=True)
        for nodeid, seconds in ranked[:15]:
            terminalreporter.write_line(f"{seconds:.2f}s cpu      {nodeid}")


# Modules that share the torch-converged lab, in the order they run: last and back to back, so
# the stack is installed once per session (a `lab.fresh()` between them would install it again).
# test_sudo_login hardens that lab (root refused), so it runs last of all.
TORCH_MODULES = (
    "test_launchers.py",
    "test_torch_preflight.py",
    "test_torch_stack.py",
    "test_sudo_login.py",
)


def _torch_rank(item) -> int:
    name = Path(str(item.fspath)).name
    return TORCH_MODULES.index(name) + 1 if name in TORCH_MODULES else 0


def pytest_collection_modifyitems(config, items):
    items.sort(key=_torch_rank)  # stable: every module keeps its own order
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.lab)
            if os.geteuid() != 0:
                # In CI a lab test that cannot run is a failure: a green run must have run them.
                if os.environ.get("CI"):
                    raise pytest.UsageError(
                        "lab tests need root (namespaces, mounts) and CI must run them"
                    )
                item.add_marker(pytest.mark.skip(reason="lab tests need root (namespaces, mounts)"))


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> LabController:
    # The session's own key store, so tests never touch the developer's .trainfleet/.
    os.environ["TRAINFLEET_HOME"] = str(tmp_path_factory.mktemp("trainfleet-home"))
    controller = LabController()
    if controller.lab.is_up():
        pytest.fail(
            "a lab is already up: the tests bring up their own (`python -m lab down` first)"
        )
    yield controller
    left = controller.down()
    assert not left, f"the test lab left this behind: {left}"


@pytest.fixture()
def lab3(lab: LabController) -> LabController:
    """A freshly booted 3-node lab, as new servers would come: no trainfleet state at all."""
    lab.fresh(3)
    return lab


@pytest.fixture()
def torch_lab(lab: LabController, tmp_path_factory) -> tuple[LabController, str]:
    """A 3-node lab converged with torch pinned in every node's venv (from the wheelhouse),
    shared by the tests that need it (installing torch takes minutes). Each test starts with
    no preflight verdicts on the controller: an earlier test's failed node is not left out of
    this one's healthy launch files."""
    from trainfleet.stamps import stamps_path

    stamps_path("lab").unlink(missing_ok=True)
    return converged_torch_lab(lab, tmp_path_factory)


def converged_torch_lab(lab: LabController, tmp_path_factory) -> tuple[LabController, str]:
    """The torch lab, converged on first use and reused while nothing re-booted it."""
    from tests.lab.harness import TORCH_STACK, deploy_twice

    inventory = str(tmp_path_factory.getbasetemp() / "torch" / "variant.py")
    if lab.prepared != "torch":
        lab.fresh(3)
        workdir = tmp_path_factory.getbasetemp() / "torch"
        workdir.mkdir(exist_ok=True)
        inventory = lab.spec_inventory(workdir, stack=TORCH_STACK)
        lab.torch_first_run, _ = deploy_twice(inventory, "deploy/cluster.py")
        lab.prepared = "torch"
    return lab, inventory
