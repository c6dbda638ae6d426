import ast
import importlib.metadata as metadata
import os

torch_dist = None
try:
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if isinstance(name, str) and isinstance(version, str):
            print("pkg", name.replace(" ", "_"), version.replace(" ", "_"))
            if torch_dist is None and name.lower() == "torch":
                torch_dist = dist
except Exception:
    pass
if torch_dist is None:
    raise SystemExit(0)
if not any(os.path.exists(d) for d in ("/dev/nvidiactl", "/dev/kfd")):
    # No GPU driver's device node: CUDA (or ROCm) cannot start, so torch sees no GPU. Read
    # its version and CUDA build from its files instead of importing it (seconds of CPU per
    # node per run); torch/version.py holds them as literals.
    cuda = None
    try:
        path = torch_dist.locate_file("torch/version.py")
        for node in ast.parse(open(path, encoding="utf-8").read()).body:
            target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
            if isinstance(target, ast.Name) and target.id == "cuda" and node.value is not None:
                cuda = ast.literal_eval(node.value)
    except Exception:
        raise SystemExit(0)
    print("torch", torch_dist.version)
    print("torch_cuda", cuda)
    print("torch_gpu", False)
    raise SystemExit(0)
try:
    import torch
except Exception:
    raise SystemExit(0)
print("torch", torch.__version__)
print("torch_cuda", torch.version.cuda)
try:
    gpu = bool(torch.cuda.is_available())
except Exception:
    gpu = False
print("torch_gpu", gpu)
if gpu:
    try:
        print("torch_cudnn", torch.backends.cudnn.version())
    except Exception:
        pass
    try:
        v = torch.cuda.nccl.version()
        print("torch_nccl", ".".join(map(str, v)) if isinstance(v, tuple) else v)
    except Exception:
        pass
