"""pdsh: installed, talking ssh, and ``pdsh -a`` addressing the whole cluster."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation

from facts.pdsh_facts import PDSH_PURPOSE, PdshState
from operations.managed_block_ops import block_change
from operations.packages_ops import install_any
from operations.remote import fail_command, write_file_command
from runtime.gather import fact
from trainfleet.capabilities.pdsh import PdshPlan
from trainfleet.defaults import PDSH_GENDERS, PDSH_MACHINES, PDSH_PROFILE, PDSH_RCMD_DEFAULT


@operation()
def pdsh(pdsh: PdshPlan, present: bool = True):
    """
    Install pdsh, make ssh its remote command type, and list the cluster for ``pdsh -a``.

    + pdsh: the plan's ``pdsh`` part: ``nodes``, the names ``pdsh -a`` addresses
      (/etc/pdsh/machines); ``genders``, the /etc/genders block as the plan rendered it
      (templates/pdsh/genders.j2), written as given
    + present: ``False`` removes trainfleet's node lists (the package stays)

    Debian's pdsh reads ``-a`` targets from ``/etc/genders`` and its default rcmd from
    ``/etc/pdsh/rcmd_default``; RHEL-family builds read ``/etc/pdsh/machines`` and get
    ``PDSH_RCMD_TYPE=ssh`` from ``/etc/profile.d``. Both lists are managed blocks.

    **Example:**

    .. code:: python

        pdsh_ops.pdsh(name="pdsh over ssh to every node", pdsh=plan.pdsh)
    """
    nodes, wanted = list(pdsh.nodes), list(pdsh.genders)
    current = fact(PdshState, genders=wanted, machines=list(nodes))
    manager = current["os"]["package_manager"]
    if manager is None:
        yield fail_command(
            f"pdsh: unsupported OS {current['os']['id']!r} (Debian/Ubuntu and RHEL-family are)"
        )
        return
    commands = []
    if present and not current["installed"]:
        # pdsh and its ssh module come from EPEL on RHEL-family. Rocky/Alma/CentOS ship
        # epel-release in their extras; on RHEL proper enable EPEL first.
        commands.append(install_any(current["os"], ["pdsh"], ["pdsh", "pdsh-rcmd-ssh"], "pdsh"))
    if present and current["rcmd_default"] != pdsh.rcmd_default.strip():  # read without its newline
        commands.append(write_file_command(PDSH_RCMD_DEFAULT, pdsh.rcmd_default))
    if present and current["os"]["family"] == "rhel" and current["profile"] != pdsh.profile:
        commands.append(write_file_command(PDSH_PROFILE, pdsh.profile))
    machines = list(nodes) if present else None
    for path, block, lines in (
        (PDSH_GENDERS, current["genders"], wanted if present else None),
        (PDSH_MACHINES, current["machines"], machines),
    ):
        commands += block_change(path, PDSH_PURPOSE, block, lines)
    if not commands:
        host.noop(f"pdsh is set up for {len(nodes)} nodes")
        return
    yield from commands
