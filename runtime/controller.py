"""The controller's side of a large run: enough open files, and parallelism chosen for the
inventory's size instead of pyinfra's default (20 hosts per core, capped by the open-file
limit), which runs every operation in batches once a cluster outgrows it."""

from __future__ import annotations

import resource

FILES_PER_HOST = 3  # pyinfra's own estimate: an SSH socket and ~2 files per host while ops run
FILES_SPARE = 64  # Python's modules, logs, the key store
UNLIMITED = 1 << 20  # what an unlimited soft limit counts as


def raise_open_files(hosts: int) -> int:
    """Raise the soft ``nofile`` limit towards what ``hosts`` connections need, never past the hard
    limit (only root raises that: ``ulimit -Hn`` or limits.conf). Returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = FILES_PER_HOST * hosts + FILES_SPARE
    if soft == resource.RLIM_INFINITY:
        return UNLIMITED
    if soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(hard, wanted)
        if new > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
                soft = new
            except (
                ValueError,
                OSError,
            ):  # a system cap below the hard limit (macOS): keep what we have
                pass
    return soft


def parallel_hosts(hosts: int, open_files: int) -> int:
    """Every host at once, as far as the open files allow: each node's one fact command and
    each operation then run on the whole cluster at once, not in batches."""
    return max(1, min(hosts, (open_files - FILES_SPARE) // FILES_PER_HOST))


def configure_pyinfra(hosts: int) -> None:
    """While pyinfra loads the inventory: raise the open-file limit and, unless ``--parallel``
    was given, run every host at once. pyinfra read the limit when it was imported, so its
    copy is brought up to date too (its warning for a too-high --parallel then tells the truth)."""
    from pyinfra.api import state as pyinfra_state
    from pyinfra.context import ctx_config

    open_files = raise_open_files(hosts)
    pyinfra_state.nofile_limit = open_files
    pyinfra_state.MAX_PARALLEL = round((open_files - 10) / 3)
    if ctx_config.isset() and not ctx_config.get().PARALLEL:
        ctx_config.get().PARALLEL = parallel_hosts(hosts, open_files)
