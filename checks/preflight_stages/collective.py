# The preflight's collective, run by the pinned venv python of every rank at once (one rank per
# GPU, one per CPU node). Prints one JSON line per step, so the controller knows how far each
# rank got even when the run is cut off. Arguments: LOCAL_RANK BACKEND JOB..., each JOB
# "END,FIRST,WORLD,MASTER_ADDR,MASTER_PORT,BYTES": a process group of its own, this rank being
# FIRST + LOCAL_RANK of WORLD, which must end END seconds after this process started; the jobs
# run one after the other in this one process (torch is imported once). With BYTES > 0, a timed
# all_reduce of that many bytes follows (the bandwidth stage's pairs). A job without BYTES that
# fails (the whole cluster's collective) ends the process: no pair can be measured where
# the cluster cannot train. Every step names its job; a step without one (the import, or what
# collective.sh adds) is the process's.
# Run as `python -I -c` in a private root-only directory: no module a node user planted in the
# working directory (or named in PYTHON* variables) is imported instead of the standard library's.
import json
import os
import socket
import sys
import threading
import time
from datetime import timedelta


def say(step, **data):
    print(json.dumps({"step": step, **data}), flush=True)


local, backend = int(sys.argv[1]), sys.argv[2]
jobs = [job.split(",") for job in sys.argv[3:]]
started = time.monotonic()
visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
gpu = (
    (
        visible[local]
        if local < len(visible)
        else f"none (CUDA_VISIBLE_DEVICES lists {len(visible)})"
    )
    if visible
    else local
)
_, first, _, _, _, _ = jobs[0]
say(
    "start",
    job=0,
    rank=int(first) + local,
    local=local,
    host=socket.gethostname(),
    gpu=gpu if backend == "nccl" else None,
)
# A pair NCCL gives up on (its timeout: the job's end) raises in this process instead of ending
# it, so the jobs after it still run: the watchdog below bounds what never returns.
os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "2"
try:
    import torch
    import torch.distributed as dist
except Exception as exc:  # the venv itself is broken: its own words, e.g. "No module named 'torch'"
    say("error", stage="import", error=f"{type(exc).__name__}: {exc}")
    sys.exit(2)


def sync():
    if backend == "nccl":
        torch.cuda.synchronize()


def timed_all_reduce(device, rank, world, nbytes):
    """Warm-up, then all_reduce of an nbytes buffer repeated for about a second (the same count
    on every rank: the slowest warm-up decides), seconds per all_reduce on this rank."""
    buf = torch.full((nbytes // 4,), float(rank + 1), dtype=torch.float32, device=device)
    dist.all_reduce(buf)  # checked: a large buffer arrives whole, not only a small one
    if not bool(torch.all(buf == world * (world + 1) / 2)):
        raise Failed("bandwidth", "the large all_reduce gave a wrong sum")
    buf.zero_()
    started = time.perf_counter()
    for _ in range(2):
        dist.all_reduce(buf)
    sync()
    warm = torch.tensor([(time.perf_counter() - started) / 2], dtype=torch.float64, device=device)
    dist.all_reduce(warm, op=dist.ReduceOp.MAX)
    iters = max(3, min(20, int(1.0 / max(float(warm[0]), 1e-6))))
    dist.barrier()
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buf)
    sync()
    return (time.perf_counter() - started) / iters, iters


class Failed(Exception):
    """A job's own failure, in its stage's words."""

    def __init__(self, stage, error, **data):
        super().__init__(error)
        self.stage, self.data = stage, data


def run(job, rank, world, master, port, nbytes, deadline):
    # Rendezvous through the master's store first, so that on a timeout the master can say
    # which ranks joined and which did not.
    store = dist.TCPStore(
        master,
        port,
        world,
        rank == 0,
        timedelta(seconds=max(1.0, deadline - time.monotonic())),
        wait_for_workers=False,
    )
    store.set(f"joined/{rank}", socket.gethostname())
    store.add("joined", 1)
    while int(store.add("joined", 0)) < world:
        if time.monotonic() > deadline:
            joined = [r for r in range(world) if store.check([f"joined/{r}"])]
            missing = [r for r in range(world) if r not in joined]
            raise Failed("rendezvous", "timeout", joined=joined, missing=missing)
        time.sleep(0.1)
    say("joined", job=job)
    if backend == "nccl":
        torch.cuda.set_device(
            local
        )  # local rank i: the i-th device CUDA_VISIBLE_DEVICES leaves visible
    dist.init_process_group(
        backend,
        store=store,
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())),
    )
    say("initialised", job=job, backend=backend)
    device = torch.device("cuda", local) if backend == "nccl" else torch.device("cpu")
    value = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    say(
        "all_reduce",
        job=job,
        ok=bool(torch.all(value == expected)),
        got=float(value[0]),
        expected=expected,
    )
    versions = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
    }
    # all_gather of fixed-size byte tensors (all_gather_object would need numpy in the venv)
    blob = json.dumps(versions).encode()[:255].ljust(256, b" ")
    mine = torch.tensor(list(blob), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    gathered_v = [json.loads(bytes(t.cpu().tolist()).decode()) for t in gathered]
    say("all_gather", job=job, versions=gathered_v)
    if nbytes > 0:
        seconds, iters = timed_all_reduce(device, rank, world, nbytes)
        say("bandwidth", job=job, bytes=nbytes // 4 * 4, seconds=seconds, iters=iters)
    dist.barrier()
    say("done", job=job)
    # the cluster's collective passed here: the right sum, and the same versions on every rank
    return bool(torch.all(value == expected)) and len({json.dumps(v) for v in gathered_v}) == 1


current = {"job": 0, "until": float("inf")}


def watchdog():
    """A job past its end (and 5 s of grace) that nothing interrupted, such as a hung CUDA or
    NCCL call: the process ends (exit 124, as timeout(1) would), so the collective keeps its
    own bound and a pair its round's; the jobs after it do not run."""
    while time.monotonic() <= current["until"]:
        time.sleep(0.2)
    os._exit(124)


threading.Thread(target=watchdog, daemon=True).start()
status, passed = 0, True
for job, (end, first, world, master, port, nbytes) in enumerate(jobs):
    rank, world, nbytes = int(first) + local, int(world), int(nbytes)
    if job and not passed and not int(jobs[job - 1][5]):
        break  # the collective failed: its exit status and words stay its own
    current.update(job=job, until=started + float(end) + 5)
    if job:
        say("start", job=job, rank=rank, local=local, gpu=gpu if backend == "nccl" else None)
    try:
        passed = run(job, rank, world, master, int(port), nbytes, started + float(end))
        status = 0
    except Failed as failed:
        kind = "timeout" if failed.stage == "rendezvous" else "error"
        say(
            kind,
            job=job,
            stage=failed.stage,
            **({"error": str(failed)} if kind == "error" else {}),
            **failed.data,
        )
        status, passed = (3 if kind == "timeout" else 4), False
    except Exception as exc:
        say(
            "error",
            job=job,
            stage="collective",
            error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
        )
        status, passed = 4, False
    finally:  # the next job makes a process group of its own
        try:
            if dist.is_initialized():
                dist.destroy_process_group()
        except Exception:
            pass
current["until"] = float("inf")
sys.exit(status)  # the last job's that ran: what collective.sh adds (exit, stderr) is its own
