"""Reading /etc/hosts: the one parser of its lines, and the check for stale cluster names."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HostsLine:
    lineno: int
    address: str
    names: tuple[str, ...]


def parse_hosts_line(lineno: int, line: str) -> HostsLine | None:
    """hosts(5): an address, then names; '#' starts a comment. None for blank/comment lines."""
    fields = line.split("#", 1)[0].split()
    if len(fields) < 2:
        return None
    return HostsLine(lineno=lineno, address=fields[0], names=tuple(fields[1:]))


@dataclass(frozen=True)
class StaleLine:
    """A user line outside the managed block that maps a cluster name elsewhere."""

    lineno: int
    name: str
    address: str
    expected: str

    def __str__(self) -> str:
        return (
            f"line {self.lineno} maps {self.name} to {self.address}, "
            f"but the cluster says {self.expected}"
        )


def stale_lines(outside: list[tuple[int, str]], expected: dict[str, str]) -> list[StaleLine]:
    """Lines outside the block that resolve a cluster name to another address.

    Resolvers read /etc/hosts top-down and stop at the first match, so such a line
    before the block shadows it; after the block it is still a trap for the next edit.
    """
    found = []
    for lineno, line in outside:
        parsed = parse_hosts_line(lineno, line)
        if parsed is None:
            continue
        for name in parsed.names:
            want = expected.get(name.lower())
            if want is not None and parsed.address != want:
                found.append(StaleLine(lineno, name, parsed.address, want))
    return found
