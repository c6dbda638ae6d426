"""Files as facts: exact bytes, framed so no content can pass for fact output; the managed
block of any file; and the one reader of sectioned fact output.

A file travels as ONE line, ``file NAME STATE LINK BASE64``: whatever it holds (a marker
line, no final newline, CRLF, invalid UTF-8) it cannot end its section or forge another.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Callable
from typing import Any, TypedDict

from pyinfra.api import FactBase, StringCommand
from pyinfra.api.exceptions import FactProcessError

from facts.shell import shell
from trainfleet.blocks import BrokenBlock, Split, markers, split_block, with_block

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

# Shell: a file that holds a cluster-wide block (a line per node: /etc/hosts, genders), read
# so a converged node's answer does not grow with the cluster: ``tf_block NAME PATH BEGIN END
# SHA``. If the lines between the BEGIN line and the next END line hash (each line with its
# newline) to SHA, the plan's block, it prints ``block NAME SHA`` and the file without those
# lines (the user's lines stay whole: they are per node); else the whole file (``tf_file``).
BLOCK_FN = (
    FILE_FN
    + r"""
tf_block() {
  if [ -n "$5" ] && [ -f "$2" ] && [ ! -L "$2" ]; then
    s=$(tf_b="$3" tf_e="$4" LC_ALL=C awk \
      '$0 == ENVIRON["tf_e"] && i { exit } i { print } $0 == ENVIRON["tf_b"] { i = 1 }' \
      < "$2" | sha256sum) || s=
    if [ "${s%% *}" = "$5" ]; then
      echo "block $1 $5"; printf 'file %s regular - ' "$1"
      tf_b="$3" tf_e="$4" LC_ALL=C awk '$0 == ENVIRON["tf_e"] { i = 0 } !i { print }
        $0 == ENVIRON["tf_b"] && !d { i = 1; d = 1 }' < "$2" | base64 -w0 || printf '!'
      echo; return
    fi
  fi
  tf_file "$1" "$2"
}
"""
)


def block_sha256(lines: list[str]) -> str:
    """The digest ``tf_block`` compares a block's lines with: each line with its newline."""
    return hashlib.sha256("".join(f"{line}\n" for line in lines).encode()).hexdigest()


def block_args(path: str, purpose: str, expect: list[str] | None) -> list[str]:
    """``tf_block``'s arguments after NAME for ``path`` (no ``expect``: read whole)."""
    return [path, *markers(purpose), block_sha256(expect) if expect is not None else ""]


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


def encode_lines(lines: list[str]) -> str:
    """``decode_lines``' inverse: the lines as one base64 line."""
    text = "".join(f"{line}\n" for line in lines)
    return base64.b64encode(text.encode("utf-8", "surrogateescape")).decode()


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


def file_line(name: str, data: str | bytes | None, link: bool = False) -> str:
    """The ``tf_file`` line of a file holding ``data`` (None: missing): ``read_file_line``'s
    inverse (a converged node's answer, for the controller benchmark)."""
    state = "link" if link else "-"
    if data is None:
        return f"file {name} missing {state}"
    raw = data.encode("utf-8", "surrogateescape") if isinstance(data, str) else data
    return f"file {name} regular {state} {base64.b64encode(raw).decode()}"


def with_block_line(line: str, purpose: str, block: list[str], top: bool = False) -> str:
    """The ``tf_file`` line ``line`` once ``block`` is written in its file as
    operations/managed_block_ops.py writes it (the file's other bytes kept)."""
    name, read = read_file_line(line)
    new = with_block(split_block(file_text(read) or "", purpose), purpose, block, top=top)
    return file_line(name, new, read["link"])


def block_file_answer(
    line: str, purpose: str, block: list[str], expect: list[str] | None, top: bool = False
) -> list[str]:
    """What ``tf_block`` (``expect`` asked for) or ``tf_file`` (None) prints once ``block`` is
    written in the file ``line`` carries."""
    new = with_block_line(line, purpose, block, top)
    return [new] if expect is None else block_answer(new, purpose, expect)


def with_files(lines: list[str], answers: dict[str, Callable[[str], list[str]]]) -> list[str]:
    """``lines`` with each ``file NAME`` line whose NAME is in ``answers`` replaced by what
    ``answers[NAME]`` makes of it."""
    out: list[str] = []
    for line in lines:
        name = line.split(" ", 2)[1] if line.startswith("file ") else None
        out += answers[name](line) if name in answers else [line]
    return out


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


def block_answer(line: str, purpose: str, expect: list[str]) -> list[str]:
    """What ``tf_block`` prints for the file a ``tf_file`` line carries, ``expect`` asked for
    (the controller benchmark's converged node; a unit test holds it to the shell's answer)."""
    name, read = read_file_line(line)
    if read["state"] != "regular" or read["link"] or read["data"] is None:
        return [line]
    begin, end = markers(purpose)
    text = read["data"].decode("utf-8", "surrogateescape")
    lines = text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
    body: list[str] = []
    inside = False
    for each in lines:  # awk's first pass: the lines after BEGIN up to the next END
        if each == end and inside:
            break
        if inside:
            body.append(each)
        inside = inside or each == begin
    if block_sha256(body) != block_sha256(expect):
        return [line]
    kept: list[str] = []
    inside = done = False
    for each in lines:  # awk's second pass: every line but those
        inside = inside and each != end
        if not inside:
            kept.append(each)
        if each == begin and not done:
            inside = done = True
    elided = "".join(f"{each}\n" for each in kept).encode("utf-8", "surrogateescape")
    return [
        f"block {name} {block_sha256(expect)}",
        f"file {name} regular - {base64.b64encode(elided).decode()}",
    ]


def read_digest_lines(lines: list[str]) -> dict[str, str]:
    """{NAME: SHA} from the ``block NAME SHA`` lines among ``lines`` (``tf_block``)."""
    digests = {}
    for line in lines:
        if line.startswith("block "):
            fields = line.split(" ")
            if len(fields) != 3 or len(fields[2]) != 64 or fields[2].strip("0123456789abcdef"):
                raise FactProcessError(f"not a block digest line: {line[:80]!r}")
            digests[fields[1]] = fields[2]
    return digests


def block_or_digest(
    output: list[str], name: str, purpose: str, expect: list[str] | None
) -> BlockState:
    """The one reader of a ``tf_block`` answer: the file ``name`` of ``output`` split around
    its block; a block the node answered by digest is ``expect`` (the lines that digest was
    asked for), ``text`` and ``sha256`` then None (the node kept them: nothing to rewrite).
    A digest that is not ``expect``'s fails the read, never passes."""
    files = read_file_lines(output)
    digest = read_digest_lines(output).get(name)
    if digest is None:
        return block_state(files.get(name), purpose)
    if expect is None or digest != block_sha256(expect):
        raise FactProcessError(f"{name}: block digest {digest[:12]} is not the one asked for")
    return block_state(files.get(name), purpose, matched=list(expect))


def block_state(
    read: FileRead | None, purpose: str, matched: list[str] | None = None
) -> BlockState:
    """A file (None or missing: no such file) split around the block that holds ``purpose``.
    ``matched``: the node left out the block's lines, which are these (``tf_block``)."""
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
    whole = decode(read["data"])
    text = (
        whole if matched is None else None
    )  # with ``matched``: not the file's, nothing to rewrite
    state: BlockState = {
        "exists": True,
        "block": None,
        "outside": [],
        "broken": None,
        "text": text,
        "sha256": hashlib.sha256(read["data"]).hexdigest() if text is not None else None,
        "link": read["link"],
    }
    try:
        try:
            split = split_block(whole, purpose)
        except BrokenBlock:
            if matched is None:
                raise
            split_block(_lines_back(whole, purpose, matched), purpose)  # its own line numbers
            raise
    except BrokenBlock as exc:
        state["broken"] = str(exc)
        return state
    if matched is not None:
        if split.block != [] or read["link"]:
            raise FactProcessError("a block answered by digest came back with lines or a link")
        split = Split(split.before, matched, split.after)
    state["block"], state["outside"] = split.block, split.outside
    return state


def _lines_back(text: str, purpose: str, lines: list[str]) -> str:
    """The file ``tf_block`` left ``lines`` out of, with them back after its first BEGIN line."""
    parts = text.split("\n")
    at = parts.index(markers(purpose)[0]) + 1
    return "\n".join(parts[:at] + lines + parts[at:])


def file_command(path: str) -> StringCommand:
    """Print ``path`` as one framed ``file`` line named ``path``."""
    return shell(FILE_FN + 'tf_file "$1" "$1"', path)


class ManagedBlock(FactBase[BlockState]):
    """
    A file split around trainfleet's block for ``purpose``, with the bytes it was split from.

    + path: the file
    + purpose: what the block holds, as in its markers, e.g. ``cluster hosts``
    + expect: the block the plan wants (a cluster-wide one): a node that holds it answers
      its digest instead of its lines (``tf_block``)

    .. code:: python

        {
            "exists": True,
            "block": ["192.0.2.11      gpu-a01.cluster.example.com gpu-a01"],
            "outside": [(1, "127.0.0.1 localhost")],
            "broken": None, "text": "127.0.0.1 localhost\\n# BEGIN ...", "sha256": "9f2c...",
            "link": False,
        }
    """

    def command(self, path: str, purpose: str, expect: list[str] | None = None) -> StringCommand:
        self.path, self.purpose, self.expect = path, purpose, expect
        if expect is None:
            return file_command(path)
        return shell(BLOCK_FN + 'tf_block "$1" "$@"', *block_args(path, purpose, expect))

    def process(self, output: list[str]) -> BlockState:
        files = read_file_lines(output)
        if len(files) != 1:
            raise FactProcessError(f"expected one file line, got {len(files)}")
        if self.expect is None:
            (read,) = files.values()
            return block_state(read, self.purpose)
        return block_or_digest(output, self.path, self.purpose, self.expect)

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What a node answers this command once ``value``'s block is written in its file as
        ``recorded`` holds it (the controller benchmark's converged node; a file it has no
        line for is a missing one, the block then its only content)."""
        named = any(line.startswith(f"file {self.path} ") for line in recorded)
        return with_files(
            recorded if named else [*recorded, file_line(self.path, None)],
            {
                self.path: lambda line: block_file_answer(
                    line, self.purpose, value["block"], self.expect
                )
            },
        )
