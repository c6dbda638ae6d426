"""The layout enforces itself: module names unique across the product's folders, and the layers of
../shared/ARCHITECTURE.md as import contracts (pyproject.toml's [tool.importlinter]) that hold."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = (
    "trainfleet",
    "facts",
    "operations",
    "runtime",
    "checks",
    "deploy",
    "inventories",
    "lab",
    "bench",
)
# Every package has these; `python -m X` needs the second.
PACKAGE_FILES = {"__init__.py", "__main__.py"}


def shared_names(root: Path, folders: tuple[str, ...] = PRODUCT) -> dict[str, list[str]]:
    """Module file names found more than once under ``folders``, each with its paths."""
    seen: dict[str, list[str]] = defaultdict(list)
    for folder in folders:
        for path in sorted((root / folder).rglob("*.py")):
            if path.name not in PACKAGE_FILES:
                seen[path.name].append(str(path.relative_to(root)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def test_no_two_modules_share_a_name_across_the_product_folders():
    assert shared_names(ROOT) == {}


def test_a_shared_name_is_found_in_any_folder_and_depth(tmp_path):
    for path in ("facts/drift.py", "checks/sub/drift.py", "lab/__init__.py", "bench/__init__.py"):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).touch()
    (tmp_path / "trainfleet").mkdir()
    assert shared_names(tmp_path, ("trainfleet", "facts", "checks", "lab", "bench")) == {
        "drift.py": ["facts/drift.py", "checks/sub/drift.py"]
    }


def _lint_imports() -> str:
    # The venv's own (make venv installs it with the `test` extra), else one on PATH.
    found = shutil.which("lint-imports", path=f"{Path(sys.executable).parent}{os.pathsep}")
    found = found or shutil.which("lint-imports")
    if not found:
        # In CI the contracts must have been checked: a missing tool is a failure there.
        assert not os.environ.get("CI"), "lint-imports is missing: make venv installs it"
        pytest.skip("lint-imports is not installed (pip install -e '.[test]')")
    return found


def _run_lint_imports(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_lint_imports(), "--no-cache"], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_the_import_contracts_hold():
    result = _run_lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr


# Planted imports, each of which must be caught, and named, by the contract it breaks.
PLANTED = [
    ("trainfleet/model.py", "gevent", "The core imports neither pyinfra nor gevent"),
    ("trainfleet/spec.py", "pyinfra.api", "The core imports neither pyinfra nor gevent"),
    ("trainfleet/model.py", "facts.hosts_facts", "Layers:"),
    ("facts/hosts_facts.py", "runtime.gather", "Layers:"),
    ("checks/publish.py", "operations.remote", "Layers:"),  # siblings stay independent
    ("operations/hosts_ops.py", "deploy.cluster", "Layers:"),
    ("facts/hosts_facts.py", "trainfleet.keystore", "Facts import only"),
    ("inventories/prod.py", "facts.hosts_facts", "Inventories use the run-time"),
    ("lab/netns.py", "trainfleet.model", "The lab imports nothing of the product"),
    ("runtime/faults.py", "lab.netns", "The product imports neither the lab nor the benchmark"),
]


@pytest.fixture(scope="module")
def product_copy(tmp_path_factory) -> Path:
    copy = tmp_path_factory.mktemp("layout")
    for folder in PRODUCT:
        shutil.copytree(ROOT / folder, copy / folder, ignore=shutil.ignore_patterns("*.pyc"))
    shutil.copy(ROOT / "pyproject.toml", copy)
    return copy


def _lint_with_planted(copy: Path, importer: str, imported: str) -> str:
    """What lint-imports says of the copy with ``import imported`` added to ``importer``
    (taken out again after); it must fail."""
    planted = copy / importer
    original = planted.read_text()
    planted.write_text(original + f"\nimport {imported}  # planted\n")
    try:
        result = _run_lint_imports(copy)
    finally:
        planted.write_text(original)
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    return output


@pytest.mark.parametrize(("importer", "imported", "contract"), PLANTED)
def test_a_planted_import_breaks_its_contract(product_copy, importer, imported, contract):
    output = _lint_with_planted(product_copy, importer, imported)
    module = importer.removesuffix(".py").replace("/", ".")
    top = imported.partition(".")[0]
    # An external package is named as a whole (pyinfra, not pyinfra.api).
    shown = imported if top in PRODUCT else top
    assert f"{module} -> {shown} (l." in _report_of(output, contract), output


@pytest.mark.parametrize(
    ("importer", "imported", "named"),
    [
        ("trainfleet/compare.py", "trainfleet.plan", "- .plan -> .capabilities"),
        ("trainfleet/model.py", "trainfleet.capabilities.hosts", "- .model -> .capabilities"),
        ("trainfleet/plan_types.py", "trainfleet.capabilities", "- .plan_types -> .capabilities"),
    ],
)
def test_a_planted_import_circle_in_the_core_is_named(product_copy, importer, imported, named):
    """The comparison, the model and the plan's types stay below the capabilities: an import
    that closes a circle is refused, naming the import that would break it."""
    output = _lint_with_planted(product_copy, importer, imported)
    assert "No cycles are allowed in trainfleet." in output and named in output, output


def _report_of(output: str, contract: str) -> str:
    """What lint-imports says under a broken contract's heading (its name, underlined)."""
    lines = output.splitlines()
    headings = [i for i, line in enumerate(lines[:-1]) if line and lines[i + 1] == "-" * len(line)]
    for start, end in zip(headings, [*headings[1:], len(lines)], strict=True):
        if lines[start].startswith(contract):
            return "\n".join(lines[start:end])
    return ""
