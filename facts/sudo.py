"""Passwordless sudo, proved before anything runs through it (``ssh.become: sudo``).

pyinfra runs a sudo login's commands as ``sudo -H -n -E``; when sudo wants a password it
answers by prompting on the controller (getpass), which blocks an unattended run or dies
on a closed stdin. So the login user's sudo is tried first, without pyinfra's sudo: one
command that always exits 0 and says ``ok`` or why not, in words no sudo line matches
(pyinfra's prompt is triggered by sudo's own "a password is required" line).
"""

from __future__ import annotations

from pyinfra.api import QuoteString, StringCommand

from trainfleet.preflight import printable

OK = "trainfleet-sudo: ok"
REFUSED = "trainfleet-sudo: refused: "

# `sudo -n` never prompts; -E as every later command has (it needs sudoers' SETENV, which
# `ALL` implies); `id -u` printing 0 last proves the command ran as root (sudo may warn
# first, e.g. "unable to resolve host" on a fresh server). stdin is closed so nothing can
# wait on it; the answer is one line whatever sudo printed (its lecture, a PAM note).
PROBE = (f"if u=$(sudo -n -E id -u </dev/null 2>&1) && [ \"$(printf '%s\\n' \"$u\" | tail -n 1)\" = 0 ]; "
         f"then echo '{OK}'; "
         f"else printf '%s%s\\n' '{REFUSED}' \"$(printf '%s' \"$u\" | tr '\\n' ' ' | cut -c1-300)\"; fi")


def sudo_probe_command() -> StringCommand:
    return StringCommand("sh", "-c", QuoteString(PROBE))


def sudo_refusal(lines: list[str], user: str) -> str | None:
    """None when the probe proved root through passwordless sudo, else the reason (printable)."""
    answer = [line for line in lines if line.startswith("trainfleet-sudo: ")]
    if answer == [OK]:
        return None
    said = answer[-1][len(REFUSED):].strip() if answer and answer[-1].startswith(REFUSED) else ""
    return (f"{user} cannot act as root without a password (sudo -n said: {printable(said) or 'nothing'}); "
            f"give {user} passwordless sudo (NOPASSWD) or connect as root")
