"""The controller's own files (stamps, reports, the hardware ledger): written through unique
temp files in the reports folder, so a link planted at a name cannot redirect the write."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from checks import drift_check
from checks.publish import publish, report_path
from trainfleet import stamps
from trainfleet.controller_files import write_atomic


def _plant(reports: Path, names: list[str]) -> Path:
    """A link at each of ``names`` to one victim file: what a writer through them changes."""
    reports.mkdir(parents=True, exist_ok=True)
    victim = reports.parent / "victim"
    victim.write_text("untouched\n")
    for name in names:
        (reports / name).symlink_to(victim)
    return victim


def test_stamps_reports_and_the_ledger_never_write_through_a_planted_temp_name(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TRAINFLEET_HOME", str(tmp_path / "home"))
    reports = stamps.stamps_path("lab").parent
    # the names the writers used before: .<file>.<pid>.tmp, <report>.tmp, <ledger>.tmp
    victim = _plant(
        reports,
        [
            f".preflight-lab-stamps.json.{os.getpid()}.tmp",
            "drift-lab.tmp",
            "hardware-ledger-lab.tmp",
        ],
    )
    stamps.save("lab", {"node1": {"passed": True}})
    publish("t", "table", [], '{"ok": true}', report_path("drift", "lab"), "NO_SUCH_ENV")
    drift_check.write_ledger("lab", {}, {"node1": {"GPU 0 serial": "1"}})
    assert victim.read_text() == "untouched\n"
    assert stamps.load("lab") == {"node1": {"passed": True}}
    assert json.loads(report_path("drift", "lab").read_text()) == {"ok": True}
    ledger = drift_check.ledger_path("lab")
    assert ledger.stat().st_mode & 0o777 == 0o600  # serial numbers: the controller user's
    left = sorted(p.name for p in reports.iterdir() if not p.is_symlink())
    assert left == ["drift-lab.json", "hardware-ledger-lab.json", "preflight-lab-stamps.json"]


def test_a_failed_write_leaves_the_file_as_it_was_and_no_temp_file(tmp_path):
    path = tmp_path / "reports" / "drift-lab.json"
    write_atomic(path, "old\n")
    with pytest.raises(TypeError):
        write_atomic(path, None)  # type: ignore[arg-type]
    (tmp_path / "reports" / "dir.json").mkdir()
    with pytest.raises(IsADirectoryError):
        write_atomic(tmp_path / "reports" / "dir.json", "new\n")
    assert path.read_text() == "old\n"
    assert sorted(p.name for p in path.parent.iterdir()) == ["dir.json", "drift-lab.json"]
