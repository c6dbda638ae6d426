# The preflight's collective, run by every node's pinned venv python at once (one rank per
# node). Prints one JSON line per step, so the controller knows how far each rank got even
# when the run is cut off. Arguments: RANK WORLD MASTER_ADDR MASTER_PORT BACKEND TIMEOUT
# Run as `python -I -c` in a private root-only directory: no module a node user planted in the
# working directory (or named in PYTHON* variables) is imported instead of the standard library's.
import json
import socket
import sys
import time
from datetime import timedelta


def say(step, **data):
    print(json.dumps({"step": step, **data}), flush=True)


rank, world, master, port, backend, limit = (int(sys.argv[1]), int(sys.argv[2]), sys.argv[3],
                                             int(sys.argv[4]), sys.argv[5], float(sys.argv[6]))
deadline = time.monotonic() + limit
say("start", rank=rank, host=socket.gethostname())
try:
    import torch
    import torch.distributed as dist
except Exception as exc:  # the venv itself is broken: its own words, e.g. "No module named 'torch'"
    say("error", stage="import", error=f"{type(exc).__name__}: {exc}")
    sys.exit(2)

# Rendezvous through the master's store first, so that on a timeout the master can say
# which ranks joined and which did not.
try:
    store = dist.TCPStore(master, port, world, rank == 0, timedelta(seconds=limit), wait_for_workers=False)
    store.set(f"joined/{rank}", socket.gethostname())
    store.add("joined", 1)
    while int(store.add("joined", 0)) < world:
        if time.monotonic() > deadline:
            joined = [r for r in range(world) if store.check([f"joined/{r}"])]
            say("timeout", stage="rendezvous", joined=joined, missing=[r for r in range(world) if r not in joined])
            sys.exit(3)
        time.sleep(0.1)
    say("joined")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
    say("initialised", backend=backend)
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    value = torch.full((4,), float(rank + 1), device=device)
    dist.all_reduce(value)
    expected = world * (world + 1) / 2
    say("all_reduce", ok=bool(torch.all(value == expected)), got=float(value[0]), expected=expected)
    versions = {"torch": torch.__version__, "cuda": torch.version.cuda,
                "nccl": ".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None}
    # all_gather of fixed-size byte tensors (all_gather_object would need numpy in the venv)
    blob = json.dumps(versions).encode()[:255].ljust(256, b" ")
    mine = torch.tensor(list(blob), dtype=torch.uint8, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    say("all_gather", versions=[json.loads(bytes(t.cpu().tolist()).decode()) for t in gathered])
    dist.barrier()
    dist.destroy_process_group()
    say("done")
except Exception as exc:
    say("error", stage="collective", error=f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    sys.exit(4)
