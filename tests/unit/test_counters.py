"""InfiniBand error counters before and after the bandwidth stage: the stage's script run here
over a real sysfs tree (leptonai/gpud's H100 node, tests/fixtures/hardware/infiniband), one
counter file changed between the readings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from checks.bandwidth_stage import COUNTERS
from checks.counters_verdicts import counter_problems, read_counters
from trainfleet.hw.infiniband import ERROR_COUNTERS

TREE = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "infiniband"
TREE = TREE / "sys-class-infiniband-h100.0"


def reading(root: Path) -> dict:
    out = subprocess.run(
        ["sh", "-c", COUNTERS, "trainfleet", " ".join(ERROR_COUNTERS), str(root)],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return read_counters(out.stdout.splitlines())


def test_a_port_whose_symbol_errors_grew_under_load_is_named_and_static_counts_are_not(tmp_path):
    sysfs = tmp_path / "sys" / "class" / "infiniband"
    shutil.copytree(TREE, sysfs)
    before = reading(tmp_path)
    assert before[("mlx5_1", "1", "link_downed")] == 255  # a count from before: not judged
    assert before[("mlx5_4", "1", "symbol_error")] == 0
    assert len({(h, p) for h, p, _ in before}) == 9 and len(before) == 9 * len(ERROR_COUNTERS)
    assert counter_problems({"n1": before}, {"n1": reading(tmp_path)}) == []
    (sysfs / "mlx5_4" / "ports" / "1" / "counters" / "symbol_error").write_text("12")
    (problem,) = counter_problems({"n1": before}, {"n1": reading(tmp_path)})
    assert (problem.stage, problem.node) == ("bandwidth", "n1")
    assert "mlx5_4 port 1 symbol_error 0 -> 12" in problem.cause
    # a counter reset in between says nothing; a node without HCAs reads none
    assert (
        counter_problems(
            {"n1": {("a", "1", "symbol_error"): 9}}, {"n1": {("a", "1", "symbol_error"): 0}}
        )
        == []
    )
    assert reading(tmp_path / "nothing") == {}
    assert read_counters(["ib mlx5_0 1 symbol_error 3", "ib ../x 1 symbol_error 3", "junk"]) == {
        ("mlx5_0", "1", "symbol_error"): 3
    }


def test_a_gpu_whose_pcie_replays_grew_under_load_is_named(tmp_path):
    """On a GPU node the script also sends nvidia-smi -q -x (here the H100's real document, its
    replay_counter 2; then the same with one line changed: 40)."""
    xml = TREE.parents[1] / "h100_device" / "nvidia-smi-q.xml"
    after = tmp_path / "after.xml"
    text = xml.read_text()
    assert text.count("<replay_counter>2</replay_counter>") == 1
    after.write_text(text.replace("<replay_counter>2<", "<replay_counter>40<"))
    (tmp_path / "bin").mkdir()
    smi = tmp_path / "bin" / "nvidia-smi"

    def read_with(document: Path) -> dict:
        smi.write_text(f"#!/bin/sh\ncat '{document}'\n")
        smi.chmod(0o755)
        out = subprocess.run(
            ["sh", "-c", COUNTERS, "trainfleet", " ".join(ERROR_COUNTERS), str(tmp_path), "gpu"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
            env={"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin"},
        )
        return read_counters(out.stdout.splitlines())

    before = read_with(xml)
    assert before == {("00000000:00:06.0", "PCIe", "replays"): 2}
    (problem,) = counter_problems({"g": before}, {"g": read_with(after)})
    assert "GPU 00000000:00:06.0 PCIe replays 2 -> 40" in problem.cause
    assert read_counters(["smi not-base64!"]) == {}


def test_a_watched_node_whose_counters_could_not_be_read_fails():
    (problem,) = counter_problems({"n1": {}}, {"n1": {}}, ["n1"])
    assert problem.node == "n1" and "could not be read before the bandwidth stage" in problem.cause
