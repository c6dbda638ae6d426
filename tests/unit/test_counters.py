"""InfiniBand error counters before and after the bandwidth stage: the stage's script run here
over a real sysfs tree (leptonai/gpud's H100 node, tests/fixtures/hardware/infiniband), one
counter file changed between the readings."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from checks.bandwidth_stage import COUNTERS
from checks.counters_verdicts import counter_problems, read_counters
from trainfleet.hw.infiniband import ERROR_COUNTERS, ROCE_COUNTERS

TREE = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "infiniband"
TREE = TREE / "sys-class-infiniband-h100.0"
H100 = TREE.parents[1] / "h100_device"
NO_LINKS = H100 / "nvidia-smi-nvlink-e.txt"  # the H100 (a VM's one GPU) has no NVLink: empty
# nvidia-smi nvlink -e of an H100 with links, abridged by its author (tests/fixtures/hardware/
# nvidia_smi/README.md)
LINKS = TREE.parents[1] / "nvidia_smi" / "nvidia-smi-nvlink-e_ml-engineering-h100_abridged.txt"


def reading(root: Path, sh: str = "sh", env: dict[str, str] | None = None) -> dict:
    """counters.sh's reading of the sysfs under ``root`` (``sh``, ``env``: a shell and PATH of
    the test's own, where it stubs a tool)."""
    out = subprocess.run(
        [
            sh,
            "-c",
            COUNTERS,
            "trainfleet",
            " ".join(ERROR_COUNTERS),
            str(root),
            "",
            " ".join(ROCE_COUNTERS),
        ],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
        env=env,
    )
    return read_counters(out.stdout.splitlines())


def test_a_port_whose_symbol_errors_grew_under_load_is_named_and_static_counts_are_not(tmp_path):
    sysfs = tmp_path / "sys" / "class" / "infiniband"
    shutil.copytree(TREE, sysfs)
    before = reading(tmp_path)
    assert before[("mlx5_1", "1", "link_downed")] == 255  # a count from before: not judged
    assert before[("mlx5_4", "1", "symbol_error")] == 0
    errors = {key: v for key, v in before.items() if key[2] in ERROR_COUNTERS}
    assert len({(h, p) for h, p, _ in errors}) == 9 and len(errors) == 9 * len(ERROR_COUNTERS)
    # each port's link layer is read beside them: mlx5_bond_0 is the one RoCE port
    assert [key for key in before if key[2] == "link_layer/Ethernet"] == [
        ("mlx5_bond_0", "1", "link_layer/Ethernet")
    ]
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

    def read_with(document: Path, links: Path = NO_LINKS) -> dict:
        # nvidia-smi nvlink -e prints the links' counters, nvidia-smi -q -x the document
        smi.write_text(
            f"#!/bin/sh\nif [ \"$1\" = nvlink ]; then cat '{links}'; else cat '{document}'; fi\n"
        )
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

    # an NVLink's error counters: each read; one that grew between the readings is named
    with_links = read_with(xml, LINKS)
    nvlinks = {key: v for key, v in with_links.items() if key[1].startswith("NVLink")}
    assert len(nvlinks) == 9 and set(nvlinks.values()) == {0}  # links 0, 1, 17: three each
    assert nvlinks[("GPU 0", "NVLink 17", "CRC Errors")] == 0
    grown = tmp_path / "grown.txt"
    text = LINKS.read_text()
    assert text.count("Link 1: CRC Errors: 0") == 1
    grown.write_text(text.replace("Link 1: CRC Errors: 0", "Link 1: CRC Errors: 12"))
    (problem,) = counter_problems({"g": with_links}, {"g": read_with(xml, grown)})
    assert "GPU 0 NVLink 1 CRC Errors 0 -> 12" in problem.cause and "NVLink: reset" in problem.cause


def test_a_watched_node_whose_counters_could_not_be_read_fails():
    (problem,) = counter_problems({"n1": {}}, {"n1": {}}, ["n1"])
    assert problem.node == "n1" and "could not be read before the bandwidth stage" in problem.cause


def test_a_counter_read_before_the_stage_but_not_after_is_named():
    before = {("GPU 0", "NVLink 1", "CRC Errors"): 0, ("mlx5_0", "1", "symbol_error"): 0}
    after = {("mlx5_0", "1", "symbol_error"): 0}  # nvidia-smi nvlink -e timed out after
    (problem,) = counter_problems({"g": before}, {"g": after}, ["g"])
    assert problem.node == "g" and "could not be read after it: GPU 0 NVLink 1 CRC Errors" in (
        problem.cause
    )
