"""Smoke training job: proves a launcher wired every rank into one working process group.

Runs under any launcher that sets torch.distributed's variables (torchrun, ``deepspeed``,
``accelerate launch``, ``colossalai run``: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT), under OpenMPI's ``mpirun`` (OMPI_COMM_WORLD_*; the master's address and port from
--master-addr/--master-port or from MASTER_ADDR/MASTER_PORT passed with ``mpirun -x``), or alone
as one rank. Needs torch only: it is copied to nodes and run by their venv's python.

Each rank prints exactly one JSON line on stdout, e.g.
  {"smoke": "ok", "rank": 0, "world": 2, "host": "node1", "backend": "gloo", "all_reduce": 3.0,
   "weights_equal": true, "steps": 2, "launcher_env": "torch"}
and exits 1 when anything failed (the line then has "smoke": "fail" and an "error").
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import json
import os
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

STEPS = 2


@dataclass(frozen=True)
class Placement:
    """Where this process sits in the job, and which launcher's variables said so."""

    rank: int
    world: int
    local_rank: int
    style: str  # "torch" | "openmpi" | "none"


def placement(env: Mapping[str, str]) -> Placement:
    """This process's rank, world size and local rank from the launcher's environment."""
    if "RANK" in env and "WORLD_SIZE" in env:
        return Placement(
            int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", "0")), "torch"
        )
    if "OMPI_COMM_WORLD_RANK" in env and "OMPI_COMM_WORLD_SIZE" in env:
        return Placement(
            int(env["OMPI_COMM_WORLD_RANK"]),
            int(env["OMPI_COMM_WORLD_SIZE"]),
            int(env.get("OMPI_COMM_WORLD_LOCAL_RANK", "0")),
            "openmpi",
        )
    return Placement(0, 1, 0, "none")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds for the rendezvous and each collective (default 60)",
    )
    parser.add_argument(
        "--master-addr",
        "--master_addr",
        default=None,
        help="rank 0's address when the launcher sets no MASTER_ADDR (mpirun)",
    )
    parser.add_argument(
        "--master-port",
        "--master_port",
        type=int,
        default=None,
        help="rank 0's port when the launcher sets no MASTER_PORT (mpirun)",
    )
    parser.add_argument(
        "--deadline",
        type=float,
        default=None,
        help="seconds after which this rank ends itself, whatever it is doing (ranks "
        "a runner started over ssh outlive the runner's own timeout)",
    )
    parser.add_argument(
        "--expect-world",
        type=int,
        default=None,
        help="fail unless the job has exactly this many ranks (a launcher that "
        "started fewer, e.g. one process alone, passes otherwise)",
    )
    # DeepSpeed's launcher (and torch.distributed.launch) append --local_rank=N to the
    # script's arguments; the environment already carries it, so it is accepted and unused.
    parser.add_argument(
        "--local-rank", "--local_rank", type=int, default=None, help=argparse.SUPPRESS
    )
    return parser.parse_args(argv)


def init(where: Placement, args: argparse.Namespace, backend: str) -> None:
    timeout = timedelta(seconds=args.timeout)
    if where.world == 1 and where.style == "none":
        # Alone: an in-process store, so no port has to be free.
        dist.init_process_group(
            backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout
        )
        return
    addr = args.master_addr or os.environ.get("MASTER_ADDR")
    port = args.master_port or os.environ.get("MASTER_PORT")
    if not addr or not port:
        raise RuntimeError(
            f"{where.style} launcher set no MASTER_ADDR/MASTER_PORT: "
            "pass --master-addr and --master-port (or mpirun -x them)"
        )
    # env:// rather than tcp://: under torchrun the workers must join the agent's store that
    # already listens on MASTER_PORT, which only the env:// rendezvous knows how to do.
    os.environ.update(
        MASTER_ADDR=addr,
        MASTER_PORT=str(port),
        RANK=str(where.rank),
        WORLD_SIZE=str(where.world),
        LOCAL_RANK=str(where.local_rank),
    )
    dist.init_process_group(
        backend, init_method="env://", rank=where.rank, world_size=where.world, timeout=timeout
    )


def train(where: Placement, device: torch.device) -> tuple[float, bool]:
    """The all_reduce's value and whether every rank ends with the same weights."""
    value = torch.tensor([float(where.rank + 1)], device=device)
    dist.all_reduce(value)
    expected = where.world * (where.world + 1) / 2
    if value.item() != expected:
        raise RuntimeError(f"all_reduce gave {value.item()}, expected {expected}")

    torch.manual_seed(0)
    model = nn.Linear(8, 4).to(device)
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None
    )
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    # Rank-dependent data: the weights stay equal only if DDP really averages the gradients.
    data = torch.Generator().manual_seed(1000 + where.rank)
    for _ in range(STEPS):
        inputs = torch.randn(16, 8, generator=data).to(device)
        targets = torch.randn(16, 4, generator=data).to(device)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(inputs), targets).backward()
        optimizer.step()

    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(where.world)]
    dist.all_gather(gathered, flat)
    return value.item(), all(torch.equal(other, flat) for other in gathered)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.deadline:  # dumps where it hung to stderr, then exits 1: the launcher sees a failure
        faulthandler.dump_traceback_later(args.deadline, exit=True)
    where = placement(os.environ)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    report: dict[str, Any] = {
        "smoke": "fail",
        "rank": where.rank,
        "world": where.world,
        "host": socket.gethostname(),
        "backend": backend,
        "all_reduce": None,
        "weights_equal": False,
        "steps": 0,
        "launcher_env": where.style,
    }
    try:
        if args.expect_world is not None and where.world != args.expect_world:
            raise RuntimeError(f"{where.world} rank(s) in the job, expected {args.expect_world}")
        if backend == "nccl":
            torch.cuda.set_device(where.local_rank)
            device = torch.device("cuda", where.local_rank)
        else:
            device = torch.device("cpu")
        init(where, args, backend)
        report["all_reduce"], report["weights_equal"] = train(where, device)
        report["steps"] = STEPS
        dist.destroy_process_group()
        if report["weights_equal"]:
            report["smoke"] = "ok"
        else:
            report["error"] = "weights differ between ranks after training"
    except Exception as exc:  # every failure still ends in this rank's one JSON line
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        report["error"] = f"{type(exc).__name__}: {first_line}"
        if dist.is_initialized():
            with contextlib.suppress(Exception):  # the verdict is already a failure
                dist.destroy_process_group()
    # One write call: launchers run ranks unbuffered (python -u) on one shared pipe, where
    # print's separate write of the newline lets two ranks' lines run together.
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    return 0 if report["smoke"] == "ok" else 1


if __name__ == "__main__":
    code = main()
    sys.stderr.flush()
    # Skip interpreter finalization: a gloo worker thread may still be releasing DDP's last
    # allreduce (which holds a Python object) when it starts; that thread is then killed
    # while it waits for the GIL, and std::terminate aborts a job that had passed (SIGABRT,
    # "terminate called without an active exception": 5 runs in 16 under mpirun, torch 2.13).
    os._exit(code)
