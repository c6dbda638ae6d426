"""Preflight verdicts from stage output (no GPUs here: the GPU lines are captured tool output)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from checks.preflight import parse_hygiene
from trainfleet import Cluster
from trainfleet.preflight import PreflightReport, collective_problems, hygiene_problems, isolate, listener_pids

CLUSTER = Cluster.parse("""\
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: 8}
  - {name: gpu-a02, address: 192.0.2.12, gpus: 8}
  - {name: gpu-a03, address: 192.0.2.13, gpus: 8}
""")
# `nvidia-smi -L` on an 8x H100 SXM node (format of nvidia-smi 550; UUIDs shortened).
NVIDIA_SMI_L = [f"gpu GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-5b7a1c3e-0c2d-4f1a-9e6b-7d3c2a1b0f{i:02d})" for i in range(8)]
# `ss -Hltnp 'sport = :29500'` while a stale torchrun still holds the port.
SS_HOLDER = 'holder LISTEN 0      128          0.0.0.0:29500      0.0.0.0:*    users:(("python3",pid=4242,fd=3))'
ENV = {"NCCL_SOCKET_IFNAME": "=ens1f0", "GLOO_SOCKET_IFNAME": "ens1f0", "NCCL_IB_HCA": "=mlx5_0:1"}


def node_output(cvd: str = "", slots: int = 8, env: dict | None = None, extra: list[str] | None = None) -> list[str]:
    resolves = [f"resolve {n.name} {n.address}" for n in CLUSTER.nodes]
    env_lines = [f"env {k}={v}" for k, v in (ENV if env is None else env).items()]
    return [*(extra or []), *resolves, "gpus", *NVIDIA_SMI_L, f"cvd {cvd}", *env_lines, f"slots {slots}"]


def problems_for(outputs: dict[str, list[str]]) -> list[str]:
    seen = {node: parse_hygiene(lines) for node, lines in outputs.items()}
    slots = {node: data.pop("slots") for node, data in seen.items() if "slots" in data}
    # The derived env may carry pass-through variables the hygiene stage does not read.
    expected = {n.name: {**ENV, "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"} for n in CLUSTER.nodes}
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
        'gpu-a01: master port 29500 is already in use (users:(("python3",pid=4242,fd=3)))']


def test_a_missing_or_wrong_variable_in_the_non_login_environment_is_named():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a03"] = node_output(env={"NCCL_SOCKET_IFNAME": "=eno1", "NCCL_IB_HCA": "=mlx5_0:1"})
    assert problems_for(outputs) == [
        "gpu-a03: NCCL_SOCKET_IFNAME is '=eno1' in the non-login environment ranks get, expected '=ens1f0'",
        "gpu-a03: GLOO_SOCKET_IFNAME is 'missing' in the non-login environment ranks get, expected 'ens1f0'",
    ]


def test_a_name_resolving_elsewhere_is_named():
    outputs = {n.name: node_output() for n in CLUSTER.nodes}
    outputs["gpu-a02"] = [line.replace("resolve gpu-a03 192.0.2.13", "resolve gpu-a03 192.0.2.99")
                          for line in node_output()]
    assert problems_for(outputs) == ["gpu-a02: gpu-a03 resolves to 192.0.2.99, not 192.0.2.13"]


def done(versions=None):
    v = versions or {"torch": "2.4.1+cu124", "cuda": "12.4", "nccl": "2.20.5"}
    return [{"step": "start"}, {"step": "joined"}, {"step": "all_reduce", "ok": True, "got": 6.0, "expected": 6.0},
            {"step": "all_gather", "versions": [v, v, {**v, "torch": "2.3.1+cu121"}]}, {"step": "done"}]


def test_the_collective_names_a_rank_with_other_versions_and_ranks_that_never_joined():
    steps = {n.name: done() for n in CLUSTER.nodes}
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "torch 2.3.1+cu121 differs from the other ranks' 2.4.1+cu124")]
    timeout = {"step": "timeout", "stage": "rendezvous", "joined": [0, 1], "missing": [2]}
    steps = {"gpu-a01": [{"step": "start"}, timeout], "gpu-a02": [{"step": "start"}], "gpu-a03": []}
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "never joined the rendezvous at gpu-a01:29500 (joined: gpu-a01, gpu-a02)")]


def test_isolation_blames_the_failing_pairs_node_or_the_master_when_all_fail():
    assert [p.node for p in isolate(CLUSTER, {"gpu-a02": True, "gpu-a03": False})] == ["gpu-a03"]
    assert [p.node for p in isolate(CLUSTER, {"gpu-a02": False, "gpu-a03": False})] == ["gpu-a01"]


# --- what the node printed never becomes a command unchecked; every python runs isolated ---

HOSTILE_PID_LINES = ["pid 1; rm -rf /", "pid $(id)", "pid `id`", "pid 12 13", "pid -1", "pid 0", "pid 0x10",
                     "pid 99999999", "pid \u0661\u0662", "pid 12\n; id", "pid", "pid 4242&&id"]


def test_only_exact_decimal_pids_in_range_are_taken_the_rest_is_refused():
    pids, refused = listener_pids(["pid 4242", *HOSTILE_PID_LINES, "resolve x", "pid 4194304"])
    assert pids == [4242, 4194304]
    assert refused == HOSTILE_PID_LINES


def test_a_node_printing_hostile_pid_lines_is_named_and_they_reach_no_command(monkeypatch):
    import checks.preflight as preflight

    sent: list[str] = []
    listener_output = {"gpu-a01": ["pid 4242", "pid 4243"], "gpu-a02": ["pid 1; rm -rf /", "pid $(id)", "pid 77"],
                       "gpu-a03": ["pid 5000"]}

    def run_everywhere(state, commands, seconds):
        sent.extend(c.get_raw_value() for c in commands.values())
        if len(sent) == len(commands):  # the first call starts the listeners
            return listener_output
        return {node: [f"ok {n.name}" for n in CLUSTER.nodes] + ["ok gpu-a01:29500"] for node in commands}

    monkeypatch.setattr(preflight, "run_everywhere", run_everywhere)
    report = PreflightReport(cluster="c", nodes=[n.name for n in CLUSTER.nodes])
    preflight._reachability(None, CLUSTER, report, master_port_free=True)
    assert [(p.node, p.cause) for p in report.problems] == [
        ("gpu-a02", "printed 'pid 1; rm -rf /' where a listener's PID belongs: not used (the listener ends by its "
                    "timeout)"),
        ("gpu-a02", "printed 'pid $(id)' where a listener's PID belongs: not used (the listener ends by its timeout)")]
    kills = {c.split("' trainfleet ", 1)[1] for c in sent if "/proc/$pid/cmdline" in c}  # their arguments
    (token,) = {args.split()[1] for args in kills}  # one token for the run
    assert kills == {f"/run/trainfleet/{token} {token} 4242 4243", f"/run/trainfleet/{token} {token} 77",
                     f"/run/trainfleet/{token} {token} 5000"}
    listeners = [c for c in sent if "s.listen(128)" in c]
    assert len(listeners) == 3 and all(f"' trainfleet 20 {token} 192.0.2.1" in c for c in listeners)


def test_ending_listeners_kills_only_this_runs_processes_whatever_pids_are_passed(tmp_path, monkeypatch):
    import checks.preflight as preflight

    monkeypatch.setattr(preflight, "RUN_DIR", str(tmp_path))

    token = "trainfleet-preflight-0123456789abcdef"
    sleep = [sys.executable, "-c", "import time; time.sleep(30)"]
    ours = subprocess.Popen([*sleep, token])  # carries the token, as a listener does
    other = subprocess.Popen([*sleep, "trainfleet-preflight-ffffffffffffffff"])  # another run's
    try:
        command = preflight.end_listeners_command(token, [ours.pid, other.pid])
        subprocess.run(["sh", "-c", command.get_raw_value()], check=True, timeout=10)
        assert ours.wait(timeout=5) == -15
        assert other.poll() is None
    finally:
        for p in (ours, other):
            p.kill()
            p.wait()
    with pytest.raises(ValueError):
        preflight.end_listeners_command(token, ["1; id"])  # type: ignore[list-item]


def _run_stage(command, cwd, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", command.get_raw_value()], cwd=cwd, capture_output=True, text=True, timeout=30,
                          env={**os.environ, **env})


def _plant(directory, modules=("json", "socket", "threading", "sys", "sitecustomize")):
    for module in modules:
        (directory / f"{module}.py").write_text(f"open({str(directory / ('PWNED-' + module))!r}, 'w').close()\n")


@pytest.fixture
def planted(tmp_path, monkeypatch):
    """(the preflight module with its RUN_DIR under tmp_path, that dir, a dir of planted modules)."""
    import checks.preflight as preflight

    base = tmp_path / "run"
    monkeypatch.setattr(preflight, "RUN_DIR", str(base))
    modules = tmp_path / "tmp"
    modules.mkdir()
    _plant(modules)
    return preflight, base, modules


def test_stage_pythons_run_isolated_in_a_private_directory_that_is_removed(planted):
    preflight, base, planted = planted
    # Started from the planted directory, with it on PYTHONPATH too: nothing there is imported.
    probe = preflight._python(preflight._PROBE, "127.0.0.1", "closed=127.0.0.1:1")
    done = _run_stage(probe, planted, PYTHONPATH=str(planted))
    assert done.stdout.startswith("fail closed ConnectionRefusedError"), done
    assert sorted(p.name for p in planted.glob("PWNED-*")) == []
    assert base.is_dir() and oct(base.stat().st_mode & 0o777) == "0o700" and list(base.iterdir()) == []


def test_listeners_run_isolated_in_their_own_directory_and_end_with_it(planted):
    preflight, base, planted = planted
    with socket.socket() as s:  # a free port
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    token = "trainfleet-preflight-00112233aabbccdd"
    start = preflight._sh(preflight.listener_workdir(token, str(base)) + preflight._LISTEN,
                          20, token, "127.0.0.1", port)
    pids, refused = listener_pids(_run_stage(start, planted, PYTHONPATH=str(planted)).stdout.splitlines())
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
        subprocess.run(["sh", "-c", preflight.end_listeners_command(token, pids).get_raw_value()], check=True)
        for _ in range(50):
            if not os.path.exists(f"/proc/{pids[0]}") or "Z" in open(f"/proc/{pids[0]}/stat").read().split()[2]:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the listener was not ended")
        assert list(base.iterdir()) == []
    finally:
        subprocess.run(["kill", str(pids[0])], capture_output=True)


def test_the_private_directory_is_refused_unless_a_real_0700_directory_of_ours(tmp_path, monkeypatch):
    import checks.preflight as preflight

    elsewhere = tmp_path / "theirs"
    elsewhere.mkdir(mode=0o777)
    base = tmp_path / "run"
    base.symlink_to(elsewhere)
    monkeypatch.setattr(preflight, "RUN_DIR", str(base))
    done = _run_stage(preflight._python("echo ran"), tmp_path)
    assert done.returncode == 97 and done.stdout == f"trainfleet: refused to run: {base} is not a directory of ours " \
                                                   "with mode 700\n"
    assert list(elsewhere.iterdir()) == []
    assert [(p.node, p.cause) for p in preflight._refusals("reachability", {"gpu-a01": [done.stdout.strip()]})] == [
        ("gpu-a01", f"refused to run: {base} is not a directory of ours with mode 700")]


def test_every_python_a_stage_starts_is_isolated_and_none_runs_from_tmp():
    import checks.preflight as preflight

    scripts = {"listen": preflight._LISTEN, "probe": preflight._PROBE, "collective": preflight._COLLECTIVE_RUN}
    for name, script in scripts.items():
        starts = re.findall(r'(?:python3|"\$python")( -\S+)? -c', script)
        assert starts and all(flag == " -I" for flag in starts), name
    collective = preflight._collective_command(0, 3, "192.0.2.11", 29500, "gloo", 25).get_raw_value()
    assert "/tmp" not in collective.replace(preflight.COLLECTIVE, "") and "mktemp -d /run/trainfleet/" in collective
    assert " -I -c " in collective and "/opt/trainfleet/venv/bin/python" in collective


def test_a_port_holders_name_reaches_the_report_without_control_characters():
    holder = 'holder LISTEN 0 128 0.0.0.0:29500 0.0.0.0:* users:(("\x1b]0;owned\x07x",pid=4242,fd=3))'
    assert parse_hygiene([holder])["port_holder"] == 'users:(("\\x1b]0;owned\\x07x",pid=4242,fd=3))'


# ---- the collective says why a rank failed, in that rank's own words ------------------------

def _collective_on(preflight, venv, cwd) -> list[dict]:
    """Run the real collective command of rank 0 of 1 with ``venv`` as the node venv."""
    preflight.VENV_DIR = str(venv)
    command = preflight._collective_command(0, 1, "127.0.0.1", 1, "gloo", 5)
    return preflight._steps(_run_stage(command, cwd).stdout.splitlines())


def causes(steps: list[dict]) -> list[str]:
    one = Cluster.parse("nodes:\n  - {name: gpu-a01, address: 192.0.2.11}\n")
    return [p.cause for p in collective_problems(one, {"gpu-a01": steps})]


def test_a_node_without_a_venv_is_named_for_its_missing_python_not_a_timeout(planted, monkeypatch, tmp_path):
    preflight, _, cwd = planted
    monkeypatch.setattr(preflight, "VENV_DIR", "unset")
    venv = tmp_path / "no-venv"
    assert causes(_collective_on(preflight, venv, cwd)) == [
        f"python failed: no python at {venv}/bin/python: the node has no venv (pin stack.torch and deploy)"]


def test_a_venv_without_torch_is_named_with_pythons_own_message(planted, monkeypatch, tmp_path):
    preflight, _, cwd = planted
    monkeypatch.setattr(preflight, "VENV_DIR", "unset")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    assert causes(_collective_on(preflight, venv, cwd)) == [
        "import failed: ModuleNotFoundError: No module named 'torch'"]


def test_a_python_that_cannot_start_is_named_with_its_exit_status_and_last_words(planted, monkeypatch, tmp_path):
    preflight, _, cwd = planted
    monkeypatch.setattr(preflight, "VENV_DIR", "unset")
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    python = tmp_path / "venv" / "bin" / "python"
    # what a venv whose base interpreter was removed prints (the dynamic loader's message)
    python.write_text("#!/bin/sh\necho 'python: error while loading shared libraries: libpython3.11.so.1.0: "
                      "cannot open shared object file: No such file or directory' >&2\nexit 127\n")
    python.chmod(0o755)
    assert causes(_collective_on(preflight, tmp_path / "venv", cwd)) == [
        "python exited with status 127 after 'no output': python: error while loading shared libraries: "
        "libpython3.11.so.1.0: cannot open shared object file: No such file or directory"]


def test_what_a_failing_rank_printed_reaches_the_report_escaped_and_silence_is_a_timeout():
    import checks.preflight as preflight

    steps = preflight._steps(['{"step": "start"}', "exit 1", "stderr \x1b]0;owned\x07 Traceback"])
    assert causes(steps) == ["python exited with status 1 after 'start': \\x1b]0;owned\\x07 Traceback"]
    assert causes(preflight._steps(['{"step": "start"}', "exit 124"])) == ["stopped after 'start' (timed out)"]
    # a rank that finished, then exited non-zero (its teardown failed), did finish
    assert causes(preflight._steps(['{"step": "done"}', "", "exit 134", "stderr terminate called"])) == []
    assert causes([]) == ["stopped after 'no output' (timed out)"]
    assert preflight._steps(["[1, 2]", "exit 9999", "nonsense"]) == []


def test_a_rank_that_never_joined_because_its_python_is_missing_says_so():
    timeout = {"step": "timeout", "stage": "rendezvous", "joined": [0, 1], "missing": [2]}
    missing = {"step": "error", "stage": "python", "error": "no python at /opt/trainfleet/venv/bin/python"}
    steps = {"gpu-a01": [{"step": "start"}, timeout], "gpu-a02": [{"step": "start"}], "gpu-a03": [missing]}
    assert [(p.node, p.cause) for p in collective_problems(CLUSTER, steps)] == [
        ("gpu-a03", "python failed: no python at /opt/trainfleet/venv/bin/python")]


# ---- hostnames and the SSH mesh -------------------------------------------------------------

def test_nodes_sharing_a_hostname_are_each_named():
    outputs = {n.name: node_output(extra=[f"hostname {n.name}"]) for n in CLUSTER.nodes}
    assert problems_for(outputs) == []
    outputs["gpu-a03"] = node_output(extra=["hostname gpu-a02"])
    assert problems_for(outputs) == ["gpu-a02: its hostname 'gpu-a02' is also the hostname of gpu-a03",
                                     "gpu-a03: its hostname 'gpu-a02' is also the hostname of gpu-a02"]


def test_every_node_must_reach_every_node_as_every_mesh_user_and_silence_fails():
    from trainfleet.preflight import mesh_problems

    cluster = Cluster.parse(CLUSTER_TEXT_WITH_USERS)
    names = [n.name for n in cluster.nodes]
    ok = {user: {peer: "ok" for peer in names} for user in ("root", "alice")}
    assert mesh_problems(cluster, {n: ok for n in names}, names, 25) == []
    one_way = {**ok, "alice": {**ok["alice"], "gpu-a03": "rc=255 alice@gpu-a03: Permission denied (publickey)."}}
    partial = {"root": {"gpu-a01": "ok"}, "alice": ok["alice"]}  # peers the probe never reported
    proofs = {"gpu-a01": one_way, "gpu-a02": partial, "gpu-a03": None}
    assert [(p.node, p.cause) for p in mesh_problems(cluster, proofs, names, 25)] == [
        ("gpu-a01", "as alice, cannot ssh to gpu-a03: rc=255 alice@gpu-a03: Permission denied (publickey)."),
        ("gpu-a02", "as root, cannot ssh to gpu-a02: not probed"),
        ("gpu-a02", "as root, cannot ssh to gpu-a03: not probed"),
        ("gpu-a03", "its SSH probes gave no complete answer within 25 s"),
    ]
    # a node that could not be reached at all is named once, as unreachable, by the caller
    assert mesh_problems(cluster, {n: ok for n in names[:2]}, names[:2], 25) == []


def test_the_ssh_stage_reads_one_bundled_probe_per_node_and_a_cut_off_answer_is_no_pass():
    from facts.fingerprint import MeshProofs

    fact = MeshProofs()
    command = fact.command(users=["root", "alice"], peers=["gpu-a01", "gpu-a02"]).get_raw_value()
    assert command.count("BatchMode=yes") == 2 and "StrictHostKeyChecking=yes" in command
    with pytest.raises(Exception):
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
    line = {"smoke": "ok" if ok else "fail", "rank": rank, "world": world, "host": host, "backend": "nccl"}
    if not ok:
        line["error"] = "DistStoreError: Timed out after 61 seconds waiting for clients. 2/3 clients joined."
    return json.dumps(line)


def test_every_rank_of_every_node_must_report_ok_from_the_smoke_job():
    from trainfleet.preflight import rank_owners, smoke_problems

    owners = rank_owners(CLUSTER)
    assert (owners[0], owners[7], owners[8], owners[23]) == ("gpu-a01", "gpu-a01", "gpu-a02", "gpu-a03")
    # DeepSpeed's pdsh prefixes each line with the node; its own log lines surround them.
    lines = ["[INFO] [runner.py:618:main] cmd = pdsh -S -f 1024 -w gpu-a01,gpu-a02,gpu-a03 ..."]
    lines += [f"{owners[r]}: {_rank(r, owners[r])}" for r in range(24)]
    assert smoke_problems(CLUSTER, "deepspeed", {"gpu-a01": lines + ["exit 0"]}) == []

    broken = [line for line in lines if not line.startswith("gpu-a03")] + [
        f"gpu-a02: {_rank(9, 'gpu-a02', ok=False)}", "exit 1",
        "stderr gpu-a03: /opt/trainfleet/venv/bin/python: No module named deepspeed"]
    found = [(p.node, p.cause) for p in smoke_problems(CLUSTER, "deepspeed", {"gpu-a01": broken})]
    assert found[0] == ("gpu-a02", "through deepspeed: rank 9 failed: DistStoreError: Timed out after 61 seconds "
                                   "waiting for clients. 2/3 clients joined.")
    assert found[1:] == [("gpu-a03", f"through deepspeed: rank {r} never reported (its launcher exited with status 1: "
                                     "gpu-a03: /opt/trainfleet/venv/bin/python: No module named deepspeed)")
                         for r in range(16, 24)]


def test_a_smoke_job_in_the_wrong_world_or_silent_is_no_pass():
    from trainfleet.preflight import smoke_problems

    small = Cluster.parse("nodes:\n  - {name: a, address: 192.0.2.1}\n  - {name: b, address: 192.0.2.2}\n")
    assert [p.cause for p in smoke_problems(small, "torchrun", {"a": [_rank(0, "a", world=1)], "b": []})] == [
        "through torchrun: rank 0 ran in a world of 1, the cluster has 2 ranks",
        "through torchrun: rank 1 never reported (its launcher gave no answer)"]


def test_the_smoke_stage_starts_runners_once_from_root_owned_ground_and_bounds_them():
    import checks.preflight as preflight

    deepspeed = preflight.smoke_command(CLUSTER, "deepspeed").get_raw_value()
    assert "/etc/trainfleet/launch/deepspeed.sh /etc/trainfleet/launch/smoke_train.py --timeout 60 --deadline 110" in deepspeed
    assert "cd / && exec timeout -k 5" in deepspeed and "mktemp -d /run/trainfleet/" in deepspeed
    mpirun = preflight.smoke_command(CLUSTER, "mpirun").get_raw_value()
    assert ("/etc/trainfleet/launch/mpirun.sh --mca orte_tmpdir_base /run/trainfleet /opt/trainfleet/venv/bin/python "
            "/etc/trainfleet/launch/smoke_train.py --timeout 60 --deadline 110 --master-addr 192.0.2.11 "
            "--master-port 29500") in mpirun
    with pytest.raises(ValueError):
        preflight.smoke_command(CLUSTER, "../../tmp/x")
