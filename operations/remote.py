"""The one primitive that changes files on nodes, and the shell pieces it is made of.

Every file trainfleet writes goes through ``write_command``:
- **as the file's owner**: a file in a path a user controls (a mesh user's home) is read,
  staged and renamed by a process running with that user's uid, gid and groups (setpriv)
  and a fixed environment (PATH, HOME, USER, LOGNAME, LANG: nothing of root's), so a
  symlink or a race planted there gives the user only what the user already had; a
  symlink the user owns (``~/.ssh/config -> ~/dotfiles/ssh_config``) is followed and its
  target gets the change. Root writes only where no one else can: every directory up to
  ``/`` must be root's and not writable by others (a sticky one is allowed above a
  root-owned child), a link is followed only through root's own files and directories
  (root's dotfiles: the link stays, its target gets the change), and ownership is copied
  with ``chown -h``;
- **compare and swap**: the node replaces the file only if it still holds exactly the bytes
  the fact read (sha256), so a line added since, or by a second controller, is never lost;
- **atomic**: the new bytes go to a unique ``mktemp`` file beside the target, which gets the
  target's mode (and, as root, owner and SELinux context) and is renamed over it;
- **serialised**: every write holds the node's trainfleet lock (``flock`` on a file in the
  root-only /run/trainfleet); a writer that cannot take it within LOCK_WAIT seconds fails,
  naming the controller that holds it and since when.
Content travels base64-encoded (any byte, no quoting question): as an argument when small
and public, else uploaded to a unique name in /run/trainfleet (root only) and fed to the
writer on its standard input. Private keys are always uploaded, never on a command line.
A sudo login (``ssh.become: sudo``) cannot write there over SFTP: pyinfra uploads to a temp
file and copies it with sudo, so that temp file goes to the login user's own 0700 directory
that root makes in /run (never /tmp, where others could read a key or plant the name).
"""

from __future__ import annotations

import base64
import hashlib
import uuid
from io import BytesIO
from pathlib import Path

from pyinfra.api import FileUploadCommand, QuoteString, StringCommand
from pyinfra.api.command import PyinfraCommand
from pyinfra.context import ctx_host

from facts.managed_block_facts import USER_ENV_FN
from facts.shell import script as read_script
from facts.shell import shell
from trainfleet.defaults import RUN_DIR

LOCK_WAIT = 60  # seconds a write waits for another run's write on the same node
USER_TIMEOUT = 60  # seconds a step running as a user may take (a FIFO planted to hang it)
ABSENT = "absent"  # expected state of a file that must not exist yet
ANY = "any"  # whole files trainfleet owns: no user bytes to protect

SCRIPTS = Path(__file__).resolve().parent / "scripts"  # the operations' scripts, beside them


def script(name: str) -> str:
    """The text of ``operations/scripts/<name>`` (modules read theirs once, at import)."""
    return read_script(name, SCRIPTS)


# The root-only run directory: made if missing, else it must be root's real 0700 directory.
RUN_DIR_SCRIPT = script("remote_run_dir.sh")

# A sudo login's upload directory ($2: the login user): made by root in /run, where nobody
# else can make a name, owned by that user alone; anything else there is refused.
UPLOAD_DIR_SCRIPT = script("remote_upload_dir.sh")

# Runs as root: the run dir, the node lock, then the writer (as the user where one is named,
# with only a fixed environment: USER_ENV_FN).
_LOCKED = RUN_DIR_SCRIPT + USER_ENV_FN + script("remote_locked.sh")

# Root writes only where nobody else can change the path: every existing directory from the
# file's up to / is root's; the file's own (or the one its new parents are made in) is
# writable by root alone; above it, a sticky directory is allowed (only root can rename a
# root-owned entry in it).
_ROOT_SAFE_DIR = script("remote_root_safe_dir.sh")

# Root follows a link (``/root/.ssh/config -> ../dotfiles/ssh_config``) only where nobody else
# can change where it leads: walked one name at a time from /, every directory on the way, each
# link met (the first and any it leads through) and the file at the end are owned by root, and
# every directory and the file are writable by root alone (no sticky exception: a chain
# through /tmp is refused). Prints the file at the end; the link stays a link.
_ROOT_LINK = script("remote_root_link.sh")

# The writer: $1 path, $2 expected sha256 | absent | any, $3 mode of a new file, $4 mode of new
# directories; content base64 in $TF_DATA, or on stdin when $TF_DATA is empty.
_WRITE = script("remote_write_args.sh") + _ROOT_SAFE_DIR + _ROOT_LINK + script("remote_write.sh")

# Linux caps one argument at 128 KiB: larger contents (known hosts of hundreds of nodes)
# are uploaded instead of travelling on the command line.
INLINE_LIMIT = 64 * 1024


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _locked(
    script: str, env: dict[str, str], args: list[str], user: str | None = None, staged: str = ""
) -> StringCommand:
    env = {
        "TF_LOCK_WAIT": str(LOCK_WAIT),
        "TF_USER_TIMEOUT": str(USER_TIMEOUT),
        "TF_AS": user or "",
        "TF_STAGED": staged,
        "TF_SCRIPT": script,
        **env,
    }
    return shell(
        _LOCKED,
        RUN_DIR,
        *args,
        prefix=("env", *(QuoteString(f"{key}={value}") for key, value in env.items())),
    )


def run_dir_command(login: str | None = None) -> StringCommand:
    """Make sure /run/trainfleet is root's own 0700 directory (before an upload into it), and
    a sudo ``login``'s upload directory is that user's own."""
    if login:
        return shell(RUN_DIR_SCRIPT + UPLOAD_DIR_SCRIPT, RUN_DIR, login)
    return shell(RUN_DIR_SCRIPT, RUN_DIR)


def upload_dir(login: str) -> str:
    return f"/run/trainfleet-upload.{login}"


def sudo_login() -> str | None:
    """The current host's login user when it acts as root through sudo, else None."""
    if not ctx_host.isset():  # composing a command outside a deploy (tests, tools)
        return None
    data = ctx_host.get().data
    return str(data.get("ssh_user")) if data.get("_sudo") else None


def write_command(
    path: str,
    content: bytes | str,
    expect: str = ANY,
    mode: str = "644",
    user: str | None = None,
    secret: bool = False,
    dir_mode: str = "755",
) -> list[PyinfraCommand]:
    """Replace ``path`` with ``content`` if it still is ``expect`` (its sha256, ABSENT or ANY).

    + user: write as this user (a file in a path the user controls); None: as root, where
      only root can write
    + mode: mode of a new file (an existing one keeps its own)
    + secret: upload the content instead of passing it as an argument (private keys)
    + dir_mode: mode of missing parent directories made on the way
    """
    data = content.encode("utf-8", "surrogateescape") if isinstance(content, str) else content
    args = [path, expect, mode, dir_mode]
    encoded = base64.b64encode(data).decode()
    if not secret and len(encoded) <= INLINE_LIMIT:
        return [_locked(_WRITE, {"TF_DATA": encoded}, args, user)]
    name = f"stage.{uuid.uuid4().hex}"
    staged = f"{RUN_DIR}/{name}"
    login = sudo_login()
    temp = (
        f"{upload_dir(login)}/{name}" if login else None
    )  # pyinfra's sudo upload: SFTP here, then cp
    return [
        run_dir_command(login),
        FileUploadCommand(BytesIO(encoded.encode()), staged, remote_temp_filename=temp),
        _locked(_WRITE, {"TF_DATA": ""}, args, user, staged=staged),
    ]


def write_file_command(path: str, content: str, mode: str = "644") -> StringCommand:
    """A whole file only trainfleet writes (no user bytes in it), as root, atomically.
    A file in a user's home is written as that user: ``write_command(..., user=...)``."""
    (command,) = write_command(path, content, expect=ANY, mode=mode)
    return command


def as_user_command(user: str | None, script: str, *args: str) -> StringCommand:
    """``script`` run by ``sh`` as ``user`` (setpriv, bounded in time; None: as root), holding
    the node lock."""
    return _locked(script, {}, list(args), user)


class FailCommand(StringCommand):
    """A command that only fails; composing operations can tell it from real changes."""


def fail_command(message: str) -> StringCommand:
    """A command that fails this host's operation with ``message`` on stderr.

    Raising in an operation aborts the whole run; failing its command fails only
    this host, so every other node still converges and the report names this one.
    """
    return FailCommand("echo", QuoteString(f"trainfleet: {message}"), "1>&2;", "exit", "1")
