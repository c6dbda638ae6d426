"""Remote commands that change files safely: atomic, in place, never past their own lines.

Every file change trainfleet makes goes through one of these builders:
- the new content is written to a temp file beside the target, given the
  target's mode, owner and SELinux context, then renamed over it (atomic);
- a managed block is replaced where it stands; every other line is copied as is.
Values travel as environment variables and positional arguments, quoted by
pyinfra's QuoteString: nothing of the user's is ever spliced into the script.
"""

from __future__ import annotations

from pyinfra.api import QuoteString, StringCommand

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
BEGIN { b = ENVIRON["TF_BEGIN"]; e = ENVIRON["TF_END"]; blk = ENVIRON["TF_BLOCK"]; keep = ENVIRON["TF_KEEP"] == "1" }
!done && $0 == b { skip = 1; next }
skip && $0 == e { skip = 0; done = 1; if (keep) printf "%s", blk; next }
skip { next }
{ print }
END { if (!done && keep) printf "%s", blk }
' "$src" > "$t"
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


def replace_block_command(
    path: str, begin: str, end: str, lines: list[str], present: bool = True,
    mode: str = "644", owner: str | None = None,
) -> StringCommand:
    """Put ``lines`` between the markers in ``path`` (appending the block if absent),
    or with ``present=False`` remove the block. A new file gets ``mode`` and ``owner``."""
    block = "".join(f"{line}\n" for line in [begin, *lines, end])
    env = {"TF_BEGIN": begin, "TF_END": end, "TF_BLOCK": block, "TF_KEEP": "1" if present else "0"}
    return _sh(_REPLACE_BLOCK, env, path, mode, owner or "")


def write_file_command(path: str, content: str, mode: str = "644", owner: str | None = None) -> StringCommand:
    """Write ``content`` to ``path`` atomically; an existing file keeps its mode and owner.

    Not for secrets: the content is an argument of the remote command. Keys are uploaded.
    """
    return _sh(_WRITE_FILE, {"TF_CONTENT": content}, path, mode, owner or "")


def fail_command(message: str) -> StringCommand:
    """A command that fails this host's operation with ``message`` on stderr.

    Raising in an operation aborts the whole run; failing its command fails only
    this host, so every other node still converges and the report names this one.
    """
    return StringCommand("echo", QuoteString(f"trainfleet: {message}"), "1>&2;", "exit", "1")
