"""Facts about a node's names: its hostname and its /etc/hosts."""

from __future__ import annotations

from typing import TypedDict

from pyinfra.api import FactBase, QuoteString, StringCommand

from trainfleet.blocks import BrokenBlock, markers, split_block

HOSTS_PURPOSE = "cluster hosts"
_SEP = "--trainfleet--"
_MISSING = "--trainfleet-missing--"


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
        return StringCommand("hostname;", "echo", _SEP + ";", "cat", QuoteString(path), "2>/dev/null", "||", "true")

    def process(self, output: list[str]) -> HostnameStateT:
        sep = output.index(_SEP)
        static = [line.strip() for line in output[sep + 1:] if line.strip() and not line.startswith("#")]
        return {"running": output[0].strip() if sep else "", "static": static[0] if static else None}


class EtcHostsT(TypedDict):
    exists: bool
    block: list[str] | None
    outside: list[tuple[int, str]]
    broken: str | None


class EtcHosts(FactBase[EtcHostsT]):
    """
    ``/etc/hosts`` split around trainfleet's managed block.

    + path: the hosts file

    .. code:: python

        {
            "exists": True,
            "block": ["192.0.2.11      gpu-a01.cluster.example.com gpu-a01"],  # None: no block yet
            "outside": [(1, "127.0.0.1 localhost")],   # (line number, line) the user owns
            "broken": None,  # or why the markers cannot be trusted
        }
    """

    def command(self, path: str = "/etc/hosts") -> StringCommand:
        return StringCommand("cat", QuoteString(path), "2>/dev/null", "||", "echo", _MISSING)

    def process(self, output: list[str]) -> EtcHostsT:
        if output == [_MISSING]:
            return {"exists": False, "block": None, "outside": [], "broken": None}
        begin, end = markers(HOSTS_PURPOSE)
        try:
            split = split_block(output, begin, end)
        except BrokenBlock as exc:
            return {"exists": True, "block": None, "outside": list(enumerate(output, 1)), "broken": str(exc)}
        return {"exists": True, "block": split.block, "outside": split.outside, "broken": None}
