"""Preflight verdicts from stage output (no GPUs here: the GPU lines are captured tool output)."""

from __future__ import annotations

import json
import os
import re
import secrets
import socket
import subprocess
import sys
import time
from datetime import UTC
from pathlib import Path

import pytest

from checks import (
    bandwidth_stage,
    collective_stage,
    collective_verdicts,
    preflight_check,
    rank_output,
    reachability_stage,
    smoke_stage,
    stage_runner,
)
from checks.bandwidth_verdicts import pair_figures
from checks.collective_verdicts import (
    collective_problems,
    isolate,
    second_pass,
    version_problems,
)
from checks.healthy_subset import healthy_subset
from checks.hygiene_output import parse_hygiene
from checks.hygiene_verdicts import hygiene_problems
from checks.preflight_report import PreflightReport
from checks.reachability_verdicts import listener_pids
from checks.stage_runner import shell_stage, stage_script
from trainfleet import Cluster
from trainfleet.nccl import ENV_PREFIXES
from trainfleet.spec import parse_cluster

CLUSTER = parse_cluster("""\
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}
  - {name: gpu-a02, address: 192.0.2.12, gpus: 8}
  - {name: gpu-a03, address: 192.0.2.13, gpus: 8}
""")
# `nvidia-smi -L` on an 8x H100 SXM node (format of nvidia-smi 550; UUIDs shortened).
NVIDIA_SMI_L = [
    f"gpu GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-5b7a1c3e-0c2d-4f1a-9e6b-7d3c2a1b0f{i:02d})"
    for i in range(8)
]
# `ss -Hltnp 'sport = :29500'` while a stale torchrun still holds the port.
SS_HOLDER = (
    "holder LISTEN 0      128          0.0.0.0:29500      0.0.0.0:*    "
    'users:(("python3",pid=4242,fd=3))'
)
ENV = {
    "NCCL_SOCKET_IFNAME": "=ens1f0",
    "GLOO_SOCKET_IFNAME": "ens1f0",
    "NCCL_IB_HCA": "=mlx5_0:1",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",  # nccl.env passes it through: checked as seen
}


def node_output(
    cvd: str = "", slots: int = 8, env: dict | None = None, extra: list[str] | None = None
) -> list[str]:
    resolves = [f"resolve {n.name} {n.address}" for n in CLUSTER.nodes]
    env_lines = [f"env {k}={v}" for k, v in (ENV if env is None else env).items()]
    return [
        *(extra or []),
        *resolves,
        "gpus",
        *NVIDIA_SMI_L,
        f"cvd {cvd}",
        *env_lines,
        f"slots {slots}",
    ]


def problems_for(outputs: dict[str, list[str]]) -> list[str]:
    seen = {node: parse_hygiene(lines) for node, lines in outputs.items()}
    slots = {node: data.pop("slots") for node, data in seen.items() if "slots" in data}
    expected = {n.name: ENV for n in CLUSTER.nodes}
    return [f"{p.node}: {p.cause}" for p in hygiene_problems(CLUSTER, seen, expected, slots)]


def test_a_healthy_gpu_cluster_passes_hygiene():
    assert problems_for({n.name: node_output() for n in CLUSTER.nodes}) == []


def test_fewer_visible_gpus_than_processes_and_wrong_slots_are_named():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a02"] = node_output(cvd="0,1,2,3", slots=4)
    assert problems_for(outputs) == [
        "gpu-a02: hostfile gives 4 slots, the spec 8 (8 GPUs)",
        "gpu-a02: only 4 GPUs visible (CUDA_VISIBLE_DEVICES=0,1,2,3), the spec needs 8",
    ]


def test_a_taken_master_port_names_the_master_and_the_holder():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a01"] = node_output(extra=[SS_HOLDER])
    assert problems_for(outputs) == [
        'gpu-a01: master port 29500 is already in use (users:(("python3",pid=4242,fd=3)))'
    ]


def test_a_missing_or_wrong_variable_in_the_non_login_environment_is_named():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a03"] = node_output(
        env={
            "NCCL_SOCKET_IFNAME": "=eno1",
            "NCCL_IB_HCA": "=mlx5_0:1",
            "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }
    )
    assert problems_for(outputs) == [
        "gpu-a03: NCCL_SOCKET_IFNAME is '=eno1' in the non-login environment ranks get, expected "
        "'=ens1f0'",
        "gpu-a03: GLOO_SOCKET_IFNAME is 'missing' in the non-login environment ranks get, expected "
        "'ens1f0'",
    ]


def test_a_planned_torch_variable_missing_and_a_stray_nccl_one_are_named_a_cuda_home_is_not():
    """Checked as seen: every NCCL_/GLOO_/UCX_ variable ranks get, and the TORCH_/CUDA_ ones
    the plan names (a CUDA profile script's CUDA_HOME is not the plan's business)."""
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    env = {k: v for k, v in ENV.items() if not k.startswith("TORCH_")}
    outputs["gpu-a02"] = node_output(
        env={**env, "NCCL_IB_DISABLE": "1", "CUDA_HOME": "/usr/local/cuda", "TORCH_HOME": "/x"}
    )
    assert problems_for(outputs) == [
        "gpu-a02: TORCH_NCCL_ASYNC_ERROR_HANDLING is 'missing' in the non-login environment "
        "ranks get, expected '1'",
        "gpu-a02: NCCL_IB_DISABLE is '1' in the non-login environment ranks get, which the "
        "plan does not set",
    ]


def test_the_hygiene_script_prints_the_variables_of_the_families_it_is_given():
    """The real script on this machine, handed trainfleet.nccl.ENV_PREFIXES as the stage
    hands it: every family the list names is printed, nothing else (no second list in it)."""
    names = {p: f"{p}TRAINFLEET_TEST" for p in ENV_PREFIXES}
    command = shell_stage(
        stage_script("hygiene.sh"), 1, 0, "me", "/nonexistent", "x", "", "", " ".join(ENV_PREFIXES)
    )
    clean = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIXES)}
    out = subprocess.run(
        ["sh", "-c", command.get_raw_value()],
        capture_output=True,
        text=True,
        timeout=30,
        env={**clean, **{name: "1" for name in names.values()}, "OTHER_TRAINFLEET_TEST": "1"},
    ).stdout.splitlines()
    assert parse_hygiene(out)["env"] == {name: "1" for name in names.values()}


def test_a_name_resolving_elsewhere_is_named():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a02"] = [
        line.replace("resolve gpu-a03 192.0.2.13", "resolve gpu-a03 192.0.2.99")
        for line in node_output()
    ]
    assert problems_for(outputs) == ["gpu-a02: gpu-a03 resolves to 192.0.2.99, not 192.0.2.13"]


V = {"torch": "2.4.1+cu124", "cuda": "12.4", "nccl": "2.20.5"}


def finished(world: int = 24, versions: list | None = None, gpu: str | None = None) -> list[dict]:
    """One rank's steps through the whole collective."""
    total = world * (world + 1) / 2
    return [
        {"step": "start", "gpu": gpu},
        {"step": "joined"},
        {"step": "all_reduce", "ok": True, "got": total, "expected": total},
        {"step": "all_gather", "versions": versions or [V] * world},
        {"step": "done"},
    ]


def test_versions_without_a_majority_name_every_node_by_the_one_majority_vote():
    """A tie (12 ranks of each torch) is no verdict on either side: every node is named with
    the count of each value (drift's vote, trainfleet.compare.majority), never one side chosen
    by set order; a rank that sent no version dict is a value of its own."""
    owners = [n.name for n in CLUSTER.nodes[:2] for _ in range(12)]
    versions = [V] * 12 + [{**V, "torch": "2.3.1+cu121"}] * 12
    tie = "'2.4.1+cu124' on 12, '2.3.1+cu121' on 12"
    assert [(p.node, p.cause) for p in version_problems(owners, versions)] == [
        ("gpu-a01", f"torch 2.4.1+cu124: the ranks have no majority ({tie})"),
        ("gpu-a02", f"torch 2.3.1+cu121: the ranks have no majority ({tie})"),
    ]
    odd = [V] * 23 + ["not a dict"]
    owners = [n.name for n in CLUSTER.nodes for _ in range(8)]
    assert {p.cause for p in version_problems(owners, odd)} == {
        f"{key} None differs from the other ranks' {V[key]}" for key in V
    }


def test_the_collective_names_a_node_with_other_versions_once_and_ranks_that_never_joined():
    versions = [V] * 16 + [{**V, "torch": "2.3.1+cu121"}] * 8  # every GPU rank of gpu-a03
    steps = {n.name: [finished(versions=versions) for _ in range(8)] for n in CLUSTER.nodes}
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "torch 2.3.1+cu121 differs from the other ranks' 2.4.1+cu124")
    ]
    timeout = {
        "step": "timeout",
        "stage": "rendezvous",
        "joined": list(range(16)),
        "missing": list(range(16, 24)),
    }
    steps = {
        "gpu-a01": [[{"step": "start"}, timeout]] + [[{"step": "start"}]] * 7,
        "gpu-a02": [[{"step": "start"}]] * 8,
        "gpu-a03": [],
    }
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "never joined the rendezvous at gpu-a01:29500 (joined: gpu-a01, gpu-a02)")
    ]
    # two GPUs of gpu-a02 (global ranks 13 and 14) never came: named by their local ranks
    timeout = {
        **timeout,
        "joined": [r for r in range(24) if r not in (13, 14)],
        "missing": [13, 14],
    }
    steps["gpu-a01"][0] = [{"step": "start"}, timeout]
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        (
            "gpu-a02",
            "local ranks 5, 6 never joined the rendezvous at gpu-a01:29500 (joined: gpu-a01, "
            "gpu-a02, gpu-a03)",
        )
    ]


def test_a_failing_gpu_rank_is_named_by_node_local_rank_and_the_gpu_its_cuda_visible_devices_gave():
    steps = {n.name: [finished(gpu=str(i)) for i in range(8)] for n in CLUSTER.nodes}
    # CUDA_VISIBLE_DEVICES=4,5,6,7,0,1,2,3 on gpu-a02: local rank 1 runs on GPU 5
    steps["gpu-a02"] = [finished(gpu=str((i + 4) % 8)) for i in range(8)]
    steps["gpu-a02"][1] = [
        {"step": "start", "gpu": "5"},
        {"step": "joined"},
        {
            "step": "error",
            "stage": "collective",
            "error": "DistBackendError: NCCL error: unhandled cuda error (run with "
            "NCCL_DEBUG=INFO)",
        },
    ]
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        (
            "gpu-a02",
            "local rank 1 (GPU 5): collective failed: DistBackendError: NCCL error: unhandled cuda "
            "error (run with NCCL_DEBUG=INFO)",
        )
    ]


def test_ranks_are_laid_out_one_per_gpu_in_hostfile_order_and_one_on_a_cpu_node():
    from checks.collective_verdicts import rank_layout, rank_places

    assert rank_layout(CLUSTER.nodes) == {"gpu-a01": (0, 8), "gpu-a02": (8, 8), "gpu-a03": (16, 8)}
    mixed = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1, gpus: 4}\n  - {name: b, address: 192.0.2.2}\n"
        "  - {name: c, address: 192.0.2.3, gpus: 2}\n"
    )
    assert rank_layout(mixed.nodes) == {"a": (0, 4), "b": (4, 1), "c": (5, 2)}
    assert rank_places(mixed)[5] == ("c", 0) and len(rank_places(mixed)) == mixed.total_slots == 7


def test_each_node_starts_a_rank_per_slot_with_its_global_rank_its_lines_come_back_by_local_rank(
    planted, monkeypatch, tmp_path
):
    _, cwd = planted
    # A stand-in python: prints what the collective's first step would (its arguments and the
    # environment it got), then rank 10 fails as a rank whose GPU is gone would.
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/bin/sh\nshift 3\nfirst=${3#*,}; rank=$((${first%%,*} + $1))\n"
        'echo "{\\"step\\": \\"start\\", \\"rank\\": $rank, \\"local\\": $1, '
        '\\"args\\": \\"$*\\", \\"debug\\": \\"$NCCL_DEBUG $NCCL_DEBUG_SUBSYS\\"}"\n'
        'echo "$(hostname):1:1 [$1] NCCL INFO Using network Socket" > "$NCCL_DEBUG_FILE"\n'
        "[ \"$rank\" = 10 ] && { echo 'RuntimeError: CUDA error: no CUDA-capable device' >&2; "
        "exit 1; }\n"
        'echo \'{"step": "done"}\'\n'
    )
    python.chmod(0o755)
    _use_venv(monkeypatch, str(tmp_path / "venv"))
    command = collective_stage.collective_command(8, 4, 24, "192.0.2.11", 29500, "nccl", 5)
    ranks = rank_output.node_steps(_run_stage(command, cwd).stdout.splitlines(), 4)
    assert [r[0]["rank"] for r in ranks] == [8, 9, 10, 11] and [r[0]["local"] for r in ranks] == [
        0,
        1,
        2,
        3,
    ]
    assert (
        ranks[0][0]["args"] == "0 nccl 5,8,24,192.0.2.11,29500,0"
        and ranks[0][0]["debug"] == "INFO INIT,NET"
    )
    assert [s["step"] for s in ranks[2]] == ["start", "exit", "stderr", "nccl"]
    assert ranks[2][2]["text"] == "RuntimeError: CUDA error: no CUDA-capable device"
    assert ranks[3][-1]["text"].endswith("[3] NCCL INFO Using network Socket")
    assert [collective_verdicts.rank_failure(r) for r in ranks] == [
        None,
        None,
        "python exited with status 1 after 'start': RuntimeError: CUDA error: no CUDA-capable "
        "device",
        None,
    ]


def test_the_collective_script_gives_each_rank_the_gpu_cuda_visible_devices_lists_at_its_local_rank(
    planted, monkeypatch, tmp_path
):
    _, cwd = planted
    venv = tmp_path / "venv"  # a venv without torch: each rank gets as far as its first step
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    _use_venv(monkeypatch, str(venv))
    command = collective_stage.collective_command(8, 2, 16, "127.0.0.1", 1, "nccl", 5)
    out = _run_stage(
        command, cwd, CUDA_VISIBLE_DEVICES="GPU-5b7a1c3e,GPU-0c2d4f1a"
    ).stdout.splitlines()
    ranks = rank_output.node_steps(out, 2)
    assert [(r[0]["rank"], r[0]["local"], r[0]["gpu"]) for r in ranks] == [
        (8, 0, "GPU-5b7a1c3e"),
        (9, 1, "GPU-0c2d4f1a"),
    ]
    two = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1, gpus: 8}\n  - {name: b, address: 192.0.2.2, "
        "gpus: 2}\n"
    )
    # both ranks of b failed alike: b is named once, in python's words
    steps = {"a": [finished(16)] * 8, "b": ranks}
    assert [(p.node, p.cause) for p in collective_problems(two, steps)] == [
        ("b", "import failed: ModuleNotFoundError: No module named 'torch'")
    ]
    from checks.collective_verdicts import failed_before_the_network

    assert failed_before_the_network(steps) == {"b"}  # no pair test (isolation) can say more


def test_lines_of_ranks_a_node_does_not_run_are_dropped_and_a_node_wide_line_reaches_every_rank():
    ranks = rank_output.node_steps(
        ["nopython", '0 {"step": "start"}', '7 {"step": "done"}', "1x exit 3"], 2
    )
    assert [[s["step"] for s in r] for r in ranks] == [["error", "start"], ["error"]]


def test_isolation_blames_the_failing_pairs_node_or_the_master_when_all_fail():
    assert [p.node for p in isolate(CLUSTER, {"gpu-a02": True, "gpu-a03": False})] == ["gpu-a03"]
    assert [p.node for p in isolate(CLUSTER, {"gpu-a02": False, "gpu-a03": False})] == ["gpu-a01"]


FIVE = parse_cluster(
    "nodes:\n"
    + "".join(f"  - {{name: n{i}, address: 192.0.2.{10 + i}, gpus: 0}}\n" for i in range(1, 6))
)


def test_isolations_second_pass_pairs_each_suspect_with_a_node_known_good_in_turn():
    first = {"n2": True, "n3": False, "n4": True, "n5": False}
    assert second_pass(FIVE, first) == [("n2", "n3"), ("n4", "n5")]
    # every pair with the master failed: the first other node with each of the rest
    assert second_pass(FIVE, dict.fromkeys(first, False)) == [
        ("n2", "n3"),
        ("n2", "n4"),
        ("n2", "n5"),
    ]
    assert second_pass(FIVE, dict.fromkeys(first, True)) == []


def test_the_second_pass_tells_a_bad_node_from_a_bad_link_to_the_master():
    first = {"n2": True, "n3": False, "n4": True, "n5": False}
    found = isolate(FIVE, first, {"n3": ("n2", False), "n5": ("n4", True)})
    assert [(p.node, p.cause) for p in found] == [
        (
            "n3",
            "2-rank collectives between n3 and n1, and between n3 and n2 (which passes with n1) "
            "fail: n3 is at fault",
        ),
        (
            "n5",
            "a 2-rank collective between n1 and n5 fails, between n4 and n5 passes: the link "
            "between n1 and n5 is at fault",
        ),
    ]


def test_every_pair_with_the_master_failing_is_the_master_only_where_pairs_without_it_pass():
    first = dict.fromkeys(["n2", "n3", "n4", "n5"], False)
    others = {"n3": ("n2", True), "n4": ("n2", True), "n5": ("n2", False)}
    assert [(p.node, p.cause) for p in isolate(FIVE, first, others)] == [
        ("n1", "every pair with the master fails: the master is at fault (n2 passes with n3, n4)"),
        ("n5", "fails with the master and with n2"),
    ]
    nowhere = dict.fromkeys(["n3", "n4", "n5"], ("n2", False))
    found = isolate(FIVE, first, nowhere)
    assert [p.node for p in found] == ["n1", "n2", "n3", "n4", "n5"]
    assert {p.cause for p in found} == {
        "every 2-rank pair fails, with the master and without it: not one node's fault"
    }
    # named alike on every node: no healthy subset to offer
    assert healthy_subset([n.name for n in FIVE.nodes], found)["note"] == (
        "every node failed alike: the cause is not one node's"
    )


# --- what the node printed never becomes a command unchecked; every python runs isolated ---

HOSTILE_PID_LINES = [
    "pid 1; rm -rf /",
    "pid $(id)",
    "pid `id`",
    "pid 12 13",
    "pid -1",
    "pid 0",
    "pid 0x10",
    "pid 99999999",
    "pid \u0661\u0662",
    "pid 12\n; id",
    "pid",
    "pid 4242&&id",
]


def test_only_exact_decimal_pids_in_range_are_taken_the_rest_is_refused():
    pids, refused = listener_pids(["pid 4242", *HOSTILE_PID_LINES, "resolve x", "pid 4194304"])
    assert pids == [4242, 4194304]
    assert refused == HOSTILE_PID_LINES


def test_a_node_printing_hostile_pid_lines_is_named_and_they_reach_no_command(monkeypatch):
    sent: list[str] = []
    listener_output = {
        "gpu-a01": ["pid 4242", "pid 4243"],
        "gpu-a02": ["pid 1; rm -rf /", "pid $(id)", "pid 77"],
        "gpu-a03": ["pid 5000"],
    }

    def run_everywhere(state, commands, seconds, stdin=None):
        sent.extend(c.get_raw_value() for c in commands.values())
        if len(sent) == len(commands):  # the first call starts the listeners
            return listener_output
        return {
            node: [f"ok {n.name}" for n in CLUSTER.nodes] + ["ok gpu-a01:29500"]
            for node in commands
        }

    monkeypatch.setattr(reachability_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="c", nodes=[n.name for n in CLUSTER.nodes])
    reachability_stage.run_reachability(None, CLUSTER, report, master_port_free=True)
    assert [(p.node, p.cause) for p in report.problems] == [
        (
            "gpu-a02",
            "printed 'pid 1; rm -rf /' where a listener's PID belongs: not used (the listener ends "
            "by its timeout)",
        ),
        (
            "gpu-a02",
            "printed 'pid $(id)' where a listener's PID belongs: not used (the listener ends by "
            "its timeout)",
        ),
    ]
    kills = {
        c.split("' trainfleet ", 1)[1] for c in sent if "/proc/$pid/cmdline" in c
    }  # their arguments
    (token,) = {args.split()[1] for args in kills}  # one token for the run
    assert kills == {
        f"/run/trainfleet/{token} {token} 4242 4243",
        f"/run/trainfleet/{token} {token} 77",
        f"/run/trainfleet/{token} {token} 5000",
    }
    listeners = [c for c in sent if "s.listen(128)" in c]
    assert len(listeners) == 3 and all(f"' trainfleet 20 {token} 192.0.2.1" in c for c in listeners)


def test_ending_listeners_kills_only_this_runs_processes_whatever_pids_are_passed(
    tmp_path, monkeypatch
):
    _use_run_dir(monkeypatch, str(tmp_path))

    token = "trainfleet-preflight-0123456789abcdef"
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    ours = subprocess.Popen([*sleep, token])  # carries the token, as a listener does
    other = subprocess.Popen([*sleep, "trainfleet-preflight-ffffffffffffffff"])  # another run's
    try:
        command = reachability_stage.end_listeners_command(token, [ours.pid, other.pid])
        subprocess.run(["sh", "-c", command.get_raw_value()], check=True, timeout=10)
        assert ours.wait(timeout=5) == -15
        assert other.poll() is None
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
    with pytest.raises(ValueError):
        reachability_stage.end_listeners_command(token, ["1; id"])  # type: ignore[list-item]


def _use_run_dir(monkeypatch, path: str) -> None:
    """Point every stage module that reads RUN_DIR at ``path``."""
    for module in (stage_runner, reachability_stage):
        monkeypatch.setattr(module, "RUN_DIR", path)


def _use_venv(monkeypatch, path: str) -> None:
    """Point the collective's command and its output's parser at the venv ``path``."""
    for module in (collective_stage, rank_output):
        monkeypatch.setattr(module, "VENV_PYTHON", f"{path}/bin/python")


def _run_stage(command, cwd, stdin: str | None = None, **env) -> subprocess.CompletedProcess:
    """``command`` run by sh in ``cwd``, a fresh rendezvous secret on its stdin (as the
    controller sends it) unless ``stdin`` says otherwise."""
    return subprocess.run(
        ["sh", "-c", command.get_raw_value()],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, **env},
        input=secrets.token_hex(32) + "\n" if stdin is None else stdin,
    )


def _plant(directory, modules=("json", "socket", "threading", "sys", "sitecustomize")):
    for module in modules:
        (directory / f"{module}.py").write_text(
            f"open({str(directory / ('PWNED-' + module))!r}, 'w').close()\n"
        )


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """(the stages' RUN_DIR under tmp_path, that dir, a dir of planted modules)."""
    base = tmp_path / "run"
    _use_run_dir(monkeypatch, str(base))
    modules = tmp_path / "tmp"
    modules.mkdir()
    _plant(modules)
    return base, modules


def test_stage_pythons_run_isolated_in_a_private_directory_that_is_removed(planted):
    base, planted = planted
    # Started from the planted directory, with it on PYTHONPATH too: nothing there is imported.
    probe = stage_runner.python_stage(reachability_stage._PROBE, "127.0.0.1", "closed=127.0.0.1:1")
    done = _run_stage(probe, planted, PYTHONPATH=str(planted))
    assert done.stdout.startswith("fail closed ConnectionRefusedError"), done
    assert sorted(p.name for p in planted.glob("PWNED-*")) == []
    assert (
        base.is_dir() and oct(base.stat().st_mode & 0o777) == "0o700" and list(base.iterdir()) == []
    )


def test_listeners_run_isolated_in_their_own_directory_and_end_with_it(planted):
    base, planted = planted
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "trainfleet-preflight-00112233aabbccdd"
    start = stage_runner.shell_stage(
        stage_runner.listener_workdir(token, str(base)) + reachability_stage._LISTEN,
        20,
        token,
        "127.0.0.1",
        port,
    )
    pids, refused = listener_pids(
        _run_stage(start, planted, PYTHONPATH=str(planted)).stdout.splitlines()
    )
    assert len(pids) == 1 and refused == []
    try:
        assert (base / token).is_dir() and os.readlink(f"/proc/{pids[0]}/cwd") == str(base / token)
        for _ in range(50):  # it binds within moments
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail("the listener never listened")
        assert list(planted.glob("PWNED-*")) == []
        subprocess.run(
            ["sh", "-c", reachability_stage.end_listeners_command(token, pids).get_raw_value()],
            check=True,
        )
        for _ in range(50):
            if (
                not os.path.exists(f"/proc/{pids[0]}")
                or "Z" in open(f"/proc/{pids[0]}/stat").read().split()[2]
            ):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the listener was not ended")
        assert list(base.iterdir()) == []
    finally:
        subprocess.run(["kill", str(pids[0])], capture_output=True)


def test_the_private_directory_is_refused_unless_a_real_0700_directory_of_ours(
    tmp_path, monkeypatch
):
    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o777)
    base = tmp_path / "run"
    base.symlink_to(elsewhere)
    _use_run_dir(monkeypatch, str(base))
    done = _run_stage(stage_runner.python_stage("echo ran"), tmp_path)
    assert (
        done.returncode == 97
        and done.stdout
        == f"trainfleet: refused to run: {base} is not a directory of ours with mode 700\n"
    )
    assert list(elsewhere.iterdir()) == []
    assert [
        (p.node, p.cause)
        for p in stage_runner.refusals("reachability", {"gpu-a01": [done.stdout.strip()]})
    ] == [("gpu-a01", f"refused to run: {base} is not a directory of ours with mode 700")]


def test_every_python_a_stage_starts_is_isolated_and_none_runs_from_tmp():
    scripts = {
        "listen": reachability_stage._LISTEN,
        "probe": reachability_stage._PROBE,
        "collective": collective_stage._COLLECTIVE_RUN,
    }
    for name, script in scripts.items():
        starts = re.findall(r'(?:python3|"\$python")( -\S+)? -c', script)
        assert starts and all(flag == " -I" for flag in starts), name
    collective = collective_stage.collective_command(
        0, 1, 3, "192.0.2.11", 29500, "gloo", 25
    ).get_raw_value()
    assert (
        "/tmp" not in collective.replace(collective_stage.COLLECTIVE, "")
        and "mktemp -d /run/trainfleet/" in collective
    )
    assert " -I -c " in collective and "/opt/trainfleet/venv/bin/python" in collective


def test_a_port_holders_name_reaches_the_report_without_control_characters():
    holder = (
        'holder LISTEN 0 128 0.0.0.0:29500 0.0.0.0:* users:(("\x1b]0;owned\x07x",pid=4242,fd=3))'
    )
    assert parse_hygiene([holder])["port_holder"] == 'users:(("\\x1b]0;owned\\x07x",pid=4242,fd=3))'


# ---- the collective says why a rank failed, in that rank's own words ------------------------


def _collective_on(monkeypatch, venv, cwd) -> list[dict]:
    """Run the real collective command of rank 0 of 1 with ``venv`` as the node venv."""
    _use_venv(monkeypatch, str(venv))
    command = collective_stage.collective_command(0, 1, 1, "127.0.0.1", 1, "gloo", 5)
    return rank_output.node_steps(_run_stage(command, cwd).stdout.splitlines(), 1)[0]


def causes(steps: list[dict]) -> list[str]:
    one = parse_cluster("nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n")
    return [p.cause for p in collective_problems(one, {"gpu-a01": [steps]})]


def test_a_node_without_a_venv_is_named_for_its_missing_python_not_a_timeout(
    planted, monkeypatch, tmp_path
):
    _, cwd = planted
    _use_venv(monkeypatch, "unset")
    venv = tmp_path / "no-venv"
    assert causes(_collective_on(monkeypatch, venv, cwd)) == [
        f"python failed: no python at {venv}/bin/python: "
        "the node has no venv (pin stack.torch and deploy)"
    ]


def test_a_venv_without_torch_is_named_with_pythons_own_message(planted, monkeypatch, tmp_path):
    _, cwd = planted
    _use_venv(monkeypatch, "unset")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert causes(_collective_on(monkeypatch, venv, cwd)) == [
        "import failed: ModuleNotFoundError: No module named 'torch'"
    ]


def _env_collective(cwd, python) -> list[str]:
    """The collective of rank 0 of 1 by the spec's ``preflight.python`` (the stack unmanaged)."""
    cluster = parse_cluster(
        f"manage: {{stack: false}}\npreflight: {{python: {python}}}\n"
        "nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n"
    )
    command = collective_stage.collective_command(
        0, 1, 1, "127.0.0.1", 1, "gloo", 5, cluster.job_python
    )
    return causes(rank_output.node_steps(_run_stage(command, cwd).stdout.splitlines(), 1)[0])


def test_an_existing_envs_missing_python_is_named_as_the_specs_not_a_timeout(planted, tmp_path):
    _, cwd = planted
    python = f"{tmp_path}/conda/envs/train/bin/python"
    assert _env_collective(cwd, python) == [
        f"python failed: no python at {python} (preflight.python): the node lacks that env"
    ]


def test_an_existing_env_without_torch_is_named_with_pythons_own_message(planted, tmp_path):
    _, cwd = planted
    env = tmp_path / "conda"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    assert _env_collective(cwd, f"{env}/bin/python") == [
        "import failed: ModuleNotFoundError: No module named 'torch'"
    ]


def test_the_smoke_job_and_the_launchers_use_the_existing_env():
    from trainfleet.capabilities.launchers import render_launchers

    cluster = parse_cluster(
        "manage: {stack: false}\npreflight: {python: /opt/conda/envs/train/bin/python}\n"
        "nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n"
    )
    smoke = smoke_stage.smoke_command(cluster, "mpirun").get_raw_value()
    assert "/opt/conda/envs/train/bin/python" in smoke and "/opt/trainfleet" not in smoke
    files = render_launchers(cluster, cluster.nodes[0])
    assert "exec /opt/conda/envs/train/bin/torchrun " in files["torchrun.sh"][0]
    assert not any("/opt/trainfleet/venv" in text for text, _ in files.values())


def test_a_python_that_cannot_start_is_named_with_its_exit_status_and_last_words(
    planted, monkeypatch, tmp_path
):
    _, cwd = planted
    _use_venv(monkeypatch, "unset")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    # what a venv whose base interpreter was removed prints (the dynamic loader's message)
    python.write_text(
        "#!/bin/sh\necho 'python: error while loading shared libraries: libpython3.11.so.1.0: "
        "cannot open shared object file: No such file or directory' >&2\nexit 127\n"
    )
    python.chmod(0o755)
    assert causes(_collective_on(monkeypatch, tmp_path / "venv", cwd)) == [
        "python exited with status 127 after 'no output': python: "
        "error while loading shared libraries: libpython3.11.so.1.0: "
        "cannot open shared object file: No such file or directory"
    ]


def test_what_a_failing_rank_printed_reaches_the_report_escaped_and_silence_is_a_timeout():
    steps = rank_output._steps(['{"step": "start"}', "exit 1", "stderr \x1b]0;owned\x07 Traceback"])
    assert causes(steps) == [
        "python exited with status 1 after 'start': \\x1b]0;owned\\x07 Traceback"
    ]
    assert causes(rank_output._steps(['{"step": "start"}', "exit 124"])) == [
        "stopped after 'start' (timed out)"
    ]
    # a rank that finished, then exited non-zero (its teardown failed), did finish
    assert (
        causes(rank_output._steps(['{"step": "done"}', "", "exit 134", "stderr terminate called"]))
        == []
    )
    assert causes([]) == ["stopped after 'no output' (timed out)"]
    assert rank_output._steps(["[1, 2]", "exit 9999", "nonsense"]) == []


def test_a_rank_that_never_joined_because_its_python_is_missing_says_so():
    timeout = {
        "step": "timeout",
        "stage": "rendezvous",
        "joined": list(range(16)),
        "missing": list(range(16, 24)),
    }
    missing = {
        "step": "error",
        "stage": "python",
        "error": "no python at /opt/trainfleet/venv/bin/python",
    }
    steps = {
        "gpu-a01": [[{"step": "start"}, timeout]],
        "gpu-a02": [[{"step": "start"}]],
        "gpu-a03": [[missing]] * 8,
    }
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "python failed: no python at /opt/trainfleet/venv/bin/python")
    ]


# ---- hostnames and the SSH mesh -------------------------------------------------------------


def test_nodes_sharing_a_hostname_are_each_named():
    outputs = {n.name: node_output(extra=[f"hostname {n.name}"]) for n in CLUSTER.nodes}
    assert problems_for(outputs) == []
    outputs["gpu-a03"] = node_output(extra=["hostname gpu-a02"])
    assert problems_for(outputs) == [
        "gpu-a02: its hostname 'gpu-a02' is also the hostname of gpu-a03",
        "gpu-a03: its hostname 'gpu-a02' is also the hostname of gpu-a02",
    ]


def test_every_node_must_reach_every_node_as_every_mesh_user_and_silence_fails():
    from checks.mesh_verdicts import mesh_problems

    cluster = parse_cluster(CLUSTER_TEXT_WITH_USERS)
    names = [n.name for n in cluster.nodes]
    ok = {user: {peer: "ok" for peer in names} for user in ("root", "alice")}
    assert mesh_problems(cluster, {n: ok for n in names}, names, 25) == []
    one_way = {
        **ok,
        "alice": {**ok["alice"], "gpu-a03": "rc=255 alice@gpu-a03: Permission denied (publickey)."},
    }
    partial = {"root": {"gpu-a01": "ok"}, "alice": ok["alice"]}  # peers the probe never reported
    proofs = {"gpu-a01": one_way, "gpu-a02": partial, "gpu-a03": None}
    # the silent node is named alone: the logins to it are not held against its peers
    assert [(p.node, p.cause) for p in mesh_problems(cluster, proofs, names, 25)] == [
        ("gpu-a03", "its SSH probes gave no complete answer within 25 s"),
        ("gpu-a02", "as root, cannot ssh to itself: not probed"),
    ]
    # every node answered: alice's one failing login is a link, named on both its ends
    proofs = {"gpu-a01": one_way, "gpu-a02": ok, "gpu-a03": ok}
    link = (
        "the link gpu-a01-gpu-a03 fails (as alice, gpu-a01 cannot ssh to gpu-a03: rc=255 "
        "alice@gpu-a03: Permission denied (publickey).): both ends named, neither told at fault"
    )
    assert [(p.node, p.cause) for p in mesh_problems(cluster, proofs, names, 25)] == [
        ("gpu-a01", link),
        ("gpu-a03", link),
    ]
    # nobody logs in to gpu-a03 as alice (its authorized keys are gone): gpu-a03 alone
    denied = "rc=255 Permission denied (publickey)."
    shut = {**ok, "alice": {**ok["alice"], "gpu-a03": denied}}
    proofs = {"gpu-a01": shut, "gpu-a02": shut, "gpu-a03": ok}
    assert [(p.node, p.cause) for p in mesh_problems(cluster, proofs, names, 25)] == [
        (
            "gpu-a03",
            f"no peer reaches it: as alice, gpu-a01 cannot ssh to gpu-a03: {denied}; "
            f"as alice, gpu-a02 cannot ssh to gpu-a03: {denied}",
        ),
    ]
    # a node that could not be reached at all is named once, as unreachable, by the caller
    assert mesh_problems(cluster, {n: ok for n in names[:2]}, names[:2], 25) == []


def test_the_ssh_stage_reads_one_bundled_probe_per_node_and_a_cut_off_answer_is_no_pass():
    from pyinfra.api.exceptions import FactProcessError

    from runtime.bundle import MeshProofs

    fact = MeshProofs()
    command = fact.command(users=["root", "alice"], peers=["gpu-a01", "gpu-a02"]).get_raw_value()
    assert command.count("BatchMode=yes") == 2 and "StrictHostKeyChecking=yes" in command
    with pytest.raises(FactProcessError, match="missing or not one line"):
        fact.process([])  # killed by its bound before any section: nothing proven


CLUSTER_TEXT_WITH_USERS = """\
cluster: {mesh_users: [root, alice]}
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}
  - {name: gpu-a02, address: 192.0.2.12, gpus: 8}
  - {name: gpu-a03, address: 192.0.2.13, gpus: 8}
"""


# ---- the smoke stage ------------------------------------------------------------------------


def _rank(rank: int, host: str, ok: bool = True, world: int = 24) -> str:
    line = {
        "smoke": "ok" if ok else "fail",
        "rank": rank,
        "world": world,
        "host": host,
        "backend": "nccl",
    }
    if not ok:
        line["error"] = (
            "DistStoreError: Timed out after 61 seconds waiting for clients. 2/3 clients joined."
        )
    return json.dumps(line)


def test_every_rank_of_every_node_must_report_ok_from_the_smoke_job():
    from checks.collective_verdicts import rank_owners
    from checks.smoke_verdicts import smoke_problems

    owners = rank_owners(CLUSTER)
    assert (owners[0], owners[7], owners[8], owners[23]) == (
        "gpu-a01",
        "gpu-a01",
        "gpu-a02",
        "gpu-a03",
    )
    # DeepSpeed's pdsh prefixes each line with the node; its own log lines surround them.
    lines = ["[INFO] [runner.py:618:main] cmd = pdsh -S -f 1024 -w gpu-a01,gpu-a02,gpu-a03 ..."]
    lines += [f"{owners[r]}: {_rank(r, owners[r])}" for r in range(24)]
    assert smoke_problems(CLUSTER, "deepspeed", {"gpu-a01": lines + ["exit 0"]}) == []

    broken = [line for line in lines if not line.startswith("gpu-a03")] + [
        f"gpu-a02: {_rank(9, 'gpu-a02', ok=False)}",
        "exit 1",
        "stderr gpu-a03: /opt/trainfleet/venv/bin/python: No module named deepspeed",
    ]
    found = [(p.node, p.cause) for p in smoke_problems(CLUSTER, "deepspeed", {"gpu-a01": broken})]
    assert found[0] == (
        "gpu-a02",
        "through deepspeed: rank 9 failed: DistStoreError: Timed out after 61 seconds "
        "waiting for clients. 2/3 clients joined.",
    )
    assert found[1:] == [
        (
            "gpu-a03",
            f"through deepspeed: rank {r} never reported (its launcher exited with status 1: "
            "gpu-a03: /opt/trainfleet/venv/bin/python: No module named deepspeed)",
        )
        for r in range(16, 24)
    ]


def test_a_smoke_job_in_the_wrong_world_or_silent_is_no_pass():
    from checks.smoke_verdicts import smoke_problems

    small = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
    )
    assert [
        p.cause for p in smoke_problems(small, "torchrun", {"a": [_rank(0, "a", world=1)], "b": []})
    ] == [
        "through torchrun: rank 0 ran in a world of 1, the cluster has 2 ranks",
        "through torchrun: rank 1 never reported (its launcher gave no answer)",
    ]


def test_the_smoke_stage_starts_runners_once_from_root_owned_ground_and_bounds_them():
    deepspeed = smoke_stage.smoke_command(CLUSTER, "deepspeed").get_raw_value()
    assert (
        "/etc/trainfleet/launch/deepspeed.sh /etc/trainfleet/launch/smoke_train.py --timeout 60 "
        "--deadline 110" in deepspeed
    )
    assert "cd / && exec timeout -k 5" in deepspeed and "mktemp -d /run/trainfleet/" in deepspeed
    mpirun = smoke_stage.smoke_command(CLUSTER, "mpirun").get_raw_value()
    assert (
        "/etc/trainfleet/launch/mpirun.sh --mca orte_tmpdir_base /run/trainfleet "
        "/opt/trainfleet/venv/bin/python /etc/trainfleet/launch/smoke_train.py --timeout 60 "
        "--deadline 110 --master-addr 192.0.2.11 --master-port 29500"
    ) in mpirun
    with pytest.raises(ValueError):
        smoke_stage.smoke_command(CLUSTER, "../../tmp/x")


# ---- the bandwidth stage: node pairs, busbw, the slow node or link ---------------------------


def test_busbw_is_nccl_tests_all_reduce_bus_bandwidth():
    from checks.bandwidth_verdicts import busbw

    assert busbw(10.0, 2) == 10.0  # two ranks: each link carries the buffer once each way
    assert busbw(10.0, 16) == 18.75  # 2 * 15 / 16
    assert busbw(10.0, 1) == 0.0


def test_a_pairs_figures_are_its_ranks_mean_time_and_a_partial_pair_has_none():
    from checks.bandwidth_verdicts import pair_figures

    mib64 = 64 << 20
    ranks = [
        [{"step": "bandwidth", "bytes": mib64, "seconds": t}, {"step": "done"}]
        for t in (0.003, 0.005) * 8
    ]
    figures = pair_figures(ranks)
    algbw = mib64 / 0.004 / 1e9  # 16.78 GB/s
    assert figures == {
        "ranks": 16,
        "bytes": mib64,
        "seconds": 0.004,
        "algbw_gbps": round(algbw, 4),
        "busbw_gbps": round(algbw * 30 / 16, 4),
    }
    assert pair_figures(ranks[:-1] + [[{"step": "done"}]]) is None  # one rank gave no figure
    assert pair_figures([[{"step": "bandwidth", "bytes": mib64, "seconds": 0}]] * 2) is None
    assert pair_figures([[{"step": "bandwidth", "bytes": mib64, "seconds": "1"}]] * 2) is None
    assert (
        pair_figures([[{"step": "bandwidth", "bytes": b, "seconds": 1.0}] for b in (mib64, 1)])
        is None
    )
    assert pair_figures([]) is None


@pytest.mark.parametrize("count", [2, 3, 4, 5, 6, 7, 8])
def test_pair_rounds_put_every_node_in_two_pairs_and_no_node_twice_in_a_round(count):
    from checks.bandwidth_verdicts import pair_rounds

    nodes = [f"n{i}" for i in range(count)]
    rounds = pair_rounds(nodes)
    pairs = [pair for r in rounds for pair in r]
    for r in rounds:
        members = [n for pair in r for n in pair]
        assert len(members) == len(set(members))
    assert all(
        nodes.index(a) < nodes.index(b) for a, b in pairs
    )  # rendezvous on the lower-ranked node
    assert len(set(pairs)) == len(pairs)
    if count == 2:
        assert rounds == [[("n0", "n1")]]
    else:
        assert {n: sum(n in p for p in pairs) for n in nodes} == {n: 2 for n in nodes}
        assert len(rounds) == (2 if count % 2 == 0 else 3)
    assert pair_rounds(["n0"]) == []


def test_pair_rounds_of_the_lab_and_of_four_nodes():
    from checks.bandwidth_verdicts import pair_rounds

    assert pair_rounds(["node1", "node2", "node3"]) == [
        [("node1", "node2")],
        [("node2", "node3")],
        [("node1", "node3")],
    ]
    assert pair_rounds(["a", "b", "c", "d"]) == [[("a", "b"), ("c", "d")], [("b", "c"), ("a", "d")]]


def test_a_node_slow_in_every_pair_is_named_as_the_slow_node():
    from checks.bandwidth_verdicts import bandwidth_problems

    measured = {("a", "b"): 180.0, ("b", "c"): 41.5, ("a", "c"): 40.2}
    assert [(p.stage, p.node, p.cause) for p in bandwidth_problems(measured, 150)] == [
        (
            "bandwidth",
            "c",
            "slow: 41.50 GB/s, median 180.00, floor 150 GB/s (with b: 41.50, with a: 40.20 GB/s): "
            "the node is slow with every partner",
        )
    ]
    # without a floor, the median alone names it (at three nodes: not the pairs' median, 41.5)
    assert [p.node for p in bandwidth_problems(measured, None)] == ["c"]


def test_a_slow_pair_of_nodes_fast_elsewhere_is_named_as_the_slow_link_on_both_nodes():
    from checks.bandwidth_verdicts import bandwidth_problems

    measured = {("a", "b"): 182.0, ("c", "d"): 181.0, ("b", "c"): 12.5, ("a", "d"): 179.9}
    cause = (
        "the link b-c is slow: 12.50 GB/s, median 181.50, floor 150 GB/s, while both nodes reach "
        "it with their other partners"
    )
    assert [(p.node, p.cause) for p in bandwidth_problems(measured, 150)] == [
        ("b", cause),
        ("c", cause),
    ]


def test_a_healthy_node_between_two_slow_neighbours_is_not_called_slow():
    from checks.bandwidth_verdicts import bandwidth_problems

    # Every pair under the floor, none against the median: no node or link explains it, every
    # node is named alike (the healthy subset then says so instead of picking one).
    measured = {("a", "b"): 20.0, ("c", "d"): 21.0, ("b", "c"): 19.0, ("a", "d"): 22.0}
    found = bandwidth_problems(measured, 150)
    assert not any("the node is slow" in p.cause for p in found)
    assert [p.node for p in found] == ["a", "b", "c", "d"] and len({p.cause for p in found}) == 1
    assert found[0].cause.startswith("4 of 4 pairs are slow (a-b 20.00 GB/s; c-d 21.00 GB/s;")
    assert "no single node or link explains it" in found[0].cause
    # Only b slow: its peers a and c are fast with their other partner, so b is named.
    only_b = {("a", "b"): 20.0, ("c", "d"): 181.0, ("b", "c"): 19.0, ("a", "d"): 182.0}
    assert [
        (p.node, p.cause.endswith("the node is slow with every partner"))
        for p in bandwidth_problems(only_b, 150)
    ] == [("b", True)]
    # A ring of eight, b and d slow: c is slow only with them; it is not told from them.
    ring = list("abcdefgh")
    figures = {node: 0.1 if node in "bd" else 1.0 for node in ring}
    eight = {
        (x, y): min(figures[x], figures[y]) for x, y in zip(ring, ring[1:] + ring[:1], strict=True)
    }
    named = {p.node: p.cause for p in bandwidth_problems(eight, None, nodes=ring)}
    assert sorted(named) == ["b", "c", "d"]
    assert named["b"].endswith("the node is slow with every partner")
    assert named["d"].endswith("the node is slow with every partner")
    assert named["c"].endswith("but only with b, d, slow themselves: not told from them")


def test_the_median_judge_passes_the_labs_noise_and_names_the_issues_slow_node():
    from checks.bandwidth_verdicts import bandwidth_problems, busbw_median

    # the issue's unthrottled lab: 0.32-0.46 GB/s between pairs, nobody slow
    noisy = {("n1", "n2"): 0.46, ("n2", "n3"): 0.32, ("n3", "n4"): 0.41, ("n1", "n4"): 0.35}
    assert bandwidth_problems(noisy, None) == []
    assert busbw_median(noisy) == pytest.approx(0.435)
    # node3 throttled to about 1/8: its pairs 0.05 GB/s
    slow = {("n1", "n2"): 0.40, ("n2", "n3"): 0.05, ("n3", "n4"): 0.05, ("n1", "n4"): 0.40}
    assert [(p.node, p.cause) for p in bandwidth_problems(slow, None)] == [
        (
            "n3",
            "slow: 0.05 GB/s, median 0.40 (with n2: 0.05, with n4: 0.05 GB/s): the node is slow "
            "with every partner",
        )
    ]
    # the spec tightens the fraction: a pair at 0.7 of the median is slow under 0.8, not 0.5
    tight = {("n1", "n2"): 1.0, ("n2", "n3"): 0.7, ("n3", "n4"): 0.7, ("n1", "n4"): 1.0}
    assert bandwidth_problems(tight, None) == []
    assert [p.node for p in bandwidth_problems(tight, None, 0.8)] == ["n3"]
    # the floor stays an extra gate: every pair fast against the median, all under the floor
    assert {p.node for p in bandwidth_problems(noisy, 1.0)} == {"n1", "n2", "n3", "n4"}


def test_without_a_floor_nothing_fails_and_two_nodes_name_their_pair():
    from checks.bandwidth_verdicts import bandwidth_problems

    assert bandwidth_problems({("a", "b"): 0.5, ("b", "c"): 0.4, ("a", "c"): 0.3}, None) == []
    assert [(p.node, p.cause) for p in bandwidth_problems({("a", "b"): 9.0}, 10)] == [
        (
            n,
            "bus bandwidth 9.00 GB/s between a and b is under the floor of 10 GB/s (no third node "
            "to tell the slow node from the slow link)",
        )
        for n in ("a", "b")
    ]
    assert bandwidth_problems({("a", "b"): 10.0}, 10) == []  # at the floor passes
    assert [(p.node, p.cause) for p in bandwidth_problems({("a",): 99.5}, 100.0)] == [
        ("a", "its GPUs' bus bandwidth 99.50 GB/s is under the floor of 100 GB/s")
    ]


def _bandwidth_lines(
    rank: int, world: int, seconds: float | None, nbytes: int = 16 << 20, job: int = 0
) -> list[str]:
    """One rank's lines (local rank 0) for one job: the collective (``seconds`` None) or a
    pair's timed all_reduce."""
    total = world * (world + 1) / 2
    steps = [
        {"step": "start", "rank": rank},
        {"step": "joined"},
        {"step": "all_reduce", "ok": True, "got": total, "expected": total},
        {
            "step": "all_gather",
            "versions": [{"torch": "2.13.0", "cuda": None, "nccl": None}] * world,
        },
        {"step": "bandwidth", "bytes": nbytes, "seconds": seconds, "iters": 10},
        {"step": "done"},
    ]
    return [
        f"0 {json.dumps({**s, 'job': job})}" for s in steps if seconds or s["step"] != "bandwidth"
    ]


def _ranks_run(commands: dict, seconds_of) -> dict[str, list[str]]:
    """What each node's rank prints for its jobs, read from its command: each job is
    "END,FIRST,WORLD,MASTER,PORT,BYTES"; ``seconds_of(port)`` is that pair's time per
    all_reduce."""
    out = {}
    for node, command in commands.items():
        jobs = re.split(r" (?:gloo|nccl) ", command.get_raw_value())[-1].split()
        out[node] = [
            line
            for index, job in enumerate(jobs)
            for _, first, world, _, port, nbytes in [job.split(",")]
            for line in _bandwidth_lines(
                int(first), int(world), seconds_of(int(port)) if int(nbytes) else None, job=index
            )
        ]
    return out


def _preflight_collective(
    monkeypatch, cluster, seconds_of=lambda port: 0.02, networks=None, answer=None
):
    """The collective and the bandwidth stage's pairs as the preflight runs them, every node's
    ranks answering from their command; the commands each node got, and the report."""
    calls: list[tuple[dict[str, str], int]] = []

    def run_everywhere(state, commands, seconds, stdin=None):
        raw = {node: c.get_raw_value() for node, c in commands.items()}
        if "counters" in next(iter(raw.values())):
            return {node: [] for node in raw}
        calls.append((raw, seconds))
        return (answer or _ranks_run)(commands, seconds_of)

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(bandwidth_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="lab", nodes=[n.name for n in cluster.nodes])
    preflight_check._collective_stages(
        None, cluster, report, networks or {}, {n.name for n in cluster.nodes}
    )
    return calls, report


def test_the_pairs_run_after_the_collective_in_the_same_command_and_the_slow_node_is_named(
    monkeypatch,
):
    lab = parse_cluster(
        "preflight: {min_busbw_gbps: 0.5}\nnodes:\n  - {name: node1, address: 198.18.0.11}\n"
        "  - {name: node2, address: 198.18.0.12}\n  - {name: node3, address: 198.18.0.13}\n"
    )
    slow_ports = {29502, 29503}  # the pairs with node3 (rounds 2 and 3): 0.2 s per all_reduce
    calls, report = _preflight_collective(
        monkeypatch, lab, lambda port: 0.2 if port in slow_ports else 0.02
    )
    # one command per node: the collective, then its three rounds; then node3's two slow pairs
    # measured again, each on its own port, in two rounds (they share node3)
    (raw, seconds), (again, again_seconds) = calls
    assert seconds == 25 + 3 * 30 and sorted(raw) == ["node1", "node2", "node3"]
    assert again_seconds == 2 * 30 and sorted(again) == ["node1", "node2", "node3"]
    assert again["node2"].endswith(" 1 gloo 30,0,2,198.18.0.12,29502,16777216")
    assert again["node1"].endswith(" 1 gloo 60,0,2,198.18.0.11,29503,16777216")
    assert again["node3"].endswith(
        " 1 gloo 30,1,2,198.18.0.12,29502,16777216 60,1,2,198.18.0.11,29503,16777216"
    )
    assert " trainfleet /opt/trainfleet/venv/bin/python 120 " in raw["node3"]  # python's bound
    # the collective (world 3, on the master's port), then each pair: 1 rank per CPU node,
    # world 2, its rendezvous on its lower node, 16 MiB, a port of its own (master_port + 1 +
    # its index among all pairs), ending with its round
    assert raw["node1"].endswith(
        " 1 gloo 25,0,3,198.18.0.11,29500,0 55,0,2,198.18.0.11,29501,16777216"
        " 115,0,2,198.18.0.11,29503,16777216"
    )
    assert raw["node2"].endswith(
        " 1 gloo 25,1,3,198.18.0.11,29500,0 55,1,2,198.18.0.11,29501,16777216"
        " 85,0,2,198.18.0.12,29502,16777216"
    )
    assert raw["node3"].endswith(
        " 1 gloo 25,2,3,198.18.0.11,29500,0 85,1,2,198.18.0.12,29502,16777216"
        " 115,1,2,198.18.0.11,29503,16777216"
    )
    assert report.stages["collective"] == "ok"
    pairs = report.details["bandwidth"]["pairs"]
    assert {name: p["busbw_gbps"] for name, p in pairs.items()} == {
        "node1-node2": round((16 << 20) / 0.02 / 1e9, 4),
        "node2-node3": round((16 << 20) / 0.2 / 1e9, 4),
        "node1-node3": round((16 << 20) / 0.2 / 1e9, 4),
    }
    assert [(p.node, p.cause) for p in report.problems] == [
        (
            "node3",
            "slow: 0.08 GB/s, median 0.84, floor 0.5 GB/s (with node2: 0.08, with node1: 0.08 "
            "GB/s): the node is slow with every partner",
        )
    ]
    # every pair as a fraction of the median, in the JSON
    assert report.details["bandwidth"]["median_gbps"] == round((16 << 20) / 0.02 / 1e9, 4)
    assert [p["of_median"] for p in pairs.values()] == [1.0, 0.1, 0.1]
    assert [p.get("measured_gbps") for p in pairs.values()] == [None] + 2 * [[0.0839, 0.0839]]
    assert report.stages["bandwidth"] == "failed"


def test_bandwidth_pairs_get_distinct_ports_and_every_gpu_of_both_nodes():
    four = parse_cluster(
        "nodes:\n"
        + "".join(f"  - {{name: g{i}, address: 192.0.2.{i}, gpus: 8}}\n" for i in range(4))
    )
    jobs = bandwidth_stage.bandwidth_jobs(
        four, [[("g0", "g1"), ("g2", "g3")], [("g1", "g2"), ("g0", "g3")]], 25, 30
    )
    big = 256 << 20
    assert jobs == {
        "g0": [(55, 0, 16, "192.0.2.0", 29501, big), (85, 0, 16, "192.0.2.0", 29504, big)],
        "g1": [(55, 8, 16, "192.0.2.0", 29501, big), (85, 0, 16, "192.0.2.1", 29503, big)],
        "g2": [(55, 0, 16, "192.0.2.2", 29502, big), (85, 8, 16, "192.0.2.1", 29503, big)],
        "g3": [(55, 8, 16, "192.0.2.2", 29502, big), (85, 8, 16, "192.0.2.0", 29504, big)],
    }


def test_a_ranks_steps_are_split_by_job_and_what_the_process_said_goes_to_the_job_it_was_in():
    steps = [
        {"step": "start", "job": 0},
        {"step": "done", "job": 0},
        {"step": "start", "job": 1},
        {"step": "joined", "job": 1},
        {"step": "exit", "code": 124},
        {"step": "stderr", "text": "killed"},
        {"step": "nccl", "text": "NCCL INFO Using network Socket"},
    ]
    first, second, third = rank_output.job_steps(steps, 3)
    assert [s["step"] for s in first] == ["start", "done", "nccl"]  # NCCL's log: the process's
    assert [s["step"] for s in second] == ["start", "joined", "exit", "stderr", "nccl"]
    assert [s["step"] for s in third] == ["exit", "stderr", "nccl"]  # never ran: the process died
    assert collective_verdicts.rank_failure(third) == "stopped after 'no output' (timed out)"
    nopython = rank_output.node_steps(["nopython"], 1)[0]
    assert all(job and job[0]["stage"] == "python" for job in rank_output.job_steps(nopython, 2))


def test_a_single_node_measures_its_gpus_alone_and_a_single_cpu_node_is_skipped_with_a_note(
    monkeypatch,
):
    one_gpu_node = parse_cluster("nodes:\n  - {name: g, address: 192.0.2.1, gpus: 8}\n")
    assert bandwidth_stage.bandwidth_plan(one_gpu_node) == ([[("g",)]], None)
    cpu = parse_cluster("nodes:\n  - {name: c, address: 192.0.2.1}\n")
    calls, report = _preflight_collective(monkeypatch, cpu)
    ((raw, _),) = calls
    assert raw["c"].endswith(" 1 gloo 25,0,1,192.0.2.1,29500,0")  # the collective alone
    assert report.stages["bandwidth"] == "skipped" and report.problems == []
    assert (
        report.details["bandwidth"]["note"]
        == "a single node with one CPU rank (gloo): no link to measure"
    )


def test_a_pair_that_did_not_finish_is_named_in_its_ranks_words_and_no_figure_is_no_pass():
    two = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
    )
    collective = _bandwidth_lines(0, 2, None)
    ranks = {
        "a": [
            rank_output.job_steps(s, 2)
            for s in rank_output.node_steps(collective + _bandwidth_lines(0, 2, 0.1, job=1)[:3], 1)
        ],
        "b": [
            rank_output.job_steps(s, 2)
            for s in rank_output.node_steps(
                collective + ['0 {"step": "start", "job": 1}', "0 exit 124"], 1
            )
        ],
    }
    report = PreflightReport(cluster="c", nodes=["a", "b"])
    bandwidth_stage.judge_bandwidth(None, two, report, ranks, {})
    assert [(p.node, p.cause) for p in report.problems] == [
        ("a", "the timed all_reduce with b did not finish: stopped after 'all_reduce' (timed out)"),
        ("b", "the timed all_reduce with a did not finish: stopped after 'start' (timed out)"),
    ]
    assert report.details["bandwidth"]["pairs"] == {}


def test_a_failed_collective_skips_the_pairs_and_their_judgement(monkeypatch):
    three = parse_cluster(
        "nodes:\n" + "".join(f"  - {{name: n{i}, address: 192.0.2.{i}}}\n" for i in range(1, 4))
    )

    def failing(commands, seconds_of):
        out = _ranks_run(commands, seconds_of)
        out["n3"] = [
            '0 {"step": "start", "job": 0}',
            '0 {"step": "error", "job": 0, '
            '"stage": "import", "error": "ModuleNotFoundError: No module named torch"}',
            "0 exit 2",
        ]
        return out

    _, report = _preflight_collective(monkeypatch, three, answer=failing)
    assert report.stages["collective"] == "failed" and report.stages["bandwidth"] == "skipped"
    assert "bandwidth" not in report.details


# ---- NCCL's own choice of network, read from real NCCL_DEBUG=INFO logs ------------------------

NCCL_LOGS = Path(__file__).resolve().parents[1] / "fixtures" / "nccl_debug"


def nccl_log(name: str) -> list[str]:
    return (NCCL_LOGS / name).read_text().splitlines()


@pytest.mark.parametrize(
    ("log", "network", "evidence"),
    [
        ("nccl-2.7.8_gcp_socket.log", "Socket", "NCCL INFO Using network Socket"),
        ("nccl-2.25.1_ib_disabled_socket.log", "Socket", "NCCL INFO Using network Socket"),
        (
            "nccl-2.3.7_ipoib_internal_socket.log",
            "Socket",
            "NCCL INFO Using internal Network Socket",
        ),
        ("nccl-952_socket_channels.log", "Socket", "[receive] via NET/Socket/0"),
        ("nccl-2.19.3_dgxh100_roce.log", "IB", "NCCL INFO Using network IB"),
        ("nccl-2.27_roce_mpirun.log", "IB", "NCCL INFO Using network IB"),
        (
            "nccl-2.4.7_ib_bootstrap_socket.log",
            "IB",
            "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:192.168.11.1<0>",
        ),
        ("nccl-1453_ibext_plugin_channels.log", "IBext_v8", "[send] via NET/IBext_v8/7/GDRDMA"),
        ("nccl-efa_aws_libfabric_ring.log", "AWS Libfabric", "[send] via NET/AWS Libfabric/0"),
        ("nccl-1597_efa_libfabric.log", "Libfabric", "NCCL INFO Using network Libfabric"),
    ],
)
def test_the_network_nccl_used_is_read_from_its_real_info_logs(log, network, evidence):
    from checks.fabric_verdicts import nccl_network

    found, line = nccl_network(nccl_log(log))
    assert found == network and line.endswith(evidence)
    assert nccl_network(["NCCL version 2.20.5+cuda12.4", "garbage NCCL INFO Using network"]) == (
        None,
        None,
    )


def _two_ib_nodes(ib: str = "auto") -> Cluster:
    return parse_cluster(
        f"nccl: {{ib: {ib}}}\nnodes:\n  - {{name: gpu-a01, address: 192.0.2.11, gpus: 2}}\n"
        "  - {name: gpu-a02, address: 192.0.2.12, gpus: 2}\n"
    )


def _network(tree: str) -> dict:
    from tests.unit.test_nccl_env import ib_ports

    return {"interfaces": [], "ib_ports": ib_ports(tree)}


def test_ranks_that_went_over_sockets_on_a_node_with_active_ib_are_named():
    from checks.fabric_verdicts import nccl_socket_problems

    cluster = _two_ib_nodes()
    networks = {"gpu-a01": _network("ib_two_hcas"), "gpu-a02": _network("ib_two_hcas")}
    ib = nccl_log("nccl-2.19.3_dgxh100_roce.log")
    socket_ = nccl_log("nccl-2.7.8_gcp_socket.log")
    assert nccl_socket_problems(cluster, {"gpu-a01": [ib, ib], "gpu-a02": [ib, ib]}, networks) == []
    found = nccl_socket_problems(
        cluster, {"gpu-a01": [ib, ib], "gpu-a02": [socket_, socket_]}, networks
    )
    assert [(p.stage, p.node, p.cause) for p in found] == [
        (
            "collective",
            "gpu-a02",
            "NCCL went over sockets although mlx5_0 port 1, mlx5_1 port 1 are active (NCCL "
            "INFO Using network Socket): training runs at a fraction of the fabric's speed; "
            "check NCCL_IB_DISABLE, NCCL_IB_HCA and the RDMA libraries NCCL loads",
        )
    ]
    # a log that names no network is no pass where IB is active
    assert [
        p.cause
        for p in nccl_socket_problems(cluster, {"gpu-a01": [ib, ib], "gpu-a02": [[], ib]}, networks)
    ] == [
        "NCCL's INFO log names no network although mlx5_0 port 1, mlx5_1 port 1 are active: "
        "whether it used them is unknown"
    ]


def test_sockets_are_fine_where_no_ib_port_is_active_the_spec_disables_ib_or_there_is_one_node():
    from checks.fabric_verdicts import nccl_socket_problems

    socket_ = nccl_log("nccl-2.25.1_ib_disabled_socket.log")
    logs = {"gpu-a01": [socket_], "gpu-a02": [socket_]}
    down = {"gpu-a01": _network("ib_port_down"), "gpu-a02": _network("ib_port_down")}
    assert nccl_socket_problems(_two_ib_nodes(), logs, down) == []
    active = {"gpu-a01": _network("ib_two_hcas"), "gpu-a02": _network("ib_two_hcas")}
    assert nccl_socket_problems(_two_ib_nodes("disable"), logs, active) == []
    one = parse_cluster("nodes:\n  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}\n")
    assert nccl_socket_problems(one, logs, active) == []


def test_the_collective_stage_judges_nccls_choice_from_its_ranks_captured_log(monkeypatch):
    cluster = _two_ib_nodes()
    networks = {"gpu-a01": _network("ib_two_hcas"), "gpu-a02": _network("ib_two_hcas")}
    socket_ = [
        line
        for line in nccl_log("nccl-2.7.8_gcp_socket.log")
        if "NET/" in line or "Using network" in line
    ]
    ib = [
        line
        for line in nccl_log("nccl-2.19.3_dgxh100_roce.log")
        if "NET/" in line or "Using network" in line
    ]

    def run_everywhere(state, commands, seconds, stdin=None):
        out = {}
        for node, command in commands.items():
            first = 0 if node == "gpu-a01" else 2
            out[node] = [f"{i} {json.dumps(s)}" for i in range(2) for s in finished(4)] + [
                f"{i} nccl {line}"
                for i in range(2)
                for line in (socket_ if node == "gpu-a02" else ib)
            ]
            assert command.get_raw_value().endswith(f" 2 nccl 25,{first},4,192.0.2.11,29500,0")
        return out

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="c", nodes=["gpu-a01", "gpu-a02"])
    assert (
        collective_stage.run_collective(None, cluster, report, networks)[0] is True
    )  # every rank finished
    assert [(p.node, p.cause[:60]) for p in report.problems] == [
        ("gpu-a02", "NCCL went over sockets although mlx5_0 port 1, mlx5_1 port 1"),
        # IB, but no channel line says GPUDirect RDMA (the quoted log has none): fails closed
        ("gpu-a01", "GPUDirect RDMA is expected here (an IB/RoCE port is active) "),
    ]
    assert "with GPUDirect RDMA not logged" in report.problems[1].cause


# ---- an InfiniBand port down on one node while its peers' are active --------------------------


def test_a_port_down_on_one_node_while_active_on_its_peers_is_named_with_its_state():
    from checks.fabric_verdicts import ib_port_problems

    networks = {
        "gpu-a01": _network("ib_two_hcas"),
        "gpu-a02": _network("ib_one_of_two_down"),
        "gpu-a03": _network("ib_two_hcas"),
    }
    assert [(p.stage, p.node, p.cause) for p in ib_port_problems(CLUSTER, networks)] == [
        (
            "hygiene",
            "gpu-a02",
            "InfiniBand mlx5_1 port 1 is DOWN (1:DOWN) here but ACTIVE on gpu-a01, gpu-a03: "
            "NCCL on this node would run without it",
        )
    ]
    alike = {n.name: _network("ib_two_hcas") for n in CLUSTER.nodes}
    assert ib_port_problems(CLUSTER, alike) == []


def test_a_lone_port_down_silently_disabling_ib_on_one_node_and_a_missing_hca_are_named():
    from checks.fabric_verdicts import ib_port_problems

    networks = {
        "gpu-a01": _network("roce_v2_cx6"),
        "gpu-a02": _network("ib_port_down"),
        "gpu-a03": {"interfaces": [], "ib_ports": []},
    }
    found = [(p.node, p.cause) for p in ib_port_problems(CLUSTER, networks)]
    # ib_port_down's mlx5_0 port 1 is DOWN where roce_v2_cx6's is ACTIVE: the same HCA layout
    assert found == [
        (
            "gpu-a02",
            "InfiniBand mlx5_0 port 1 is DOWN (1:DOWN) here but ACTIVE on gpu-a01: NCCL on "
            "this node would run without it",
        )
    ]
    # an HCA missing altogether counts once most nodes have it active
    networks["gpu-a02"] = _network("roce_v2_cx6")
    assert [(p.node, p.cause) for p in ib_port_problems(CLUSTER, networks)] == [
        (
            "gpu-a03",
            "InfiniBand mlx5_0 port 1 is missing here but ACTIVE on gpu-a01, gpu-a02: NCCL on this "
            "node would run without it",
        )
    ]
    # nodes whose spec keeps NCCL off IB, and nodes whose facts could not be read, are not judged
    networks["gpu-a03"] = None
    assert ib_port_problems(CLUSTER, networks) == []


def test_a_cpu_node_without_hcas_beside_ib_gpu_nodes_is_not_named_but_a_gpu_node_is():
    from checks.fabric_verdicts import ib_port_problems

    mixed = parse_cluster(
        "nodes:\n  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}\n  - {name: gpu-a02, address: "
        "192.0.2.12, gpus: 8}\n  - {name: cpu-a03, address: 192.0.2.13}\n"
    )
    networks = {
        "gpu-a01": _network("roce_v2_cx6"),
        "gpu-a02": _network("roce_v2_cx6"),
        "cpu-a03": {"interfaces": [], "ib_ports": []},
    }
    assert ib_port_problems(mixed, networks) == []  # it runs gloo: no HCA is no fault
    networks["gpu-a02"] = {"interfaces": [], "ib_ports": []}
    assert [
        p.node for p in ib_port_problems(mixed, {**networks, "gpu-a03": None})
    ] == []  # no majority, no alike peer
    three_gpu = {n.name: _network("roce_v2_cx6") for n in CLUSTER.nodes}
    three_gpu["gpu-a03"] = {"interfaces": [], "ib_ports": []}
    assert [p.node for p in ib_port_problems(CLUSTER, three_gpu)] == ["gpu-a03"]


def test_the_measured_figures_are_printed_for_people_with_the_floor_or_its_absence():
    pair = {
        "nodes": ["node1", "node2"],
        "ranks": 2,
        "bytes": 16 << 20,
        "seconds": 0.016,
        "algbw_gbps": 1.0486,
        "busbw_gbps": 1.0486,
    }
    details = {
        "backend": "gloo",
        "bytes": 16 << 20,
        "floor_gbps": None,
        "pairs": {"node1-node2": pair},
    }
    assert bandwidth_stage.bandwidth_lines(details) == [
        "busbw node1-node2: 1.05 GB/s (algbw 1.05 GB/s, 2 ranks gloo, 16 MiB)",
        "busbw floor: none (preflight.min_busbw_gbps): judged against the median only",
    ]
    judged = {
        **details,
        "median_gbps": 2.1,
        "min_fraction": 0.5,
        "pairs": {"node1-node2": {**pair, "of_median": 0.499}},
    }
    assert bandwidth_stage.bandwidth_lines(judged)[:2] == [
        "busbw node1-node2: 1.05 GB/s (0.50 of the median) (algbw 1.05 GB/s, 2 ranks gloo, 16 MiB)",
        "busbw median: 2.10 GB/s (each node's best pair): a pair under 0.5 of it is slow "
        "(preflight.min_busbw_fraction)",
    ]
    assert (
        bandwidth_stage.bandwidth_lines({**details, "floor_gbps": 150})[-1]
        == "busbw floor: 150 GB/s"
    )
    assert bandwidth_stage.bandwidth_lines(
        {"pairs": {}, "note": "a single node with one GPU: no link to measure"}
    ) == ["bandwidth not measured: a single node with one GPU: no link to measure"]
    assert bandwidth_stage.bandwidth_lines({}) == []


# ---- clocks and MTUs compared across nodes (hygiene) --------------------------------------------


def test_a_node_whose_clock_is_seconds_off_is_named_and_read_windows_widen_the_slack():
    from checks.hygiene_verdicts import clock_problems

    sent = 1_700_000_000.0
    readings = {
        "a": (sent + 0.05, sent, sent + 0.1),
        "b": (sent + 0.06, sent, sent + 0.1),
        "c": (sent + 3.05, sent, sent + 0.1),
    }
    (problem,) = clock_problems(readings, 100, expected={"a", "b", "c"})
    assert problem.node == "c" and "2990 ms ahead of the other nodes'" in problem.cause
    # 150 ms apart but read within a 1 s window: not provably off, so not named.
    slow = {"a": (sent + 0.5, sent, sent + 1.0), "b": (sent + 0.65, sent, sent + 1.0)}
    assert clock_problems(slow, 100, expected={"a", "b"}) == []
    behind = {
        "a": (sent + 0.05, sent, sent + 0.1),
        "b": (sent + 0.05, sent, sent + 0.1),
        "c": (sent - 0.9, sent, sent + 0.1),
    }
    assert "behind" in clock_problems(behind, 100, expected={"a", "b", "c"})[0].cause


def test_a_node_that_printed_no_clock_fails_and_the_hygiene_line_is_read_strictly():
    from checks.hygiene_verdicts import clock_problems

    (problem,) = clock_problems({"a": (1.0, 0.0, 2.0)}, 100, expected={"a", "b"})
    assert problem.node == "b" and "no clock reading" in problem.cause
    assert parse_hygiene(["clock 1700000000.123456789"])["clock"] == pytest.approx(
        1700000000.123456789
    )
    assert "clock" not in parse_hygiene(["clock 1e9"]) and "clock" not in parse_hygiene(
        ["clock nan"]
    )


def _eth0(cluster) -> dict[str, str]:
    """Each node's cluster interface as the plan derives it (the one holding its address)."""
    return {node.name: "eth0" for node in cluster.nodes}


def _mtu_network(address: str, mtu: int | None, ports: list[dict] | None = None) -> dict:
    return {
        "interfaces": [{"name": "eth0", "addresses": [address], "bridge": False, "mtu": mtu}],
        "ib_ports": ports or [],
    }


def test_the_one_node_whose_cluster_mtu_or_active_ib_mtu_differs_is_named():
    from checks.fabric_verdicts import mtu_problems

    three = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
        "  - {name: c, address: 192.0.2.3}\n"
    )

    def port(mtu: int) -> dict[str, object]:
        return {"device": "mlx5_0", "port": 1, "state": "4: ACTIVE", "active_mtu": mtu}

    networks = {
        "a": _mtu_network("192.0.2.1", 9000, [port(4096)]),
        "b": _mtu_network("192.0.2.2", 1500, [port(4096)]),
        "c": _mtu_network("192.0.2.3", 9000, [port(2048)]),
    }
    found = {(p.node, p.cause) for p in mtu_problems(three, networks, _eth0(three))}
    assert found == {
        (
            "b",
            "the cluster interface's MTU is 1500, 9000 on a, c: traffic between them fragments or "
            "is dropped",
        ),
        (
            "c",
            "mlx5_0 port 1's active MTU is 2048, 4096 on a, b: traffic between them fragments or "
            "is dropped",
        ),
    }
    same = {n: _mtu_network(f"192.0.2.{i}", 9000) for i, n in enumerate("abc", start=1)}
    assert mtu_problems(three, same, _eth0(three)) == []


def test_an_unreadable_cluster_mtu_fails_and_an_even_split_names_every_node():
    from checks.fabric_verdicts import mtu_problems

    two = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
    )
    (problem,) = mtu_problems(
        two,
        {"a": _mtu_network("192.0.2.1", None), "b": _mtu_network("192.0.2.2", 9000)},
        _eth0(two),
    )
    assert problem.node == "a" and "cannot be read" in problem.cause
    split = mtu_problems(
        two,
        {"a": _mtu_network("192.0.2.1", 1500), "b": _mtu_network("192.0.2.2", 9000)},
        _eth0(two),
    )
    assert {p.node for p in split} == {"a", "b"} and all(
        "no MTU is on most nodes" in p.cause for p in split
    )


# -- the certificate mesh's validity (issue #18) ---------------------------------------------------


def test_preflight_names_missing_expired_and_future_certificates_warns_of_those_due_for_renewal():
    from datetime import datetime, timedelta

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from checks.mesh_verdicts import certificate_verdicts
    from trainfleet import certificates

    cluster = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
    )
    ca = Ed25519PrivateKey.generate()
    key = (
        ca.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    )  # any key will do
    now = datetime(2026, 11, 24, tzinfo=UTC)

    def cert(kind: str, signed: datetime, days: int) -> str:
        names = ["a", "192.0.2.1"] if kind == "host" else ["root"]
        return certificates.sign(
            ca, key, kind, names, "trainfleet:t:a", 7, timedelta(days=days), signed
        )

    held = {
        "a": {
            "ssh_host_ed25519_key-cert.pub": cert("host", now - timedelta(days=10), 365),
            "root's certificate": cert("user", now - timedelta(days=300), 365),
        },  # 65 days left of 365
        "b": {
            "ssh_host_ed25519_key-cert.pub": cert("host", now - timedelta(days=40), 30),  # expired
            "root's certificate": None,
        },
    }
    validity, problems, warnings = certificate_verdicts(cluster, held, now)

    assert validity["a"]["ssh_host_ed25519_key-cert.pub"].startswith(
        "355 days left (until 2027-11-14"
    )
    assert [(w.node, w.cause) for w in warnings] == [
        ("a", "root's certificate has 65 days left: the next deploy signs it again")
    ]
    assert sorted((p.node, p.cause.split(" (")[0].split(":")[0]) for p in problems) == [
        ("b", "root's certificate is missing"),
        ("b", "ssh_host_ed25519_key-cert.pub is not valid now"),
    ]
    # A node holding no host certificate at all cannot prove its host by certificate.
    _, problems, _ = certificate_verdicts(
        cluster, {"a": {"root's certificate": held["a"]["root's certificate"]}}, now
    )
    assert [p.cause for p in problems] == ["sshd presents no host certificate: run the deploy"]


def test_preflight_names_a_certificate_that_is_not_the_clusters_cas_for_this_node_and_user():
    """Issue #26: a damaged signature, another CA, a user certificate where a host one is
    wanted, or another node's names: each fails the certificate check."""
    import base64
    from datetime import datetime, timedelta

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    from checks.mesh_verdicts import certificate_verdicts
    from trainfleet import certificates

    cluster = parse_cluster(
        "nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n"
    )
    ca, other = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    ca_public = ca.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    key = (
        other.public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
    )  # any key will do
    now = datetime(2026, 11, 24, tzinfo=UTC)

    def cert(kind: str, names: list[str], signer=ca) -> str:
        return certificates.sign(
            signer, key, kind, names, "trainfleet:t", 7, timedelta(days=365), now
        )

    good = cert("host", ["a", "192.0.2.1"])
    kind, blob = good.split()[:2]
    data = bytearray(base64.b64decode(blob))
    data[-10] ^= 1
    held = {
        "a": {
            "ssh_host_ed25519_key-cert.pub": f"{kind} {base64.b64encode(bytes(data)).decode()}",
            "root's certificate": cert("user", ["root"], other),
        },
        "b": {
            "ssh_host_ed25519_key-cert.pub": cert("host", ["a", "192.0.2.1"]),  # a's names
            "root's certificate": cert("host", ["root"]),
        },
    }
    _, problems, _ = certificate_verdicts(cluster, held, now, ca_public)
    assert sorted((p.node, p.cause) for p in problems) == [
        ("a", "root's certificate is not the cluster's (signed by another CA): run the deploy"),
        (
            "a",
            "ssh_host_ed25519_key-cert.pub is not the cluster's (its signature does not verify "
            "(damaged or forged)): run the deploy",
        ),
        (
            "b",
            "root's certificate is not the cluster's (a host certificate where a user certificate "
            "is wanted): run the deploy",
        ),
        (
            "b",
            "ssh_host_ed25519_key-cert.pub is not the cluster's (principals a,192.0.2.1, the plan "
            "wants b,192.0.2.2): run the deploy",
        ),
    ]
    good_held = {
        "a": {"ssh_host_ed25519_key-cert.pub": good, "root's certificate": cert("user", ["root"])}
    }
    assert certificate_verdicts(cluster, good_held, now, ca_public)[1] == []


def test_the_collective_passes_on_what_nccl_decided_from_its_own_log(
    planted, monkeypatch, tmp_path
):
    """The real collective command, its "python" a stand-in that leaves the INFO log NCCL 2.28.9
    wrote on an H100 (tests/fixtures/hardware/h100_device) where NCCL_DEBUG_FILE points: the
    lines NCCL's decisions are read from reach the controller."""
    from checks.collective_stage import nccl_logs
    from checks.nccl_decisions import decisions

    _, cwd = planted
    log = (
        Path(__file__).resolve().parents[1]
        / "fixtures/hardware/h100_device/nccl-1rank-info-all.log"
    )
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        f'#!/bin/sh\ncp {log} "$NCCL_DEBUG_FILE"\necho \'{{"step": "done"}}\'\n'
    )
    (venv / "bin" / "python").chmod(0o755)
    _use_venv(monkeypatch, str(venv))
    command = collective_stage.collective_command(0, 1, 1, "127.0.0.1", 1, "nccl", 5)
    steps = rank_output.node_steps(_run_stage(command, cwd).stdout.splitlines(), 1)
    (lines,) = nccl_logs({"h": steps})["h"]
    assert decisions([lines]) == {
        "NCCL version": "2.28.9+cuda13.0",
        "net plugin": "none found (NCCL's own)",
        "GPUDirect RDMA": "disabled for eth0",
        "transport within the node": "not logged",
    }
    assert any("Using network Socket" in line for line in lines)


def test_error_counters_are_read_around_the_collective_and_pairs_on_nodes_with_hcas(monkeypatch):
    lab = parse_cluster(
        "nodes:\n  - {name: node1, address: 198.18.0.11}\n  - {name: node2, address: 198.18.0.12}\n"
    )
    calls: list[list[str]] = []
    counters = iter([["ib mlx5_0 1 symbol_error 0"], ["ib mlx5_0 1 symbol_error 7"]])

    def run_everywhere(state, commands, seconds, stdin=None):
        calls.append(sorted(commands))
        if "counters" in next(iter(commands.values())).get_raw_value():
            return {"node2": next(counters)}
        return _ranks_run(commands, lambda port: 0.02)

    monkeypatch.setattr(collective_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(bandwidth_stage, "run_everywhere", run_everywhere)
    monkeypatch.setattr(bandwidth_stage, "COUNTERS", "# counters\n" + bandwidth_stage.COUNTERS)
    report = PreflightReport(cluster="lab", nodes=["node1", "node2"])
    ports = {"node2": {"ib_ports": [{"device": "mlx5_0", "port": 1, "state": "4: ACTIVE"}]}}
    preflight_check._collective_stages(
        None, lab, report, {"node1": {"ib_ports": []}, **ports}, {"node1", "node2"}
    )
    # before, the collective with its pair, after
    assert calls == [["node2"], ["node1", "node2"], ["node2"]]
    assert [(p.stage, p.node) for p in report.problems] == [("bandwidth", "node2")]
    assert "mlx5_0 port 1 symbol_error 0 -> 7" in report.problems[0].cause


# ---- the collective script's jobs as they ran on a real H100 (fixtures/hardware/h100_preflight)

H100_RUNS = Path(__file__).resolve().parents[1] / "fixtures" / "hardware" / "h100_preflight"


def _real_run(name: str, ranks: int, jobs: int) -> list[list[list[dict]]]:
    """Each local rank's steps per job, from collective.sh's real output."""
    lines = (H100_RUNS / f"{name}.out").read_text().splitlines()
    return [rank_output.job_steps(r, jobs) for r in rank_output.node_steps(lines, ranks)]


def test_one_process_runs_the_collective_then_its_rounds_over_nccl_and_gloo_on_a_real_machine():
    ((collective, *rounds),) = _real_run("nccl-collective-then-two-rounds", 1, 3)
    assert collective_verdicts.rank_failure(collective) is None
    assert not any(s["step"] == "bandwidth" for s in collective)  # the collective times nothing
    for job in rounds:  # NCCL initialised, destroyed and initialised again, in one process
        assert collective_verdicts.rank_failure(job) is None
        # a world of one GPU moves nothing over a link: its figure proves the job ran whole
        (timed,) = [s for s in job if s["step"] == "bandwidth"]
        assert timed["bytes"] == 256 << 20 and timed["iters"] >= 3
    two_ranks = _real_run("gloo-two-ranks-collective-then-two-rounds", 2, 3)
    for job in (1, 2):
        figures = pair_figures([rank[job] for rank in two_ranks])
        assert figures and figures["busbw_gbps"] > 0
    ((alone,),) = _real_run("nccl-collective", 1, 1)
    assert collective_verdicts.rank_failure(alone) is None
    assert any("NCCL INFO Using network Socket" in s.get("text", "") for s in alone)


def test_a_collective_whose_peer_never_came_ends_the_process_and_runs_no_pair():
    ((collective, pair),) = _real_run("gloo-collective-missing-peer", 1, 2)
    timeout = next(s for s in collective if s["step"] == "timeout")
    assert (timeout["stage"], timeout["joined"], timeout["missing"]) == ("rendezvous", [0], [1])
    assert [s["step"] for s in pair] == ["exit"]  # never started: the process's exit status only
    assert (
        collective_verdicts.rank_failure(pair)
        == "python exited with status 3 after 'no output' and wrote nothing to stderr"
    )


def test_a_pair_whose_peer_never_came_times_out_alone_and_the_next_round_still_runs():
    ((collective, lonely, alone),) = _real_run("gloo-pair-missing-peer-then-next", 1, 3)
    assert collective_verdicts.rank_failure(collective) is None
    timeout = next(s for s in lonely if s["step"] == "timeout")
    assert (timeout["stage"], timeout["missing"]) == ("rendezvous", [1])
    assert collective_verdicts.rank_failure(lonely) == "stopped after 'timeout' (timed out)"
    assert collective_verdicts.rank_failure(alone) is None and pair_figures([alone])


def test_isolation_runs_its_second_pass_on_the_suspects_nodes_with_their_partners_rendezvous(
    monkeypatch,
):
    """The two passes' commands as sent (every node silent: every pair fails): first the master
    hosts a pair with each node on ports of their own, then n2 hosts one with each of the rest
    at its own address; the verdict is the second pass's."""
    sent: list[dict[str, str]] = []

    def silent(state, commands, seconds, stdin=None):
        sent.append({node: c.get_raw_value() for node, c in commands.items()})
        return {}

    monkeypatch.setattr(collective_stage, "run_everywhere", silent)
    report = PreflightReport(cluster="t", nodes=[n.name for n in FIVE.nodes])
    collective_stage.run_isolation(None, FIVE, report)
    first, second = sent
    assert sorted(first) == ["n1", "n2", "n3", "n4", "n5"]
    for i, node in enumerate(["n2", "n3", "n4", "n5"]):
        assert f"20,0,2,192.0.2.11,{29501 + i},0" in first["n1"]
        assert f"20,1,2,192.0.2.11,{29501 + i},0" in first[node]
    assert sorted(second) == ["n2", "n3", "n4", "n5"]
    for i, node in enumerate(["n3", "n4", "n5"]):
        assert f"20,0,2,192.0.2.12,{29501 + i},0" in second["n2"]
        assert f"20,1,2,192.0.2.12,{29501 + i},0" in second[node]
    assert {p.node for p in report.problems} == {"n1", "n2", "n3", "n4", "n5"}
    assert report.details["isolation"]["second pass"] == {
        "n2 n3": False,
        "n2 n4": False,
        "n2 n5": False,
    }
    assert len({p.cause for p in report.problems}) == 1  # alike: no one rank's words added
    # one node silent, the others done: it alone is named, ending with its own rank's words

    def only_n3_silent(state, commands, seconds, stdin=None):
        return {node: ['0 {"step": "done"}'] for node in commands if node != "n3"}

    monkeypatch.setattr(collective_stage, "run_everywhere", only_n3_silent)
    report = PreflightReport(cluster="t", nodes=[n.name for n in FIVE.nodes])
    collective_stage.run_isolation(None, FIVE, report)
    (culprit,) = report.problems
    assert culprit.node == "n3" and culprit.cause.startswith(
        "2-rank collectives between n3 and n1, and between n3 and n2 (which passes with n1) fail"
    )
    assert culprit.cause.endswith("(n3's rank: stopped after 'no output' (timed out))")


def test_a_node_that_cannot_reach_the_rendezvous_port_skips_the_collective_it_would_hang():
    from checks.reachability_verdicts import rendezvous_unreachable

    matrix = {
        "gpu-a01": {"gpu-a01:29500": "ok", "gpu-a02": "ok"},
        "gpu-a02": {"gpu-a01:29500": "ok", "gpu-a03": "timed out"},  # a peer only: run it
        "gpu-a03": {"gpu-a01:29500": "timed out", "gpu-a02": "ok"},
    }
    assert rendezvous_unreachable(CLUSTER, matrix) == ["gpu-a03"]
    assert rendezvous_unreachable(CLUSTER, {"gpu-a03": {"gpu-a02": "refused"}}) == []


def test_a_collective_that_cannot_succeed_is_not_run_a_failed_probe_or_a_missing_interface(
    monkeypatch,
):
    """Skip what cannot succeed: a peer's listener no node reaches (the issue's cut-off node),
    or a node whose socket interface variable names an interface it does not have (its ranks
    fail at once, the others waited out the collective's bound: 68.7 s in the issue)."""
    from checks.collective_verdicts import missing_interfaces

    names = [n.name for n in CLUSTER.nodes]
    ok_matrix = {src: dict.fromkeys([*names, "gpu-a01:29500"], "ok") for src in names}
    ran: list[str] = []

    def stages(matrix, env):
        def reach(state, cluster, report, free):
            report.details["reachability"] = matrix

        monkeypatch.setattr(preflight_check, "run_reachability", reach)
        monkeypatch.setattr(preflight_check, "run_ssh_mesh", lambda *a: None)
        monkeypatch.setattr(preflight_check, "_collective_stages", lambda *a: ran.append("ran"))
        report = PreflightReport(cluster="c", nodes=names)
        report.details["hygiene"] = {n: {"env": {"GLOO_SOCKET_IFNAME": env(n)}} for n in names}
        networks = {n: {"interfaces": [{"name": "eth0"}, {"name": "eno1"}]} for n in names}
        ran.clear()
        preflight_check._stages(None, CLUSTER, report, networks, set(names), None)
        return report.stages.get("collective"), ran[:]

    assert stages(ok_matrix, lambda n: "eth0") == (None, ["ran"])
    cut = {
        src: {**row, "gpu-a03": "timed out" if src != "gpu-a03" else "ok"}
        for src, row in ok_matrix.items()
    }
    assert stages(cut, lambda n: "eth0") == ("skipped", [])
    assert stages(ok_matrix, lambda n: "ens9" if n == "gpu-a02" else "eth0") == ("skipped", [])
    seen = {"a": {"env": {"GLOO_SOCKET_IFNAME": "eth0,ens9"}}, "b": {"env": {}}}
    seen["c"] = {"env": {"NCCL_SOCKET_IFNAME": "=ib0"}}
    seen["d"] = {"env": {"NCCL_SOCKET_IFNAME": "en"}}
    seen["e"] = {"env": {"NCCL_SOCKET_IFNAME": "^docker"}}
    have = {"interfaces": [{"name": "eth0"}, {"name": "eno1"}]}
    networks = dict.fromkeys(seen, have)
    assert missing_interfaces(seen, networks, "gloo") == {
        "a": "GLOO_SOCKET_IFNAME=eth0,ens9 names an interface the node does not have (it has "
        "eth0, eno1): its ranks cannot start, the collective is not run"
    }
    assert sorted(missing_interfaces(seen, networks, "nccl")) == ["a", "c"]  # "en": a prefix
    assert missing_interfaces(seen, {}, "nccl") == {}  # interfaces not read: not judged here


def test_a_pair_slow_once_but_not_when_measured_again_names_nothing(monkeypatch):
    """A busy host slows one pair's second of measurement (node1-node3, port 29503): the pair
    is measured again on its own port, judged by its better figure, and nothing is named; both
    figures stay in the JSON and the text."""
    lab = parse_cluster(
        "nodes:\n  - {name: node1, address: 198.18.0.11}\n"
        "  - {name: node2, address: 198.18.0.12}\n  - {name: node3, address: 198.18.0.13}\n"
    )
    sent: list[dict] = []

    def answer(commands, seconds_of):
        sent.append(commands)
        return _ranks_run(commands, lambda port: 0.2 if len(sent) == 1 and port == 29503 else 0.02)

    calls, report = _preflight_collective(monkeypatch, lab, answer=answer)
    assert len(calls) == 2 and sorted(calls[1][0]) == ["node1", "node3"]
    assert calls[1][0]["node1"].endswith(" 1 gloo 30,0,2,198.18.0.11,29503,16777216")
    assert report.problems == [] and report.stages["bandwidth"] == "ok"
    pair = report.details["bandwidth"]["pairs"]["node1-node3"]
    fast, slow = round((16 << 20) / 0.02 / 1e9, 4), round((16 << 20) / 0.2 / 1e9, 4)
    assert pair["measured_gbps"] == [slow, fast] and pair["busbw_gbps"] == fast
    assert pair["of_median"] == 1.0
    lines = bandwidth_stage.bandwidth_lines(report.details["bandwidth"])
    (line,) = [line for line in lines if "twice" in line]
    assert line.startswith("busbw node1-node3: 0.84 GB/s (1.00 of the median)")
    assert line.endswith("(measured twice: 0.08, 0.84 GB/s, the better judged)")


@pytest.mark.parametrize("suspect_is_slow", [False, True])
def test_a_node_slow_only_with_slow_partners_is_retested_with_a_partner_known_good(
    monkeypatch, suspect_is_slow
):
    """A ring of eight, node2 and node4 slow: node3's two pairs are both slow, with them. It is
    re-tested with node6 (in no slow pair), in one more round: fast there, it is cleared; slow
    there too, it is the slow node."""
    from checks.preflight_scope import worst_case

    eight = parse_cluster(
        "nodes:\n"
        + "".join(f"  - {{name: node{i}, address: 198.18.0.{10 + i}}}\n" for i in range(1, 9))
    )
    # the ring's ports: 29501 node1-node2, 29502 node3-node4, 29505 node2-node3, 29506 node4-node5
    slow_ring = {29501, 29502, 29505, 29506}
    sent: list[dict] = []

    def answer(commands, seconds_of):
        sent.append(commands)
        if len(sent) <= 2:  # the stage, then its slow pairs measured again: slow both times
            return _ranks_run(commands, lambda port: 0.2 if port in slow_ring else 0.02)
        return _ranks_run(commands, lambda port: 0.2 if suspect_is_slow else 0.02)

    calls, report = _preflight_collective(monkeypatch, eight, answer=answer)
    assert len(calls) == 3  # the collective's command, the slow pairs again, the re-test's round
    again, _ = calls[1]
    assert sorted(again) == ["node1", "node2", "node3", "node4", "node5"]
    assert {int(p) for raw in again.values() for p in re.findall(r",(\d+),16777216", raw)} == (
        slow_ring
    )  # each slow pair on its own port
    retest, seconds = calls[2]
    assert sorted(retest) == ["node3", "node6"] and seconds == 30
    assert retest["node6"].endswith(" 1 gloo 30,0,2,198.18.0.16,29501,16777216")
    assert retest["node3"].endswith(" 1 gloo 30,1,2,198.18.0.16,29501,16777216")
    named = {p.node: p.cause for p in report.problems}
    assert named["node2"].endswith("the node is slow with every partner")
    assert named["node4"].endswith("the node is slow with every partner")
    if suspect_is_slow:
        assert named["node3"] == (
            "slow: 0.08 GB/s with node6, a partner known good, median 0.84: the node is slow "
            "with every partner"
        )
    else:
        assert sorted(named) == ["node2", "node4"]
    assert report.details["bandwidth"]["retest"] == {
        "node6 node3": round((16 << 20) / (0.2 if suspect_is_slow else 0.02) / 1e9, 4)
    }
    # the stated worst case holds the re-test's round (from seven nodes)
    rounds = 2
    assert worst_case(eight)["collective and bandwidth"] >= 25 + rounds * 30 + 30 + 2 * 10
