"""The controller's own files (reports, stamps, the hardware ledger, the key store) written
atomically, by one writer."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_atomic(path: Path, data: str | bytes, mode: int = 0o644) -> None:
    """``data`` (text as UTF-8) into ``path`` through a unique temp file beside it (mkstemp: a
    random name, O_EXCL, never through a link someone placed), fsynced, then renamed over
    ``path``: a reader sees the old file or the whole new one, and the temp file is removed on
    any failure."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as file:
            os.fchmod(file.fileno(), mode)  # mkstemp made it 0600: never wider in between
            file.write(data.encode() if isinstance(data, str) else data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
