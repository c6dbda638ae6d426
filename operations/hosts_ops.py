"""Names: each node's hostname, and every node's address in every node's /etc/hosts."""

from __future__ import annotations

from pyinfra import host, logger
from pyinfra.api import QuoteString, StringCommand, operation

from facts.hosts_facts import HOSTS_PURPOSE, HostnameState
from facts.managed_block_facts import ManagedBlock
from operations.managed_block_ops import block_change
from operations.remote import write_file_command
from runtime.gather import fact
from trainfleet.capabilities.hosts import HostsPlan
from trainfleet.etc_hosts import stale_lines


@operation()
def hostname(hosts: HostsPlan, hostname_file: str = "/etc/hostname"):
    """
    Set the node's hostname, running and persistent.

    + hosts: the node's names, the plan's ``hosts`` part (``hosts.hostname``: the short name
      the node must have)
    + hostname_file: the file that keeps it across reboots

    Writes the file atomically and sets the kernel's name with ``hostname``; this is
    what ``hostnamectl set-hostname`` does, without needing systemd-hostnamed.

    **Example:**

    .. code:: python

        hosts_ops.hostname(name="Hostname is the node's spec name", hosts=plan.hosts)
    """
    hostname = hosts.hostname
    state = fact(HostnameState, path=hostname_file)
    if state["running"] == hostname and state["static"] == hostname:
        host.noop(f"hostname is {hostname}")
        return
    if state["static"] != hostname:
        yield write_file_command(hostname_file, hosts.hostname_file)
    if state["running"] != hostname:
        yield StringCommand("hostname", QuoteString(hostname))


@operation()
def hosts_block(hosts: HostsPlan, path: str = "/etc/hosts", present: bool = True):
    """
    Keep one managed block in /etc/hosts with every cluster node's address and names.

    + hosts: the plan's ``hosts`` part: ``lines``, the block (one ``address fqdn name`` line per
      node); ``names``, every cluster name, lower-case, -> the address it must resolve to
      (checked against the lines outside the block)
    + path: the hosts file
    + present: ``False`` removes the block

    Lines outside the block are never changed. A line outside it that maps a cluster
    name to another address is reported as a warning (it may shadow the block).

    **Example:**

    .. code:: python

        hosts_ops.hosts_block(name="Cluster hosts block in /etc/hosts", hosts=plan.hosts)
    """
    lines, names = hosts.lines, hosts.names
    current = fact(ManagedBlock, path=path, purpose=HOSTS_PURPOSE, expect=list(lines))
    for stale in stale_lines(current["outside"], names) if present else []:
        logger.warning(
            f"{host.print_prefix}{path} {stale} (outside trainfleet's block; left as is)"
        )

    changes = block_change(path, HOSTS_PURPOSE, current, list(lines) if present else None)
    if not changes:
        host.noop(
            f"{path} lists the {len(lines)} cluster nodes"
            if present
            else f"{path} has no cluster hosts block"
        )
        return
    yield from changes
