"""The one shell-command builder: a script run by ``sh -c`` with its arguments, all quoted.

Facts and operations (and the preflight's stages) build every multi-line command here, so a
value reaches a shell only as a quoted positional argument, never spliced into the script.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from pyinfra.api import QuoteString, StringCommand

NAME = "trainfleet"  # the script's $0: what sh names in its own error messages


def shell(script: str, *args: object, prefix: Sequence[str | QuoteString] = ()) -> StringCommand:
    """``[prefix...] sh -c SCRIPT trainfleet ARGS...``: ``$1``.. are ``args`` (each ``str()``-ed
    and quoted); ``prefix`` runs the shell (``timeout``, ``env``)."""
    return StringCommand(
        *prefix, "sh", "-c", QuoteString(script), NAME, *(QuoteString(str(a)) for a in args)
    )


SCRIPTS = Path(__file__).resolve().parent / "scripts"  # the facts' scripts, beside them


def script(name: str, folder: Path = SCRIPTS) -> str:
    """The text of ``<folder>/<name>``, by default ``facts/scripts/<name>`` (modules read theirs
    once, at import; operations/remote.py's ``script`` reads operations/scripts/)."""
    return (folder / name).read_text(encoding="utf-8")
