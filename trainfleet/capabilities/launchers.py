"""Launcher files as data: every launcher's files for a node, rendered from the one spec.

Plain functions of the cluster model; operations/launchers_ops.py only puts them in place.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from trainfleet.defaults import LAUNCH_DIR, VENV_DIR
from trainfleet.model import Cluster, Node
from trainfleet.render import render_lines, variables

# file name -> (template, mode)
LAUNCHER_FILES = MappingProxyType(
    {
        "hostfile": ("launchers/hostfile.j2", "644"),
        "colossalai_hostfile": ("launchers/colossalai_hostfile.j2", "644"),
        "accelerate.yaml": ("launchers/accelerate.yaml.j2", "644"),
        "torchrun.sh": ("launchers/torchrun.sh.j2", "755"),
        "mpirun.sh": ("launchers/mpirun.sh.j2", "755"),
        "colossalai.sh": ("launchers/colossalai.sh.j2", "755"),
        "deepspeed.sh": ("launchers/deepspeed.sh.j2", "755"),
        "accelerate.sh": ("launchers/accelerate.sh.j2", "755"),
        "horovod.sh": ("launchers/horovod.sh.j2", "755"),
        "README": ("launchers/README.j2", "644"),
        # Read by DeepSpeed's runner from the directory it is started in. Its parser accepts no
        # blank or comment lines, so the template writes KEY=VALUE lines only.
        ".deepspeed_env": ("launchers/deepspeed_env.j2", "644"),
        # The smoke job every launcher can start: two DDP steps, checked (trainfleet/smoke/train.py)
        "smoke_train.py": ("smoke/train.py", "644"),
        # `colossalai run` over OpenSSH: fabric's paramiko accepts any host key (colossalai.sh)
        "colossalai_run.py": ("launch/colossalai_run.py", "644"),
    }
)
VERBATIM = frozenset({"smoke_train.py", "colossalai_run.py"})
# Ascend clusters also get the HCCL rank table MindSpore reads (RANK_TABLE_FILE), built from
# every NPU node's device IPs (trainfleet/plan.py: rank_table_part)
RANK_TABLE = "rank_table.json"
LAUNCH_FILE_NAMES = (
    *LAUNCHER_FILES,
    RANK_TABLE,
)  # every file trainfleet may keep in LAUNCH_DIR  # copied as they are (paths under trainfleet/), not rendered
_HERE = Path(__file__).resolve().parent.parent  # trainfleet/: smoke/, launch/


def render_launchers(
    cluster: Cluster,
    node: Node,
    forward: dict[str, str] | None = None,
    mca: dict[str, str] | None = None,
    shared: dict[tuple[Any, ...], str] | None = None,
) -> dict[str, tuple[str, str]]:
    """Every launcher file for ``node``: name -> (content, mode).

    + forward: variables with the same value on every node, which launchers may pass on to
      every rank (``mpirun -x``, ``.deepspeed_env``); per-node values (interface names) are
      left to each node's own environment
    + mca: OpenMPI's MCA parameters (the same on every node), repeated on the mpirun line
    + shared: the files already rendered for other nodes of the same cluster, reused where a
      template does not read ``node`` (hostfiles list every node: rendering them once per
      node would cost N x N)
    """
    forward = forward or {}
    mca = mca or {}
    # Horovod takes interface names only: given when every node's is the same (GLOO_SOCKET_IFNAME
    # is then uniform), else left to Horovod, which looks for the NICs all workers share.
    nics = forward.get("GLOO_SOCKET_IFNAME")
    context = {
        "cluster": cluster,
        "node": node,
        "launch_dir": LAUNCH_DIR,
        "venv": VENV_DIR,
        "forward": sorted(forward),
        "forward_env": dict(sorted(forward.items())),
        "mca": mca,
        "nics": nics,
    }
    same_for = (id(cluster), tuple(sorted(forward.items())), tuple(sorted(mca.items())))
    shared = {} if shared is None else shared
    # Every node's name, comma-separated: joined once per cluster, not once per node.
    context["host_list"] = shared.setdefault(
        ("host list", id(cluster)), ",".join(n.name for n in cluster.nodes)
    )

    def content(source: str) -> str:
        names = variables(source)
        if names is None or "node" in names:
            return "".join(f"{line}\n" for line in render_lines(source, **context))
        key = (source, *same_for)
        if key not in shared:
            shared[key] = "".join(f"{line}\n" for line in render_lines(source, **context))
        return shared[key]

    return {
        name: ((_HERE / source).read_text() if name in VERBATIM else content(source), mode)
        for name, (source, mode) in LAUNCHER_FILES.items()
    }
