"""NCCL network environment: derived per node, written where every process sees it."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from facts.nccl_env_facts import NcclEnvFiles
from operations.managed_block_ops import block_change
from operations.remote import fail_command, write_file_command
from runtime.gather import fact
from trainfleet.defaults import NCCL_CONF, NCCL_ENVIRONMENT, NCCL_PROFILE
from trainfleet.nccl import ENV_PURPOSE


@operation()
def nccl_env(
    profile: str, environment: list[str], nccl_conf: list[str], problems: list[str] | None = None
):
    """
    Write the node's NCCL environment where every kind of process sees it.

    + profile, environment, nccl_conf: the three files' content, e.g. the plan's ``nccl``
      part (``trainfleet.plan.nccl_part``), which renders them from the node's variables
    + problems: reasons the environment could not be derived; the node fails with them
      and no file is written

    - ``/etc/profile.d/trainfleet-nccl.sh``: login shells (the whole file is trainfleet's)
    - ``/etc/environment`` (managed block): non-login ssh sessions through pam_env, i.e. the
      ranks pdsh, mpirun and DeepSpeed's runner start
    - ``/etc/nccl.conf`` (managed block, NCCL_* only): every NCCL process, whatever its shell

    **Example:**

    .. code:: python

        part = nccl_part(Derived(env={"NCCL_SOCKET_IFNAME": "=eth0", "NCCL_IB_DISABLE": "1"}))
        nccl_env.nccl_env(name="NCCL environment", profile=part.profile,
                          environment=part.environment, nccl_conf=part.nccl_conf)
    """
    if problems:
        yield fail_command("NCCL environment not written: " + "; ".join(problems))
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
