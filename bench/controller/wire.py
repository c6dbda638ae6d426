"""What crosses the wire in one pyinfra run against the fake fleet, counted where pyinfra's
``@fake`` connector sees it: each command it is asked to run (the string a real connector would
send), the stdout lines it answers with (what the controller reads back), and the files
pyinfra would upload. Installed by bench/controller/fake_inventory.py when ``TRAINFLEET_BENCH_WIRE``
names a file; the counts are written there as JSON when the pyinfra process exits.

The cost inside a timed run is one ``len`` per command and per answered line.
"""

from __future__ import annotations

import atexit
import io
import json
import os
from typing import Any

ENV = "TRAINFLEET_BENCH_WIRE"
FIELDS = ("commands", "command_bytes", "stdout_lines", "stdout_bytes", "uploads", "upload_bytes")


def _size(source: Any) -> int:
    """Bytes of a file pyinfra uploads (a path or an in-memory file); 0 when unknown."""
    if isinstance(source, str):
        try:
            return os.path.getsize(source)
        except OSError:
            return 0
    if isinstance(source, (io.BytesIO, io.StringIO)):
        value = source.getvalue()
        return len(value.encode() if isinstance(value, str) else value)
    return 0


def install(path: str) -> dict[str, int]:
    """Count through FakeConnector from now on; write the counts to ``path`` at exit."""
    from pyinfra.connectors.fake import FakeConnector

    counts = dict.fromkeys(FIELDS, 0)
    lookup, put_file = FakeConnector._lookup_response, FakeConnector.put_file

    def counted_lookup(self: Any, command_str: str) -> Any:
        status, output = lookup(self, command_str)
        counts["commands"] += 1
        counts["command_bytes"] += (
            len(command_str.encode("utf-8", "surrogateescape")) + 1
        )  # and its newline
        lines = output.stdout_lines
        counts["stdout_lines"] += len(lines)
        counts["stdout_bytes"] += sum(
            len(line.encode("utf-8", "surrogateescape")) + 1 for line in lines
        )
        return status, output

    def counted_put_file(self: Any, filename_or_io: Any, *args: Any, **kwargs: Any) -> bool:
        counts["uploads"] += 1
        counts["upload_bytes"] += _size(filename_or_io)
        return put_file(self, filename_or_io, *args, **kwargs)

    FakeConnector._lookup_response = counted_lookup  # type: ignore[method-assign]
    FakeConnector.put_file = counted_put_file  # type: ignore[method-assign]

    def write() -> None:
        with open(path, "w") as handle:
            json.dump(counts, handle)

    atexit.register(write)
    return counts


def read(path: str) -> dict[str, int] | None:
    try:
        with open(path) as handle:
            found = json.load(handle)
    except (OSError, ValueError):
        return None
    return {key: int(found.get(key, 0)) for key in FIELDS}
