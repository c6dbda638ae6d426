"""Passwordless sudo, proved before anything runs through it (``ssh.become: sudo``).

pyinfra runs a sudo login's commands as ``sudo -H -n -E sh -c '...'``; when sudo wants a
password it answers by prompting on the controller (getpass), which blocks an unattended run,
dies on a closed stdin, or takes a typed password. So the login user's sudo is tried first,
without pyinfra's sudo, in exactly that form (a rule that allows only ``id`` does not pass):
one command that always exits 0 and says ``ok`` or why not, in words no sudo line matches
(pyinfra's prompt is triggered by sudo's own "a password is required" line).
"""

from __future__ import annotations

import inspect
from typing import Any

from pyinfra.api import State, StringCommand
from pyinfra.api.arguments import pop_global_arguments
from pyinfra.connectors.util import make_unix_command

from facts.shell import shell
from trainfleet.text import printable

OK = "trainfleet-sudo: ok"
REFUSED = "trainfleet-sudo: refused: "

# What is run through sudo: it prints the uid it runs as.
PROVE = StringCommand("id", "-u")
# The arguments of pyinfra's command wrapper the proof does not take: it proves sudo WITHOUT a
# password (pyinfra's sudo password is a prompt on the controller, never wanted).
_NOT_PROVED = frozenset(
    {"command", "_sudo_password", "_sudo_askpass_path", "_su_password", "_su_askpass_path"}
)


def sudo_form(state: State, host: Any, command: StringCommand = PROVE) -> StringCommand:
    """``command`` wrapped exactly as pyinfra wraps every command of this host (its global
    arguments: ``sudo -H -n -E sh -c '...'`` for a trainfleet sudo login), so the proof
    passes only where sudoers lets every real command through, not just ``id``."""
    arguments, _ = pop_global_arguments(state, host, {})
    accepted = inspect.signature(make_unix_command).parameters.keys() - _NOT_PROVED
    return make_unix_command(
        command, **{key: value for key, value in arguments.items() if key in accepted}
    )


def probe_script(sudo_command: str) -> str:
    """The proof: ``sudo_command`` (never prompting: pyinfra's form has ``-n``), stdin closed so
    nothing can wait on it; ``id -u`` printing 0 last proves it ran as root (sudo may warn
    first, e.g. "unable to resolve host"); the answer is one line whatever sudo printed."""
    return (
        f"if u=$({sudo_command} </dev/null 2>&1) && "
        '[ "$(printf \'%s\\n\' "$u" | tail -n 1)" = 0 ]; '
        f"then echo '{OK}'; "
        f"else printf '%s%s\\n' '{REFUSED}' "
        "\"$(printf '%s' \"$u\" | tr '\\n' ' ' | cut -c1-300)\"; fi"
    )


def sudo_probe_command(sudo_command: StringCommand) -> StringCommand:
    return shell(probe_script(sudo_command.get_raw_value()))


def sudo_refusal(lines: list[str], user: str) -> str | None:
    """None when the probe proved root through passwordless sudo, else the reason (printable)."""
    answer = [line for line in lines if line.startswith("trainfleet-sudo: ")]
    if answer == [OK]:
        return None
    said = answer[-1][len(REFUSED) :].strip() if answer and answer[-1].startswith(REFUSED) else ""
    return (
        f"{user} cannot act as root without a password (sudo -n said: "
        f"{printable(said) or 'nothing'}); "
        f"give {user} passwordless sudo (NOPASSWD) or connect as root"
    )
