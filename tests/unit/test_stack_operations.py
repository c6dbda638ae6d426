"""Stack operations against fact data (tests/fixtures/stack/<op>), and their pure builders."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pyinfra_testing.operations import make_operation_tests

from operations.stack_busy_ops import busy_guard
from operations.stack_repo_ops import _KEYRING, NVIDIA_REPOS, keyring_install, mirror_problem
from trainfleet.capabilities.stack import StackPlan, cuda_distro, with_files
from trainfleet.pins import package_pins, torch_requirement

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "stack"

TestCudaRepo = make_operation_tests(
    "operations", "stack_repo_ops.cuda_repo", FIXTURES / "cuda_repo"
)
TestPackages = make_operation_tests(
    "operations", "stack_packages_ops.packages", FIXTURES / "packages"
)
TestGcc = make_operation_tests("operations", "stack_gcc_ops.gcc", FIXTURES / "gcc")
TestTorchVenv = make_operation_tests(
    "operations", "stack_venv_ops.torch_venv", FIXTURES / "torch_venv"
)
TestPythonPackages = make_operation_tests(
    "operations", "stack_venv_ops.python_packages", FIXTURES / "python_packages"
)
# What deploy/cluster.py calls: the whole stack from one fact read; a refused part changes nothing.
TestSoftware = make_operation_tests("operations", "stack_ops.software", FIXTURES / "software")

RENDERED = ("cuda_repo_url", "repo_files", "gcc_toolset", "gcc_files")


def _planned_fixtures() -> list[Path]:
    return [
        path
        for folder in ("cuda_repo", "gcc", "software")
        for path in sorted((FIXTURES / folder).glob("*.json"))
        if set(RENDERED) & json.loads(path.read_text())["kwargs"].get("stack", {}).keys()
    ]


@pytest.mark.parametrize("path", _planned_fixtures(), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_the_files_an_operation_fixture_is_given_are_those_the_plan_renders(path):
    """Each fixture's StackPlan holds, for the files it writes, exactly what the plan renders
    (templates/stack/) for that fixture's fact and pins: the operations write only what the
    plan gives them, so their fixtures prove the plan's files too."""
    fixture = json.loads(path.read_text())
    given = fixture["kwargs"]["stack"]
    (found,) = fixture["facts"]["stack_facts.StackVersions"].values()
    pins = {key: value for key, value in given.items() if key not in RENDERED}
    if path.parent.name == "cuda_repo":
        pins["pinned"] = ["cuda"]
    plan = StackPlan(
        pinned=frozenset(pins.get("pinned", [])),
        cuda_repo=pins.get("cuda_repo", NVIDIA_REPOS),
        gcc=pins.get("gcc") if path.parent.name != "cuda_repo" else None,
    )
    rendered = with_files(plan, found)
    wanted = {key: getattr(rendered, key) for key in RENDERED}
    assert {key: given[key] for key in RENDERED if key in given} == {
        key: value for key, value in wanted.items() if value or key in given
    }


PROD = {
    "cuda": "12.4",
    "cudnn": "9.1.0.70",
    "nccl": "2.21.5-1",
    "torch": "2.4.1",
    "torch_cuda": "cu124",
    "gcc": "11",
}


def test_prod_stack_pins_per_family():
    assert package_pins(PROD, "debian") == {
        "cuda-toolkit-12-4": None,
        "libcudnn9-cuda-12": "9.1.0.70-1",
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
    }
    assert list(package_pins(PROD, "rhel")) == [
        "cuda-toolkit-12-4",
        "libcudnn9-cuda-12",
        "libnccl",
        "libnccl-devel",
    ]


def test_full_versions_are_taken_as_given():
    pins = package_pins(
        {"cuda": "12.4.1", "cudnn": "8.9.7.29-1+cuda12.2", "nccl": "2.21.5-1+cuda12.4"}, "debian"
    )
    assert pins == {
        "cuda-toolkit-12-4": "12.4.1-1",
        "libcudnn8": "8.9.7.29-1+cuda12.2",
        "libnccl2": "2.21.5-1+cuda12.4",
        "libnccl-dev": "2.21.5-1+cuda12.4",
    }


def test_openmpi_is_pinned_at_the_exact_package_version_on_each_family():
    assert package_pins({"openmpi": "4.1.4-3+b1"}, "debian") == {"openmpi-bin": "4.1.4-3+b1"}
    assert package_pins({"openmpi": "4.1.1-5.el9"}, "rhel") == {"openmpi": "4.1.1-5.el9"}
    assert package_pins({**PROD, "openmpi": "4.1.4-3+b1"}, "debian")["openmpi-bin"] == "4.1.4-3+b1"


def test_unmanaged_components_pin_nothing():
    assert package_pins({"cuda": None, "cudnn": None, "nccl": None}, "debian") == {}
    with pytest.raises(ValueError):
        package_pins({"cudnn": "9.1.0.70"}, "debian")


@pytest.mark.parametrize(
    ("os_id", "version", "distro"),
    [
        ("ubuntu", "22.04", "ubuntu2204"),
        ("debian", "12", "debian12"),
        ("rocky", "9.4", "rhel9"),
        ("centos", "7", "rhel7"),
        ("almalinux", "8.10", "rhel8"),
    ],
)
def test_nvidia_repo_names(os_id, version, distro):
    family = "debian" if os_id in ("ubuntu", "debian") else "rhel"
    assert (
        cuda_distro({"id": os_id, "family": family, "version": version, "package_manager": None})
        == distro
    )


def test_torch_requirement_is_the_exact_build():
    assert torch_requirement("2.4.1", "cu124") == "torch==2.4.1+cu124"
    assert torch_requirement("2.4.1+cu121", "cu124") == "torch==2.4.1+cu121"


# ---- the keyring script itself, run here against a local .deb (dpkg -i replaced by a stub) ----

needs_tools = pytest.mark.skipif(
    not all(shutil.which(t) for t in ("gpg", "dpkg-deb", "curl")),
    reason="needs gpg, dpkg-deb and curl",
)


def _gpg(home: Path, *args: str) -> bytes:
    return subprocess.run(
        [
            "gpg",
            "--homedir",
            str(home),
            "--batch",
            "--quiet",
            "--pinentry-mode",
            "loopback",
            "--passphrase",
            "",
            *args,
        ],
        check=True,
        capture_output=True,
    ).stdout


def _new_key(home: Path, name: str) -> tuple[bytes, str]:
    """A new signing key: (its public key, binary; its fingerprint)."""
    home.mkdir(mode=0o700)
    try:
        _gpg(
            home,
            "--quick-gen-key",
            f"{name} <{name}@trainfleet.invalid>",
            "ed25519",
            "sign",
            "never",
        )
        colons = _gpg(home, "--with-colons", "--list-keys").decode()
        return _gpg(home, "--export"), next(
            line.split(":")[9] for line in colons.splitlines() if line.startswith("fpr")
        )
    finally:
        subprocess.run(
            ["gpgconf", "--homedir", str(home), "--kill", "all"], check=False, capture_output=True
        )


def _keyring_deb(out: Path, keyring: bytes | None) -> Path:
    root = out / "build"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text(
        "Package: cuda-keyring\nVersion: 1.1-1\nArchitecture: all\n"
        "Maintainer: tests <t@trainfleet.invalid>\nDescription: test\n"
    )
    if keyring is not None:
        (root / "usr/share/keyrings").mkdir(parents=True)
        (root / "usr/share/keyrings/cuda-archive-keyring.gpg").write_bytes(keyring)
    deb = out / "cuda-keyring_1.1-1_all.deb"
    subprocess.run(
        ["dpkg-deb", "--root-owner-group", "--build", str(root), str(deb)],
        check=True,
        capture_output=True,
    )
    return deb


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    work = tmp_path_factory.mktemp("keys")
    return {name: _new_key(work / name, name) for name in ("nvidia", "other")}


def _run_keyring(tmp_path: Path, url: str, fingerprint: str, proto: str, path: str | None = None):
    """The keyring command as cuda_repo renders it, with `dpkg` a stub that logs its arguments."""
    stub = tmp_path / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "dpkg").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/dpkg.log\n')
    os.chmod(stub / "dpkg", 0o755)
    command = keyring_install(url, fingerprint).get_raw_value()
    assert command.endswith(f" {proto}")
    env = {**os.environ, "PATH": f"{stub}:{path or os.environ['PATH']}"}
    run = subprocess.run(["sh", "-c", command], env=env, capture_output=True, text=True, timeout=60)
    log = tmp_path / "dpkg.log"
    return run, log.read_text() if log.exists() else ""


@needs_tools
def test_the_keyring_is_installed_only_when_its_one_key_has_the_pinned_fingerprint(tmp_path, keys):
    (public, fpr), other_fpr = keys["nvidia"], keys["other"][1]
    deb = _keyring_deb(tmp_path, public)

    run, dpkg = _run_keyring(tmp_path, f"file://{deb}", fpr, "file")
    assert run.returncode == 0, run.stderr
    assert dpkg.startswith("-i --force-confold /") and dpkg.rstrip().endswith("/cuda-keyring.deb")

    (tmp_path / "dpkg.log").unlink()
    run, dpkg = _run_keyring(tmp_path, f"file://{deb}", other_fpr, "file")
    assert run.returncode == 1 and dpkg == ""
    assert f"holds the key(s) [{fpr}], not exactly {other_fpr}; nothing installed" in run.stderr


@needs_tools
def test_a_keyring_with_an_extra_key_or_none_is_refused(tmp_path, keys):
    (public, fpr), (other, _) = keys["nvidia"], keys["other"]
    two = _keyring_deb(tmp_path / "two", public + other)
    run, dpkg = _run_keyring(tmp_path, f"file://{two}", fpr, "file")
    assert run.returncode == 1 and dpkg == "" and "not exactly" in run.stderr

    empty = _keyring_deb(tmp_path / "none", None)
    run, dpkg = _run_keyring(tmp_path, f"file://{empty}", fpr, "file")
    assert (
        run.returncode == 1
        and dpkg == ""
        and "has no /usr/share/keyrings/cuda-archive-keyring.gpg" in run.stderr
    )

    (tmp_path / "junk.deb").write_bytes(b"<html>a captive portal</html>")
    run, dpkg = _run_keyring(tmp_path, f"file://{tmp_path}/junk.deb", fpr, "file")
    assert run.returncode == 1 and dpkg == "" and "is not a .deb" in run.stderr


@needs_tools
def test_without_gpg_or_sq_nothing_is_installed(tmp_path, keys):
    public, fpr = keys["nvidia"]
    deb = _keyring_deb(tmp_path, public)
    bin_dir = tmp_path / "bin"  # every tool of this machine but gpg and sq
    bin_dir.mkdir()
    for directory in ("/usr/bin", "/bin"):
        for tool in Path(directory).iterdir():
            if tool.name not in ("gpg", "sq") and not (bin_dir / tool.name).exists():
                (bin_dir / tool.name).symlink_to(tool)
    run, dpkg = _run_keyring(tmp_path, f"file://{deb}", fpr, "file", path=str(bin_dir))
    assert run.returncode == 1 and dpkg == ""
    assert "neither gpg nor sq is installed" in run.stderr


@needs_tools
def test_the_download_keeps_to_the_scheme_it_was_given(tmp_path, keys):
    """curl gets --proto/--proto-redir =<scheme>: told https, an http URL (as a redirect would
    give) is refused by curl itself, before any connection."""
    assert (
        keyring_install("https://m.example.com/k.deb", keys["nvidia"][1])
        .get_raw_value()
        .endswith(" https")
    )
    run = subprocess.run(
        [
            "sh",
            "-c",
            _KEYRING,
            "trainfleet",
            "http://127.0.0.1:9/k.deb",
            keys["nvidia"][1],
            "https",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        run.returncode == 1
        and "cannot download http://127.0.0.1:9/k.deb; nothing installed" in run.stderr
    )
    assert "Protocol" in run.stderr and "connect" not in run.stderr, run.stderr


def test_mirror_schemes():
    assert mirror_problem(NVIDIA_REPOS) is None
    assert mirror_problem("file:///srv/nvidia-mirror") is None
    assert "stack.insecure: true" in mirror_problem("http://mirror.example.com/cuda")
    assert mirror_problem("http://mirror.example.com/cuda", insecure=True) is None
    assert mirror_problem("ftp://mirror.example.com/cuda", insecure=True)
    assert mirror_problem("mirror.example.com/cuda")


def test_venv_pins_take_plain_versions_and_packages_installed_without_their_requirements():
    from trainfleet.pins import venv_pins, without_requirements

    python = {
        "DeepSpeed": "0.19.8",
        "colossalai": {"version": "0.5.0", "deps": False},
        "Fabric": {"version": "3.2.3"},
    }
    assert venv_pins(python) == {"colossalai": "0.5.0", "deepspeed": "0.19.8", "fabric": "3.2.3"}
    assert without_requirements(python) == ["colossalai"]


def test_a_venv_pin_means_what_pips_double_equals_means():
    from trainfleet.pins import satisfies

    assert (
        satisfies("0.19.1+cu124", "0.19.1")
        and satisfies("1.0.0", "1.0")
        and satisfies("2.1.0rc1", "2.1.0rc1")
    )
    assert not satisfies("0.19.2", "0.19.1") and not satisfies("0.19.1+cu121", "0.19.1+cu124")


def _guard(venv: Path | str, path: str) -> subprocess.CompletedProcess:
    command = busy_guard(str(venv)).get_raw_value()
    return subprocess.run(["sh", "-c", command], capture_output=True, text=True, env={"PATH": path})


def _holding(path: Path) -> subprocess.Popen:
    """A process that maps ``path`` (as a library is mapped), until killed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * 4096)
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import mmap, time; f = open({str(path)!r}, 'rb'); "
            "m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ); print('held', flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_the_probe_counts_a_file_below_the_venv_not_a_path_that_merely_holds_it(tmp_path):
    """The probe run for real against three processes: one maps a file below the venv, one a
    file of a sibling whose name starts like it (venv2), one a file below another directory
    whose path holds the venv's whole path. Only the first is the venv's."""
    venv = tmp_path / "opt" / "trainfleet" / "venv"
    inside = venv / "lib" / "held.bin"
    sibling = tmp_path / "opt" / "trainfleet" / "venv2" / "lib" / "held.bin"
    holds = tmp_path / "home" / "x" / str(venv).lstrip("/") / "lib" / "held.bin"
    assert str(venv) in str(holds) and str(sibling).startswith(str(venv))
    holders: list[subprocess.Popen] = []
    try:
        for path in (inside, sibling, holds):
            holders.append(_holding(path))
        found = _guard(venv, os.environ["PATH"])
        assert found.returncode == 1, found.stderr
        named = set(re.findall(r"busy venv ([0-9]+)", found.stderr))
        assert named == {str(holders[0].pid)}
    finally:
        for holder in holders:
            holder.kill()
            holder.wait()


def test_the_guard_before_a_stack_change_stops_it_for_a_job_that_started_since_the_read(
    tmp_path,
):
    """The software operation's first command, run here: a venv no process maps passes; this
    very test's python maps its own venv, named by pid; a GPU process list that is not all
    pids ([N/A]) is not "no job"."""
    path = os.environ["PATH"]
    assert _guard(tmp_path / "venv", path).returncode == 0
    mine = _guard(Path(os.path.realpath(sys.prefix)), path)
    assert mine.returncode == 1 and f"busy venv {os.getpid()}" in mine.stderr
    assert "nothing changed; rerun when it ends" in mine.stderr
    smi = tmp_path / "bin" / "nvidia-smi"
    smi.parent.mkdir()
    smi.write_text("#!/bin/sh\necho 830\necho '[N/A]'\n")
    smi.chmod(0o755)
    unknown = _guard(tmp_path / "venv", f"{smi.parent}:{path}")
    assert unknown.returncode == 1
    assert "busy unknown gpu;busy gpu 830" in unknown.stderr
