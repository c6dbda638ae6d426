"""A property costs its capability's module, nothing else: in a copy of the tree, hosts,
nccl_env and launchers each get a throwaway part of their plan and a property drift observes
and expects (from a section they already read), only in their own module; the tests that loop
over the registry (the plan, the deploy's recording run, drift, the controller benchmark's fake
nodes, the docs) still pass there, untouched. A hand-kept list of properties or parts anywhere
else would break them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPIED = [
    "trainfleet",
    "facts",
    "runtime",
    "operations",
    "checks",
    "deploy",
    "inventories",
    "lab",
    "bench",
    "templates",
    "tests",
    "docs",
    "README.md",
    "pyproject.toml",
]
# The tests that loop over the registry, or over every property and part of a node's plan.
GUARDED = [
    "tests/unit/test_capabilities.py",
    "tests/unit/test_plan.py",
    "tests/unit/test_pure_plan.py",
    "tests/unit/test_drift.py",
    "tests/unit/test_drift_observe.py",
    "tests/unit/test_controller_bench.py",
    "tests/unit/test_docs.py",
]
# capability -> (its plan part's dataclass, the value the plan gives the new field, what drift
# observes of a node: an expression over ``fp``, the node's answers, of a section the capability
# reads already, that no fault the tests inject changes (their "a changed fact changes exactly
# the property read from it" would rightly name it otherwise))
THROWAWAY = {
    "hosts": ("HostsPlan", "1", 'str(int("throwaway" not in fp["hosts"]))'),
    "nccl_env": ("NcclPlan", "1", 'str(int("throwaway" not in fp["nccl_seen"]))'),
    "launchers": ("LaunchersPlan", "1", 'str(int("throwaway" not in fp["launchers"]))'),
}
# In the copy: every converged node of the benchmark's fleet is observed with the new properties
# as planned, and a node whose answer differs is named by drift on exactly that property.
REACHES_DRIFT = """
import copy, tempfile
from pathlib import Path
from bench.controller import fleet as fleet_mod
from bench.controller.record import load
from checks.drift_check import expect, observe
from tests.unit.test_pure_plan import _fingerprints
from trainfleet.capabilities import RULES
from trainfleet.compare import compare

fleet = fleet_mod.build(3, Path(tempfile.mkdtemp()), load())
answers = _fingerprints(fleet)
props = [f"{name} throwaway" for name in ("hosts", "nccl_env", "launchers")]
for name, fp in answers.items():
    plan = fleet.plan.nodes[name]
    seen, wanted = observe(fp, plan, fleet.cluster), expect(plan)
    assert all(seen[p] == wanted[p] == "1" for p in props), (name, seen, wanted)
answers["node0002"] = odd = copy.deepcopy(answers["node0002"])
odd["hosts"]["throwaway"] = True
observed = {n: observe(fp, fleet.plan.nodes[n], fleet.cluster) for n, fp in answers.items()}
expected = {n: expect(fleet.plan.nodes[n]) for n in answers}
report = compare("c", list(answers), observed, expected, rules=RULES)
assert [(f.node, f.property) for f in report.findings] == [("node0002", "hosts throwaway")]
print("reaches drift")
"""


def with_field(text: str, part: str, field: str) -> str:
    """``text`` with ``field`` as the last field of the dataclass ``part``."""
    lines = text.splitlines(keepends=True)
    start = lines.index(f"class {part}:\n")
    end = next(
        i for i in range(start + 1, len(lines)) if lines[i].strip() and not lines[i][0].isspace()
    )
    while not lines[end - 1].strip():
        end -= 1
    return "".join([*lines[:end], f"    {field}\n", *lines[end:]])


def add_throwaway_property(module: Path, name: str) -> None:
    """The edit a developer makes: a field in the part (given by ``plan_part``), and a property
    in ``observe`` and ``expect`` (wrapped at the end of the module, so the edit does not depend
    on how those functions are written today)."""
    part, value, observed = THROWAWAY[name]
    # defaulted to the planned value: a test that builds a part by hand (not by plan_part)
    # holds what the plan would
    text = with_field(module.read_text(), part, "throwaway: int = 1")
    prop = f"{name} throwaway"
    text += f'''

_plan_part, _observe, _expect = plan_part, observe, expect


def plan_part(ctx, node):
    part = _plan_part(ctx, node)
    return replace(part, throwaway={value})


def observe(fp, plan, cluster):
    return {{**_observe(fp, plan, cluster), "{prop}": {observed}}}


def expect(plan):
    mine = plan.{name}
    return {{**_expect(plan), "{prop}": str(mine.throwaway)}} if _expect(plan) else {{}}
'''
    if "from dataclasses import replace" not in text:
        text = text.replace(
            "from __future__ import annotations\n",
            "from __future__ import annotations\n\nfrom dataclasses import replace\n",
            1,
        )
    module.write_text(text)


@pytest.fixture(scope="module")
def tree_with_throwaway_properties(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, copy / name)
    for name in THROWAWAY:
        add_throwaway_property(copy / "trainfleet" / "capabilities" / f"{name}.py", name)
    return copy


def test_a_throwaway_property_costs_its_capabilitys_module_only(tree_with_throwaway_properties):
    copy = tree_with_throwaway_properties
    changed = sorted(
        str(path.relative_to(copy))
        for path in copy.rglob("*.py")
        if "__pycache__" not in path.parts
        and path.read_bytes() != (ROOT / path.relative_to(copy)).read_bytes()
    )
    assert changed == [f"trainfleet/capabilities/{name}.py" for name in sorted(THROWAWAY)]
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *GUARDED],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    # the copy's modules were the ones tested, and the properties were seen
    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            "import trainfleet.capabilities.hosts as h; print(h.__file__); "
            "print(sorted(f.name for f in __import__('dataclasses').fields(h.HostsPlan)))",
        ],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.startswith(str(copy)) and "throwaway" in probe.stdout, probe
    drift = subprocess.run(
        [sys.executable, "-c", REACHES_DRIFT],
        cwd=copy,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert drift.stdout.strip() == "reaches drift", drift.stdout[-2000:] + drift.stderr[-3000:]
