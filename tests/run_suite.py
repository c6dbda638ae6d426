"""``make test``'s pytest: the suite in shards run at once, each lab shard with a lab of its own.

A lab test waits more than it computes (SSH round trips, sshd restarts, the preflight's bounded
collectives), so the lab modules are split into shards that run side by side, until the CPU is
the limit (measured: the machine about 90% busy); the unit tests start when a first lab shard
ends. The first lab shard runs in this machine's network namespace exactly as ``pytest`` alone
would; every other one runs inside a network namespace this runner creates (its own bridge, the
same 198.18.0.0/24 addresses, so tests name the same nodes), under its own lab state dir and
namespace prefix. The torch lab's modules share one converged lab, so they stay in one shard.

Usage: ``python -m tests.run_suite [PYTEST ARGS...]`` (every shard gets the args; root needed
for the lab). Each shard's output is printed whole once it ends, then the suite's slowest tests,
the lab tests that used the most CPU, how busy the machine was, and one closing line,
``N passed, N failed, N skipped``. Exit status: the worst of the shards.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOGS = REPO / ".trainfleet" / "suite"  # ignored by git, beside the reports


@dataclass(frozen=True)
class Shard:
    name: str
    paths: tuple[str, ...]
    netns: str | None = None  # None: this machine's namespace, the lab's defaults
    env: dict[str, str] = field(default_factory=dict)
    deferred: bool = False  # started only once a first shard has ended


def _lab(*modules: str) -> tuple[str, ...]:
    return tuple(f"tests/lab/{module}" for module in modules)


def lab_shard(letter: str, *modules: str) -> Shard:
    """A lab shard beside the first: its own controller namespace, lab state and prefix."""
    return Shard(
        f"lab-{letter}",
        _lab(*modules),
        netns=f"tflabctl{letter}",
        env={
            "TRAINFLEET_LAB_DIR": f"/var/lib/trainfleet-lab-{letter}",
            "TRAINFLEET_LAB_PREFIX": f"tflab{letter}-",
        },
    )


# Lab modules by shard, balanced on measured CPU and wall times (the closing note of #28 has
# them); every lab module is in exactly one lab shard (tests/unit/test_run_suite.py). The suite
# is CPU-bound on two cores once the shards overlap. The unit tests wait on nothing and need no
# lab: they start when the first lab shard ends, on the CPU the torch shard's tail leaves idle.
SHARDS = (
    Shard(
        "torch",  # one torch install, then every launcher and preflight on it
        _lab(
            "test_launchers.py",
            "test_torch_preflight.py",
            "test_torch_stack.py",
            "test_sudo_login.py",
        ),
    ),
    lab_shard(
        "b",
        "test_scale.py",
        "test_ssh_certificates.py",
        "test_nccl_env.py",
        "test_two_controllers.py",
        "test_lab.py",
        "test_remove.py",
    ),
    lab_shard(
        "c",
        "test_drift.py",
        "test_ssh_mesh.py",
        "test_stack_packages.py",
        "test_openmpi.py",
        "test_hostile_user.py",
        "test_hosts.py",
        "test_gpu_node.py",
    ),
    Shard("unit", ("tests/unit",), deferred=True),
)


DURATION = re.compile(r"^(\d+\.\d+)s (call|setup|teardown|cpu) +(\S+)$")
OUTCOME = re.compile(r"(\d+) (passed|failed|skipped|errors?|xfailed|xpassed)\b")


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _in_netns(shard: Shard, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", shard.netns, *argv] if shard.netns else argv


class CpuGroups:
    """A cpuacct cgroup (v1) per shard: the CPU its whole tree used, the lab nodes' processes
    included (they descend from the shard), which its lab tests also read per test. Accounting
    only: the scheduler keeps sharing the CPU as it would without (by session), which serves
    the suite's wall time better than an even split between shards (measured). Where cgroups
    cannot be made, shards run without, and the CPU figures are left out."""

    ROOT = Path("/sys/fs/cgroup/cpuacct")

    def __init__(self, shards: tuple[Shard, ...]):
        self.paths: dict[str, Path] = {}
        self.fds: list[int] = []
        for shard in shards:
            path = self.ROOT / f"trainfleet-suite-{shard.name}"
            try:
                if path.is_dir():
                    path.rmdir()  # left by an interrupted run: empty, or this fails
                path.mkdir()
            except OSError as exc:
                print(f"run_suite: no CPU accounting groups ({exc}); no CPU figures")
                self.remove()
                return
            self.paths[shard.name] = path

    def enter(self, shard: Shard):
        """A preexec function: the shard's process joins its group before pytest starts."""
        path = self.paths.get(shard.name)

        def join() -> None:
            if path:
                (path / "cgroup.procs").write_text(str(os.getpid()))

        return join

    def usage_fd(self, shard: Shard) -> int | None:
        """A descriptor of the shard's CPU use, which its lab tests read (tests/lab/conftest.py)."""
        path = self.paths.get(shard.name)
        if not path:
            return None
        fd = os.open(path / "cpuacct.usage", os.O_RDONLY)
        self.fds.append(fd)
        return fd

    def seconds(self, name: str) -> float | None:
        path = self.paths.get(name)
        return int((path / "cpuacct.usage").read_text()) / 1e9 if path else None

    def remove(self) -> list[str]:
        """Remove every group; what could not be removed (a process still in it) is named."""
        for fd in self.fds:
            os.close(fd)
        self.fds, left = [], []
        for path in self.paths.values():
            try:
                path.rmdir()
            except FileNotFoundError:
                pass
            except OSError:
                left.append(str(path))
        self.paths = {}
        return left


def busy_seconds() -> float:
    """CPU seconds this machine has spent busy since boot, every core (/proc/stat)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def _outcomes(log: str) -> dict[str, int]:
    """The counts on pytest's closing line ("3 failed, 10 passed, 1 skipped in 5.0s")."""
    closing = [line for line in log.splitlines() if re.search(r" in \d+\.\d+s", line)]
    counts: dict[str, int] = {}
    for count, word in OUTCOME.findall(closing[-1] if closing else ""):
        key = "errors" if word.startswith("error") else word
        counts[key] = counts.get(key, 0) + int(count)
    return counts


def slowest(logs: dict[str, str], count: int = 15, phases=("call", "setup", "teardown")):
    """The suite's slowest test phases across every shard, as pytest prints them (or, with
    phases=("cpu",), the lab tests that used the most CPU, as tests/lab/conftest.py prints)."""
    rows = [
        (float(m[1]), f"{float(m[1]):8.2f}s {m[2]:8} {m[3]}  [{name}]")
        for name, log in logs.items()
        for m in map(DURATION.match, log.splitlines())
        if m and m[2] in phases
    ]
    return [text for _, text in sorted(rows, reverse=True)[:count]]


def main(argv: list[str]) -> int:
    if os.geteuid() != 0:
        print("run_suite: the lab needs root (namespaces, mounts)", file=sys.stderr)
        return 2
    LOGS.mkdir(parents=True, exist_ok=True)
    namespaces = [shard.netns for shard in SHARDS if shard.netns]
    started, busy = time.monotonic(), busy_seconds()
    running: dict[str, tuple[subprocess.Popen, Path, float]] = {}
    logs: dict[str, str] = {}
    codes: dict[str, int] = {}
    groups = CpuGroups(SHARDS)
    try:
        for netns in namespaces:
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
            _ip("netns", "add", netns)
            _ip("-n", netns, "link", "set", "lo", "up")
        for shard in SHARDS:  # what an interrupted run left of a shard's lab (make test's
            if shard.env:  # own `lab down` sees only the first's)
                subprocess.run(
                    _in_netns(shard, [sys.executable, "-m", "lab", "down"]),
                    cwd=REPO,
                    env={**os.environ, **shard.env},
                    capture_output=True,
                )

        def start(shard: Shard) -> None:
            log = LOGS / f"{shard.name}.log"
            fd = groups.usage_fd(shard)
            with open(log, "w") as out:
                running[shard.name] = (
                    subprocess.Popen(
                        _in_netns(
                            shard,
                            [sys.executable, "-m", "pytest", "-q", "--durations=15", *argv]
                            + list(shard.paths),
                        ),
                        cwd=REPO,
                        env={
                            **os.environ,
                            **shard.env,
                            **({"TRAINFLEET_SUITE_CPU_FD": str(fd)} if fd is not None else {}),
                        },
                        pass_fds=() if fd is None else (fd,),
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        preexec_fn=groups.enter(shard),
                    ),
                    log,
                    time.monotonic(),
                )
            print(f"--- shard {shard.name} started (its log: {log})", flush=True)

        deferred = [shard for shard in SHARDS if shard.deferred]
        for shard in SHARDS:
            if not shard.deferred:
                start(shard)
        while running:
            for name, (proc, log, began) in list(running.items()):
                if proc.poll() is None:
                    continue
                del running[name]
                while deferred:  # the CPU the ended shard leaves goes to the deferred ones
                    start(deferred.pop(0))
                codes[name], logs[name] = proc.returncode, log.read_text(errors="replace")
                spent, cpu = int(time.monotonic() - began), groups.seconds(name)
                print(
                    f"\n--- shard {name}: exit {proc.returncode}, {spent // 60}:{spent % 60:02d} "
                    + (f"wall, {cpu:.0f} CPU seconds" if cpu is not None else "wall")
                )
                sys.stdout.write(logs[name])
                sys.stdout.flush()
            time.sleep(0.5)
    finally:
        for proc, _, _ in running.values():  # interrupted: end the shards this runner started
            proc.terminate()
            proc.wait()
        for netns in namespaces:
            subprocess.run(["ip", "netns", "delete", netns], capture_output=True)
        left = groups.remove()
        if left:
            print(f"run_suite: CPU groups still in use (a process outlived its shard): {left}")
            codes["cgroups"] = 1
    wall = time.monotonic() - started
    minutes, seconds = divmod(int(wall), 60)
    print(f"\n--- the suite's slowest test phases (of every shard), {minutes}:{seconds:02d} wall:")
    print("\n".join(slowest(logs)))
    heaviest = slowest(logs, phases=("cpu",))
    if heaviest:
        print("--- the lab tests that used the most CPU (their nodes' processes included):")
        print("\n".join(heaviest))
    totals: dict[str, int] = {}
    for log in logs.values():
        for key, count in _outcomes(log).items():
            totals[key] = totals.get(key, 0) + count
    failed = totals.get("failed", 0) + totals.get("errors", 0)
    # a shard that failed without pytest's closing line (a crash), or groups left in use
    failed += sum(1 for name, code in codes.items() if code and not _outcomes(logs.get(name, "")))
    busy = busy_seconds() - busy
    print(
        f"--- the machine was busy {busy:.0f} CPU seconds of {wall * os.cpu_count():.0f} "
        f"({os.cpu_count()} cores)\n"
        f"--- exits: {', '.join(f'{name} {code}' for name, code in codes.items())}\n"
        f"{totals.get('passed', 0)} passed, {failed} failed, {totals.get('skipped', 0)} skipped"
    )
    return max(codes.values(), default=2)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
