"""/etc/os-release, read by one shell fragment that every fact needing the OS embeds (the
bundle runs those facts in one command; each section stays parseable on its own).
``trainfleet.osfamily.os_release`` parses what the fragment prints."""

from __future__ import annotations

from trainfleet.osfamily import OS_FIELDS, OsField


def os_release_sh(fields: tuple[OsField, ...]) -> str:
    """A subshell sourcing /etc/os-release that prints ``<key> <value>`` for each field
    (``(key, VARIABLE, default)``); with no os-release it prints nothing."""
    echoes = "; ".join(f'echo "{key} ${{{name}:-{default}}}"' for key, name, default in fields)
    return f"( . /etc/os-release 2>/dev/null; {echoes} )"


OS_FAMILY_SH = os_release_sh(OS_FIELDS)  # id, like, version: the OS family and package manager
OS_NAME_SH = os_release_sh((("os", "PRETTY_NAME", "unknown"),))  # the machine's identity
