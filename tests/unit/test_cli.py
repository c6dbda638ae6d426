"""The `trainfleet` console script: installed with the package, the same main (and subcommands) as
`python -m trainfleet`."""

from __future__ import annotations

import importlib.metadata
import json
import os
import pkgutil
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.unit.cli_run import run_cli
from trainfleet.__main__ import main

REPO = Path(__file__).resolve().parents[2]


def _missing(what: str) -> None:
    """`make test` installs the package (`pip install -e '.[test]'`): in CI a missing script is a
    failure, elsewhere (a venv installed before the script existed) a skip."""
    assert not os.environ.get("CI"), f"{what} is missing: make venv installs it"
    pytest.skip(f"{what} is not installed (pip install -e '.[test]')")


def test_the_console_script_is_declared_and_resolves_to_main():
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"trainfleet": "trainfleet.__main__:main"}
    assert pkgutil.resolve_name(scripts["trainfleet"]) is main


def test_the_installed_entry_point_is_the_same_main():
    found = importlib.metadata.entry_points(group="console_scripts", name="trainfleet")
    if not found:
        _missing("the trainfleet entry point")
    (entry,) = found
    assert entry.value == "trainfleet.__main__:main"
    assert entry.load() is main


def _installed() -> Path:
    script = Path(sys.executable).parent / "trainfleet"
    if not script.exists():
        _missing(str(script))
    return script


def _run(*argv: str | Path, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    # ``home``: the controller's TRAINFLEET_HOME (its key store) for this run.
    return run_cli(*argv, env=None if home is None else {"TRAINFLEET_HOME": str(home)})


EXAMPLE_OK = "inventories/prod.yml: ok: 2 nodes (gpu-a[01-02]), 16 GPUs, master gpu-a01\n"


def test_the_installed_script_checks_the_example_spec():
    result = _run(_installed(), "check", "inventories/prod.yml")
    assert result.returncode == 0, result.stderr
    assert result.stdout == EXAMPLE_OK


def test_both_commands_offer_the_same_subcommands_each_under_its_own_name():
    script = _run(_installed(), "--help")
    module = _run(sys.executable, "-m", "trainfleet", "--help")
    assert script.returncode == module.returncode == 0, script.stderr + module.stderr
    usage = "[-h] [--version]"
    assert script.stdout.startswith(f"usage: trainfleet {usage}")
    assert module.stdout.startswith(f"usage: python -m trainfleet {usage}")
    # the same help under each name (argparse wraps the usage line by the name's length)
    assert " ".join(script.stdout.replace("trainfleet", "T").split()) == " ".join(
        module.stdout.replace("python -m trainfleet", "T").split()
    )


def test_python_m_trainfleet_still_runs_main():
    result = _run(sys.executable, "-m", "trainfleet", "check", "inventories/prod.yml")
    assert result.returncode == 0, result.stderr
    assert result.stdout == EXAMPLE_OK


def test_the_version_and_the_exit_status_of_a_usage_error_apart_from_a_bad_spec(tmp_path):
    version = _run(_installed(), "--version")
    assert version.returncode == 0 and version.stdout.startswith("trainfleet 0.")
    assert _run(_installed(), "no-such-command").returncode == 64
    assert _run(_installed(), "check").returncode == 64  # no spec named
    bad = tmp_path / "bad.yml"
    bad.write_text("nodes: 3\n")
    assert _run(_installed(), "check", str(bad)).returncode == 2


def test_the_help_lists_every_command_and_every_option_of_each():
    helped = _run(_installed(), "--help").stdout
    commands = _run(_installed(), "no-such-command").stderr  # usage names the choices
    names = commands.split("{", 1)[1].split("}", 1)[0].split(",")
    assert {"check", "deploy", "drift", "preflight", "capture", "remediate"} <= set(names)
    for name in names:
        (line,) = [ln for ln in helped.splitlines() if ln.startswith(f"  trainfleet {name} ")]
        options = _run(_installed(), name, "--help").stdout
        listed = set(re.findall(r"^ {2}(?:(-\w), )?(--[\w-]+)", options, re.M)) - {("-h", "--help")}
        assert listed or name == "schema", options  # the parse found options where there are
        for short, option in listed:  # the usage line names an option by its short name if any
            said = short or option
            assert f"[{said}" in line or f" {said} " in line, (name, said)
    assert "exit status: 0 ok, 1 findings or failed nodes, 2 a bad spec" in helped


def test_check_json_reports_problems_as_json_too(tmp_path):
    bad = tmp_path / "bad.yml"
    bad.write_text("nodes: 3\n")
    run = _run(_installed(), "check", "--json", str(bad), "inventories/prod.yml")
    assert run.returncode == 2 and run.stderr == ""
    refused, good = map(json.loads, run.stdout.splitlines())
    assert refused == {
        "spec": str(bad),
        "ok": False,
        "problems": [
            f"{bad}:1: nodes: must be a list of nodes, got integer; accepts: a list of nodes, "
            "each a mapping of name, address, gpus, npus, ssh, nccl (name and address required)"
        ],
    }
    assert good["ok"] is True and good["spec"] == "inventories/prod.yml" and good["nodes"]


def test_keys_list_and_ca_read_the_store_and_never_make_a_key_or_a_ca(tmp_path):
    listed = _run(_installed(), "keys", "list", "inventories/prod.yml", home=tmp_path / "home")
    assert listed.returncode == 0, listed.stderr
    assert "root@gpu-a01: no key yet (the deploy makes it)" in listed.stdout
    ca = _run(_installed(), "keys", "ca", "inventories/prod.yml", home=tmp_path / "home")
    assert ca.returncode == 1 and "no CA yet; the first deploy makes it" in ca.stderr
    assert not (tmp_path / "home").exists()  # nothing made, not even a folder


def test_the_front_door_builds_pyinfras_command_and_refuses_bad_flags_before_it(tmp_path):
    from trainfleet import front_door

    parser = __import__("argparse").ArgumentParser()
    front_door.add_parsers(parser.add_subparsers(dest="command"))
    args = parser.parse_args(
        ["preflight", "inventories/prod.yml", "--stale", "6h", "--smoke", "deepspeed", "--limit",
         "gpu-a01", "--wide", "--metrics", str(tmp_path / "p.prom")]
    )  # fmt: skip
    argv, env = front_door.command("preflight", args)
    assert argv[1:] == [
        "-y", "--limit", "gpu-a01",
        "--data", f"trainfleet_metrics={tmp_path / 'p.prom'}",
        "--data", "trainfleet_stale=6h", "--data", "trainfleet_smoke=deepspeed",
        "inventories/from_spec.py", "deploy/preflight.py",
    ]  # fmt: skip
    assert env == {
        "TRAINFLEET_SPEC": str((REPO / "inventories/prod.yml").resolve()),
        "TRAINFLEET_WIDE": "1",
    }
    deploy = parser.parse_args(["deploy", "x.yml", "--dry"])
    assert front_door.command("deploy", deploy)[0][1:] == [
        "--dry",
        "inventories/from_spec.py",
        "deploy/cluster.py",
    ]
    for argv, why in (
        (["preflight", "inventories/prod.yml", "--stale", "6x"], "--stale:"),
        (["preflight", "inventories/prod.yml", "--smoke", "slurm"], "--smoke:"),
        (["drift", "inventories/prod.yml", "--metrics", str(tmp_path / "m.txt")], "--metrics:"),
        (["deploy", "inventories/prod.yml", "--dry", "-y"], "--dry and -y"),
    ):
        run = _run(_installed(), *argv)
        assert run.returncode == 64 and why in run.stderr, (argv, run.stderr)
    assert _run(_installed(), "remediate", "inventories/prod.yml").returncode == 64  # no --node
    # --limit and --node against the spec's nodes: a limit matching none would check nothing
    names = ["gpu-a01", "gpu-a02"]
    for ok in (["--limit", "gpu-a01"], ["--limit", "gpu-a0*,nodes"], []):
        assert front_door.node_problems(parser.parse_args(["drift", "x.yml", *ok]), names) == []
    (limit,) = front_door.node_problems(
        parser.parse_args(["drift", "x.yml", "--limit", "gpu-a01,gpu-b*"]), names
    )
    assert limit == "--limit: 'gpu-b*' matches no node of the spec (gpu-a[01-02])"
    (node,) = front_door.node_problems(
        parser.parse_args(["remediate", "x.yml", "--node", "gpu-a03"]), names
    )
    assert node.startswith("--node: 'gpu-a03' is no node of the spec")
    run = _run(_installed(), "remediate", "inventories/prod.yml", "--node", "gpu-a03")
    assert run.returncode == 64 and "--> " not in run.stderr  # pyinfra never started
    bad = tmp_path / "bad.yml"
    bad.write_text("nodes: 3\n")
    assert _run(_installed(), "drift", str(bad)).returncode == 2
