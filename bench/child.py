"""``python -m bench.child OUT.json -- ARGV...``: run ARGV, write its wall time and own rusage.

Why a wrapper: on Linux a child's ``ru_maxrss`` starts from the peak of the process it was
forked from (exec keeps the old memory's high-water mark), so a pyinfra forked straight from
the benchmark would report the benchmark's own memory. Forked from this small process, its
peak is pyinfra's. stdout and stderr are the child's, passed through.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m bench.child OUT.json -- ARGV...", file=sys.stderr)
        return 2
    out, command = argv[0], argv[2:]
    started = time.perf_counter()
    proc = subprocess.Popen(command)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - started
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    with open(out, "w") as f:
        json.dump(
            {
                "returncode": code,
                "seconds": seconds,
                "maxrss_kb": usage.ru_maxrss,
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
            },
            f,
        )
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
