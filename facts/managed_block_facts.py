"""Files as facts: exact bytes, framed so no content can pass for fact output; the managed
block of any file; and the one reader of sectioned fact output.

A file travels as ONE line, ``file NAME STATE LINK BASE64``: whatever it holds (a marker
line, no final newline, CRLF, invalid UTF-8) it cannot end its section or forge another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand
from pyinfra.api.exceptions import FactProcessError

from trainfleet.blocks import BrokenBlock, split_block

SECTION = "--trainfleet-section--"

# Shell: print a file as one framed line. STATE is regular | missing | other (a directory,
# FIFO, device: never opened, so a planted FIFO cannot hang the read); LINK is link | -.
FILE_FN = r"""
tf_file() {
  if [ -L "$2" ]; then l=link; else l=-; fi
  if [ -f "$2" ]; then printf 'file %s regular %s ' "$1" "$l"; base64 -w0 < "$2" || printf '!'; echo
  elif [ -e "$2" ]; then echo "file $1 other $l"
  else echo "file $1 missing $l"; fi
}
"""


# Shell: run a command for a user (name or uid) with a fixed environment and nothing else:
# ``tf_user_env USER COMMAND ARGS...``. Root's environment (and through ``sudo -E`` the
# admin's: an agent socket, a token, a library path) never reaches a user's process.
USER_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
USER_ENV_FN = (
    r"""
tf_user_env() {
  tf_e=$(getent passwd "$1") || { echo "trainfleet: no such user: $1" >&2; return 1; }
  tf_u=${tf_e%%:*}; tf_h=$(printf '%s\n' "$tf_e" | cut -d: -f6); shift
  env -i PATH="""
    + USER_PATH
    + r""" HOME="$tf_h" USER="$tf_u" LOGNAME="$tf_u" LANG=C.UTF-8 "$@"
}
"""
)

# Shell: run a script as a user (uid 0: as is), read-only, bounded in time (a FIFO the user
# planted cannot hang the run), its output as ONE base64 line: ``tf_as UID GID SCRIPT ARGS...``.
# What the user's process prints is the user's own word about the user's own files only.
AS_USER_FN = (
    USER_ENV_FN
    + r"""
tf_as() {
  uid=$1 gid=$2 s=$3; shift 3
  if [ "$uid" = 0 ]; then (cd / && sh -c "$s" trainfleet "$@") 2>/dev/null | base64 -w0
  else (cd / && tf_user_env "$uid" timeout 30 setpriv --reuid="$uid" --regid="$gid" --init-groups \
          sh -c "$s" trainfleet "$@") 2>/dev/null | base64 -w0
  fi
  echo
}
"""
)


def decode_lines(encoded: str) -> list[str]:
    """The lines one base64 line carries (from ``tf_as`` or a bundle section)."""
    try:
        text = base64.b64decode(encoded, validate=True).decode("utf-8", "surrogateescape")
    except (binascii.Error, ValueError) as exc:
        raise FactProcessError(f"unreadable encoded output ({exc})") from exc
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


class FileRead(TypedDict):
    state: str  # regular | missing | other
    link: bool  # the path is a symbolic link (state is its target's)
    data: bytes | None


def read_file_line(line: str) -> tuple[str, FileRead]:
    """Parse one ``tf_file`` line; raise FactProcessError if it is not one."""
    fields = line.split(" ", 4)
    if (
        len(fields) < 4
        or fields[0] != "file"
        or fields[2] not in ("regular", "missing", "other")
        or fields[3] not in ("link", "-")
    ):
        raise FactProcessError(f"not a file line: {line[:80]!r}")
    data = None
    if fields[2] == "regular":
        try:
            data = base64.b64decode(fields[4] if len(fields) > 4 else "", validate=True)
        except binascii.Error as exc:
            raise FactProcessError(f"{fields[1]}: unreadable file content ({exc})") from exc
    return fields[1], {"state": fields[2], "link": fields[3] == "link", "data": data}


def read_file_lines(lines: list[str]) -> dict[str, FileRead]:
    """{NAME: FileRead} from the ``file`` lines among ``lines``."""
    return dict(read_file_line(line) for line in lines if line.startswith("file "))


def decode(data: bytes) -> str:
    """A file's bytes as text; bytes that are not UTF-8 survive the round trip unchanged."""
    return data.decode("utf-8", "surrogateescape")


def file_text(read: FileRead | None) -> str | None:
    """A whole file's text, None when it is missing or not a regular file."""
    return decode(read["data"]) if read and read["data"] is not None else None


def split_sections(
    output: list[str], marker: str = SECTION
) -> tuple[list[str], dict[str, list[str]]]:
    """The one parser of sectioned fact output: (lines before the first ``marker NAME``
    line, {NAME: its lines}). Only for output no user can write: file contents travel
    as ``file`` lines."""
    head: list[str] = []
    sections: dict[str, list[str]] = {}
    current = head
    for line in output:
        if line.startswith(marker + " "):
            current = sections.setdefault(line.split(" ", 1)[1], [])
        else:
            current.append(line)
    return head, sections


class BlockState(TypedDict):
    exists: bool
    block: list[str] | None  # None: the file has no block yet
    outside: list[tuple[int, str]]  # (line number, line) the user owns
    broken: str | None  # why the file cannot be rewritten safely
    text: str | None  # the whole file as read (None: missing)
    sha256: str | None  # of its bytes: the rewrite happens only if the node still has them
    link: bool


def block_state(read: FileRead | None, purpose: str) -> BlockState:
    """A file (None or missing: no such file) split around the block that holds ``purpose``."""
    if read is None or read["state"] == "missing":
        return {
            "exists": False,
            "block": None,
            "outside": [],
            "broken": None,
            "text": None,
            "sha256": None,
            "link": bool(read and read["link"]),
        }
    if read["state"] != "regular" or read["data"] is None:
        return {
            "exists": True,
            "block": None,
            "outside": [],
            "broken": "not a regular file",
            "text": None,
            "sha256": None,
            "link": read["link"],
        }
    text = decode(read["data"])
    state: BlockState = {
        "exists": True,
        "block": None,
        "outside": [],
        "broken": None,
        "text": text,
        "sha256": hashlib.sha256(read["data"]).hexdigest(),
        "link": read["link"],
    }
    try:
        split = split_block(text, purpose)
    except BrokenBlock as exc:
        state["broken"] = str(exc)
        return state
    state["block"], state["outside"] = split.block, split.outside
    return state


def file_command(path: str) -> StringCommand:
    """Print ``path`` as one framed ``file`` line named ``path``."""
    return StringCommand(
        "sh", "-c", QuoteString(FILE_FN + 'tf_file "$1" "$1"'), "trainfleet", QuoteString(path)
    )


class ManagedBlock(FactBase[BlockState]):
    """
    A file split around trainfleet's block for ``purpose``, with the bytes it was split from.

    + path: the file
    + purpose: what the block holds, as in its markers, e.g. ``cluster hosts``

    .. code:: python

        {
            "exists": True,
            "block": ["192.0.2.11      gpu-a01.cluster.example.com gpu-a01"],
            "outside": [(1, "127.0.0.1 localhost")],
            "broken": None, "text": "127.0.0.1 localhost\\n# BEGIN ...", "sha256": "9f2c...", "link": False,
        }
    """

    def command(self, path: str, purpose: str) -> StringCommand:
        self.purpose = purpose
        return file_command(path)

    def process(self, output: list[str]) -> BlockState:
        files = read_file_lines(output)
        if len(files) != 1:
            raise FactProcessError(f"expected one file line, got {len(files)}")
        (read,) = files.values()
        return block_state(read, self.purpose)
