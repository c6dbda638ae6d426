"""NCCL network environment: derived per node, written where every process sees it."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from facts.nccl_env_facts import NcclEnvFiles
from operations.managed_block_ops import block_change
from operations.remote import fail_command, write_file_command
from runtime.gather import fact
from trainfleet.capabilities.nccl_env import NcclPlan
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.nccl import ENV_PURPOSE


@operation()
def nccl_env(nccl: NcclPlan):
    """
    Write the node's NCCL environment where every kind of process sees it.

    + nccl: the plan's ``nccl_env`` part (``trainfleet.capabilities.nccl_env.nccl_part``): the
      three files' content (``profile``, ``environment``, ``nccl_conf``), rendered from the
      node's variables; its ``problems``, the reasons the environment could not be derived,
      fail the node and no file is written

    - ``/etc/profile.d/trainfleet-nccl.sh``: login shells (the whole file is trainfleet's)
    - ``/etc/environment`` (managed block): non-login ssh sessions through pam_env, i.e. the
      ranks pdsh, mpirun and DeepSpeed's runner start
    - ``/etc/nccl.conf`` (managed block, NCCL_* only): every NCCL process, whatever its shell

    **Example:**

    .. code:: python

        nccl_env_ops.nccl_env(name="NCCL environment", nccl=plan.nccl_env)
    """
    profile, environment, nccl_conf = nccl.profile, nccl.environment, nccl.nccl_conf
    if nccl.problems:
        yield fail_command("NCCL environment not written: " + "; ".join(nccl.problems))
        return
    current = fact(NcclEnvFiles)
    commands = []
    if current["profile"] != profile:
        commands.append(write_file_command(NCCL_PROFILE, profile))
    for path, block, lines in (
        (NCCL_ENVIRONMENT, current["environment"], environment),
        (NCCL_CONF, current["nccl_conf"], nccl_conf),
    ):
        commands += block_change(path, ENV_PURPOSE, block, list(lines))
    if not commands:
        host.noop(f"{len(environment)} NCCL variables are in place")
        return
    yield from commands
