"""NCCL network environment: derived per node, written where every process sees it."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import operation

from facts.nccl_env import NcclEnvFiles, NcclNetwork
from operations.gather import fact, gather_fact, once_per_run
from operations.managed_block import block_change
from operations.remote import fail_command, write_file_command
from trainfleet.render import render, render_lines
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.model import Cluster
from trainfleet.nccl import ENV_PURPOSE, Derived, derive_cluster


def cluster_nccl_env(cluster: Cluster) -> dict[str, Derived]:
    """Every reachable node's derived environment, from one NcclNetwork fact per node per run.

    The cross-node rules are the model's (``derive_cluster``); differing interface names are
    pointed out here (launchers forward one node's value).
    """
    def compute(state) -> dict[str, Derived]:
        derived = derive_cluster(cluster, gather_fact(state, NcclNetwork))
        names = {d.interface for d in derived.values() if d.interface}
        if len(names) > 1:
            logger.warning(f"cluster interfaces differ between nodes ({', '.join(sorted(names))}): each node gets "
                           "its own, but DeepSpeed's and ColossalAI's runners forward the launching node's "
                           "NCCL_SOCKET_IFNAME to every node")
        return derived

    return once_per_run("nccl environment", compute)


@operation()
def nccl_env(env: dict[str, str], problems: list[str] | None = None):
    """
    Write the node's NCCL environment where every kind of process sees it.

    + env: the variables, e.g. from ``cluster_nccl_env(cluster)[node].env``
    + problems: reasons the environment could not be derived; the node fails with them
      and no file is written

    - ``/etc/profile.d/trainfleet-nccl.sh``: login shells (the whole file is trainfleet's)
    - ``/etc/environment`` (managed block): non-login ssh sessions through pam_env, i.e. the
      ranks pdsh, mpirun and DeepSpeed's runner start
    - ``/etc/nccl.conf`` (managed block, NCCL_* only): every NCCL process, whatever its shell

    **Example:**

    .. code:: python

        nccl_env.nccl_env(name="NCCL environment", env={"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_DISABLE": "1"})
    """
    if problems:
        yield fail_command("NCCL environment not written: " + "; ".join(problems))
        return
    current = fact(NcclEnvFiles)
    commands = []
    profile = render("nccl_env/profile.sh.j2", env=env)
    if current["profile"] != profile:
        commands.append(write_file_command(NCCL_PROFILE, profile))
    for path, block, template in ((NCCL_ENVIRONMENT, current["environment"], "nccl_env/environment.j2"),
                                  (NCCL_CONF, current["nccl_conf"], "nccl_env/nccl.conf.j2")):
        commands += block_change(path, ENV_PURPOSE, block, render_lines(template, env=env))
    if not commands:
        host.noop(f"{len(env)} NCCL variables are in place")
        return
    yield from commands
