
try:
    import importlib.metadata as metadata
    for dist in metadata.distributions():
        name, version = dist.metadata["Name"], dist.version
        if isinstance(name, str) and isinstance(version, str):
            print("pkg", name.replace(" ", "_"), version.replace(" ", "_"))
except Exception:
    pass
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
