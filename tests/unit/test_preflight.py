"""Preflight verdicts from stage output (no GPUs here: the GPU lines are captured tool output)."""

from __future__ import annotations

from operations.preflight import parse_hygiene
from trainfleet import Cluster
from trainfleet.preflight import collective_problems, hygiene_problems, isolate

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
