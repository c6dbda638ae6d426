"""Remote commands that change files safely: atomic, in place, never past their own lines.

Every file change trainfleet makes goes through one of these builders:
- the new content is written to a temp file beside the target, given the
  target's mode, owner and SELinux context, then renamed over it (atomic);
- a managed block is replaced where it stands; every other line is copied as is.
Values travel as environment variables and positional arguments, quoted by
pyinfra's QuoteString: nothing of the user's is ever spliced into the script.
"""

from __future__ import annotations

from io import StringIO

from pyinfra.api import FileUploadCommand, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand

# Shared tail: give the temp file the target's metadata, then rename it into place.
_INSTALL = r"""
if [ -e "$f" ]; then
  chmod --reference="$f" "$t"; chown --reference="$f" "$t"
  if command -v chcon >/dev/null 2>&1; then chcon --reference="$f" "$t" 2>/dev/null || true; fi
else
  chmod "$2" "$t"
  if [ -n "$3" ]; then chown "$3" "$t"; fi
fi
mv -f "$t" "$f"
"""

_REPLACE_BLOCK = r"""set -e
f=$1
d=$(dirname "$f"); [ -d "$d" ] || mkdir -p -m 755 "$d"
t=$(mktemp "$f.trainfleet.XXXXXX")
trap 'rm -f "$t"' EXIT
if [ -e "$f" ]; then src=$f; else src=/dev/null; fi
awk '
BEGIN {
  b = ENVIRON["TF_BEGIN"]; e = ENVIRON["TF_END"]; keep = ENVIRON["TF_KEEP"] == "1"; top = ENVIRON["TF_TOP"] == "1"
  blk = ENVIRON["TF_BLOCK"]; f = ENVIRON["TF_BLOCK_FILE"]
  if (f != "") { blk = ""; while ((getline line < f) > 0) blk = blk line "\n" }
}
top && keep && !put && NR == 1 { printf "%s", blk; put = 1 }
!done && $0 == b { skip = 1; next }
skip && $0 == e { skip = 0; done = 1; if (keep && !put) { printf "%s", blk; put = 1 }; next }
skip { next }
{ print }
END { if (keep && !put) printf "%s", blk }
' "$src" > "$t"
if [ -n "$TF_BLOCK_FILE" ]; then rm -f "$TF_BLOCK_FILE"; fi
""" + _INSTALL

_WRITE_FILE = r"""set -e
f=$1
d=$(dirname "$f"); [ -d "$d" ] || mkdir -p -m 755 "$d"
t=$(mktemp "$f.trainfleet.XXXXXX")
trap 'rm -f "$t"' EXIT
printf '%s' "$TF_CONTENT" > "$t"
""" + _INSTALL


def _sh(script: str, env: dict[str, str], *args: str) -> StringCommand:
    return StringCommand(
        "env",
        *(QuoteString(f"{key}={value}") for key, value in env.items()),
        "sh", "-c", QuoteString(script), "trainfleet",
        *(QuoteString(arg) for arg in args),
    )


# Linux caps one argument at 128 KiB: larger blocks (known hosts of hundreds of nodes)
# are uploaded beside the target instead of travelling on the command line.
INLINE_LIMIT = 64 * 1024


def replace_block_command(
    path: str, begin: str, end: str, lines: list[str], present: bool = True,
    mode: str = "644", owner: str | None = None, top: bool = False,
) -> list[PyinfraCommand]:
    """Put ``lines`` between the markers in ``path`` where the block stands (if absent:
    appended, or first in the file with ``top``), or with ``present=False`` remove it.
    A new file gets ``mode`` and ``owner``."""
    block = "".join(f"{line}\n" for line in [begin, *lines, end])
    env = {"TF_BEGIN": begin, "TF_END": end, "TF_KEEP": "1" if present else "0"}
    if top:
        env["TF_TOP"] = "1"
    if len(block) <= INLINE_LIMIT:
        return [_sh(_REPLACE_BLOCK, {**env, "TF_BLOCK": block}, path, mode, owner or "")]
    staged = f"{path}.trainfleet-block"
    return [FileUploadCommand(StringIO(block), staged),
            _sh(_REPLACE_BLOCK, {**env, "TF_BLOCK_FILE": staged}, path, mode, owner or "")]


def write_file_command(path: str, content: str, mode: str = "644", owner: str | None = None) -> StringCommand:
    """Write ``content`` to ``path`` atomically; an existing file keeps its mode and owner.

    Not for secrets: the content is an argument of the remote command. Keys are uploaded.
    """
    return _sh(_WRITE_FILE, {"TF_CONTENT": content}, path, mode, owner or "")


class FailCommand(StringCommand):
    """A command that only fails; composing operations can tell it from real changes."""


def fail_command(message: str) -> StringCommand:
    """A command that fails this host's operation with ``message`` on stderr.

    Raising in an operation aborts the whole run; failing its command fails only
    this host, so every other node still converges and the report names this one.
    """
    return FailCommand("echo", QuoteString(f"trainfleet: {message}"), "1>&2;", "exit", "1")
