"""Launcher files as rendered for a CPU-only and a GPU cluster: each launcher started the way
its own runner needs (checked against the runners' source; run for real in
tests/lab/test_launchers.py)."""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path

import pytest
import yaml

from trainfleet.capabilities.launchers import VERBATIM, render_launchers
from trainfleet.launch.colossalai_run import OpenSshConnection
from trainfleet.spec import parse_cluster

NODES = """\
nodes:
  - {name: gpu-a01, address: 192.0.2.11, gpus: GPUS}
  - {name: gpu-a02, address: 192.0.2.12, gpus: GPUS}
"""


def files(gpus: int, node: int = 1, forward: dict[str, str] | None = None) -> dict[str, str]:
    cluster = parse_cluster(NODES.replace("GPUS", str(gpus)))
    return {
        name: text
        for name, (text, _) in render_launchers(
            cluster, cluster.nodes[node], forward=forward
        ).items()
    }


def test_deepspeed_gets_the_cluster_address_as_master_and_the_env_file_wherever_it_starts():
    script = files(0)["deepspeed.sh"]
    assert "DS_ENV_FILE=/etc/trainfleet/launch/.deepspeed_env; export DS_ENV_FILE" in script
    assert (
        "exec /opt/trainfleet/venv/bin/deepspeed --hostfile /etc/trainfleet/launch/hostfile \\\n"
        '    --master_addr 192.0.2.11 --master_port 29500 "$@"'
    ) in script


def test_accelerate_starts_a_multi_node_job_on_cpu_only_nodes_too():
    cpu, gpu = files(0), files(8)
    for rendered, use_cpu in ((cpu, True), (gpu, False)):
        config = yaml.safe_load(rendered["accelerate.yaml"])
        assert config["distributed_type"] == "MULTI_GPU" and config["use_cpu"] is use_cpu
        assert config["machine_rank"] == 1 and config["num_machines"] == 2
    assert (
        config["num_processes"] == 16
        and yaml.safe_load(cpu["accelerate.yaml"])["num_processes"] == 2
    )
    assert "ACCELERATE_USE_CPU=true; export ACCELERATE_USE_CPU" in cpu["accelerate.sh"]
    assert "ACCELERATE_USE_CPU" not in gpu["accelerate.sh"]
    assert (
        cpu["accelerate.sh"]
        .rstrip()
        .endswith(
            "exec /opt/trainfleet/venv/bin/accelerate launch --config_file "
            '/etc/trainfleet/launch/accelerate.yaml "$@"'
        )
    )


def test_colossalai_runs_with_the_venv_first_on_the_path_its_remote_shells_get():
    script = files(8)["colossalai.sh"]
    path = script.index("PATH=/opt/trainfleet/venv/bin:$PATH; export PATH")
    launch = "/etc/trainfleet/launch/colossalai_run.py"
    assert path < script.index(
        f"exec /opt/trainfleet/venv/bin/python {launch} \\\n    run --nproc_per_node 8"
    )


WHEELHOUSE = Path("/var/cache/trainfleet/wheelhouse")


def _wheel_source(wheel: str, member: str) -> str:
    path = WHEELHOUSE / wheel
    if not path.exists():
        # make test fills the wheelhouse (make host-deps): in CI a missing wheel is a failure
        assert not os.environ.get("CI"), f"{path} is missing: run make host-deps"
        pytest.skip(f"{path} is not here (the lab's wheelhouse; make host-deps fetches it)")
    with zipfile.ZipFile(path) as archive:
        return archive.read(member).decode()


def test_colossalai_reaches_its_hosts_with_openssh_because_fabric_accepts_any_host_key():
    # fabric 3.2.3: paramiko told to add any unknown key, and no known_hosts file ever loaded.
    fabric = _wheel_source("fabric-3.2.3-py3-none-any.whl", "fabric/connection.py")
    assert "client.set_missing_host_key_policy(AutoAddPolicy())" in fabric
    assert "load_system_host_keys" not in fabric
    # ColossalAI 0.5.0's runner: what it uses of fabric.Connection, all of it OpenSshConnection's.
    runner = _wheel_source(
        "colossalai-0.5.0-py3-none-any.whl", "colossalai/cli/launcher/multinode_runner.py"
    )
    assert "fab_conn = fabric.Connection(hostinfo.hostname, port=hostinfo.port)" in runner
    used = set(re.findall(r"fab_conn\.(\w+)", runner))
    assert used == {"cd", "prefix", "local", "run", "close"}
    assert all(callable(getattr(OpenSshConnection, name)) for name in used)
    connection = OpenSshConnection("gpu-a02", port=22)
    with connection.cd("/root/my job"), connection.prefix('export A="1"'):
        argv = connection.ssh_argv("torchrun train.py")
    assert argv == [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-p",
        "22",
        "--",
        "gpu-a02",
        "cd '/root/my job' && export A=\"1\" && torchrun train.py",
    ]
    assert connection.command("x") == "x"  # both contexts left


def test_every_script_names_the_venvs_own_launcher_and_the_smoke_job_ships_as_it_is():
    rendered = files(0)
    for name in ("torchrun.sh", "deepspeed.sh", "accelerate.sh", "colossalai.sh", "horovod.sh"):
        assert "exec /opt/trainfleet/venv/bin/" in rendered[name], name
    source = Path(__file__).resolve().parents[2] / "trainfleet" / "smoke" / "train.py"
    assert rendered["smoke_train.py"] == source.read_text()


def test_horovod_sh_means_to_horovodruns_own_parser_what_the_cluster_is(monkeypatch):
    import shlex
    import sys

    from horovod.runner import (
        launch,
    )  # the runner's parser (horovod 0.28.1, installed without a build)

    # the interface is given only when every node's is the same (GLOO_SOCKET_IFNAME forwarded)
    for gpus, forward, nics in ((8, {"GLOO_SOCKET_IFNAME": "eth0"}, {"eth0"}), (0, {}, None)):
        script = files(gpus, forward=forward)["horovod.sh"]
        (exec_line,) = [line for line in script.splitlines() if line.startswith("exec ")]
        words = shlex.split(exec_line)
        assert words[:2] == ["exec", "/opt/trainfleet/venv/bin/horovodrun"] and words[-1] == "$@"
        monkeypatch.setattr(sys, "argv", ["horovodrun", *words[2:-1], "python", "train.py"])
        args = launch.parse_args()
        slots = max(gpus, 1)
        assert (args.num_proc, args.hosts, args.nics, args.command) == (
            2 * slots,
            f"gpu-a01:{slots},gpu-a02:{slots}",
            nics,
            ["python", "train.py"],
        )


def test_files_that_do_not_read_the_node_are_rendered_once_for_the_whole_cluster():
    from trainfleet.capabilities.launchers import LAUNCHER_FILES
    from trainfleet.render import variables

    cluster = parse_cluster(NODES.replace("GPUS", "8"))
    shared: dict = {}
    first = render_launchers(cluster, cluster.nodes[0], shared=shared)
    second = render_launchers(cluster, cluster.nodes[1], shared=shared)
    assert first == render_launchers(cluster, cluster.nodes[0])  # the same files as rendering alone
    assert second == render_launchers(
        cluster, cluster.nodes[1]
    )  # a cache hit is never another node's file
    per_node = {
        name
        for name, (source, _) in LAUNCHER_FILES.items()
        if name not in VERBATIM and "node" in (variables(source) or {"node"})
    }
    assert {"hostfile", "mpirun.sh", "horovod.sh", "deepspeed.sh"} <= set(LAUNCHER_FILES) - per_node
    shared_files = set(LAUNCHER_FILES) - per_node - VERBATIM
    assert len([key for key in shared if key[0] != "host list"]) == len(shared_files)
    for name in set(LAUNCHER_FILES) - per_node - VERBATIM:
        assert first[name][0] is second[name][0]  # the same string, not rendered again
    assert first["accelerate.yaml"] != second["accelerate.yaml"]  # machine_rank is each node's own
    # other forwarded variables: not the files cached for none
    third = render_launchers(
        cluster, cluster.nodes[1], forward={"NCCL_IB_DISABLE": "1"}, shared=shared
    )
    assert third == render_launchers(cluster, cluster.nodes[1], forward={"NCCL_IB_DISABLE": "1"})
