"""StackVersions: one command per node, parsed from realistic captured outputs
(tests/fixtures/stack/facts)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra_testing.facts import make_fact_tests

from facts.stack_facts import StackVersions, gcc_info, lock_name
from trainfleet.capabilities import RULES

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stack" / "facts"

TestStackVersions = make_fact_tests("facts", "stack_facts.StackVersions", FIXTURES)


def test_versionlock_entries_name_their_package():
    assert lock_name("libnccl-devel-0:2.21.5-1+cuda12.4.*") == "libnccl-devel"  # dnf
    assert lock_name("0:libnccl-2.21.5-1+cuda12.4.*") == "libnccl"  # yum (EL7)
    assert lock_name("cuda-toolkit-12-4-0:12.4.1-1.*") == "cuda-toolkit-12-4"


def test_real_dnf_versionlock_entries_name_their_package():
    # `dnf versionlock list` as posted (tests/fixtures/stack/captures): the list file's entries
    captures = FIXTURES.parent / "captures"
    names = ("dnf-versionlock-list_fedora_terraform.txt", "dnf-versionlock_fedora33_tcsh.txt")
    entries = [line for name in names for line in (captures / name).read_text().splitlines()[1:]]
    assert [lock_name(entry) for entry in entries] == ["terraform", "tcsh"]


@pytest.mark.parametrize(
    "fixture, stack, released",
    [
        # `apt-mark unhold libnccl2`: dpkg's selection goes from hold to install
        (
            "ubuntu2204_cuda124_converged.json",
            {"cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5-1"},
            lambda line: (
                line.replace("deb hold ok", "deb install ok") if " libnccl2 " in line else line
            ),
        ),
        # `dnf versionlock delete libnccl`: its entries leave the versionlock list
        (
            "rocky9_cuda124_versionlocked.json",
            {"cuda": "12.4", "cudnn": "9.1.0.70", "nccl": "2.21.5-1"},
            lambda line: "" if line.startswith("lock libnccl-0:") else line,
        ),
    ],
)
def test_drift_names_a_pinned_package_released_from_its_hold(fixture, stack, released):
    from trainfleet.capabilities.stack import package_props, stack_part
    from trainfleet.compare import compare

    output = json.loads((FIXTURES / fixture).read_text())["output"]
    family = StackVersions().process(output)["os"]["family"]
    pins = stack_part(stack, family, gpus=0).packages
    want = {f"package {name} hold": "held" for name in pins}
    before = package_props(StackVersions().process(output))
    after = package_props(StackVersions().process([released(line) for line in output]))
    assert {prop: before[prop] for prop in want} == want
    report = compare("c", ["n1"], {"n1": after}, {"n1": want}, rules=RULES)
    released_name = "libnccl2" if family == "debian" else "libnccl"
    assert [(f.property, f.observed, f.expected) for f in report.findings] == [
        (f"package {released_name} hold", "not held", "held")
    ]


def test_gcc_first_lines():
    assert gcc_info("gcc (Ubuntu 11.4.0-1ubuntu1~22.04) 11.4.0")["major"] == 11
    assert gcc_info("gcc (GCC) 11.2.1 20220127 (Red Hat 11.2.1-9)")["version"] == "11.2.1"
    assert gcc_info("") is None


def test_removed_packages_and_stray_lines_are_not_installed():
    fact = StackVersions().process(
        [
            "id ubuntu",
            "like debian",
            "version 22.04",
            "deb deinstall ok config-files libnccl2 2.18.3-1+cuda12.2",
            "deb install ok installed libnccl-dev 2.21.5-1+cuda12.4",
            "torch 2.4.1+cpu",
            "torch_cuda None",
            "torch_gpu False",
        ]
    )
    assert fact["packages"] == {"libnccl-dev": "2.21.5-1+cuda12.4"}
    assert fact["held"] == []
    assert fact["venv"] is False  # no "venv yes" line: torch lines alone do not make a venv
    assert fact["torch"] == {
        "version": "2.4.1+cpu",
        "cuda": None,
        "gpu": False,
        "cudnn": None,
        "nccl": None,
    }


@pytest.mark.parametrize("bare", [False, True])
def test_the_command_exits_zero_and_parses_with_tools_missing(bare, tmp_path):
    """Run the real script here (read-only probes): with no venv, and with nothing on PATH but
    sh."""
    path = os.environ.get("PATH", "")
    if bare:
        (tmp_path / "bin").mkdir()
        (tmp_path / "bin" / "sh").symlink_to("/bin/sh")
        path = str(tmp_path / "bin")
    command = StackVersions().command(venv=str(tmp_path / "no-venv")).get_raw_value()
    result = subprocess.run(
        ["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60, env={"PATH": path}
    )
    assert result.returncode == 0, result.stderr
    fact = StackVersions().process(result.stdout.splitlines())
    assert fact["venv"] is False and fact["torch"] is None
    assert fact["os"]["id"]  # os-release needs no tool


def test_venv_packages_are_read_by_their_normal_names_and_a_malformed_line_is_dropped():
    from facts.stack_facts import StackVersions

    seen = StackVersions().process(
        [
            "id debian",
            "venv yes",
            "pkg Jinja2 3.1.6",
            "pkg typing_extensions 4.16.0",
            "pkg two words 1.0 extra",
            "pkg ;rm 1.0",
            "torch 2.13.0+cpu",
        ]
    )
    assert seen["venv_packages"] == {"jinja2": "3.1.6", "typing-extensions": "4.16.0"}
    assert seen["torch"]["version"] == "2.13.0+cpu"


@pytest.mark.parametrize("cuda", [None, "12.4"])
def test_without_a_gpu_device_torch_is_read_from_its_files_not_imported(cuda, tmp_path):
    """On a node with no /dev/nvidiactl (the lab, a CPU node) the script reads torch's version
    and CUDA build from its dist-info and torch/version.py (the real file of torch 2.13.0+cpu,
    its ``cuda`` line changed for a CUDA build): importing torch costs seconds of CPU per node
    per run and can only say that no GPU is there."""
    assert not os.path.exists("/dev/nvidiactl"), "this test needs a machine without a GPU"
    venv = tmp_path / "venv"
    subprocess.run(["python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    (site,) = venv.glob("lib/python3*/site-packages")
    info = site / "torch-2.13.0+cpu.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.13.0+cpu\n")
    (site / "torch").mkdir()
    marker = tmp_path / "imported"
    (site / "torch" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    real = (FIXTURES.parent / "torch_files" / "version_2.13.0+cpu.py.txt").read_text()
    if cuda:
        real = real.replace("cuda: Optional[str] = None", f"cuda: Optional[str] = {cuda!r}")
    (site / "torch" / "version.py").write_text(real)
    command = StackVersions().command(venv=str(venv)).get_raw_value()
    result = subprocess.run(["/bin/sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    fact = StackVersions().process(result.stdout.splitlines())
    assert fact["venv"] is True and fact["venv_packages"]["torch"] == "2.13.0+cpu"
    assert fact["torch"] == {
        "version": "2.13.0+cpu",
        "cuda": cuda,
        "gpu": False,
        "cudnn": None,
        "nccl": None,
    }
    assert not marker.exists(), "torch was imported"


def test_what_runs_on_the_stack_is_read_as_pids_only_and_a_forged_line_is_dropped():
    busy = StackVersions().process(
        [
            "busy venv 4242",
            "busy gpu 17",
            "busy venv 4242",  # the same process: once
            "busy venv 12; rm -rf /",
            "busy evil 5",
            "busy gpu 12345678901",  # more digits than a pid has
            "busy unknown gpu",  # nvidia-smi failed: a job cannot be ruled out
            "busy unknown evil",
        ]
    )["busy"]
    assert busy == {"venv": [4242], "gpu": [17], "unknown": ["gpu"]}
    assert StackVersions.default()["busy"] == {"venv": [], "gpu": [], "unknown": []}


def test_the_busy_probe_finds_a_process_mapping_the_venv_through_a_link_and_not_itself(tmp_path):
    """The script's own probe, run here: a process that maps a file under the venv's real path
    is found when the venv is named through a symbolic link; this shell is not."""
    real = tmp_path / "real-venv"
    (real / "lib").mkdir(parents=True)
    library = real / "lib" / "held.bin"
    library.write_bytes(b"\0" * 4096)
    (tmp_path / "venv").symlink_to(real)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import mmap, sys, time; f = open({str(library)!r}, 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print('held', flush=True); "
            "time.sleep(30)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        out = subprocess.run(
            StackVersions().command(str(tmp_path / "venv")).get_raw_value(),
            shell=True,
            capture_output=True,
            text=True,
            timeout=60,
        )
        busy = StackVersions().process(out.stdout.splitlines())["busy"]
        assert busy["venv"] == [holder.pid]
    finally:
        holder.kill()
        holder.wait()
