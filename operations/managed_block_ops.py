"""Managed blocks in files the user otherwise owns: the commands that change one."""

from __future__ import annotations

from pyinfra.api.command import PyinfraCommand

from facts.managed_block_facts import BlockState
from operations.remote import ABSENT, fail_command, write_command
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
