"""OpenMPI's network: the same interfaces as NCCL, in every mesh user's MCA parameter file.

Why ``~/.openmpi/mca-params.conf`` and not the system file: the system file lives under
OpenMPI's install prefix, which differs per build (Debian ``/etc/openmpi``, RHEL's
``/etc/openmpi-x86_64``, HPC-X and conda their own), and on Debian it is a dpkg conffile
whose edits make every upgrade prompt. The user file has one path for every OpenMPI build,
and OpenMPI ranks it above the system file (below the environment and the command line).
Each node reads its own copy: ``mpirun`` does not ship it, so every node gets it.
"""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from facts.openmpi_facts import MCA_FILE, MCA_PURPOSE, OpenMpiState
from operations.managed_block_ops import block_change
from operations.remote import fail_command
from runtime.gather import fact
from trainfleet.capabilities.openmpi import MpiPlan


@operation()
def mca_params(mpi: MpiPlan):
    """
    Keep OpenMPI's parameters in each user's ``~/.openmpi/mca-params.conf`` (managed block,
    first in the file; the user's own lines below it are kept and, later in the file, win).

    + mpi: the plan's ``openmpi`` part: ``users``, whose OpenMPI is configured (the mesh
      users); ``lines``, the block's ``name = value`` lines; ``problems``, the reasons the
      parameters could not be derived (the node fails with them)

    **Example:**

    .. code:: python

        openmpi_ops.mca_params(name="OpenMPI network", mpi=plan.openmpi)
    """
    users, lines = mpi.users, mpi.lines
    if mpi.problems:
        yield fail_command("OpenMPI parameters not written: " + "; ".join(mpi.problems))
        return
    current = fact(OpenMpiState, users=users)
    commands = []
    for user in users:
        state = current["users"].get(user)
        if state is None or not state["exists"] or not state["home"]:
            commands.append(fail_command(f"user {user} does not exist on this node"))
            continue
        path = f"{state['home']}/{MCA_FILE}"
        # Written as the user (setpriv), ~/.openmpi made by the user: the user's home is the user's.
        writer = None if state["uid"] == "0" else user
        commands += block_change(
            path, MCA_PURPOSE, state["params"], list(lines), mode="644", user=writer, top=True
        )
    if not commands:
        version = current["version"] or "not installed yet"
        host.noop(f"OpenMPI parameters in place for {', '.join(users)} (OpenMPI: {version})")
        return
    yield from commands
