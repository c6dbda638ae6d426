"""What every part of the stack's operation reads: the StackVersions fact (once per node,
lent by ``stack_ops.software`` to the parts it composes), and its refusal of an OS it has no
package manager for."""

from __future__ import annotations

from pyinfra.api import StringCommand

from facts.stack_facts import StackVersions, StackVersionsT
from operations.remote import fail_command
from runtime.gather import fact
from trainfleet.defaults import VENV_DIR
from trainfleet.osfamily import OsFamilyT


def stack_fact(venv: str = VENV_DIR) -> StackVersionsT:
    # StackVersions imports torch on the node (seconds): ``software`` reads it once and lends
    # it (gather.lent) to the parts, which ask for it here.
    return fact(StackVersions, venv=venv)


def unsupported(os_: OsFamilyT, what: str) -> StringCommand:
    return fail_command(f"{what}: unsupported OS {os_['id']!r} (Debian/Ubuntu and RHEL-family are)")
