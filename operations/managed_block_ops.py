"""Managed blocks in files the user otherwise owns: the change, and a generic operation."""

from __future__ import annotations

from pyinfra import host
from pyinfra.api import operation
from pyinfra.api.command import PyinfraCommand

from facts.managed_block_facts import BlockState, ManagedBlock
from operations.remote import ABSENT, fail_command, write_command
from runtime.gather import fact
from trainfleet.blocks import split_block, with_block


def block_change(
    path: str,
    purpose: str,
    current: BlockState,
    lines: list[str] | None,
    mode: str = "644",
    user: str | None = None,
    top: bool = False,
    dir_mode: str = "755",
) -> list[PyinfraCommand]:
    """The commands that make ``path``'s block hold ``lines`` (None: no block); [] if it does.

    The new file is built from the bytes the fact read and written only if the node still
    has them. A file that cannot be split unambiguously fails this host, untouched; a link
    is followed on the node only where that is safe (``write_command``). ``user``: write as
    that user (a file in the user's home).
    """
    if current["broken"]:
        return [fail_command(f"{path}: {current['broken']}; fix it by hand, nothing was changed")]
    if lines is None and current["block"] is None:
        return []
    if lines is not None and current["block"] == lines:
        return []
    if current["exists"] and current["text"] is None:  # answered by digest: no bytes to rewrite
        return [fail_command(f"{path}: read by its block's digest only; nothing was changed")]
    text = current["text"] or ""
    new = with_block(split_block(text, purpose), purpose, lines, top=top)
    expect = current["sha256"] if current["exists"] else ABSENT
    return write_command(path, new, expect=expect, mode=mode, user=user, dir_mode=dir_mode)


@operation()
def managed_block(
    path: str, purpose: str, lines: list[str], present: bool = True, mode: str = "644"
):
    """
    Keep ``lines`` in one block of a root-owned ``path`` between trainfleet's markers; never
    touch the rest.

    + path: the file (created with ``mode`` if missing)
    + purpose: what the block holds; it names the markers
    + lines: the block's content
    + present: ``False`` removes the block
    + mode: mode of a newly created file

    **Example:**

    .. code:: python

        managed_block.managed_block(
            name="Cluster nodes in /etc/genders",
            path="/etc/genders", purpose="pdsh nodes", lines=["gpu-a01 trainfleet"],
        )
    """
    current = fact(ManagedBlock, path=path, purpose=purpose)
    changes = block_change(path, purpose, current, lines if present else None, mode=mode)
    if not changes:
        host.noop(f"{path}: {purpose} block is up to date")
        return
    yield from changes
