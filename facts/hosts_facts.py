"""Facts about a node's names. (/etc/hosts itself is read with managed_block.ManagedBlock.)"""

from __future__ import annotations

from typing import Any, TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

HOSTS_PURPOSE = "cluster hosts"
_SEP = "--trainfleet--"


class HostnameStateT(TypedDict):
    running: str
    static: str | None


class HostnameState(FactBase[HostnameStateT]):
    """
    The running hostname (kernel) and the persistent one (``/etc/hostname``), in one command.

    + path: the persistent hostname file

    .. code:: python

        {"running": "gpu-a01", "static": "gpu-a01"}
    """

    def command(self, path: str = "/etc/hostname") -> StringCommand:
        return StringCommand(
            "hostname;", "echo", _SEP + ";", "cat", QuoteString(path), "2>/dev/null", "||", "true"
        )

    def process(self, output: list[str]) -> HostnameStateT:
        sep = output.index(_SEP)
        static = [
            line.strip() for line in output[sep + 1 :] if line.strip() and not line.startswith("#")
        ]
        return {
            "running": output[0].strip() if sep else "",
            "static": static[0] if static else None,
        }

    def answer(self, value: dict[str, Any], recorded: list[str]) -> list[str]:
        """What the command prints on the node ``recorded`` holds once its running name and
        /etc/hostname are ``value``'s (the file's comments kept)."""
        sep = recorded.index(_SEP) if _SEP in recorded else len(recorded)
        running = recorded[0] if sep else ""
        after = recorded[sep + 1 :]
        if "static" in value:
            kept = [line for line in after if line.startswith("#") or not line.strip()]
            after = kept + ([value["static"]] if value["static"] else [])
        return [value.get("running", running), _SEP, *after]
