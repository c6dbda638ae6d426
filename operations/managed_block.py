"""Managed blocks in files the user otherwise owns: the change, and a generic operation."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.command import PyinfraCommand

from facts.managed_block import BlockState, ManagedBlock
from operations.gather import fact
from operations.remote import fail_command, replace_block_command
from trainfleet.blocks import markers


def block_change(
    path: str, purpose: str, current: BlockState, lines: list[str] | None,
    mode: str = "644", owner: str | None = None, top: bool = False,
) -> list[PyinfraCommand]:
    """The commands that make ``path``'s block hold ``lines`` (None: no block); [] if it does.

    Damaged markers give a failing command: this host fails, the file is left alone.
    """
    if current["broken"]:
        return [fail_command(f"{path}: trainfleet's markers are damaged ({current['broken']}); "
                             "fix them by hand, nothing was changed")]
    begin, end = markers(purpose)
    if lines is None:
        return replace_block_command(path, begin, end, [], present=False) if current["block"] is not None else []
    if current["block"] == lines:
        return []
    return replace_block_command(path, begin, end, lines, mode=mode, owner=owner, top=top)


@operation()
def managed_block(path: str, purpose: str, lines: list[str], present: bool = True,
                  mode: str = "644", owner: str | None = None):
    """
    Keep ``lines`` in one block of ``path`` between trainfleet's markers; never touch the rest.

    + path: the file (created with ``mode``/``owner`` if missing)
    + purpose: what the block holds; it names the markers
    + lines: the block's content
    + present: ``False`` removes the block
    + mode: mode of a newly created file
    + owner: ``user:group`` of a newly created file

    **Example:**

    .. code:: python

        managed_block.managed_block(
            name="Cluster nodes in /etc/genders",
            path="/etc/genders", purpose="pdsh nodes", lines=["gpu-a01 trainfleet"],
        )
    """
    current = fact(ManagedBlock, path=path, purpose=purpose)
    changes = block_change(path, purpose, current, lines if present else None, mode=mode, owner=owner)
    if not changes:
        host.noop(f"{path}: {purpose} block is up to date")
        return
    yield from changes
